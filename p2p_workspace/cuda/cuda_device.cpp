// CUDA implementation of the device interface (compiled when nvcc is found; runs only on a GPU).
// CI never runs it (no GPU there): everything device-independent (the watchdog, the failure
// state, the workspace protocols) lives in shared code that the host tests exercise. Where it
// has run: docs/testing.md, "What has run on a GPU".
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
// was satisfied visible to the work after it (docs/testing.md says where this has run).
//
// NOTE [Group streams]
// The pipeline streams are the group's own (new_stream creates them; they are not c10's pool
// streams, which ProcessGroupNCCL and torch.cuda.Stream() share, 32 per priority): no wrap-around
// serialises a group behind NCCL or a user's stream, and cuBLAS keeps one workspace per stream,
// two per group. The device waits only for streams it owns or handed to one of its ops since it
// last drained (quiesce, drain), never for every stream of the GPU, and every such wait has the
// group's deadline (set_timeout): a wait of group A that blocks a stream is an error in group B,
// not a hang. Nor does anything device-wide run where a wait may be blocked: no cudaFreeHost,
// cudaHostAlloc, emptyCache or cudaDeviceSynchronize on the paths of ops, waits, releases or
// teardown (NOTE [Pinned pools]; a cudaMalloc that runs out of memory says how much torch's cache
// holds instead of emptying it), and block frees wait in a queue for the device's allocations and
// completed drains (NOTE [Deferred frees]), not wherever a block's last reference goes.
//
// NOTE [Hardware queues]
// The release of a blocked stream memory wait is a write from the device's auxiliary stream
// (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp), which helps only if the aux
// stream does not queue behind the wait. CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS
// hardware queues (8 unless the process sets it; Megatron sets 1), and work of two streams on one
// queue runs in the order it was submitted: with one queue the release waits behind the very wait
// it releases, for good. A cuStreamWaitValue32 watches one word and has no deadline, so nothing
// else ends it either. The wait kernel polls its own deadline and the failure words (NOTE
// [Failure words]) and needs no release, so below kMinHardwareQueues (the caller's stream, the
// two pipeline streams and the aux stream each on a queue of its own) the device waits with the
// kernel, and says so once. Above it a collision of the aux stream with a blocked stream is still
// possible (streams share queues round-robin); the failure words and the kernels' deadlines are
// what keeps that case from hanging for good where the kernel runs, and scripts/gpu_check.sh runs
// the fault step with one queue.
#include "p2p_workspace/cuda/cuda_device.hpp"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/cuda/vmm_blocks.hpp"
#include "p2p_workspace/deferred_frees.hpp"
#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p {

namespace {

#define CUDA_P2P_CUDA_CHECK(expr)                          \
  do {                                                     \
    cudaError_t err__ = (expr);                            \
    TORCH_CHECK(err__ == cudaSuccess, "cuda_p2p: ", #expr, \
                " failed: ", cudaGetErrorString(err__));   \
  } while (0)

using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// Selects `device` for the scope and restores the previous one, ignoring every error: for
// destructors, which may run at process exit after the CUDA context is gone (a throwing
// c10::cuda::CUDAGuard would terminate the process there).
class QuietDeviceSwitch {
 public:
  explicit QuietDeviceSwitch(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
    (void)cudaGetLastError();
  }
  ~QuietDeviceSwitch() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
    (void)cudaGetLastError();
  }
  QuietDeviceSwitch(const QuietDeviceSwitch&) = delete;
  QuietDeviceSwitch& operator=(const QuietDeviceSwitch&) = delete;

 private:
  int previous_ = -1;
};

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

class CudaStreamImpl : public Stream {
 public:
  explicit CudaStreamImpl(c10::cuda::CUDAStream s) : stream(s) {}
  c10::cuda::CUDAStream stream;
};

// Writes signal words from the device's auxiliary stream, which no wait ever blocks: what
// releases blocked waits (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp).
struct AuxWriter {
  cudaStream_t stream = nullptr;
  std::mutex* mu = nullptr;
  WriteValueFn write_value = nullptr;
  int device = 0;

  void write(uint32_t* addr, uint32_t value) const noexcept {
    QuietDeviceSwitch guard(device);
    std::lock_guard<std::mutex> lock(*mu);
    if (write_value) {
      (void)write_value(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr),
                        value, 0);
    } else {
      (void)cuda::launch_write_signal(addr, value, stream);
    }
    (void)cudaGetLastError();
  }
};

