// CUDA implementation of the device interface (cuda_device_impl.hpp; compiled when nvcc is found;
// runs only on a GPU). CI never runs it (no GPU there): everything device-independent (the
// watchdog, the failure state, the workspace protocols) lives in shared code that the host tests
// exercise. Where it has run: docs/status.md.
//
// NOTE [CUDA signal ordering]
// write_signal is cuStreamWriteValue32 with the default flags, which puts a memory fence before
// the write: everything the stream did before (a cudaMemcpyAsync into a peer's buffer, a GEMM
// writing the own buffer) is visible to a peer that observes the new value. wait_signals is
// cuStreamWaitValue32(GEQ), which compares (int32_t)(*addr - value) >= 0 like the host side
// (signal_reached). Neither occupies an SM. Where the driver entry points are missing, one-thread
// kernels do the same with st.release.sys / ld.acquire.sys (signal_kernels.cu).
//
// NOTE [Descriptor visibility]
// The op descriptors of a handshake are written into the peers' pads by SM stores (a kernel,
// ops/cuda/signature_kernel.cu), then announced by the barrier's cuStreamWriteValue32. Over
// NVLink the write's fence orders them; over PCIe P2P posted writes may still be in flight when
// the peer observes the signal. So the kernel ends with a system-wide fence, and where the device
// supports it (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES) every wait carries
// CU_STREAM_WAIT_VALUE_FLUSH, which makes remote writes that reached the device before the wait
// was satisfied visible to the work after it (docs/status.md says where this has run).
//
// NOTE [Group streams]
//  - The pipeline streams are the group's own (new_stream creates them), not c10's pool streams,
//    which ProcessGroupNCCL and torch.cuda.Stream() share (32 per priority): no wrap-around
//    serialises a group behind NCCL or a user's stream, and cuBLAS keeps one workspace per
//    stream, two per group.
//  - The device waits only for streams it owns or handed to one of its ops since it last drained
//    (quiesce, drain), never for every stream of the GPU, and every such wait has the group's
//    deadline (set_timeout): a wait of group A that blocks a stream is an error in group B, not a
//    hang.
//  - Nothing device-wide runs where a wait may be blocked: no cudaFreeHost, cudaHostAlloc,
//    emptyCache or cudaDeviceSynchronize on the paths of ops, waits, releases or teardown (NOTE
//    [Pinned pools]; a cudaMalloc that runs out of memory says how much torch's cache holds
//    instead of emptying it); block frees wait in a queue for the device's allocations and
//    completed drains (NOTE [Deferred frees]).
//
// NOTE [Hardware queues]
// Why: the release of a blocked stream memory wait is a write from the device's auxiliary stream
// (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp), which helps only if that stream
// does not queue behind the wait. CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware
// queues (8 unless the process sets it; Megatron sets 1), and the work of two streams on one
// queue runs in submission order: with one queue the release waits behind the very wait it
// releases, and a cuStreamWaitValue32 has no deadline of its own.
// What the device does:
//  - below kMinHardwareQueues (the caller's stream, the two pipeline streams and the aux stream
//    each on a queue of its own) it waits with the wait kernel, which polls its own deadline and
//    the failure words (NOTE [Failure words]) and needs no release, and says so once;
//  - above it a collision of the aux stream with a blocked stream is still possible (streams
//    share queues round-robin): the failure words and the kernels' deadlines keep that case from
//    hanging for good where the kernel runs, and scripts/gpu_check.sh runs the fault step with
//    one queue.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <optional>
#include <sstream>

#include "p2p_workspace/cuda/cuda_device_impl.hpp"

