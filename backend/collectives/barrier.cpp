// barrier (no route handshake: NOTE [Barriers order the GPU] in
// backend/wrapped_backends.cpp) and monitored_barrier, which only Gloo runs.
#include "backend/entry_sequence.hpp"

namespace cuda_p2p {

using c10d::OpType;
using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::barrier(const c10d::BarrierOptions& opts) {
  if (hierarchy_ && ran_hierarchically(call(OpId::kBarrier), hierarchy_->barrier(opts))) {
    return hierarchical_done(call(OpId::kBarrier), {});
  }
  // A barrier for a CUDA device stays with NCCL unless the workspace itself is on CUDA. No route
  // handshake: NCCL's and Gloo's barriers are where a barrier of a rank without the workspace
  // meets its peers'.
  const bool device_ok = !opts.device.has_value() || !opts.device->is_cuda() ||
                         (is_p2p_available() && !collectives_.on_host());
  const char* why = !collectives_.on() ? reason::kWorkspaceOff
                    : !device_ok       ? reason::kDevice
                                       : nullptr;
  if (why) {
    counters_.fallback(OpId::kBarrier, why);
    c10d::BarrierOptions routed = opts;
    // NOTE [Barriers order the GPU] in backend/wrapped_backends.cpp.
    const bool gpu_workspace = workspace_ && !collectives_.on_host();
    c10d::Backend& b = wrapped_.route_barrier(
        routed, config_.workspace_device != WorkspaceDevice::kCpu && !collectives_.on_host(),
        gpu_workspace ? std::optional(workspace_->device().tensor_device().index()) : std::nullopt);
    return wrapped_.tracked_if_cpu(b, b.barrier(routed));
  }
  std::optional<Millis> timeout;
  if (opts.timeout > Millis(0)) timeout = opts.timeout;
  counters_.record(OpId::kBarrier, collectives_.barrier(timeout));
  return completed(OpType::BARRIER, [] { return std::vector<at::Tensor>{}; }, opts.asyncOp);
}

void ProcessGroupCudaP2P::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Only Gloo implements it; it reports which ranks failed to arrive.
  counters_.fallback(OpId::kMonitoredBarrier, reason::kNoWorkspaceOp);
  wrapped_.cpu()->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace cuda_p2p
