// ProcessGroupCudaP2P, the router: its construction (configuration, the workspace's rendezvous,
// the engines), what the entry sequence (backend/entry_sequence.hpp) needs beyond its templates,
// the workspace's API, and timeout / abort / shutdown. The c10d overrides are the slices of
// backend/collectives/, one file per op.
#include "backend/ProcessGroupCudaP2P.hpp"

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>

#include "backend/works.hpp"
#include "ops/channels.hpp"
#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/host/host_device.hpp"

#ifdef CUDA_P2P_WITH_WINDOWS
#include "backend/windows.hpp"
#endif

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "ops/cuda/op_kernels.cuh"
#endif

namespace cuda_p2p {

using ops::OpCall;
using ops::OpId;

namespace {

c10::intrusive_ptr<c10d::Store> checked_store(c10::intrusive_ptr<c10d::Store> store, int rank,
                                              int size) {
  TORCH_CHECK(store, "cuda_p2p: a c10d Store is required, got None");
  TORCH_CHECK(size >= 1, "cuda_p2p: world size must be >= 1, got ", size);
  TORCH_CHECK(rank >= 0 && rank < size, "cuda_p2p: rank must be in [0, ", size, "), got ", rank);
  return store;
}

// NOTE [CUDA collectives are opt-in]
// A user who switches backend="nccl" to backend="cuda_p2p" must lose nothing: until the workspace
// collectives have been validated across GPUs and measured against NCCL (docs/testing.md, "What has
// run on a GPU", says where they have run), ordinary collectives on CUDA tensors go to the wrapped
// NCCL backend unless the user opts in (Options.cuda_workspace_collectives, else
// CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1: Config::cuda_collectives). The counters say which path ran
// ("all_reduce.wrapped" vs "all_reduce.one_shot", ...). A host workspace (CPU tensors) is not
// affected; the fused ops use the workspace on either device.

// NOTE [The workspace's device]
// A group has one workspace, on one device: tensors on the other device go to the wrapped
// backend (counted ".wrapped"). By default ("auto") it lives on a GPU when the group drives one
// (it wraps a CUDA backend: Python creates NCCL when a GPU is visible; which GPU: NOTE [The
// workspace's GPU] in backend/config.cpp), else in host shared memory.
// Options.workspace_device / CUDA_P2P_WORKSPACE_DEVICE choose: "cpu" keeps
// a host workspace on a GPU machine, for CPU tensor-parallel inference there (and for the CPU
// test suite run on a GPU machine: tests/python/conftest.py); "cuda" insists on the GPU and
// fails, naming the knob, where there is none: in ProcessGroupCudaP2P::check_options, before any
// rendezvous, and here. Every rank constructs the backend, so the rendezvous is collective.
void check_workspace_device(const Config& config, bool has_cuda_device) {
#ifdef CUDA_P2P_WITH_CUDA
  constexpr bool kBuiltWithCuda = true;
#else
  constexpr bool kBuiltWithCuda = false;
#endif
  TORCH_CHECK(has_cuda_device || config.workspace_device != WorkspaceDevice::kCuda,
              "cuda_p2p: ", config.workspace_device_from,
              " asks for a workspace on the GPU ('cuda'), but ",
              kBuiltWithCuda ? "this group wraps no CUDA backend (no GPU visible to torch, or "
                               "NCCL unavailable)"
                             : "cuda_p2p was built without CUDA",
              "; use 'cpu' or 'auto'");
}

std::unique_ptr<SymmetricWorkspace> make_workspace(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size, const Config& config,
                                                   bool wraps_cuda,
                                                   std::optional<int64_t> bound_cuda_device) {
  if (!config.workspace) return nullptr;
  std::shared_ptr<Device> device;
#ifdef CUDA_P2P_WITH_CUDA
  if (config.workspace_device != WorkspaceDevice::kCpu && wraps_cuda) {
    // NOTE [The workspace's GPU] in backend/config.cpp.
    device = make_cuda_device(choose_cuda_device(bound_cuda_device, c10::cuda::device_count(),
                                                 c10::cuda::current_device())
                                  .index,
                              cuda_hardware_queues(), config.cuda_blocks);
    // The ops' own kernels too (the device loaded its signal kernels): NOTE [Kernels loaded up
    // front] in p2p_workspace/cuda/signal_kernels.cuh. Into the workspace GPU's context.
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device->device_index()));
    const cudaError_t err = cuda::load_op_kernels();
    TORCH_CHECK(err == cudaSuccess,
                "cuda_p2p: loading the ops' CUDA kernels failed: ", cudaGetErrorString(err));
  }
#else
  (void)wraps_cuda;
  (void)bound_cuda_device;
#endif
  check_workspace_device(config, device != nullptr);
  if (!device) device = make_host_device(size, config.host_streams, config.host_semantics);
  // NOTE [Zero-copy collectives] in ops/zero_copy.cpp: the exchange is read by the host.
  TORCH_CHECK(device->host_paths() != nullptr ||
                  config.collective.zero_copy_agreement != ops::ZeroCopyAgreement::kExchange,
              "cuda_p2p: ", config.zero_copy_agreement_from,
              " asks for 'exchange', which needs a host workspace, but this group's workspace "
              "is on the GPU; use 'signature' or 'auto'");
  return std::make_unique<SymmetricWorkspace>(
      c10::make_intrusive<c10d::PrefixStore>("cuda_p2p/", store), rank, size, std::move(device),
      config.workspace_options);
}

}  // namespace

