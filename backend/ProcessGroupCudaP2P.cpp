// ProcessGroupCudaP2P's lifecycle: construction (configuration, the workspace's rendezvous),
// the workspace's API (buffers, barrier, growth), counters, the fused ops' per-group state, and
// timeout / abort / shutdown. Routing to the wrapped backends is in backend/wrapped_routing.cpp,
// the workspace collectives' entry in backend/workspace_collectives.cpp.
#include "backend/ProcessGroupCudaP2P.hpp"

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "ops/channels.hpp"
#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/host/host_device.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "ops/cuda/signature_kernel.cuh"
#include "ops/cuda/sleep_kernel.cuh"
#endif

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

ProcessGroupCudaP2P::ProcessGroupCudaP2P(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                         c10::intrusive_ptr<Options> options,
                                         c10::intrusive_ptr<c10d::Backend> cpu_backend,
                                         c10::intrusive_ptr<c10d::Backend> cuda_backend,
                                         std::optional<int64_t> bound_cuda_device)
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
  config_ = resolve_config(*options_, size);

  // NOTE [CUDA collectives are opt-in]
  // A user who switches backend="nccl" to backend="cuda_p2p" must lose nothing: until the
  // workspace collectives have been validated across GPUs (so far they have run, and matched
  // their references, only with ranks sharing one GPU: docs/testing.md) and measured against
  // NCCL, ordinary collectives on CUDA tensors go to the wrapped NCCL backend unless the user
  // opts in (Options.cuda_workspace_collectives, else CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1:
  // Config::cuda_collectives). The counters say which path ran ("all_reduce.wrapped" vs
  // "all_reduce.one_shot", ...). A host workspace (CPU tensors) is not affected; the fused ops
  // use the workspace on either device.

  // NOTE [The workspace's device]
  // A group has one workspace, on one device: tensors on the other device go to the wrapped
  // backend (counted ".wrapped"). By default ("auto") it lives on a GPU when the group drives one
  // (it wraps a CUDA backend: Python creates NCCL when a GPU is visible; which GPU: NOTE [The
  // workspace's GPU] in backend/config.cpp), else in host shared memory.
  // Options.workspace_device / CUDA_P2P_WORKSPACE_DEVICE choose: "cpu" keeps
  // a host workspace on a GPU machine, for CPU tensor-parallel inference there (and for the CPU
  // test suite run on a GPU machine: tests/python/conftest.py); "cuda" insists on the GPU and
  // fails here, naming the knob, where there is none. Every rank constructs the backend, so the
  // rendezvous is collective.
  if (config_.workspace) {
    std::shared_ptr<Device> device;
    const auto where = config_.workspace_device;
#ifdef CUDA_P2P_WITH_CUDA
    if (where != WorkspaceDevice::kCpu && cuda_backend_) {
      // NOTE [The workspace's GPU] in backend/config.cpp.
      device = make_cuda_device(choose_cuda_device(bound_cuda_device, c10::cuda::device_count(),
                                                   c10::cuda::current_device())
                                    .index,
                                cuda_hardware_queues());
      // The ops' own kernels too (the device loaded its signal kernels): NOTE [Kernels loaded up
      // front] in p2p_workspace/cuda/signal_kernels.cuh. Into the workspace GPU's context.
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device->device_index()));
      cudaError_t err = cuda::load_signature_kernels();
      if (err == cudaSuccess) err = cuda::load_sleep_kernel();
      TORCH_CHECK(err == cudaSuccess,
                  "cuda_p2p: loading the ops' CUDA kernels failed: ", cudaGetErrorString(err));
    }
    constexpr bool kBuiltWithCuda = true;
#else
    constexpr bool kBuiltWithCuda = false;
    (void)bound_cuda_device;
#endif
    TORCH_CHECK(device || where != WorkspaceDevice::kCuda,
                "cuda_p2p: ", config_.workspace_device_from,
                " asks for a workspace on the GPU ('cuda'), but ",
                kBuiltWithCuda ? "this group wraps no CUDA backend (no GPU visible to torch, or "
                                 "NCCL unavailable)"
                               : "cuda_p2p was built without CUDA",
                "; use 'cpu' or 'auto'");
    if (!device) device = make_host_device(size, config_.host_streams);
    // NOTE [Zero-copy collectives] in ops/zero_copy.cpp: the exchange is read by the host.
    TORCH_CHECK(device->tensor_device().is_cpu() ||
                    config_.collective.zero_copy_agreement != ops::ZeroCopyAgreement::kExchange,
                "cuda_p2p: ", config_.zero_copy_agreement_from,
                " asks for 'exchange', which needs a host workspace, but this group's workspace "
                "is on the GPU; use 'signature' or 'auto'");
    workspace_ = std::make_unique<SymmetricWorkspace>(
        c10::make_intrusive<c10d::PrefixStore>("cuda_p2p/", store_), rank, size, std::move(device),
        config_.workspace_options);
  }
}

