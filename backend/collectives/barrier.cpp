// barrier (no route handshake: NOTE [Barriers order the GPU] in
// backend/wrapped_backends.cpp) and monitored_barrier, which only Gloo runs.
#include "backend/entry_sequence.hpp"
#include "backend/hierarchy_entry.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using c10d::OpType;
using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::barrier(const c10d::BarrierOptions& opts) {
  if (hierarchy_ && ran_hierarchically(call(OpId::kBarrier), hierarchy_->barrier(opts))) {
    return hierarchical_done(call(OpId::kBarrier), {});
  }
  if (const char* why = barrier_rejects(opts)) return wrapped_barrier(opts, why);
  const auto timeout = opts.timeout > Millis(0) ? std::optional(opts.timeout) : std::nullopt;
  counters_.record(OpId::kBarrier, collectives_.barrier(timeout));
  return completed(OpType::BARRIER, [] { return std::vector<at::Tensor>{}; }, opts.asyncOp);
}

// A barrier for a CUDA device stays with NCCL unless the workspace itself is on CUDA.
const char* ProcessGroupCudaP2P::barrier_rejects(const c10d::BarrierOptions& opts) const {
  if (!collectives_.on()) return reason::kWorkspaceOff;
  const bool device_ok = !opts.device.has_value() || !opts.device->is_cuda() ||
                         (is_p2p_available() && !collectives_.on_host());
  return device_ok ? nullptr : reason::kDevice;
}

// No route handshake: NCCL's and Gloo's barriers are where a barrier of a rank without the
// workspace meets its peers'.
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::wrapped_barrier(const c10d::BarrierOptions& opts,
                                                                  const char* why) {
  counters_.fallback(OpId::kBarrier, why);
  c10d::BarrierOptions routed = opts;
  // NOTE [Barriers order the GPU] in backend/wrapped_backends.cpp.
  const bool gpu_workspace = workspace_ && !collectives_.on_host();
  c10d::Backend& b = wrapped_.route_barrier(
      routed, config_.workspace_device != WorkspaceDevice::kCpu && !collectives_.on_host(),
      gpu_workspace ? std::optional(workspace_->device().tensor_device().index()) : std::nullopt);
  return wrapped_.tracked_if_cpu(b, b.barrier(routed));
}

void ProcessGroupCudaP2P::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Only Gloo implements it; it reports which ranks failed to arrive.
  counters_.fallback(OpId::kMonitoredBarrier, reason::kNoWorkspaceOp);
  wrapped_.cpu()->monitoredBarrier(opts, wait_all_ranks);
}

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::barrier(std::optional<Millis> timeout) {
  return run("barrier", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o = ops::barrier(ctx, timeout);
    // A barrier blocks the caller, also when the workspace is on a GPU.
    ws_->device().synchronize(ctx.stream);
    return o;
  });
}

// --- on a group spanning hosts: the hierarchy's entry (NOTE [One hierarchical entry]) ------------

HierarchyOutcome Hierarchy::barrier(const c10d::BarrierOptions& opts) {
  if (nccl_ && opts.device.has_value() && opts.device->is_cuda()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  const bool was = agreement_on_;
  agreement_on_ = true;  // the exchange is the barrier: never skipped
  try {
    agree(ops::OpSignature::of(ops::OpId::kBarrier, ""), opts.timeout);
  } catch (...) {
    agreement_on_ = was;
    throw;
  }
  agreement_on_ = was;
  return {.ran = true, .path = "hierarchical", .runs = 1};  // the same exchange on any hosts
}

}  // namespace cuda_p2p
