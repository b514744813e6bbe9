#include "backend/ProcessGroupCudaP2P.hpp"

#include "backend/CoalescedWork.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <utility>

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

ProcessGroupCudaP2P::ProcessGroupCudaP2P(c10::intrusive_ptr<c10d::Store> store, int rank,
                                         int size, c10::intrusive_ptr<Options> options,
                                         c10::intrusive_ptr<c10d::Backend> cpu_backend,
                                         c10::intrusive_ptr<c10d::Backend> cuda_backend)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      options_(options ? std::move(options) : c10::make_intrusive<Options>()),
      cpu_backend_(std::move(cpu_backend)),
      cuda_backend_(std::move(cuda_backend)) {
  TORCH_CHECK(store_, "cuda_p2p: a c10d Store is required, got None");
  TORCH_CHECK(size >= 1, "cuda_p2p: world size must be >= 1, got ", size);
  TORCH_CHECK(rank >= 0 && rank < size, "cuda_p2p: rank must be in [0, ", size, "), got ", rank);
  TORCH_CHECK(cpu_backend_, "cuda_p2p: a wrapped backend for CPU tensors (Gloo) is required");
  for (const auto* wrapped : {cpu_backend_.get(), cuda_backend_.get()}) {
    if (wrapped == nullptr) continue;
    TORCH_CHECK(wrapped->getRank() == rank && wrapped->getSize() == size,
                "cuda_p2p: wrapped backend ", wrapped->getBackendName(), " has rank ",
                wrapped->getRank(), " of ", wrapped->getSize(), ", expected rank ", rank, " of ",
                size);
  }
  if (options_->buffer_size.has_value()) {
    TORCH_CHECK(*options_->buffer_size > 0,
                "cuda_p2p: Options.buffer_size must be positive (bytes), got ",
                *options_->buffer_size);
  }

  // The workspace lives on the GPU when this group drives one (a CUDA backend exists), else in
  // host shared memory. Every rank constructs the backend, so the rendezvous is collective.
  const char* disable = std::getenv(kDisableWorkspaceEnv);
  if (!options_->enable_workspace) {
    workspace_off_reason_ = "disabled by Options.enable_workspace = False";
  } else if (disable && std::string(disable) == "1") {
    workspace_off_reason_ = std::string("disabled by ") + kDisableWorkspaceEnv + "=1";
  } else {
    WorkspaceOptions ws;
    ws.buffer_size = options_->buffer_size.value_or(WorkspaceOptions::kDefaultBufferSize);
    ws.timeout = options_->timeout;
    std::shared_ptr<Device> device;
#ifdef CUDA_P2P_WITH_CUDA
    if (cuda_backend_) device = make_cuda_device(c10::cuda::current_device());
#endif
    if (!device) device = make_host_device();
    workspace_ = std::make_unique<SymmetricWorkspace>(
        c10::make_intrusive<c10d::PrefixStore>("cuda_p2p/", store_), rank, size, std::move(device),
        ws);
  }
}

ProcessGroupCudaP2P::~ProcessGroupCudaP2P() = default;

std::string ProcessGroupCudaP2P::p2p_unavailable_reason() const {
  if (!workspace_) return workspace_off_reason_;
  return workspace_->unavailable_reason();
}

int64_t ProcessGroupCudaP2P::get_buffer_size() const {
  return is_p2p_available() ? workspace_->buffer_size() : 0;
}