ProcessGroupCudaP2P::~ProcessGroupCudaP2P() {
  lifetime_token_.reset();  // NOTE [Group lookup cache]: no cache entry finds this backend now
}
std::string ProcessGroupCudaP2P::p2p_unavailable_reason() const {
  if (!workspace_) return config_.workspace_off_reason;
  return workspace_->unavailable_reason();
}

bool ProcessGroupCudaP2P::workspace_on_host() const {
  return workspace_ && workspace_->device().tensor_device().is_cpu();
}

std::string ProcessGroupCudaP2P::workspace_collectives_reason() const {
  if (!is_p2p_available()) return "the workspace is unavailable: " + p2p_unavailable_reason();
  if (!config_.collectives) {
    return "turned off (Options.workspace_collectives = False or "
           "CUDA_P2P_WORKSPACE_COLLECTIVES=0)";
  }
  if (!workspace_on_host() && !config_.cuda_collectives) {
    return "collectives on CUDA tensors go to NCCL by default; opt in with "
           "Options.cuda_workspace_collectives = True or CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1";
  }
  return "";
}

bool ProcessGroupCudaP2P::uses_cross_memory() const {
  return uses_workspace_collectives() && workspace_->private_reads();
}

std::string ProcessGroupCudaP2P::cross_memory_reason() const {
  if (!is_p2p_available()) return "the workspace is unavailable: " + p2p_unavailable_reason();
  if (workspace_->private_reads()) return "";
  const std::string& why = workspace_->private_reads_reason();
  if (!config_.cross_memory_off_reason.empty() && why.rfind("turned off", 0) == 0) {
    return why + " (" + config_.cross_memory_off_reason + ")";
  }
  return why;
}

int64_t ProcessGroupCudaP2P::get_buffer_size() const {
  return is_p2p_available() ? workspace_->buffer_size() : 0;
}