class CudaEventImpl : public Event {
 public:
  explicit CudaEventImpl(int device) : device_(device) {
    c10::cuda::CUDAGuard guard(device_);
    CUDA_P2P_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  ~CudaEventImpl() override {
    QuietDeviceSwitch guard(device_);
    (void)cudaEventDestroy(event);
  }
  bool captured() const override { return in_capture; }
  cudaEvent_t event;
  bool in_capture = false;  // NOTE [Captured events] in p2p_workspace/device.hpp

 private:
  int device_;
};

CudaStreamImpl& as_cuda(Stream& s) {
  auto* c = dynamic_cast<CudaStreamImpl*>(&s);
  TORCH_CHECK(c, "cuda_p2p: a CUDA device was given a stream of another device");
  return *c;
}

// NOTE [Pinned pools]
// Page-locked host memory is allocated and freed by calls that may synchronize with the whole
// device: the CUDA programming guide lists a page-locked host allocation among the operations
// after which no command of another stream starts before the earlier ones finished, and frees are
// no better documented. Issued while a stream is blocked at a wait, such a call would hold up the
// release that unblocks it, or the teardown after a failed drain - or free memory a kernel still
// writes. So the device takes all the pinned memory its waits and ops use when it is created
// (kRecords give-up records, the graph give-up record, the kHostWords words host_words() hands
// out, e.g. for op-signature records) and never frees it: at teardown it is leaked, as the
// mappings of a failed drain are (a few hundred KiB per device). A host that runs so far ahead of
// the GPU that every record is in use waits for the watchdog to retire the oldest waits, with the
// group's deadline.
//
// Events and give-up records recycled across waits: a wait costs no cudaEventCreate or pinned
// allocation once the pools are warm. Owned by the device; outlive its watchdog.
class WaitResources {
 public:
  // One per wait_signals call (its probe), plus one per kMaxKernelWaits waits on the kernel path.
  static constexpr int kRecords = 1024;
  using Record = std::pair<cuda::KernelGiveUp*, cuda::KernelGiveUp*>;  // host, device address
  explicit WaitResources(int device) : device_(device) {}
  ~WaitResources() {
    QuietDeviceSwitch guard(device_);
    for (auto e : events_) (void)cudaEventDestroy(e);
    (void)cudaGetLastError();
    // The records' memory stays allocated: NOTE [Pinned pools].
  }

  // Once, when the device is created (its device selected).
  void reserve() {
    void* chunk = nullptr;
    CUDA_P2P_CUDA_CHECK(
        cudaHostAlloc(&chunk, kRecords * sizeof(cuda::KernelGiveUp), cudaHostAllocMapped));
    void* dev = nullptr;
    CUDA_P2P_CUDA_CHECK(cudaHostGetDevicePointer(&dev, chunk, 0));
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < kRecords; ++i) {
      free_.emplace_back(static_cast<cuda::KernelGiveUp*>(chunk) + i,
                         static_cast<cuda::KernelGiveUp*>(dev) + i);
    }
  }

  cudaEvent_t event() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!events_.empty()) {
        auto e = events_.back();
        events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e;
    CUDA_P2P_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }

  // A zeroed record in host-mapped pinned memory, with its device address; none when all are
  // in use (NOTE [Pinned pools]).
  std::optional<Record> give_up() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::nullopt;
    auto r = free_.back();
    free_.pop_back();
    std::memset(r.first, 0, sizeof(cuda::KernelGiveUp));
    return r;
  }
  void put(Record r) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(r);
  }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;
  std::vector<Record> free_;
};

// One wait_signals call as the watchdog sees it: an event before the waits (the stream reached
// them) and one after (it passed them), plus the give-up records of the wait kernels.
class CudaWatchedWait : public WatchedWait {
 public:
  CudaWatchedWait(WaitResources& res, std::vector<SignalWait> waits, cudaStream_t reader,
                  std::mutex& reader_mu, cudaStream_t stream, const AuxWriter& aux)
      : res_(res),
        waits_(std::move(waits)),
        reader_(reader),
        reader_mu_(reader_mu),
        stream_(stream),
        aux_(aux) {}
  ~CudaWatchedWait() override {
    if (before) res_.put(before);
    if (after) res_.put(after);
    if (probe_event) res_.put(probe_event);
    if (probe.first) res_.put(probe);
    for (auto& g : give_ups) res_.put(g);
  }