namespace cuda_p2p {
namespace cuda {

CudaStreamImpl& as_cuda(Stream& s) {
  auto* c = dynamic_cast<CudaStreamImpl*>(&s);
  TORCH_CHECK(c, "cuda_p2p: a CUDA device was given a stream of another device");
  return *c;
}

namespace {

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string format_uuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

// How a block's memory was made, hence how it is given back.
struct BlockMemory {
  enum Kind { kMalloc, kIpcImport, kVmm } kind = kMalloc;
  std::shared_ptr<cuda::VmmBlocks> vmm;  // kVmm: the entry points (they outlive the device)
  size_t mapped = 0;                     // kVmm: the mapping's size
};

// Frees (or closes, or unmaps) a block now: with this thread's capture mode relaxed, so that a
// capture in another thread neither refuses the call nor is invalidated by it (NOTE [Deferred
// frees]).
void free_block_now(void* ptr, const BlockMemory& memory, int device) {
  // Errors are ignored: this may run during process teardown, after the context is gone.
  QuietDeviceSwitch guard(device);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  switch (memory.kind) {
    case BlockMemory::kMalloc:
      (void)cudaFree(ptr);
      break;
    case BlockMemory::kIpcImport:
      (void)cudaIpcCloseMemHandle(ptr);
      break;
    case BlockMemory::kVmm:
      memory.vmm->unmap({ptr, memory.mapped});
      break;
  }
  if (exchanged) (void)cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaGetLastError();
}

// NOTE [Blocks of an undrained device]
// cudaFree and cudaIpcCloseMemHandle synchronise the whole device before they return. After a
// drain that gave up (NOTE [Teardown drains]: a stream still queued behind a wait, or a kernel
// still running) they would hang the teardown there, or free memory a queued copy or kernel still
// writes. So once any drain of its device gave up, a block is leaked instead, as the pinned pools
// are (NOTE [Pinned pools]): the process has a failed group and should restart anyway.
class CudaBlock : public Block {
 public:
  CudaBlock(void* ptr, size_t bytes, BlockMemory memory, int device,
            std::shared_ptr<const std::atomic<bool>> undrained,
            std::shared_ptr<DeferredFrees> frees)
      : memory_(std::move(memory)),
        device_(device),
        undrained_(std::move(undrained)),
        frees_(std::move(frees)) {
    data_ = ptr;
    size_ = bytes;
  }
  ~CudaBlock() override {
    if (undrained_ && undrained_->load(std::memory_order_acquire)) return;  // NOTE above
    // NOTE [Deferred frees]: at the device's next safe point, or now if the device is gone.
    try {
      frees_->add([ptr = data_, memory = memory_, device = device_, undrained = undrained_] {
        if (undrained && undrained->load(std::memory_order_acquire)) return;  // a drain gave up
        free_block_now(ptr, memory, device);
      });
    } catch (...) {  // no memory to queue it: now, as before the queue
      free_block_now(data_, memory_, device_);
    }
  }
  const BlockMemory& memory() const { return memory_; }

 private:
  BlockMemory memory_;
  int device_;
  std::shared_ptr<const std::atomic<bool>> undrained_;  // the device's: a drain gave up
  std::shared_ptr<DeferredFrees> frees_;                // the device's
};

class IpcExporter : public BlockExporter {
 public:
  explicit IpcExporter(void* ptr) { CUDA_P2P_CUDA_CHECK(cudaIpcGetMemHandle(&handle_, ptr)); }
  std::vector<uint8_t> handle() const override {
    const auto* p = reinterpret_cast<const uint8_t*>(&handle_);
    return {p, p + sizeof(handle_)};
  }

 private:
  cudaIpcMemHandle_t handle_;
};

// One Device::host_task as cudaLaunchHostFunc runs it, in a thread of the CUDA driver.
struct HostFunction {
  std::function<void()> fn;
  std::shared_ptr<HostTaskErrors> errors;

