// reduce.
#include "backend/entry_sequence.hpp"
#include "backend/reduce_ops.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

namespace {

// Why the workspace cannot take the call (nullptr: it can).
const char* reduce_screen(const WorkspaceCollectives& collectives,
                          const std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts,
                          const std::optional<ops::ReduceOp>& op) {
  if (tensors.size() != 1 || opts.rootTensor != 0) return reason::kSeveralTensors;
  if (!op) return reason::kReduceOp;
  return collectives.all_reduce_rejects(tensors[0]);
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  return serve(
      call(OpId::kReduce),
      {tensors, tensors, reduce_screen(collectives_, tensors, opts, op), opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp) + detail::root_text("to", opts.rootRank); },
      [&] { return collectives_.reduce(tensors[0], opts.rootRank, *op); },
      [&](c10d::Backend& b) { return b.reduce(tensors, opts); }, [&] { return tensors; });
}

}  // namespace cuda_p2p