  // Queries from the watchdog thread never throw: an error counts as "not yet", so that a
  // broken context ends in the deadline's error.
  bool started() override { return done(before); }
  bool finished() override { return done(after); }
  std::vector<int> given_up() override {
    std::vector<int> peers;
    for (size_t k = 0; k < give_ups.size(); ++k) {
      const auto* g = give_ups[k].first;
      if (!load(g->gave_up)) continue;
      const size_t first = k * cuda::kMaxKernelWaits;
      const size_t last = std::min(waits_.size(), first + cuda::kMaxKernelWaits);
      const size_t named = peers.size();
      for (size_t w = first; w < last; ++w) {
        if (load(g->missing[w - first])) peers.push_back(waits_[w].peer);
      }
      if (peers.size() == named) {  // flagged without a name: blame every peer of that kernel
        for (size_t w = first; w < last; ++w) peers.push_back(waits_[w].peer);
      }
    }
    return peers;
  }
  // NOTE [Reading a blocked wait's words]
  // The waiting stream is blocked, so the words are read through the device's reader stream,
  // into pinned memory taken when the wait was enqueued (a copy into pageable memory, or an
  // allocation now, may wait for the whole device), and for at most kReadLimit: the watchdog
  // thread must never block here, since the release of every wait comes after this read:
  // otherwise a caller blocked in cudaDeviceSynchronize() behind the wait would block the
  // watchdog's read too, and the missed deadline would never be reported.
  // A word that could not be read in time names its peer as missing.
  static constexpr Millis kReadLimit{1000};
  std::vector<int> missing() override {
    std::vector<int> peers;
    std::lock_guard<std::mutex> lock(reader_mu_);
    for (size_t first = 0; first < waits_.size(); first += cuda::kMaxKernelWaits) {
      const size_t last = std::min(waits_.size(), first + cuda::kMaxKernelWaits);
      bool read = probe.first != nullptr && probe_event != nullptr;
      for (size_t w = first; read && w < last; ++w) {
        read = cudaMemcpyAsync(&probe.first->missing[w - first], waits_[w].addr, sizeof(uint32_t),
                               cudaMemcpyDeviceToHost, reader_) == cudaSuccess;
      }
      read = read && cudaEventRecord(probe_event, reader_) == cudaSuccess &&
             done_within(probe_event, kReadLimit);
      for (size_t w = first; w < last; ++w) {
        if (!read || !signal_reached(load(probe.first->missing[w - first]), waits_[w].value)) {
          peers.push_back(waits_[w].peer);
        }
      }
    }
    (void)cudaGetLastError();
    return peers;
  }
  // NOTE [Releasing blocked waits]: each word is the waiter's own pad, written here from the
  // auxiliary stream; the blocked stream (or wait kernel) sees the awaited value and passes.
  std::vector<SignalWait> awaited() const override { return waits_; }
  void release(uint32_t* word, uint32_t value) override { aux_.write(word, value); }
  const void* stream() const override { return stream_; }

  cudaEvent_t before = nullptr;
  cudaEvent_t after = nullptr;
  std::vector<std::pair<cuda::KernelGiveUp*, cuda::KernelGiveUp*>> give_ups;
  // NOTE [Reading a blocked wait's words]: pinned words for missing(), and its event.
  std::pair<cuda::KernelGiveUp*, cuda::KernelGiveUp*> probe{nullptr, nullptr};
  cudaEvent_t probe_event = nullptr;

 private:
  static bool done(cudaEvent_t e) {
    const cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();
    return q == cudaSuccess;
  }
  static uint32_t load(const uint32_t& word) {
    return *static_cast<const volatile uint32_t*>(&word);  // written by the GPU
  }
  static bool done_within(cudaEvent_t e, Millis limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto nap = std::chrono::microseconds(10);
    while (!done(e)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(10000));
    }
    return true;
  }

  WaitResources& res_;
  std::vector<SignalWait> waits_;
  cudaStream_t reader_;
  std::mutex& reader_mu_;
  cudaStream_t stream_;
  AuxWriter aux_;
};

// The first exception a host task raised, until a synchronize reports it. Shared with the host
// functions still enqueued, which may run after the device is gone.
class HostTaskErrors {
 public:
  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_) first_ = std::move(e);
  }
  std::exception_ptr take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(first_, nullptr);
  }

 private:
  std::mutex mu_;
  std::exception_ptr first_;
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