  static void CUDART_CB call(void* arg) {
    std::unique_ptr<HostFunction> task(static_cast<HostFunction*>(arg));
    try {
      task->fn();
    } catch (...) {
      task->errors->record(std::current_exception());
    }
  }
};

}  // namespace

CudaDevice::CudaDevice(int index, int hardware_queues, const std::string& blocks)
    : index_(index), resources_(index) {
  c10::cuda::CUDAGuard guard(index_);
  open_block_memory(blocks);  // NOTE [Blocks that outlive their exporter]
  cudaDriverEntryPointQueryResult q1{}, q2{};
  void* write = nullptr;
  void* wait = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 12000, cudaEnableDefault,
                                       &q1) == cudaSuccess &&
      cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 12000, cudaEnableDefault,
                                       &q2) == cudaSuccess &&
      q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess) {
    write_value_ = reinterpret_cast<WriteValueFn>(write);
    wait_value_ = reinterpret_cast<WaitValueFn>(wait);
  }
  (void)cudaGetLastError();
  if (wait_value_ && hardware_queues > 0 && hardware_queues < kMinHardwareQueues) {
    wait_value_ = nullptr;  // NOTE [Hardware queues]
    TORCH_WARN("cuda_p2p: CUDA_DEVICE_MAX_CONNECTIONS=", hardware_queues, " gives ", name(),
               "'s streams fewer than ", kMinHardwareQueues,
               " hardware queues, so a released stream memory wait could queue behind itself: "
               "this group waits with its wait kernel instead (one SM-resident thread per wait; "
               "NOTE [Hardware queues] in p2p_workspace/cuda/cuda_device.cpp)");
  }
  cudaDeviceProp prop{};
  CUDA_P2P_CUDA_CHECK(cudaGetDeviceProperties(&prop, index_));
  uuid_ = format_uuid(prop.uuid);
  int can_flush = 0;  // NOTE [Descriptor visibility]
  if (cudaDeviceGetAttribute(&can_flush, cudaDevAttrCanFlushRemoteWrites, index_) != cudaSuccess) {
    (void)cudaGetLastError();
    can_flush = 0;
  }
  if (can_flush) wait_flags_ |= CU_STREAM_WAIT_VALUE_FLUSH;
  if (cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_) != cudaSuccess) {
    (void)cudaGetLastError();
    least_priority_ = greatest_priority_ = 0;
  }
  // NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh.
  CUDA_P2P_CUDA_CHECK(cuda::load_kernels());
  resources_.reserve();  // NOTE [Pinned pools]
  // A stream of the device's own for the watchdog's reads and releases: stream order on it
  // replaces cudaDeviceSynchronize, which would also wait for unrelated work. Another for the
  // zeroing of new blocks (allocate), so that an allocation never takes aux_mu_.
  CUDA_P2P_CUDA_CHECK(cudaStreamCreateWithFlags(&aux_, cudaStreamNonBlocking));
  CUDA_P2P_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing_, cudaStreamNonBlocking));
  aux_writer_ = AuxWriter{aux_, &aux_mu_, write_value_, index_};
  // NOTE [Replay-safe signals]: where a captured wait that gives up says so. Allocated now:
  // nothing may be allocated during a capture.
  void* give_up = nullptr;
  CUDA_P2P_CUDA_CHECK(cudaHostAlloc(&give_up, sizeof(cuda::GraphGiveUp), cudaHostAllocMapped));
  std::memset(give_up, 0, sizeof(cuda::GraphGiveUp));
  graph_give_up_ = static_cast<cuda::GraphGiveUp*>(give_up);
  void* give_up_dev = nullptr;
  CUDA_P2P_CUDA_CHECK(cudaHostGetDevicePointer(&give_up_dev, give_up, 0));
  graph_give_up_dev_ = static_cast<cuda::GraphGiveUp*>(give_up_dev);
  // NOTE [Pinned pools]: the words host_words() hands out (op-signature records).
  void* words = nullptr;
  CUDA_P2P_CUDA_CHECK(cudaHostAlloc(&words, kHostWords * sizeof(uint32_t), cudaHostAllocMapped));
  std::memset(words, 0, kHostWords * sizeof(uint32_t));
  void* words_dev = nullptr;
  CUDA_P2P_CUDA_CHECK(cudaHostGetDevicePointer(&words_dev, words, 0));
  host_words_ = static_cast<uint32_t*>(words);
  host_words_dev_ = static_cast<uint32_t*>(words_dev);
  // NOTE [Counted waits end with the failure] in p2p_workspace/watchdog.hpp.
  failure_.mirror_to(&graph_give_up_->failed);
  watchdog_ = std::make_unique<Watchdog>(failure_, [dev = index_] {
    (void)cudaSetDevice(dev);
    // Its event queries must not invalidate a graph another thread is capturing in the global
    // mode (the events it queries are never captured: NOTE [Replay-safe signals]).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    (void)cudaGetLastError();
  });
  // NOTE [Counted waits end with the failure]: the watchdog reports a replay's give-up.
  watchdog_->add_probe([this] { return graph_give_up(); });
}

