// WrappedBackends: the backends a group wraps (Gloo for CPU tensors, NCCL for CUDA tensors, both
// created by the Python layer, since torch's wheel ships no Gloo headers), the routing of a call
// to the one for its tensors, and coalescing. Every operation the workspace does not run goes
// here; the Works these backends return are handed back unchanged, so completion, errors and
// futures are exactly theirs.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <utility>
#include <vector>

namespace cuda_p2p {

class WrappedBackends {
 public:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;

  // `cpu` is required; `cuda` may be null (no GPU at construction). Both must have `rank` of
  // `size`.
  WrappedBackends(c10::intrusive_ptr<c10d::Backend> cpu, c10::intrusive_ptr<c10d::Backend> cuda,
                  int rank, int size);

  const c10::intrusive_ptr<c10d::Backend>& cpu() const { return cpu_; }
  const c10::intrusive_ptr<c10d::Backend>& cuda() const { return cuda_; }
  // Whether anything was ever handed to the CUDA backend to run (an op, a barrier, the fused ops'
  // send/recv, a split or merge): the only ways a lazily created NCCL gets a communicator through
  // this group (NOTE [Shrinking a CUDA backend never used] in backend/child_groups.cpp).
  bool cuda_used() const { return cuda_used_.load(std::memory_order_acquire); }
  void mark_cuda_used() const { cuda_used_.store(true, std::memory_order_release); }
  // The backend for a device type, or null; TORCH_CHECKs for an unsupported type.
  c10::intrusive_ptr<c10d::Backend> for_device(c10::DeviceType type) const;
  // The backend for these tensors: all on one device type, with a backend for it; `op` names the
  // call in errors.
  c10d::Backend& route(c10::ArrayRef<at::Tensor> tensors, const char* op) const;
  // The backend of a barrier the workspace does not run (NOTE [Barriers order the GPU]), given
  // whether the group drives a GPU and its workspace's GPU (when the workspace is on one); names
  // that GPU in `opts.device_ids` when the caller named none.
  c10d::Backend& route_barrier(c10d::BarrierOptions& opts, bool drives_gpu,
                               std::optional<c10::DeviceIndex> workspace_gpu) const;

  // Runs `call` on the backend routed for `tensors`; a CPU backend's Work is tracked while
  // coalescing.
  template <typename Call>
  WorkPtr delegate(c10::ArrayRef<at::Tensor> tensors, const char* op, Call&& call) {
    c10d::Backend& b = route(tensors, op);
    return tracked_if_cpu(b, call(b));
  }
  WorkPtr tracked_if_cpu(const c10d::Backend& b, WorkPtr work) {
    return &b == cpu_.get() ? track(std::move(work)) : work;
  }

  // Coalescing: NCCL groups its own operations; for the CPU backend (which has no coalescing of
  // its own) every operation runs at once and end_coalescing() returns one Work over all of
  // them, and those of the workspace.
  void start_coalescing();
  WorkPtr end_coalescing(int rank);
  bool coalescing() const;
  // Records a CPU-side or workspace Work while coalescing; returns it unchanged.
  WorkPtr track(WorkPtr work);

  // cuda_p2p.all_gather_v and all_to_all_v without the workspace (checked by the caller): the
  // rows padded to the largest count and gathered; the split sizes, then the rows, exchanged.
  at::Tensor all_gather_v(const at::Tensor& input, const std::vector<int64_t>& sizes, int rank);
  std::pair<at::Tensor, std::vector<int64_t>> all_to_all_v(const at::Tensor& input,
                                                           const std::vector<int64_t>& splits);

  // Forwarded to both backends.
  void set_sequence_number();
  uint64_t sequence_number() const { return cpu_->getSequenceNumberForGroup(); }
  void set_timeout(std::chrono::milliseconds timeout);
  void abort();
  void shutdown();

 private:
  c10::intrusive_ptr<c10d::Backend> cpu_;
  c10::intrusive_ptr<c10d::Backend> cuda_;
  mutable std::atomic<bool> cuda_used_{false};
  mutable std::mutex mutex_;
  bool coalescing_ = false;
  std::vector<WorkPtr> coalesced_works_;
};

}  // namespace cuda_p2p