at::Tensor ProcessGroupCudaP2P::get_p2p_buffer(int64_t rank, at::IntArrayRef sizes,
                                               at::ScalarType dtype, int64_t storage_offset) const {
  TORCH_CHECK(is_p2p_available(), "cuda_p2p get_p2p_buffer: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  TORCH_CHECK(rank >= 0 && rank < getSize(), "cuda_p2p get_p2p_buffer: rank must be in [0, ",
              getSize(), "), got ", rank);
  return workspace_->get_buffer(static_cast<int>(rank), sizes, dtype, storage_offset);
}

void ProcessGroupCudaP2P::intra_node_barrier(const std::vector<int64_t>& ranks,
                                             std::optional<Millis> timeout) {
  TORCH_CHECK(is_p2p_available(), "cuda_p2p intra_node_barrier: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  std::vector<int> members;
  for (auto r : ranks) {
    TORCH_CHECK(r >= 0 && r < getSize(), "cuda_p2p intra_node_barrier: ranks must be in [0, ",
                getSize(), "), got ", r);
    members.push_back(static_cast<int>(r));
  }
  auto& device = workspace_->device();
  auto stream = device.current_stream();
  device.check_healthy("intra_node_barrier");
  workspace_->begin_op(*stream);  // NOTE [One order per group]
  workspace_->barrier(*stream, ops::kApiChannel, timeout, members);
  workspace_->end_op(*stream);
}

void ProcessGroupCudaP2P::bump_counter(std::string_view name, int64_t by) {
  if (config_.debug) debug_fallback(name, nullptr);  // NOTE [Debug lines] in backend/config.cpp
  std::lock_guard<std::mutex> lock(counters_mutex_);
  // Found without making a string: a hot path's counter costs a lookup, not an allocation.
  auto it = counters_.find(name);
  if (it == counters_.end()) it = counters_.emplace(std::string(name), 0).first;
  it->second += by;
}

std::map<std::string, int64_t> ProcessGroupCudaP2P::counters() const {
  std::map<std::string, int64_t> all;
  {
    std::lock_guard<std::mutex> lock(counters_mutex_);
    all.insert(counters_.begin(), counters_.end());
  }
  static_assert(std::size(kHotCounterNames) == static_cast<size_t>(HotCounter::kCount));
  for (size_t i = 0; i < hot_counters_.size(); ++i) {
    const int64_t n = hot_counters_[i].load(std::memory_order_relaxed);
    if (n != 0) all[kHotCounterNames[i]] += n;
  }
  // NOTE [Intra-op threads] in ops/collectives.cpp
  if (const int64_t n = collective_state_.parallel_splits->load(std::memory_order_relaxed)) {
    all["intra_op.split"] += n;
  }
  return all;
}

void ProcessGroupCudaP2P::reset_counters() {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_.clear();
  for (auto& n : hot_counters_) n.store(0, std::memory_order_relaxed);
  collective_state_.parallel_splits->store(0, std::memory_order_relaxed);
}

void ProcessGroupCudaP2P::ensure_min_buffer_size(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p ensure_min_buffer_size: nbytes must be >= 0, got ", nbytes);
  if (workspace_) workspace_->ensure_min_buffer_size(nbytes);
}

ops::pipeline::State& ProcessGroupCudaP2P::pipeline_state() {
  std::lock_guard<std::mutex> lock(pipeline_state_mutex_);
  if (!pipeline_state_) pipeline_state_ = std::make_shared<ops::pipeline::State>();
  return *pipeline_state_;
}

ops::pipeline::Group ProcessGroupCudaP2P::pipeline_group(c10::DeviceType device_type) {
  ops::pipeline::Group group{workspace_.get(),
                             wrapped_backend(device_type).get(),
                             pipeline_state(),
                             failure_,
                             config_.max_buffer_size,
                             getSize(),
                             [this](const std::string& name) { bump_counter(name); }};
  group.zero_copy_agreement = config_.collective.zero_copy_agreement;
  std::lock_guard<std::mutex> lock(heap_mutex_);
  group.heap = heap_.get();
  return group;
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
  if (hierarchy_) hierarchy_->set_timeout(timeout);
}

// NOTE [Device failure] in p2p_workspace/watchdog.hpp: the workspace's device is failed first,
// so that a thread blocked in a workspace collective or barrier returns with an error.
void ProcessGroupCudaP2P::abort() {
  retired_.store(true, std::memory_order_release);
  if (workspace_) workspace_->abort("the group was aborted (ProcessGroupCudaP2P.abort())");
  fail_mailboxes("the group was aborted (ProcessGroupCudaP2P.abort())");
  cpu_backend_->abort();
  if (cuda_backend_) cuda_backend_->abort();
  if (hierarchy_) hierarchy_->abort();
}

// NOTE [Shutdown flushes]
// destroy_process_group() shuts a group's backends down; NCCL's shutdown flushes: it waits for
// the collectives already enqueued, then destroys the communicator. Ours does the same: a GPU op
// returns when it is enqueued, and a user may well destroy the group right after enqueuing the
// last ones and read their results after torch.cuda.synchronize(). So shutdown() first drains
// the workspace's device (Device::retire: the group's streams and the callers' streams its ops
// used) for at most the group's timeout, and only then fails it ("the group was shut down"):
//  - drained: every op enqueued before ran to its end normally; their Works stay successful
//    (Work.wait(), is_success(), synchronize(): Device::check_work), and every later op on the
//    group raises. A wait released after all, or enqueued after the failure, makes them raise
//    (FailureState::taint): that op computed on stale data.
//  - not drained within the timeout (a peer that never enqueued its part): an abort; the pending
//    waits are released (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp), those
//    Works raise, and a warning says so.
// On the host the ops on the inline stream completed when they returned; ops on host side
// streams (set_current_stream) drain like a GPU's. abort() does not drain: it is the way out of
// a hang.
// Messages: a send through the mailboxes ends once its chunks are in this rank's outbox (NOTE
// [Mailboxes] in p2p_workspace/host/mailboxes.cpp), which dies with the group unless its receiver
// has mapped it. So before anything else shutdown() waits until the receivers took every message
// this rank sent, for at most the group's timeout or kCloseWait (10 s), whichever is shorter: a
// receive that will never be posted must not hold a destroy_process_group for the default 30
// minutes. A warning names the ranks that did not take theirs. Then the sends and receives still
// pending fail with "the group was shut down".
void ProcessGroupCudaP2P::shutdown() {
  retired_.store(true, std::memory_order_release);
  flush_mailboxes(std::min(options_->timeout, SymmetricWorkspace::kCloseWait));
  // The workspace's blocks are then released through the closing handshake (NOTE [Block
  // lifetime]): peers shut down too.
  if (workspace_) {
    const Millis limit = options_->timeout;
    if (!workspace_->device().retire("the group was shut down (ProcessGroupCudaP2P.shutdown())",
                                     limit)) {
      TORCH_WARN("cuda_p2p: rank ", getRank(), "'s shutdown: the work queued on ",
                 workspace_->device().name(), " did not finish within the group's timeout (",
                 limit.count(),
                 " ms); its waits were released and its Works raise (NOTE [Shutdown flushes])");
    }
  }
  // A send or receive still pending has no peer to wait for any more (NOTE [Mailboxes]).
  fail_mailboxes("the group was shut down (ProcessGroupCudaP2P.shutdown())");
  cpu_backend_->shutdown();
  if (cuda_backend_) cuda_backend_->shutdown();
  if (hierarchy_) hierarchy_->shutdown();
}

}  // namespace cuda_p2p