CudaDevice::~CudaDevice() {
  // NOTE [Teardown drains]: the workspace drained the group's work before it released its
  // blocks; what is still queued here (a failed drain) completes on its own after
  // cudaStreamDestroy, which does not wait.
  watchdog_.reset();  // before the pools its waits return their events to
  // NOTE [Deferred frees]: the queued blocks freed (leaked after a drain that gave up); blocks
  // that outlive the device free themselves.
  frees_->close(undrained_->load(std::memory_order_acquire));
  QuietDeviceSwitch guard(index_);
  for (auto stream : own_streams_) (void)cudaStreamDestroy(stream);
  (void)cudaStreamDestroy(aux_);
  (void)cudaStreamDestroy(zeroing_);
  // graph_give_up_ stays allocated (NOTE [Pinned pools]): a graph's kernels may still write it.
  // The failure area stays mapped and registered (NOTE [Failure words]): a kernel may still read
  // it, and an unmapped range still registered would refuse the next registration there.
  if (!areas_.empty()) (void)new std::shared_ptr<Block>(areas_.front());
  (void)cudaGetLastError();
}

at::Device CudaDevice::tensor_device() const {
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index_));
}

std::string CudaDevice::peer_access_problem(const std::string& peer_uuid) {
  // The same GPU: IPC within one device needs no peer access.
  if (peer_uuid == uuid_) return "";
  c10::cuda::CUDAGuard guard(index_);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (format_uuid(prop.uuid) != peer_uuid) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, index_, d) != cudaSuccess) (void)cudaGetLastError();
    if (can) return "";
    return "cuda:" + std::to_string(index_) + " (" + uuid_ + ") cannot access the peer's GPU " +
           "cuda:" + std::to_string(d) + " (" + peer_uuid +
           "): cudaDeviceCanAccessPeer says no (no NVLink/PCIe P2P path between them)";
  }
  // Not visible to this process (CUDA_VISIBLE_DEVICES): cudaIpcOpenMemHandle may still map it;
  // if it cannot, import_block names the error.
  return "";
}

void CudaDevice::open_block_memory(const std::string& blocks) {
  TORCH_CHECK(blocks == "auto" || blocks == "vmm" || blocks == "ipc",
              "cuda_p2p: a CUDA device's blocks are auto, vmm or ipc, got '", blocks, "'");
  if (blocks == "ipc") {
    block_memory_ = "CUDA IPC (legacy: CUDA_P2P_CUDA_BLOCKS=ipc)";
    return;
  }
  std::string why_not;
  vmm_ = cuda::VmmBlocks::open(index_, why_not);
  TORCH_CHECK(vmm_ != nullptr || blocks == "auto", "cuda_p2p: CUDA_P2P_CUDA_BLOCKS=vmm, but ",
              name(), " cannot make cuMem blocks here: ", why_not);
  block_memory_ = vmm_ ? "cuMem (POSIX descriptors)" : "CUDA IPC (legacy: " + why_not + ")";
}