ProcessGroupCudaP2P::ProcessGroupCudaP2P(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                         c10::intrusive_ptr<Options> options,
                                         c10::intrusive_ptr<c10d::Backend> cpu_backend,
                                         c10::intrusive_ptr<c10d::Backend> cuda_backend,
                                         std::optional<int64_t> bound_cuda_device)
    : c10d::Backend(rank, size),
      store_(checked_store(std::move(store), rank, size)),
      options_(options ? std::move(options) : c10::make_intrusive<Options>()),
      wrapped_(std::move(cpu_backend), std::move(cuda_backend), rank, size),
      config_(resolve_config(*options_, size)),
      workspace_(make_workspace(store_, rank, size, config_, wrapped_.cuda() != nullptr,
                                bound_cuda_device)),
      group_{store_, rank, size, workspace_.get(), config_},
      counters_(config_.debug, rank, size, options_->group_name,
                {.collectives_off = [this] { return collectives_.off_reason(); },
                 .workspace_device =
                     [this] {
                       return is_p2p_available() ? workspace_->device().tensor_device().str()
                                                 : std::string("none");
                     }}),
      collectives_(group_, failure_, counters_.intra_op_splits()),
      heap_(group_, collectives_),
      send_recv_(group_, collectives_),
      bound_cuda_device_(bound_cuda_device) {
  // NOTE [Failed groups] in ops/failure_record.hpp: the first failure of a workspace op fails the
  // workspace's device, which tells the peers (NOTE [Failure words]); then the abort hooks run
  // (NOTE [Abort hooks] in backend/abort_hooks.cpp), before the error propagates.
  failure_.on_first_failure([this](const std::string& failure) {
    if (workspace_)
      workspace_->device().abort("rank " + std::to_string(getRank()) + ": " + failure);
    abort_hooks_->run(failure);
  });
}

void ProcessGroupCudaP2P::check_options(const Options& options, int size, bool wraps_cuda) {
  const Config config = resolve_config(options, size);
#ifndef CUDA_P2P_WITH_CUDA
  wraps_cuda = false;  // no CUDA device for the workspace, whatever the group wraps
#endif
  if (config.workspace) check_workspace_device(config, wraps_cuda);
}

ProcessGroupCudaP2P::~ProcessGroupCudaP2P() {
  lifetime_token_.reset();  // NOTE [Group lookup cache]: no cache entry finds this backend now
}

// --- the entry sequence (backend/entry_sequence.hpp) ----------------------------------------

