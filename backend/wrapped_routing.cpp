// ProcessGroupCudaP2P's routing to the wrapped backends (Gloo for CPU tensors, NCCL for CUDA
// tensors): every operation the workspace does not run, and coalescing.
#include <c10/util/Exception.h>

#include <utility>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/coalesced_work.hpp"

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::wrapped_backend(c10::DeviceType type) const {
  switch (type) {
    case c10::DeviceType::CPU:
      return cpu_backend_;
    case c10::DeviceType::CUDA:
      return cuda_backend_;
    default:
      TORCH_CHECK(false, "cuda_p2p: tensors must be on cpu or cuda, got ",
                  c10::DeviceTypeName(type));
  }
}

c10d::Backend& ProcessGroupCudaP2P::route(const std::vector<at::Tensor>& tensors,
                                          const char* op) const {
  TORCH_CHECK(!tensors.empty(), "cuda_p2p ", op, ": expected at least one tensor, got none");
  const auto type = tensors.front().device().type();
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), "cuda_p2p ", op, ": got an undefined tensor");
    TORCH_CHECK(t.device().type() == type, "cuda_p2p ", op,
                ": all tensors must be on one device type, got ", tensors.front().device(), " and ",
                t.device());
  }
  auto backend = wrapped_backend(type);
  TORCH_CHECK(backend, "cuda_p2p ", op, ": got ", c10::DeviceTypeName(type),
              " tensors, but this group has no backend for them (NCCL is created only when CUDA "
              "is available at init_process_group/new_group)");
  return *backend;
}

c10d::Backend& ProcessGroupCudaP2P::route(const at::Tensor& tensor, const char* op) const {
  return route(std::vector<at::Tensor>{tensor}, op);
}

// NOTE [Barriers order the GPU]
// NCCL's barrier is an all-reduce on the GPU whose Work blocks the caller until it ran, so that
// dist.barrier() on a backend="nccl" group also orders the GPU work before it. On a cuda_p2p
// group, torch passes the device of init_process_group(device_id=...) when there is one, else
// "cpu" (its _get_object_coll_device prefers cpu when the group has a CPU backend), which sent
// the barrier to Gloo: a process barrier that orders no GPU work. So a group that drives a GPU -
// it wraps a CUDA backend and its workspace is on that GPU or not set up (workspace_device "cpu"
// keeps a host workspace, whose barriers stay on the host) - sends every barrier the workspace
// does not run to the CUDA backend, whatever the device asked, and names its workspace's GPU
// when the caller named none (NCCL would otherwise guess rank mod the GPUs). Everything else is
// a process barrier on the CPU backend.
c10d::Backend& ProcessGroupCudaP2P::route_barrier(c10d::BarrierOptions& opts) const {
  if (!cuda_backend_) return *cpu_backend_;
  const bool cuda_device = opts.device.has_value() && opts.device->is_cuda();
  const bool drives_gpu = config_.workspace_device != WorkspaceDevice::kCpu && !workspace_on_host();
  if (!cuda_device && !drives_gpu) return *cpu_backend_;
  if (opts.device_ids.empty()) {
    if (cuda_device && opts.device->has_index()) {
      opts.device_ids = {opts.device->index()};
    } else if (workspace_ && !workspace_on_host()) {
      opts.device_ids = {workspace_->device().tensor_device().index()};
    }
  }
  return *cuda_backend_;
}

WorkPtr ProcessGroupCudaP2P::track(WorkPtr work) {
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  if (coalescing_ && work) coalesced_works_.push_back(work);
  return work;
}

WorkPtr ProcessGroupCudaP2P::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                              const c10d::AllreduceOptions& opts) {
  counters_->fallback(Counters::Op::kAllReduceSparse, reason::kNoWorkspaceOp);
  return delegate(tensors, "allreduce_sparse",
                  [&](c10d::Backend& b) { return b.allreduce_sparse(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceCoalescedOptions& opts) {
  counters_->fallback(Counters::Op::kAllReduce, reason::kSeveralTensors);
  return delegate(tensors, "allreduce_coalesced",
                  [&](c10d::Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  counters_->fallback(Counters::Op::kAllGather, reason::kSeveralTensors);
  return delegate(inputs, "allgather_coalesced",
                  [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

void ProcessGroupCudaP2P::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Only Gloo implements it; it reports which ranks failed to arrive.
  counters_->fallback(Counters::Op::kMonitoredBarrier, reason::kNoWorkspaceOp);
  cpu_backend_->monitoredBarrier(opts, wait_all_ranks);
}

void ProcessGroupCudaP2P::startCoalescing() {
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(!coalescing_, "cuda_p2p: startCoalescing called twice without endCoalescing");
    coalescing_ = true;
    coalesced_works_.clear();
  }
  if (cuda_backend_) cuda_backend_->startCoalescing();
}

WorkPtr ProcessGroupCudaP2P::endCoalescing() {
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(coalescing_, "cuda_p2p: endCoalescing called without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_works_);
  }
  if (cuda_backend_) {
    if (auto cuda_work = cuda_backend_->endCoalescing()) works.push_back(std::move(cuda_work));
  }
  return c10::make_intrusive<ops::CoalescedWork>(getRank(), std::move(works));
}

}  // namespace cuda_p2p