void* CudaDevice::malloc_block(size_t bytes) {
  void* ptr = nullptr;
  // A plain cudaMalloc block (not the caching allocator): IPC handles cover whole allocations.
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
    // Torch's cache is not emptied here (NOTE [Group streams]: emptyCache frees, and a free may
    // wait for every stream of the GPU, a blocked one included); the error says what it holds.
    int64_t cached = -1;
    try {
      const auto stats =
          c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index_));
      cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
    } catch (...) {  // NOLINT(bugprone-empty-catch): no allocator on this device yet
    }
    // An OutOfMemoryError on every rank (NOTE [Allocation failures at rendezvous]).
    TORCH_CHECK_WITH(OutOfMemoryError, false, "cuda_p2p: cannot allocate a block of ", bytes,
                     " bytes on ", name(), ": ", free, " of its ", total,
                     " bytes are free (cudaMalloc: out of memory)",
                     cached > 0 ? "; torch's caching allocator holds " + std::to_string(cached) +
                                      " bytes it does not use: torch.cuda.empty_cache() before "
                                      "creating or growing the group returns them"
                                : std::string());
  }
  CUDA_P2P_CUDA_CHECK(err);
  return ptr;
}

std::shared_ptr<Block> CudaDevice::allocate(size_t bytes) {
  c10::cuda::CUDAGuard guard(index_);
  run_deferred_frees();  // NOTE [Deferred frees]: cudaMalloc may synchronise too
  std::shared_ptr<CudaBlock> block;
  if (vmm_) {  // NOTE [Blocks that outlive their exporter]
    const cuda::VmmMapping m = vmm_->allocate(bytes);
    block = std::make_shared<CudaBlock>(m.ptr, bytes, BlockMemory{BlockMemory::kVmm, vmm_, m.size},
                                        index_, undrained_, frees_);
  } else {
    block = std::make_shared<CudaBlock>(malloc_block(bytes), bytes, BlockMemory{}, index_,
                                        undrained_, frees_);
  }
  // Zeroed, then waited for: the block is published (and read by any stream, here or in a
  // peer) only after this returns. NOTE [Group streams]: on the device's zeroing stream, which
  // queues behind no other stream, outside aux_mu_ (the watchdog's scans and every release of
  // a blocked wait take it), through an event polled with the group's deadline - never a
  // stream synchronize under a lock: a first allocation while a wait is blocked neither stalls
  // the watchdog nor waits without an end.
  CUDA_P2P_CUDA_CHECK(cudaMemsetAsync(block->data(), 0, bytes, zeroing_));
  cudaEvent_t zeroed = resources_.event();
  CUDA_P2P_CUDA_CHECK(cudaEventRecord(zeroed, zeroing_));
  const Millis limit(timeout_ms_.load());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto nap = std::chrono::microseconds(1);
  while (true) {
    const cudaError_t q = cudaEventQuery(zeroed);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady || std::chrono::steady_clock::now() >= deadline) {
      (void)cudaGetLastError();
      // The memset may still run: the block stays allocated (a free would wait for it).
      (void)new std::shared_ptr<Block>(block);
      TORCH_CHECK(q == cudaErrorNotReady, "cuda_p2p: zeroing a new block on ", name(),
                  " failed: ", cudaGetErrorString(q));
      TORCH_CHECK(false, "cuda_p2p: zeroing a new block of ", bytes, " bytes on ", name(),
                  " did not finish within the group's timeout of ", limit.count(),
                  " ms (the GPU is busy with other work, or stuck)");
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
  }
  resources_.put(zeroed);
  return block;
}