class CudaDevice : public Device {
 public:
  CudaDevice(int index, int hardware_queues, const std::string& blocks)
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
    if (cudaDeviceGetAttribute(&can_flush, cudaDevAttrCanFlushRemoteWrites, index_) !=
        cudaSuccess) {
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
    watchdog_->set_probe([this] { return graph_give_up(); });
  }
  ~CudaDevice() override {
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

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  at::Device tensor_device() const override {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index_));
  }
  int device_index() const override { return index_; }
  std::string device_uuid() const override { return uuid_; }

  std::string peer_access_problem(const std::string& peer_uuid) override {
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

  // A plain cudaMalloc block, for legacy IPC.
  void* malloc_block(size_t bytes) {
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

  std::shared_ptr<Block> allocate(size_t bytes) override {
    c10::cuda::CUDAGuard guard(index_);
    run_deferred_frees();  // NOTE [Deferred frees]: cudaMalloc may synchronise too
    std::shared_ptr<CudaBlock> block;
    if (vmm_) {  // NOTE [Blocks that outlive their exporter]
      const cuda::VmmMapping m = vmm_->allocate(bytes);
      block = std::make_shared<CudaBlock>(
          m.ptr, bytes, BlockMemory{BlockMemory::kVmm, vmm_, m.size}, index_, undrained_, frees_);
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

  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override {
    c10::cuda::CUDAGuard guard(index_);
    const auto* cb = dynamic_cast<const CudaBlock*>(block.get());
    TORCH_CHECK(cb && cb->memory().kind != BlockMemory::kIpcImport,
                "cuda_p2p: only a block allocated by this device can be exported");
    if (cb->memory().kind == BlockMemory::kVmm) {  // NOTE [Blocks that outlive their exporter]
      return vmm_->exporter({block->data(), cb->memory().mapped}, max_peers);
    }
    return std::make_unique<IpcExporter>(block->data());
  }

  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override {
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

  bool blocks_outlive_owner() const override { return vmm_ != nullptr; }
  std::string block_memory() const override { return block_memory_; }

  std::shared_ptr<Stream> current_stream() override {
    return handed_out(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
  }

  // NOTE [Group streams]: a stream of the group's own, not one of c10's pool.
  std::shared_ptr<Stream> new_stream(bool high_priority) override {
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

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    c10::cuda::CUDAGuard guard(index_);
    // Through the copy engine: no SM is used. Default: either side may be host-mapped memory
    // (pinned words), which DeviceToDevice would misdescribe.
    CUDA_P2P_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, as_cuda(s).stream.stream()));
  }

  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    c10::cuda::CUDAGuard guard(index_);
    auto stream = as_cuda(s).stream.stream();
    if (write_value_) {
      // See NOTE [CUDA signal ordering].
      const CUresult r = write_value_(reinterpret_cast<CUstream>(stream),
                                      reinterpret_cast<CUdeviceptr>(addr), value, 0);
      TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: cuStreamWriteValue32 failed with CUresult ", r);
    } else {
      CUDA_P2P_CUDA_CHECK(cuda::launch_write_signal(addr, value, stream));
    }
  }

  // --- NOTE [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp ---
  uint64_t capture_id(Stream& s) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaError_t err = cudaStreamGetCaptureInfo(as_cuda(s).stream.stream(), &status, &id);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      TORCH_CHECK(false, "cuda_p2p: cudaStreamGetCaptureInfo failed: ", cudaGetErrorString(err));
    }
    TORCH_CHECK(status != cudaStreamCaptureStatusInvalidated,
                "cuda_p2p: the stream's CUDA graph capture was invalidated (an earlier call broke "
                "it); end the capture and start again");
    return status == cudaStreamCaptureStatusActive ? (id == 0 ? 1 : id) : 0;
  }
  void advance_counter(Stream& s, uint32_t* counter, uint32_t delta) override {
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(cuda::launch_advance_counter(counter, delta, as_cuda(s).stream.stream()));
  }
  void write_counted(Stream& s, uint32_t* addr, const uint32_t* counter, uint32_t offset) override {
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(
        cuda::launch_write_counted(addr, counter, offset, as_cuda(s).stream.stream()));
  }
  // The wait kernel gives up by itself at `timeout` (the GPU's clock): no watchdog can follow a
  // replay's waits, whose events are the graph's. It flags the peers in graph_give_up_ and traps,
  // which check_healthy, every host poll and the watchdog turn into the device's failure (NOTE
  // [Counted waits end with the failure]).
  void wait_counted(Stream& s, std::vector<CountedWait> waits, Millis timeout,
                    std::string context) override {
    check_healthy(context.c_str());
    c10::cuda::CUDAGuard guard(index_);
    auto stream = as_cuda(s).stream.stream();
    for (size_t i = 0; i < waits.size(); i += cuda::kMaxKernelWaits) {
      cuda::CountedKernelWaits kw{};
      for (size_t j = i; j < waits.size() && j < i + cuda::kMaxKernelWaits; ++j) {
        kw.addr[kw.count] = waits[j].addr;
        kw.counter[kw.count] = waits[j].counter;
        kw.offset[kw.count] = waits[j].offset;
        kw.peer[kw.count] = waits[j].peer;
        ++kw.count;
      }
      CUDA_P2P_CUDA_CHECK(
          cuda::launch_wait_counted(kw, static_cast<uint64_t>(timeout.count()) * 1000000ull,
                                    graph_give_up_dev_, ends(), stream));
    }
    watchdog_->arm();  // NOTE [Counted waits end with the failure]
  }

  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: one kernel, the op's own (ops/cuda/) or
  // one of barriers only. Its waits give up and end as a counted wait's do: no watchdog follows
  // them (a replay's events are the graph's), the give-up record and the failure words end them.
  void graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body, Millis timeout,
                    std::string context) override {
    check_healthy(context.c_str());
    GraphLaunch g = launch;
    g.timeout_ns = static_cast<uint64_t>(timeout.count()) * 1000000ull;
    g.give_up = graph_give_up_dev_;
    const cuda::WaitEnds e = ends();
    g.peer_failed = e.peer_failed;
    g.failed = e.failed;
    g.trap_on_peer_failure = e.trap_on_peer_failure;
    c10::cuda::CUDAStreamGuard guard(as_cuda(s).stream);
    if (body.cuda) {
      body.cuda(g);
    } else {
      CUDA_P2P_CUDA_CHECK(cuda::launch_graph_barriers(g, as_cuda(s).stream.stream()));
    }
    watchdog_->arm();  // NOTE [Counted waits end with the failure]
  }

  // NOTE [Device failure] (p2p_workspace/watchdog.hpp): the waits are bracketed by two events
  // and handed to the watchdog, which enforces `timeout` from the moment the stream reaches them.
  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    failure_.check(context.c_str());
    if (waits.empty()) return;
    c10::cuda::CUDAGuard guard(index_);
    auto stream = as_cuda(s).stream.stream();
    TORCH_CHECK(capture_id(s) == 0, "cuda_p2p ", context,
                ": a sequence-numbered wait on a stream being captured (NOTE [Replay-safe "
                "signals]); this op should have used a counted wait");
    auto watched =
        std::make_unique<CudaWatchedWait>(resources_, waits, aux_, aux_mu_, stream, aux_writer_);
    watched->before = resources_.event();
    watched->probe = take_record(context);
    watched->probe_event = resources_.event();
    CUDA_P2P_CUDA_CHECK(cudaEventRecord(watched->before, stream));
    if (wait_value_) {
      for (const auto& w : waits) {
        const CUresult r =
            wait_value_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(w.addr),
                        w.value, CU_STREAM_WAIT_VALUE_GEQ | wait_flags_);
        TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: cuStreamWaitValue32 failed with CUresult ", r);
      }
    } else {
      for (size_t i = 0; i < waits.size(); i += cuda::kMaxKernelWaits) {
        cuda::KernelWaits kw{};
        for (size_t j = i; j < waits.size() && j < i + cuda::kMaxKernelWaits; ++j) {
          kw.addr[kw.count] = waits[j].addr;
          kw.value[kw.count] = waits[j].value;
          ++kw.count;
        }
        watched->give_ups.push_back(take_record(context));
        CUDA_P2P_CUDA_CHECK(
            cuda::launch_wait_signals(kw, static_cast<uint64_t>(timeout.count()) * 1000000ull,
                                      watched->give_ups.back().second, ends(), stream));
      }
    }
    watched->after = resources_.event();
    CUDA_P2P_CUDA_CHECK(cudaEventRecord(watched->after, stream));
    // The kernel gives up at `timeout` after it starts; the watchdog's clock starts when it
    // first sees the stream at the waits, i.e. later, so for the kernel path the kernel's
    // give-up (which names the ranks exactly) normally comes first.
    watchdog_->track(std::move(watched), timeout, std::move(context));
  }

  void launch(Stream& s, std::function<void()> fn) override {
    c10::cuda::CUDAStreamGuard guard(as_cuda(s).stream);
    fn();
  }

  // A host function of the stream. CUDA forbids CUDA API calls in it (they may deadlock or fail
  // with cudaErrorNotPermitted), and so freeing CUDA tensors its closure captured; the stream
  // waits while it runs. Its exception cannot cross the driver's thread: it is kept and raised
  // by the device's next synchronize (poll_until). Of the callers, only a traced pipeline's span
  // markers (pipeline::Env::span) reach it on CUDA: the others read or write host memory of the
  // host device (cross-memory reads, host op signatures).
  void host_task(Stream& s, std::function<void()> fn) override {
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

  std::shared_ptr<Event> record(Stream& s) override {
    auto e = std::make_shared<CudaEventImpl>(index_);
    c10::cuda::CUDAGuard guard(index_);
    e->in_capture = capture_id(s) != 0;
    CUDA_P2P_CUDA_CHECK(cudaEventRecord(e->event, as_cuda(s).stream.stream()));
    return e;
  }

  void wait_event(Stream& s, const Event& e) override {
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(s).stream.stream(), as_event(e), 0));
  }

  // Polls with back-off, so that a wait that misses its deadline (found by the watchdog) becomes
  // an error here instead of a hang; the stream itself cannot be cancelled (NOTE [Device
  // failure]).
  void synchronize(Stream& s) override {
    c10::cuda::CUDAGuard guard(index_);
    auto stream = as_cuda(s).stream.stream();
    poll_until([stream] { return cudaStreamQuery(stream); }, "synchronize");
  }

  void synchronize(const Event& e) override {
    check_event_not_captured(e, "synchronize");
    c10::cuda::CUDAGuard guard(index_);
    cudaEvent_t event = as_event(e);
    poll_until([event] { return cudaEventQuery(event); }, "synchronize");
  }

  bool query(const Event& e) override {
    check_event_not_captured(e, "Work.is_completed");
    c10::cuda::CUDAGuard guard(index_);
    const cudaError_t q = cudaEventQuery(as_event(e));
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) return false;
    (void)cudaGetLastError();
    TORCH_CHECK(false, "cuda_p2p Work.is_completed: the stream failed: ", cudaGetErrorString(q));
  }

  // NOTE [Workspace growth]: waits for what this device enqueued - an event recorded now on
  // its own streams and on every stream it handed to an op since it last drained - not for the
  // whole GPU (cudaDeviceSynchronize would also wait for other libraries' work, and hang on
  // another group's blocked stream). NOTE [Group streams].
  void quiesce() override {
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

  // NOTE [Teardown drains]: like quiesce, but it raises nothing (a failed device's released
  // waits let its streams drain) and gives up at `limit`.
  bool drain(Millis limit) noexcept override {
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

  void set_timeout(Millis timeout) override { timeout_ms_.store(timeout.count()); }

  // NOTE [Releasing blocked waits]: every pending wait is released, so that the streams drain.
  void abort(const std::string& why) override { watchdog_->fail(why); }
  // NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp.
  bool retire(const std::string& why, Millis limit) override {
    const bool drained = drain(limit);
    watchdog_->fail(why, drained);
    return drained;
  }
  void check_healthy(const char* op) override {
    check_graph_give_up();
    failure_.check(op);
  }
  void check_work(const char* op) override {
    check_graph_give_up();
    failure_.check_work(op);
  }
  // Every give-up a kernel records traps right after (NOTE [Who traps]); a trap at a peer's
  // failure, which a group may ask for, records none.
  std::string lost_context() const override { return graph_give_up(); }

  // NOTE [Failure words]: this rank's area is registered (cudaHostRegisterMapped), so that its
  // wait kernels poll the word through a device address; the peers' are written by the CPU only.
  bool has_failure_words() const override { return failure_.has_words(); }
  void set_failure_words(FailureWords words) override {
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
  // The peers' areas are written by the CPU only (never registered): unmapped at once.
  void forget_failure_peers(const std::vector<int>& ranks) override {
    failure_.forget_peers(ranks);  // first: no word of theirs is written once it returns
    std::vector<std::shared_ptr<Block>> gone;  // unmapped after the lock is released
    std::lock_guard<std::mutex> lock(areas_mu_);
    for (int r : ranks) {
      const size_t i = FailureWords::area_index(areas_rank_, r);
      if (r != areas_rank_ && i < areas_.size() && areas_[i]) {
        gone.push_back(std::move(areas_[i]));
      }
    }
  }

  // NOTE [Pinned pools]: carved from the words reserved at construction, never freed.
  HostWords host_words(size_t n) override {
    std::lock_guard<std::mutex> lock(host_words_mu_);
    TORCH_CHECK(n <= kHostWords - host_words_used_, "cuda_p2p: ", name(), " was asked for ", n,
                " host-mapped words, but its pinned pool has ", kHostWords - host_words_used_,
                " of ", kHostWords,
                " left (reserved when the device was created: NOTE [Pinned pools])");
    HostWords w{host_words_ + host_words_used_, host_words_dev_ + host_words_used_};
    host_words_used_ += n;
    return w;
  }

  void record_stream(const at::Tensor& t, Stream& s) override {
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

 private:
  // NOTE [Blocks that outlive their exporter]: `blocks` is auto, vmm or ipc (make_cuda_device).
  void open_block_memory(const std::string& blocks) {
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

  static cudaEvent_t as_event(const Event& e) {
    const auto* ce = dynamic_cast<const CudaEventImpl*>(&e);
    TORCH_CHECK(ce, "cuda_p2p: a CUDA device was given an event of another device");
    return ce->event;
  }

  std::shared_ptr<Stream> handed_out(c10::cuda::CUDAStream s) {
    {
      std::lock_guard<std::mutex> lock(streams_mu_);
      callers_.insert(s.stream());
    }
    return std::make_shared<CudaStreamImpl>(s);
  }

  // The streams quiesce and drain wait for: the auxiliary and the group's own streams, and the
  // callers' streams that ops enqueued on since the last drain.
  std::vector<cudaStream_t> streams_to_drain() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::vector<cudaStream_t> all(own_streams_.begin(), own_streams_.end());
    all.insert(all.end(), callers_.begin(), callers_.end());
    all.push_back(aux_);
    return all;
  }
  // NOTE [Deferred frees]: runs the queued frees, unless this thread's current stream of the
  // device is capturing.
  void run_deferred_frees() noexcept {
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

  void forget_callers() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    callers_.clear();
  }

  // Polls `query` (cudaStreamQuery / cudaEventQuery) with back-off until it succeeds; raises
  // the device's failure as soon as there is one, and, once done, the give-up of a wait kernel
  // that ran on the way (so that its stale data is never returned silently).
  // NOTE [Group streams]: it gives up at the group's timeout, naming what it waited for - after
  // the watchdog's notice, so that a wait's own missed deadline, which names the ranks, comes
  // first.
  template <typename Query>
  void poll_until(Query query, const char* op) {
    const Millis limit(timeout_ms_.load());
    const auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
    auto nap = std::chrono::microseconds(1);
    while (true) {
      const cudaError_t q = query();
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        // A kernel that trapped recorded why first (NOTE [Who traps]): the named reason - the
        // ranks it missed, a foreign tag, a peer's failure - before the stream's bare error.
        check_graph_give_up();
        failure_.check(op);
        TORCH_CHECK(false, "cuda_p2p ", op, ": the stream failed: ", cudaGetErrorString(q));
      }
      check_graph_give_up();
      failure_.check(op);
      if (std::chrono::steady_clock::now() >= deadline) {
        // A wait that passed its own deadline names the ranks it awaited: the watchdog gets a
        // pass here first, since its thread may not have run (a loaded host) since.
        watchdog_->poll_now();
        check_graph_give_up();
        failure_.check(op);
      }
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "cuda_p2p ", op, " on ", name(),
                  ": the stream did not finish within the group's timeout of ", limit.count(),
                  " ms (work queued on it before this group's op - a long kernel, or a wait of "
                  "another group or library - still holds it)");
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
    }
    watchdog_->poll_now();
    check_graph_give_up();
    failure_.check(op);
    if (auto err = host_errors_->take()) std::rethrow_exception(err);
  }

  // A counted wait of a replayed graph that gave up (NOTE [Replay-safe signals]) fails the device
  // for good, naming the peers it gave up on, and releases the eager waits like any failure; so
  // does a peer's failure word (NOTE [Failure words]).
  void check_graph_give_up() {
    if (failure_.failed()) return;
    const auto* g = graph_give_up_;
    if (failure_.peer_failure() >= 0 ||
        (g != nullptr && *static_cast<const volatile uint32_t*>(&g->gave_up) != 0)) {
      watchdog_->check_memory_now();
      return;
    }
    // NOTE [Eager give-ups reach the next call]
    // A wait kernel (NOTE [Hardware queues]: one hardware queue, or a driver without stream
    // memory operations) that gives up at its deadline needs no release: its stream runs on with
    // stale data at once, and only the watchdog's next scan, up to its longest nap later, would
    // read its record and fail the device. So the kernel also sets one word of the device's, and
    // every check of the host (an op's entry, a Work's wait or synchronize) that finds it set
    // scans now. The GPU run of 2026-12-04 with CUDA_DEVICE_MAX_CONNECTIONS=1 found the
    // stream drained and the device still healthy right after a give-up.
    if (g != nullptr && *static_cast<const volatile uint32_t*>(&g->eager_gave_up) != 0) {
      watchdog_->poll_now();
    }
  }
  // The give-up of a counted wait as the device's failure ("" while there is none).
  std::string graph_give_up() const {
    const auto* g = graph_give_up_;
    if (g == nullptr || *static_cast<const volatile uint32_t*>(&g->gave_up) == 0) return "";
    auto ranks = [](const uint32_t* bits) {
      std::vector<int> peers;
      for (int r = 0; r < 128; ++r) {
        if (*static_cast<const volatile uint32_t*>(&bits[r / 32]) & (1u << (r % 32))) {
          peers.push_back(r);
        }
      }
      return peers;
    };
    // NOTE [Graph flags]: a foreign tag says more than the timeouts it caused elsewhere.
    const std::vector<int> foreign = ranks(g->foreign_bits);
    if (!foreign.empty()) {
      char tags[64];
      std::snprintf(tags, sizeof(tags), "(its tag 0x%08x, this rank's 0x%08x)",
                    *static_cast<const volatile uint32_t*>(&g->foreign_tag),
                    *static_cast<const volatile uint32_t*>(&g->own_tag));
      return "a flag barrier of a replayed CUDA graph met another op: " + describe_ranks(foreign) +
             (foreign.size() > 1 ? " were" : " was") + " at another captured op " + tags +
             ": the ranks replayed different graphs, or one replayed a graph more or fewer times "
             "than its peers (the kernel trapped and the CUDA context is lost; NOTE [Graph "
             "flags])";
    }
    // NOTE [One captured op at a time]: nothing ran, and the peers' waits it caused say less.
    if (*static_cast<const volatile uint32_t*>(&g->busy) != 0) {
      return graph_busy_text(*static_cast<const volatile uint32_t*>(&g->busy_tag), "CUDA graph");
    }
    const std::vector<int> peers = ranks(g->peer_bits);
    return "a wait of a replayed CUDA graph timed out: " + describe_ranks(peers) +
           " never arrived (the wait kernel trapped: the graph's kernels went on with stale data "
           "and the CUDA context is lost; NOTE [Counted waits end with the failure])";
  }
  // What a wait kernel polls besides its words (NOTE [Failure words]).
  cuda::WaitEnds ends() const {
    return cuda::WaitEnds{failure_word_dev_.load(std::memory_order_acquire),
                          graph_give_up_dev_ ? &graph_give_up_dev_->failed : nullptr,
                          failure_rank_.load(std::memory_order_acquire),
                          trap_on_peer_failure_.load(std::memory_order_acquire),
                          graph_give_up_dev_ ? &graph_give_up_dev_->eager_gave_up : nullptr};
  }
  // NOTE [Pinned pools]: a give-up record, once there is a free one.
  WaitResources::Record take_record(const std::string& context) {
    if (auto r = resources_.give_up()) return *r;
    const Millis limit(timeout_ms_.load());
    const auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
    auto nap = std::chrono::microseconds(10);
    while (true) {
      watchdog_->poll_now();  // retires the waits the streams passed, returning their records
      if (auto r = resources_.give_up()) return *r;
      check_healthy(context.c_str());
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "cuda_p2p ", context, " on ", name(),
                  ": all ", WaitResources::kRecords,
                  " records of this group's pending waits are in use (the host ran that many "
                  "waits ahead of the GPU) and none was returned within the group's timeout of ",
                  limit.count(), " ms (NOTE [Pinned pools])");
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
    }
  }

  const int index_;
  std::string uuid_;
  // NOTE [Blocks that outlive their exporter]: the cuMem entry points (null: legacy IPC blocks),
  // and what block_memory() says.
  std::shared_ptr<cuda::VmmBlocks> vmm_;
  std::string block_memory_;
  WriteValueFn write_value_ = nullptr;
  WaitValueFn wait_value_ = nullptr;
  cudaStream_t aux_ = nullptr;
  std::mutex aux_mu_;
  cudaStream_t zeroing_ = nullptr;  // allocate's
  int least_priority_ = 0;
  int greatest_priority_ = 0;
  unsigned int wait_flags_ = 0;  // NOTE [Descriptor visibility]
  AuxWriter aux_writer_;
  std::atomic<int64_t> timeout_ms_{30 * 60 * 1000};  // set_timeout: the group's
  std::mutex streams_mu_;
  std::vector<cudaStream_t> own_streams_;  // NOTE [Group streams]: destroyed with the device
  std::set<cudaStream_t> callers_;         // handed to ops since the last drain
  FailureState failure_;
  std::shared_ptr<HostTaskErrors> host_errors_ = std::make_shared<HostTaskErrors>();
  // Set once a drain gave up; its blocks then leak (NOTE [Blocks of an undrained device]).
  std::shared_ptr<std::atomic<bool>> undrained_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<DeferredFrees> frees_ = std::make_shared<DeferredFrees>();  // of our blocks
  cuda::GraphGiveUp* graph_give_up_ = nullptr;      // host-mapped: NOTE [Replay-safe signals]
  cuda::GraphGiveUp* graph_give_up_dev_ = nullptr;  // its device address
  WaitResources resources_;                         // outlives watchdog_
  // NOTE [Pinned pools]: host_words()'s pool, sized for the op-signature records of the groups
  // on this device (2 + 32 words per rank each, one per channel state).
  static constexpr size_t kHostWords = 64 * 1024;
  std::mutex host_words_mu_;
  uint32_t* host_words_ = nullptr;      // host-mapped
  uint32_t* host_words_dev_ = nullptr;  // its device address
  size_t host_words_used_ = 0;          // host_words_mu_
  // NOTE [Failure words]: the areas' mappings (this rank's first), and this rank's word as its
  // kernels read it (null: not mapped into the GPU).
  std::vector<std::shared_ptr<Block>> areas_;  // areas_mu_ once set
  int areas_rank_ = -1;                        // areas_mu_: the rank the areas are laid out for
  std::mutex areas_mu_;
  std::atomic<const uint32_t*> failure_word_dev_{nullptr};
  std::atomic<int> failure_rank_{-1};
  std::atomic<bool> trap_on_peer_failure_{false};  // NOTE [Who traps]
  std::unique_ptr<Watchdog> watchdog_;             // NOTE [Device failure]
};

}  // namespace

std::shared_ptr<Device> make_cuda_device(int device_index, int hardware_queues,
                                         const std::string& blocks) {
  return std::make_shared<CudaDevice>(device_index, hardware_queues, blocks);
}

}  // namespace cuda_p2p
