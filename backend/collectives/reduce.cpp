// reduce.
#include "backend/entry_sequence.hpp"
#include "backend/reduce_ops.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

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

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

// torch.distributed.reduce: only the root's tensor receives the result; the others' are left
// as they were (NOTE [Reduce at the root] in ops/reduce.cpp).
ops::Outcome WorkspaceCollectives::reduce(at::Tensor& t, int64_t root, ops::ReduceOp op) {
  check_or_reject("reduce", ops::OpId::kReduce, [&] {
    detail::check_root("reduce", root, size_);
    ops::check_reduce_op(op, t.scalar_type(), "reduce");
  });
  refuse_capture("reduce", "");
  // Only the root's copy goes back into a non-contiguous tensor: the others' stay as they were.
  at::Tensor work = detail::contiguous_input(t);
  return run("reduce", [&](const ops::CollectiveContext& ctx) {
    keep({work, t});
    const ops::Outcome o = ops::reduce(ctx, work, static_cast<int>(root), op);
    if (root == rank_) copy_back(t, work);
    return o;
  });
}

}  // namespace cuda_p2p