std::unique_ptr<BlockExporter> CudaDevice::export_block(const std::shared_ptr<Block>& block,
                                                        int max_peers) {
  c10::cuda::CUDAGuard guard(index_);
  const auto* cb = dynamic_cast<const CudaBlock*>(block.get());
  TORCH_CHECK(cb && cb->memory().kind != BlockMemory::kIpcImport,
              "cuda_p2p: only a block allocated by this device can be exported");
  if (cb->memory().kind == BlockMemory::kVmm) {  // NOTE [Blocks that outlive their exporter]
    return vmm_->exporter({block->data(), cb->memory().mapped}, max_peers);
  }
  return std::make_unique<IpcExporter>(block->data());
}

std::shared_ptr<Block> CudaDevice::import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                                Millis timeout) {
  c10::cuda::CUDAGuard guard(index_);
  run_deferred_frees();                          // NOTE [Deferred frees]
  if (cuda::VmmBlocks::is_vmm_handle(handle)) {  // NOTE [Blocks that outlive their exporter]
    TORCH_CHECK(vmm_ != nullptr, "cuda_p2p: a peer's block is a cuMem allocation, which ", name(),
                " does not map here (its blocks: ", block_memory_,
                "); set CUDA_P2P_CUDA_BLOCKS alike on every rank");
    const cuda::VmmMapping m = vmm_->import(handle, bytes, timeout);
    return std::make_shared<CudaBlock>(m.ptr, bytes, BlockMemory{BlockMemory::kVmm, vmm_, m.size},
                                       index_, undrained_, frees_);
  }
  TORCH_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), "cuda_p2p: a CUDA IPC handle has ",
              sizeof(cudaIpcMemHandle_t), " bytes, got ", handle.size());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    // Clear the error, or the next unrelated CUDA call in this thread would report it.
    (void)cudaGetLastError();
    TORCH_CHECK(false, "cuda_p2p: cudaIpcOpenMemHandle on ", name(), " (", uuid_,
                ") failed: ", cudaGetErrorString(err),
                " (is the peer's GPU reachable from this one, and the peer a process of this "
                "host and user?)");
  }
  return std::make_shared<CudaBlock>(ptr, bytes, BlockMemory{BlockMemory::kIpcImport, nullptr, 0},
                                     index_, undrained_, frees_);
}

std::shared_ptr<Stream> CudaDevice::current_stream() {
  return handed_out(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
}

std::shared_ptr<Stream> CudaDevice::new_stream(bool high_priority) {
  c10::cuda::CUDAGuard guard(index_);
  cudaStream_t stream = nullptr;
  CUDA_P2P_CUDA_CHECK(cudaStreamCreateWithPriority(
      &stream, cudaStreamNonBlocking, high_priority ? greatest_priority_ : least_priority_));
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    own_streams_.push_back(stream);
  }
  return std::make_shared<CudaStreamImpl>(
      c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(index_)));
}

std::shared_ptr<Stream> CudaDevice::handed_out(c10::cuda::CUDAStream s) {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    callers_.insert(s.stream());
  }
  return std::make_shared<CudaStreamImpl>(s);
}

void CudaDevice::copy(Stream& s, void* dst, const void* src, size_t n) {
  c10::cuda::CUDAGuard guard(index_);
  // Through the copy engine: no SM is used. Default: either side may be host-mapped memory
  // (pinned words), which DeviceToDevice would misdescribe.
  CUDA_P2P_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, as_cuda(s).stream.stream()));
}

void CudaDevice::launch(Stream& s, std::function<void()> fn) {
  c10::cuda::CUDAStreamGuard guard(as_cuda(s).stream);
  fn();
}

void CudaDevice::host_task(Stream& s, std::function<void()> fn) {
  c10::cuda::CUDAGuard guard(index_);
  auto task = std::make_unique<HostFunction>(HostFunction{std::move(fn), host_errors_});
  const cudaError_t err =
      cudaLaunchHostFunc(as_cuda(s).stream.stream(), &HostFunction::call, task.get());
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, "cuda_p2p: cudaLaunchHostFunc failed: ", cudaGetErrorString(err));
  }
  (void)task.release();  // owned by the host function from now on
}