at::Tensor ProcessGroupCudaP2P::get_p2p_buffer(int64_t rank, at::IntArrayRef sizes,
                                               at::ScalarType dtype,
                                               int64_t storage_offset) const {
  TORCH_CHECK(is_p2p_available(), "cuda_p2p get_p2p_buffer: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  TORCH_CHECK(rank >= 0 && rank < getSize(), "cuda_p2p get_p2p_buffer: rank must be in [0, ",
              getSize(), "), got ", rank);
  return workspace_->get_buffer(static_cast<int>(rank), sizes, dtype, storage_offset);
}

void ProcessGroupCudaP2P::intra_node_barrier(const std::vector<int64_t>& ranks,
                                             std::optional<Millis> timeout) {
  TORCH_CHECK(is_p2p_available(),
              "cuda_p2p intra_node_barrier: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  std::vector<int> members;
  for (auto r : ranks) {
    TORCH_CHECK(r >= 0 && r < getSize(), "cuda_p2p intra_node_barrier: ranks must be in [0, ",
                getSize(), "), got ", r);
    members.push_back(static_cast<int>(r));
  }
  auto& device = workspace_->device();
  auto stream = device.current_stream();
  workspace_->barrier(*stream, kApiChannel, timeout, members);
}

void ProcessGroupCudaP2P::bump_counter(const std::string& name, int64_t by) {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_[name] += by;
}

std::map<std::string, int64_t> ProcessGroupCudaP2P::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

void ProcessGroupCudaP2P::reset_counters() {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_.clear();
}

void ProcessGroupCudaP2P::ensure_min_buffer_size(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p ensure_min_buffer_size: nbytes must be >= 0, got ", nbytes);
  if (workspace_) workspace_->ensure_min_buffer_size(nbytes);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::wrapped_backend(c10::DeviceType type) const {
  switch (type) {
    case c10::DeviceType::CPU:
      return cpu_backend_;
    case c10::DeviceType::CUDA:
      return cuda_backend_;
    default:
      TORCH_CHECK(false, "cuda_p2p: tensors must be on cpu or cuda, got ", c10::DeviceTypeName(type));
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

c10d::Backend& ProcessGroupCudaP2P::route_barrier(const c10d::BarrierOptions& opts) const {
  // A barrier on a CUDA device goes to NCCL, so that it also orders that device's streams;
  // everything else is a process barrier on the CPU backend.
  if (opts.device.has_value() && opts.device->is_cuda() && cuda_backend_) return *cuda_backend_;
  return *cpu_backend_;
}

WorkPtr ProcessGroupCudaP2P::track(WorkPtr work) {
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  if (coalescing_ && work) coalesced_works_.push_back(work);
  return work;
}

WorkPtr ProcessGroupCudaP2P::broadcast(std::vector<at::Tensor>& tensors,
                                       const c10d::BroadcastOptions& opts) {
  return delegate(tensors, "broadcast", [&](c10d::Backend& b) { return b.broadcast(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allreduce(std::vector<at::Tensor>& tensors,
                                       const c10d::AllreduceOptions& opts) {
  return delegate(tensors, "allreduce", [&](c10d::Backend& b) { return b.allreduce(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                              const c10d::AllreduceOptions& opts) {
  return delegate(tensors, "allreduce_sparse", [&](c10d::Backend& b) { return b.allreduce_sparse(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return delegate(tensors, "allreduce_coalesced", [&](c10d::Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::reduce(std::vector<at::Tensor>& tensors,
                                    const c10d::ReduceOptions& opts) {
  return delegate(tensors, "reduce", [&](c10d::Backend& b) { return b.reduce(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) {
  return delegate(inputs, "allgather", [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::_allgather_base(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) {
  return delegate(input, "all_gather_into_tensor", [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); });
}

WorkPtr ProcessGroupCudaP2P::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  return delegate(inputs, "allgather_coalesced", [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  return delegate(inputs, "allgather_into_tensor_coalesced", [&](c10d::Backend& b) { return b.allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                    std::vector<at::Tensor>& inputs,
                                    const c10d::GatherOptions& opts) {
  return delegate(inputs, "gather", [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::scatter(std::vector<at::Tensor>& outputs,
                                     std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ScatterOptions& opts) {
  return delegate(outputs, "scatter", [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter(std::vector<at::Tensor>& outputs,
                                            std::vector<std::vector<at::Tensor>>& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
  return delegate(outputs, "reduce_scatter", [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  return delegate(input, "reduce_scatter_tensor", [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); });
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegate(inputs, "reduce_scatter_tensor_coalesced", [&](c10d::Backend& b) { return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::alltoall_base(at::Tensor& output, at::Tensor& input,
                                           std::vector<int64_t>& output_split_sizes,
                                           std::vector<int64_t>& input_split_sizes,
                                           const c10d::AllToAllOptions& opts) {
  return delegate(input, "all_to_all_single", [&](c10d::Backend& b) { return b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts); });
}

WorkPtr ProcessGroupCudaP2P::alltoall(std::vector<at::Tensor>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const c10d::AllToAllOptions& opts) {
  return delegate(inputs, "all_to_all", [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  TORCH_CHECK(dst_rank >= 0 && dst_rank < getSize() && dst_rank != getRank(),
              "cuda_p2p send: destination must be another rank in [0, ", getSize(), "), got ",
              dst_rank, " on rank ", getRank());
  return delegate(tensors, "send", [&](c10d::Backend& b) { return b.send(tensors, dst_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  TORCH_CHECK(src_rank >= 0 && src_rank < getSize() && src_rank != getRank(),
              "cuda_p2p recv: source must be another rank in [0, ", getSize(), "), got ",
              src_rank, " on rank ", getRank());
  return delegate(tensors, "recv", [&](c10d::Backend& b) { return b.recv(tensors, src_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return delegate(tensors, "recv_anysource", [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

WorkPtr ProcessGroupCudaP2P::barrier(const c10d::BarrierOptions& opts) {
  c10d::Backend& b = route_barrier(opts);
  auto work = b.barrier(opts);
  return &b == cpu_backend_.get() ? track(std::move(work)) : work;
}

void ProcessGroupCudaP2P::monitoredBarrier(const c10d::BarrierOptions& opts,
                                           bool wait_all_ranks) {
  // Only Gloo implements it; it reports which ranks failed to arrive.
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
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

void ProcessGroupCudaP2P::setSequenceNumberForGroup() {
  cpu_backend_->setSequenceNumberForGroup();
  if (cuda_backend_) cuda_backend_->setSequenceNumberForGroup();
}

uint64_t ProcessGroupCudaP2P::getSequenceNumberForGroup() {
  return cpu_backend_->getSequenceNumberForGroup();
}

void ProcessGroupCudaP2P::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  cpu_backend_->setTimeout(timeout);
  if (cuda_backend_) cuda_backend_->setTimeout(timeout);
}

void ProcessGroupCudaP2P::abort() {
  cpu_backend_->abort();
  if (cuda_backend_) cuda_backend_->abort();
}

void ProcessGroupCudaP2P::shutdown() {
  cpu_backend_->shutdown();
  if (cuda_backend_) cuda_backend_->shutdown();
}

}  // namespace cuda_p2p
