#include "backend/wrapped_backends.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

#include "ops/coalesced_work.hpp"

namespace cuda_p2p {

WrappedBackends::WrappedBackends(c10::intrusive_ptr<c10d::Backend> cpu,
                                 c10::intrusive_ptr<c10d::Backend> cuda, int rank, int size)
    : cpu_(std::move(cpu)), cuda_(std::move(cuda)) {
  TORCH_CHECK(cpu_, "cuda_p2p: a wrapped backend for CPU tensors (Gloo) is required");
  for (const auto* wrapped : {cpu_.get(), cuda_.get()}) {
    if (wrapped == nullptr) continue;
    TORCH_CHECK(wrapped->getRank() == rank && wrapped->getSize() == size,
                "cuda_p2p: wrapped backend ", wrapped->getBackendName(), " has rank ",
                wrapped->getRank(), " of ", wrapped->getSize(), ", expected rank ", rank, " of ",
                size);
  }
}

c10::intrusive_ptr<c10d::Backend> WrappedBackends::for_device(c10::DeviceType type) const {
  switch (type) {
    case c10::DeviceType::CPU:
      return cpu_;
    case c10::DeviceType::CUDA:
      return cuda_;
    default:
      TORCH_CHECK(false, "cuda_p2p: tensors must be on cpu or cuda, got ",
                  c10::DeviceTypeName(type));
  }
}

c10d::Backend& WrappedBackends::route(c10::ArrayRef<at::Tensor> tensors, const char* op) const {
  TORCH_CHECK(!tensors.empty(), "cuda_p2p ", op, ": expected at least one tensor, got none");
  const auto type = tensors.front().device().type();
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), "cuda_p2p ", op, ": got an undefined tensor");
    TORCH_CHECK(t.device().type() == type, "cuda_p2p ", op,
                ": all tensors must be on one device type, got ", tensors.front().device(), " and ",
                t.device());
  }
  auto backend = for_device(type);
  if (backend && backend == cuda_) mark_cuda_used();
  TORCH_CHECK(backend, "cuda_p2p ", op, ": got ", c10::DeviceTypeName(type),
              " tensors, but this group has no backend for them (NCCL is created only when CUDA "
              "is available at init_process_group/new_group)");
  return *backend;
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
c10d::Backend& WrappedBackends::route_barrier(c10d::BarrierOptions& opts, bool drives_gpu,
                                              std::optional<c10::DeviceIndex> workspace_gpu) const {
  if (!cuda_) return *cpu_;
  const bool cuda_device = opts.device.has_value() && opts.device->is_cuda();
  if (!cuda_device && !drives_gpu) return *cpu_;
  if (opts.device_ids.empty()) {
    if (cuda_device && opts.device->has_index()) {
      opts.device_ids = {opts.device->index()};
    } else if (workspace_gpu) {
      opts.device_ids = {*workspace_gpu};
    }
  }
  mark_cuda_used();
  return *cuda_;
}

WrappedBackends::WorkPtr WrappedBackends::track(WorkPtr work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (coalescing_ && work) coalesced_works_.push_back(work);
  return work;
}

bool WrappedBackends::coalescing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return coalescing_;
}

void WrappedBackends::start_coalescing() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!coalescing_, "cuda_p2p: startCoalescing called twice without endCoalescing");
    coalescing_ = true;
    coalesced_works_.clear();
  }
  if (cuda_) cuda_->startCoalescing();
}

WrappedBackends::WorkPtr WrappedBackends::end_coalescing(int rank) {
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "cuda_p2p: endCoalescing called without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_works_);
  }
  if (cuda_) {
    if (auto cuda_work = cuda_->endCoalescing()) works.push_back(std::move(cuda_work));
  }
  return c10::make_intrusive<ops::CoalescedWork>(rank, std::move(works));
}

at::Tensor WrappedBackends::all_gather_v(const at::Tensor& input, const std::vector<int64_t>& sizes,
                                         int rank) {
  const int W = static_cast<int>(sizes.size());
  std::vector<int64_t> out_sizes = input.sizes().vec();
  out_sizes[0] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  at::Tensor output =
      at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  // Every rank's rows padded to the largest count, gathered, the padding dropped.
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> padded_sizes = input.sizes().vec();
  padded_sizes[0] = largest;
  at::Tensor padded = at::zeros(padded_sizes, input.options());
  padded.narrow(0, 0, sizes[rank]).copy_(input);
  std::vector<int64_t> gathered_sizes = padded_sizes;
  gathered_sizes[0] = largest * W;
  at::Tensor gathered = at::empty(gathered_sizes, input.options());
  route(input, "all_gather_v")._allgather_base(gathered, padded, c10d::AllgatherOptions())->wait();
  int64_t row = 0;
  for (int q = 0; q < W; ++q) {
    output.narrow(0, row, sizes[q]).copy_(gathered.narrow(0, q * largest, sizes[q]));
    row += sizes[q];
  }
  return output;
}

std::pair<at::Tensor, std::vector<int64_t>> WrappedBackends::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& splits) {
  const int W = static_cast<int>(splits.size());
  c10d::Backend& b = route(input, "all_to_all_v");
  // The split sizes first (one int64 to every rank), then the rows.
  at::Tensor send_sizes =
      at::tensor(splits, at::TensorOptions().dtype(at::kLong)).to(input.device());
  at::Tensor recv_sizes = at::empty_like(send_sizes);
  std::vector<int64_t> no_splits;
  b.alltoall_base(recv_sizes, send_sizes, no_splits, no_splits, c10d::AllToAllOptions())->wait();
  const at::Tensor sizes_cpu = recv_sizes.cpu();
  std::vector<int64_t> recv(sizes_cpu.data_ptr<int64_t>(), sizes_cpu.data_ptr<int64_t>() + W);
  std::vector<int64_t> out_sizes = input.sizes().vec();
  out_sizes[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  at::Tensor output =
      at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  // Copies: Gloo's alltoall_base takes its split vectors over.
  std::vector<int64_t> in_splits = splits, out_splits = recv;
  b.alltoall_base(output, in, out_splits, in_splits, c10d::AllToAllOptions())->wait();
  return {output, recv};
}

void WrappedBackends::set_sequence_number() {
  cpu_->setSequenceNumberForGroup();
  if (cuda_) cuda_->setSequenceNumberForGroup();
}

void WrappedBackends::set_timeout(std::chrono::milliseconds timeout) {
  cpu_->setTimeout(timeout);
  if (cuda_) cuda_->setTimeout(timeout);
}

void WrappedBackends::abort() {
  cpu_->abort();
  if (cuda_) cuda_->abort();
}

void WrappedBackends::shutdown() {
  cpu_->shutdown();
  if (cuda_) cuda_->shutdown();
}

}  // namespace cuda_p2p