std::shared_ptr<Event> CudaDevice::record(Stream& s) {
  auto e = std::make_shared<CudaEventImpl>(index_);
  c10::cuda::CUDAGuard guard(index_);
  e->in_capture = capture_id(s) != 0;
  CUDA_P2P_CUDA_CHECK(cudaEventRecord(e->event, as_cuda(s).stream.stream()));
  return e;
}

void CudaDevice::wait_event(Stream& s, const Event& e) {
  c10::cuda::CUDAGuard guard(index_);
  CUDA_P2P_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(s).stream.stream(), as_event(e), 0));
}

cudaEvent_t CudaDevice::as_event(const Event& e) {
  const auto* ce = dynamic_cast<const CudaEventImpl*>(&e);
  TORCH_CHECK(ce, "cuda_p2p: a CUDA device was given an event of another device");
  return ce->event;
}

void CudaDevice::synchronize(Stream& s) {
  c10::cuda::CUDAGuard guard(index_);
  auto stream = as_cuda(s).stream.stream();
  poll_until([stream] { return cudaStreamQuery(stream); }, "synchronize");
}

void CudaDevice::synchronize(const Event& e) {
  check_event_not_captured(e, "synchronize");
  c10::cuda::CUDAGuard guard(index_);
  cudaEvent_t event = as_event(e);
  poll_until([event] { return cudaEventQuery(event); }, "synchronize");
}

bool CudaDevice::query(const Event& e) {
  check_event_not_captured(e, "Work.is_completed");
  c10::cuda::CUDAGuard guard(index_);
  const cudaError_t q = cudaEventQuery(as_event(e));
  if (q == cudaSuccess) return true;
  if (q == cudaErrorNotReady) return false;
  (void)cudaGetLastError();
  TORCH_CHECK(false, "cuda_p2p Work.is_completed: the stream failed: ", cudaGetErrorString(q));
}

void CudaDevice::quiesce() {
  c10::cuda::CUDAGuard guard(index_);
  for (auto stream : streams_to_drain()) {
    CudaEventImpl e(index_);
    if (cudaEventRecord(e.event, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // a stream the user destroyed meanwhile: nothing to wait for
      continue;
    }
    poll_until([&e] { return cudaEventQuery(e.event); }, "quiesce");
  }
  forget_callers();
}

bool CudaDevice::drain(Millis limit) noexcept {
  QuietDeviceSwitch guard(index_);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool drained = true;
  for (auto stream : streams_to_drain()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(e, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      if (e) (void)cudaEventDestroy(e);
      continue;
    }
    auto nap = std::chrono::microseconds(1);
    while (true) {
      const cudaError_t q = cudaEventQuery(e);
      if (q != cudaErrorNotReady) break;  // done, or an error: nothing more to wait for
      if (std::chrono::steady_clock::now() >= deadline) {
        drained = false;
        break;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
    }
    (void)cudaEventDestroy(e);
    (void)cudaGetLastError();
  }
  if (drained) {
    forget_callers();
    run_deferred_frees();  // NOTE [Deferred frees]: the group's streams are idle
  } else {
    undrained_->store(true, std::memory_order_release);  // NOTE [Blocks of an undrained device]
  }
  return drained;
}

std::vector<cudaStream_t> CudaDevice::streams_to_drain() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  std::vector<cudaStream_t> all(own_streams_.begin(), own_streams_.end());
  all.insert(all.end(), callers_.begin(), callers_.end());
  all.push_back(aux_);
  return all;
}

void CudaDevice::run_deferred_frees() noexcept {
  try {
    if (frees_->queued() == 0) return;
    const cudaStream_t current =
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)).stream();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(current, &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (status == cudaStreamCaptureStatusNone) frees_->run();
  } catch (...) {  // NOLINT(bugprone-empty-catch): the frees wait for the next safe point
  }
}

void CudaDevice::forget_callers() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  callers_.clear();
}