bool ProcessGroupCudaP2P::ran_hierarchically(const OpCall& entry, const HierarchyOutcome& outcome) {
  TORCH_INTERNAL_ASSERT(ops::spec(entry.id).hierarchy, "cuda_p2p: ", entry.name,
                        " is not an op the hierarchy runs (ops/op_spec.hpp)");
  counters_.hierarchical(entry.id, outcome);
  return outcome.ran;
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::hierarchical_done(
    const OpCall& entry, std::vector<at::Tensor> outputs) {
  return wrapped_.track(c10::make_intrusive<EventWork>(getRank(), entry.type, std::move(outputs)));
}

// NOTE [No Work for a synchronous call]
// torch.distributed's Python API sets the options' asyncOp from async_op, and for a synchronous
// call it waits on the Work only when there is one (`elif work is not None: work.wait()`: every
// collective in torch 2.14.1; PyTorch's PR 150398, before torch 2.8, spared NCCL's synchronous
// calls that wait, so every torch we build against has it). On the host a workspace collective
// has completed when it returns, so the Work of a synchronous call is a cost with no use: its
// allocation, its conversion to a Python object and the wait() call (which releases and takes the
// GIL; what it cost: docs/measurements/no-work-for-a-synchronous-call-2026-11-25.md). So such a
// call returns none, unless
//  * asyncOp is true: an async call, and every C++ caller that leaves the options' default
//    (DDP's reducer, the functional collectives) gets its Work;
//  * the workspace is on CUDA (or a host one with CUDA's semantics), where wait() orders the
//    caller's stream after the op (or the caller, for CPU outputs) and raises
//    the device's failure (NOTE [Device failure] in p2p_workspace/watchdog.hpp);
//  * the group is coalescing: endCoalescing's Work is made of the tracked ones;
//  * torch's allow_inflight_collective_as_graph_input() is on: ProcessGroup registers the Work
//    of every call for torch.ops._c10d_functional.wait_tensor.
bool ProcessGroupCudaP2P::returns_no_work(bool async_op) const {
  if (async_op || !workspace_ || !workspace_->device().host_synchronous() ||
      c10d::allow_inflight_collective_as_graph_input()) {
    return false;
  }
  return !wrapped_.coalescing();
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::event_work(c10d::OpType type,
                                                             std::vector<at::Tensor> outputs) {
  // On a GPU the op is enqueued, not done: its Work waits for the event the collective recorded
  // at its end (none on the host, where it has completed).
  std::shared_ptr<Device> device;
  std::shared_ptr<Event> end;
  if (workspace_ && !workspace_->device().host_synchronous()) {
    device = workspace_->device_ptr();
    auto stream = device->current_stream();
    // Under capture, the op's captured end (NOTE [Replay-safe signals]); else the end of the call
    // on the caller's stream, past the op's copies back into the caller's tensors (NOTE [Tensors
    // in stream order] in backend/workspace_collectives.cpp).
    const uint64_t capture = device->capture_id(*stream);
    end = capture ? workspace_->last_op(capture) : device->record(*stream);
  }
  auto work = c10::make_intrusive<EventWork>(getRank(), type, std::move(outputs), device,
                                             std::move(end), abort_hooks_);
  // NOTE [Mismatches reach the Work] in backend/works.cpp.
  if (device && collectives_.on()) {
    work->set_mismatch_check(collectives_.recorded_mismatch_check("Work"));
  }
  return wrapped_.track(std::move(work));
}

// NOTE [CPU outputs without a Work]
// cuda_p2p's own calls that return their outputs without a Work (all_gather_v, all_to_all_v,
// all_reduce_) hand CPU tensors to the calling thread, which reads them itself, not through work
// on its current stream: so on a host device with CUDA's semantics, whose ops return queued, the
// op has run when such a call returns. (On CUDA the caller's next kernels follow the op on its
// stream; on a synchronous host device it has run already; under capture nothing runs.) And, as
// a Work's wait() for CPU outputs does (NOTE [Mismatches reach the Work] in backend/works.cpp),
// it raises the ranks' recorded disagreement once the op has run: the caller is about to read
// the outputs.
void ProcessGroupCudaP2P::settle_cpu_outputs(const char* what) {
  if (!workspace_) return;
  Device& device = workspace_->device();
  const HostPaths* host = device.host_paths();
  if (host == nullptr || host->synchronous()) return;
  auto stream = device.current_stream();
  if (workspace_->capturing(*stream)) return;
  device.synchronize(*stream);
  if (auto check = collectives_.recorded_mismatch_check(what)) check();
}

// --- the workspace ------------------------------------------------------------------------------

bool ProcessGroupCudaP2P::uses_cross_memory() const {
  return collectives_.on() && workspace_->cross_memory_reads();
}

std::string ProcessGroupCudaP2P::cross_memory_reason() const {
  if (!is_p2p_available()) return "the workspace is unavailable: " + p2p_unavailable_reason();
  if (workspace_->cross_memory_reads()) return "";
  const std::string& why = workspace_->cross_memory_reads_reason();
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

void ProcessGroupCudaP2P::ensure_min_buffer_size(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p ensure_min_buffer_size: nbytes must be >= 0, got ", nbytes);
  if (workspace_) workspace_->ensure_min_buffer_size(nbytes);
}

// NOTE [Process-group allocation for FSDP2] in backend/symmetric_memory.cpp: never on a group
// spanning hosts, whose collectives run hierarchically.
bool ProcessGroupCudaP2P::supportsTensorAlloc(c10::DeviceIndex device_index) {
  return !hierarchy_ && heap_.allocates_comm_buffers(device_index);
}

at::Tensor ProcessGroupCudaP2P::allocateTensor(long size, at::TensorOptions options) {
  const std::optional<at::Device> device = options.device_opt();
  TORCH_CHECK_VALUE(size >= 0, "cuda_p2p allocate_tensor: expected a size >= 0, got ", size);
  TORCH_CHECK(supportsTensorAlloc(device ? device->index() : c10::DeviceIndex(-1)),
              "cuda_p2p allocate_tensor: this group does not allocate tensors on ",
              device ? device->str() : std::string("the default device"),
              " (supports_tensor_alloc is false: it allocates only where its collectives read the "
              "heap's tensors zero-copy, NOTE [Process-group allocation for FSDP2])");
  auto [tensor, in_heap] = heap_.allocate_comm_buffer(size, options);
  counters_.record(OpId::kAllocateTensor, in_heap ? "heap" : "fallback");
  return tensor;
}

// --- one-sided windows (WorkspaceWindow) --------------------------------------------------------

#ifdef CUDA_P2P_WITH_WINDOWS
bool ProcessGroupCudaP2P::supportsWindow() const { return is_p2p_available() && !hierarchy_; }

c10::intrusive_ptr<c10d::Window> ProcessGroupCudaP2P::new_window(
    const std::optional<at::Tensor>& tensor) {
  TORCH_CHECK(is_p2p_available(),
              "cuda_p2p new_window: expected a group with an available P2P workspace (its "
              "symmetric heap holds the windows), but it is unavailable: ",
              p2p_unavailable_reason());
  auto window = c10::make_intrusive<WorkspaceWindow>(
      WindowGroup{.owner = c10::intrusive_ptr<c10d::Backend>::reclaim_copy(this),
                  .group = group_,
                  .heap = heap_,
                  .counters = counters_,
                  .exchange = wrapped_.cpu(),
                  .timeout = [this] { return Millis(options_->timeout); },
                  .coalescing = [this] { return wrapped_.coalescing(); },
                  .abort_hooks = abort_hooks_});
  if (tensor) window->tensor_register(*tensor);
  return window;
}
#endif

// --- the fused pipelines and the hierarchy ------------------------------------------------------

ops::pipeline::Group ProcessGroupCudaP2P::pipeline_group(c10::DeviceType device_type) {
  // The fused ops go to the wrapped backend's send/recv where the workspace does not serve them
  // (NOTE [Shrinking a CUDA backend never used] in backend/child_groups.cpp).
  if (device_type == c10::DeviceType::CUDA &&
      !(workspace_ && workspace_->available() && workspace_->device().tensor_device().is_cuda())) {
    wrapped_.mark_cuda_used();
  }
  ops::pipeline::Group group{workspace_.get(),
                             wrapped_.for_device(device_type).get(),
                             pipelines_,
                             failure_,
                             config_.max_buffer_size,
                             getSize()};
  group.zero_copy_agreement = config_.collective.zero_copy_agreement;
  group.heap = heap_.heap();
  group.auto_all_gather = config_.fused_all_gather_algo_for(device_type);
  group.auto_reduce_scatter = config_.fused_reduce_scatter_algo_for(device_type);
  return group;
}

void ProcessGroupCudaP2P::set_hierarchy(const std::vector<int64_t>& host_of,
                                        c10::intrusive_ptr<c10d::Backend> intra,
                                        c10::intrusive_ptr<c10d::Backend> inter) {
  TORCH_CHECK(!hierarchy_, "cuda_p2p set_hierarchy: the group already has a hierarchy");
  TORCH_CHECK(static_cast<int>(host_of.size()) == getSize(), "cuda_p2p set_hierarchy: expected ",
              getSize(), " hosts (one per rank), got ", host_of.size());
  TORCH_CHECK(!is_p2p_available(),
              "cuda_p2p set_hierarchy: the group has a workspace, so its ranks are on one host");
  hierarchy_ = std::make_unique<Hierarchy>(getRank(), HostLayout(host_of), std::move(intra),
                                           std::move(inter), wrapped_.cuda() != nullptr);
}

// --- lifecycle ----------------------------------------------------------------------------------

void ProcessGroupCudaP2P::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  wrapped_.set_timeout(timeout);
  // The workspace's and the heap's waits, store exchanges and the device's host-side waits, from
  // the next op on.
  if (workspace_) workspace_->set_timeout(timeout);
  heap_.set_timeout(timeout);
  send_recv_.set_timeout(timeout);
  if (hierarchy_) hierarchy_->set_timeout(timeout);
}

// NOTE [Device failure] in p2p_workspace/watchdog.hpp: the workspace's device is failed first,
// so that a thread blocked in a workspace collective or barrier returns with an error.
void ProcessGroupCudaP2P::abort() {
  abort_hooks_->run("the group was aborted (ProcessGroupCudaP2P.abort())");  // NOTE [Abort hooks]
  retired_.store(true, std::memory_order_release);
  if (workspace_) workspace_->abort("the group was aborted (ProcessGroupCudaP2P.abort())");
  send_recv_.fail("the group was aborted (ProcessGroupCudaP2P.abort())");
  wrapped_.abort();
  if (hierarchy_) hierarchy_->abort();
}

#ifdef CUDA_P2P_C10D_HAS_ABORT_HOOKS
void ProcessGroupCudaP2P::registerAbortHook(int64_t hook_id, c10d::AbortHook hook) {
  abort_hooks_->add(hook_id, std::move(hook));
}

void ProcessGroupCudaP2P::unregisterAbortHook(int64_t hook_id) { abort_hooks_->remove(hook_id); }
#endif

// NOTE [Abort hooks] in backend/abort_hooks.cpp: a workspace op refused by a failed device - a
// peer's failure that reached this rank's failure word before an op of this rank failed on it
// midway - runs the hooks too. A local argument error leaves the device healthy: no hooks.
void ProcessGroupCudaP2P::hooks_on_device_failure() noexcept {
  if (!workspace_) return;
  try {
    workspace_->device().check_healthy("abort hooks");
  } catch (const c10::Error& e) {
    abort_hooks_->run(e.what_without_backtrace());
  } catch (...) {
  }
}

void ProcessGroupCudaP2P::check() {
  if (!workspace_) return;
  try {
    workspace_->device().check_healthy("cuda_p2p.check");
  } catch (const c10::Error& e) {
    // This rank's own abort() or shutdown is no error; a peer's failure still is (as getError).
    if (retired() &&
        classify_failure(e.what_without_backtrace(), getRank()) != ErrorKind::kRemoteError) {
      return;
    }
    hooks_on_device_failure();  // NOTE [Abort hooks]
    throw;
  }
}

std::string ProcessGroupCudaP2P::lost_context() const {
  return workspace_ ? workspace_->device().lost_context() : "";
}

// NOTE [Error kinds] in backend/abort_hooks.cpp. The wrapped Gloo reports none (its getError is
// always SUCCESS); NCCL reports its communicator's.
ErrorKind ProcessGroupCudaP2P::error_kind() {
  const ErrorKind mine = classify_failure(failure_.first(), getRank());
  if (mine != ErrorKind::kSuccess) return mine;
  // The device's failure: a peer's that reached this rank's failure word before any op of this
  // rank failed on it (NOTE [Failure words] in p2p_workspace/watchdog.hpp), or one of this rank's
  // queued ops (on a GPU, or a host device with CUDA's semantics: its wait timed out on the
  // stream, after the call returned). Once this rank aborted or shut the group down, only a
  // peer's counts: its own abort() is no error.
  if (workspace_) {
    try {
      workspace_->device().check_healthy("getError");
    } catch (const c10::Error& e) {
      const ErrorKind kind = classify_failure(e.what_without_backtrace(), getRank());
      if (kind == ErrorKind::kRemoteError || !retired()) return kind;
    }
  }
#ifdef CUDA_P2P_C10D_HAS_ERROR_TYPE
  if (const auto& cuda = wrapped_.cuda()) {
    if (const auto e = cuda->getError(); e != c10d::ErrorType::SUCCESS) {
      return static_cast<ErrorKind>(e);
    }
  }
#endif
  if (hierarchy_) {
    if (auto* intra = dynamic_cast<ProcessGroupCudaP2P*>(hierarchy_->intra().get())) {
      return intra->error_kind();
    }
  }
  return ErrorKind::kSuccess;
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
// [Mailboxes] in p2p_workspace/messages/mailboxes.cpp), which dies with the group unless its
// receiver has mapped it. So before anything else shutdown() waits until the receivers took every
// message this rank sent, for at most the group's timeout or kCloseWait (10 s), whichever is
// shorter: a receive that will never be posted must not hold a destroy_process_group for the
// default 30 minutes. A warning names the ranks that did not take theirs. Then the sends and
// receives still pending fail with "the group was shut down".
void ProcessGroupCudaP2P::shutdown() {
  retired_.store(true, std::memory_order_release);
  abort_hooks_->disarm();  // a shutdown is no abort (NOTE [Abort hooks])
  send_recv_.flush(std::min(options_->timeout, SymmetricWorkspace::kCloseWait));
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
  send_recv_.fail("the group was shut down (ProcessGroupCudaP2P.shutdown())");
  wrapped_.shutdown();
  if (hierarchy_) hierarchy_->shutdown();
}

}  // namespace cuda_p2p
