// broadcast.
#include "backend/entry_sequence.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(call(OpId::kBroadcast), hierarchy_->broadcast(tensors, opts))) {
    return hierarchical_done(call(OpId::kBroadcast), tensors);
  }
  const char* why = collectives_.rejects(tensors);
  if (!why && (tensors.size() != 1 || opts.rootTensor != 0)) why = reason::kSeveralTensors;
  return serve(
      call(OpId::kBroadcast), {tensors, tensors, why, opts.asyncOp},
      [&] { return " from root " + std::to_string(opts.rootRank); },
      [&] { return collectives_.broadcast(tensors[0], opts.rootRank); },
      [&](c10d::Backend& b) { return b.broadcast(tensors, opts); }, [&] { return tensors; });
}

}  // namespace cuda_p2p