bool CudaDevice::retire(const std::string& why, Millis limit) {
  const bool drained = drain(limit);
  watchdog_->fail(why, drained);
  return drained;
}

void CudaDevice::check_healthy(const char* op) {
  check_graph_give_up();
  failure_.check(op);
}

void CudaDevice::check_work(const char* op) {
  check_graph_give_up();
  failure_.check_work(op);
}

void CudaDevice::set_failure_words(FailureWords words) {
  if (failure_.has_words() || words.areas.empty()) return;
  trap_on_peer_failure_.store(words.trap_on_peer_failure, std::memory_order_release);
  c10::cuda::CUDAGuard guard(index_);
  const auto& own = words.areas.front();
  void* dev = nullptr;
  if (cudaHostRegister(own->data(), own->size(),
                       cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess &&
      cudaHostGetDevicePointer(&dev, words.own, 0) == cudaSuccess) {
    failure_rank_.store(words.rank, std::memory_order_release);
    failure_word_dev_.store(static_cast<const uint32_t*>(dev), std::memory_order_release);
  } else {
    // The kernels then end at their deadlines; the host side (checks, watchdog) still reads it.
    (void)cudaGetLastError();
    TORCH_WARN("cuda_p2p: ", name(), " cannot map this rank's failure area into the GPU ",
               "(cudaHostRegister failed): its wait kernels end at their deadlines, not at a ",
               "peer's failure (NOTE [Failure words])");
  }
  {
    std::lock_guard<std::mutex> lock(areas_mu_);
    areas_ = words.areas;
    areas_rank_ = words.rank;
  }
  failure_.set_words(words.rank, words.own, std::move(words.peers));
}

void CudaDevice::add_failure_probe(std::function<std::string()> probe) {
  watchdog_->add_probe(std::move(probe));
}

void CudaDevice::forget_failure_peers(const std::vector<int>& ranks) {
  failure_.forget_peers(ranks);              // first: no word of theirs is written once it returns
  std::vector<std::shared_ptr<Block>> gone;  // unmapped after the lock is released
  std::lock_guard<std::mutex> lock(areas_mu_);
  for (int r : ranks) {
    const size_t i = FailureWords::area_index(areas_rank_, r);
    if (r != areas_rank_ && i < areas_.size() && areas_[i]) {
      gone.push_back(std::move(areas_[i]));
    }
  }
}

HostWords CudaDevice::host_words(size_t n) {
  std::lock_guard<std::mutex> lock(host_words_mu_);
  TORCH_CHECK(n <= kHostWords - host_words_used_, "cuda_p2p: ", name(), " was asked for ", n,
              " host-mapped words, but its pinned pool has ", kHostWords - host_words_used_, " of ",
              kHostWords, " left (reserved when the device was created: NOTE [Pinned pools])");
  HostWords w{host_words_ + host_words_used_, host_words_dev_ + host_words_used_};
  host_words_used_ += n;
  return w;
}

void CudaDevice::record_stream(const at::Tensor& t, Stream& s) {
  if (!t.defined() || !t.has_storage()) return;
  if (t.is_cpu()) {
    // Pinned host memory (the caching host allocator's; it ignores other memory): handed out
    // again only once the stream has passed this point.
    if (t.is_pinned()) {
      at::getHostAllocator(at::kCUDA)->record_event(t.storage().mutable_data(),
                                                    t.storage().data_ptr().get_context(),
                                                    as_cuda(s).stream.unwrap());
    }
    return;
  }
  if (!t.is_cuda()) return;
  // Skips memory the caching allocator does not own (workspace views, IPC mappings).
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), as_cuda(s).stream);
}

}  // namespace cuda

std::shared_ptr<Device> make_cuda_device(int device_index, int hardware_queues,
                                         const std::string& blocks) {
  return std::make_shared<cuda::CudaDevice>(device_index, hardware_queues, blocks);
}

}  // namespace cuda_p2p
