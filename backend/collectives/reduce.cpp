// reduce.
#include "backend/entry_sequence.hpp"
#include "backend/reduce_ops.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  const char* why = tensors.size() != 1 || opts.rootTensor != 0 ? reason::kSeveralTensors
                    : !op ? reason::kReduceOp
                          : collectives_.all_reduce_rejects(tensors[0]);
  return serve(
      call(OpId::kReduce), {tensors, tensors, why, opts.asyncOp},
      [&] {
        return " " + reduce_op_text(opts.reduceOp) + " to root " + std::to_string(opts.rootRank);
      },
      [&] { return collectives_.reduce(tensors[0], opts.rootRank, *op); },
      [&](c10d::Backend& b) { return b.reduce(tensors, opts); }, [&] { return tensors; });
}

}  // namespace cuda_p2p
