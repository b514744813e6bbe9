// The CUDA device's class, private to p2p_workspace/cuda/ (the backend makes one with
// make_cuda_device and reaches it through Device: cuda_device.hpp), and the stream, event and
// pool types its members hold. Its members are defined in
//   cuda_device.cpp        identity, blocks, streams, events, failure and the pinned pools, as in
//                          device.hpp's sections (and the file's NOTEs on signal ordering,
//                          streams and hardware queues);
//   cuda_device_waits.cpp  the signals and waits: stream memory operations, the wait kernels,
//                          the flag barriers' kernels, the watchdog's view of a wait.
// Compiled only in builds with CUDA; runs only on a GPU (docs/status.md says where it has).
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/cuda/vmm_blocks.hpp"
#include "p2p_workspace/deferred_frees.hpp"
#include "p2p_workspace/device.hpp"
#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p::cuda {

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

class CudaStreamImpl : public Stream {
 public:
  explicit CudaStreamImpl(c10::cuda::CUDAStream s) : stream(s) {}
  c10::cuda::CUDAStream stream;
};

// `s` as the CUDA stream it must be (an error naming the mix-up otherwise).
CudaStreamImpl& as_cuda(Stream& s);

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

// NOTE [Pinned pools]
// Why: page-locked host memory is allocated and freed by calls that may synchronize with the
// whole device (the CUDA programming guide lists a page-locked host allocation among the
// operations after which no command of another stream starts before the earlier ones finished;
// frees are no better documented). Issued while a stream is blocked at a wait, such a call would
// hold up the release that unblocks it, or the teardown after a failed drain, or free memory a
// kernel still writes.
// What the device does:
//  - it takes all the pinned memory its waits and ops use when it is created (kRecords give-up
//    records, the graph give-up record, the kHostWords words host_words() hands out) and never
//    frees it: at teardown it is leaked, as the mappings of a failed drain are (a few hundred KiB
//    per device);
//  - a host so far ahead of the GPU that every record is in use waits for the watchdog to retire
//    the oldest waits, with the group's deadline;
//  - events and give-up records are recycled across waits (WaitResources, owned by the device,
//    outliving its watchdog): a wait costs no cudaEventCreate or pinned allocation once warm.
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

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, int hardware_queues, const std::string& blocks);
  ~CudaDevice() override;

  // --- identity ---
  std::string name() const override { return "cuda:" + std::to_string(index_); }
  at::Device tensor_device() const override;
  int device_index() const override { return index_; }
  std::string device_uuid() const override { return uuid_; }
  std::string peer_access_problem(const std::string& peer_uuid) override;

  // --- blocks ---
  std::shared_ptr<Block> allocate(size_t bytes) override;
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override;
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override;
  bool blocks_outlive_owner() const override { return vmm_ != nullptr; }
  std::string block_memory() const override { return block_memory_; }

  // --- streams ---
  std::shared_ptr<Stream> current_stream() override;
  // NOTE [Group streams]: a stream of the group's own, not one of c10's pool.
  std::shared_ptr<Stream> new_stream(bool high_priority) override;

  void copy(Stream& s, void* dst, const void* src, size_t n) override;
  // cuda_device_waits.cpp: NOTE [CUDA signal ordering] in cuda_device.cpp.
  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override;
  // NOTE [Device failure] (p2p_workspace/watchdog.hpp): the waits are bracketed by two events
  // and handed to the watchdog, which enforces `timeout` from the moment the stream reaches them.
  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override;
  void launch(Stream& s, std::function<void()> fn) override;
  // A host function of the stream. CUDA forbids CUDA API calls in it (they may deadlock or fail
  // with cudaErrorNotPermitted), and so freeing CUDA tensors its closure captured; the stream
  // waits while it runs. Its exception cannot cross the driver's thread: it is kept and raised
  // by the device's next synchronize (poll_until). Of the callers, only a traced pipeline's span
  // markers (pipeline::Env::span) reach it on CUDA: the others read or write host memory of the
  // host device (cross-memory reads, host op signatures).
  void host_task(Stream& s, std::function<void()> fn) override;

  std::shared_ptr<Event> record(Stream& s) override;
  void wait_event(Stream& s, const Event& e) override;
  // Polls with back-off, so that a wait that misses its deadline (found by the watchdog) becomes
  // an error here instead of a hang; the stream itself cannot be cancelled (NOTE [Device
  // failure]).
  void synchronize(Stream& s) override;
  void synchronize(const Event& e) override;
  bool query(const Event& e) override;
  // NOTE [Workspace growth]: waits for what this device enqueued - an event recorded now on
  // its own streams and on every stream it handed to an op since it last drained - not for the
  // whole GPU (cudaDeviceSynchronize would also wait for other libraries' work, and hang on
  // another group's blocked stream). NOTE [Group streams].
  void quiesce() override;
  // NOTE [Teardown drains]: like quiesce, but it raises nothing (a failed device's released
  // waits let its streams drain) and gives up at `limit`.
  bool drain(Millis limit) noexcept override;
  void set_timeout(Millis timeout) override { timeout_ms_.store(timeout.count()); }

  // --- failure ---
  // NOTE [Releasing blocked waits]: every pending wait is released, so that the streams drain.
  void abort(const std::string& why) override { watchdog_->fail(why); }
  // NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp.
  bool retire(const std::string& why, Millis limit) override;
  void check_healthy(const char* op) override;
  void check_work(const char* op) override;
  // Every give-up a kernel records traps right after (NOTE [Who traps]); a trap at a peer's
  // failure, which a group may ask for, records none.
  std::string lost_context() const override { return graph_give_up(); }
  // NOTE [Failure words]: this rank's area is registered (cudaHostRegisterMapped), so that its
  // wait kernels poll the word through a device address; the peers' are written by the CPU only.
  bool has_failure_words() const override { return failure_.has_words(); }
  void set_failure_words(FailureWords words) override;
  // The peers' areas are written by the CPU only (never registered): unmapped at once.
  void forget_failure_peers(const std::vector<int>& ranks) override;
  void add_failure_probe(std::function<std::string()> probe) override;

  // --- capture (cuda_device_waits.cpp; NOTE [Replay-safe signals] in
  // p2p_workspace/symmetric_workspace.cpp) ---
  uint64_t capture_id(Stream& s) override;
  void advance_counter(Stream& s, uint32_t* counter, uint32_t delta) override;
  void write_counted(Stream& s, uint32_t* addr, const uint32_t* counter, uint32_t offset) override;
  // The wait kernel gives up by itself at `timeout` (the GPU's clock): no watchdog can follow a
  // replay's waits, whose events are the graph's. It flags the peers in graph_give_up_ and traps,
  // which check_healthy, every host poll and the watchdog turn into the device's failure (NOTE
  // [Counted waits end with the failure]).
  void wait_counted(Stream& s, std::vector<CountedWait> waits, Millis timeout,
                    std::string context) override;
  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: one kernel, the op's own (ops/cuda/) or
  // one of barriers only. Its waits give up and end as a counted wait's do: no watchdog follows
  // them (a replay's events are the graph's), the give-up record and the failure words end them.
  void graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body, Millis timeout,
                    std::string context) override;
  void record_stream(const at::Tensor& t, Stream& s) override;

  // NOTE [Host fast paths]: none; the GPU's pads are written and compared by kernels.
  HostPaths* host_paths() const override { return nullptr; }
  // NOTE [Pinned pools]: carved from the words reserved at construction, never freed.
  HostWords host_words(size_t n) override;

 private:
  // NOTE [Blocks that outlive their exporter]: `blocks` is auto, vmm or ipc (make_cuda_device).
  void open_block_memory(const std::string& blocks);
  // A plain cudaMalloc block, for legacy IPC.
  void* malloc_block(size_t bytes);

  static cudaEvent_t as_event(const Event& e);
  std::shared_ptr<Stream> handed_out(c10::cuda::CUDAStream s);
  // The streams quiesce and drain wait for: the auxiliary and the group's own streams, and the
  // callers' streams that ops enqueued on since the last drain.
  std::vector<cudaStream_t> streams_to_drain();
  // NOTE [Deferred frees]: runs the queued frees, unless this thread's current stream of the
  // device is capturing.
  void run_deferred_frees() noexcept;
  void forget_callers();

  // Polls `query` (cudaStreamQuery / cudaEventQuery) with back-off until it succeeds; raises
  // the device's failure as soon as there is one, and, once done, the give-up of a wait kernel
  // that ran on the way (so that its stale data is never returned silently).
  // NOTE [Group streams]: it gives up at the group's timeout, naming what it waited for - after
  // the watchdog's notice, and no earlier than the deadline of a wait its stream reached late
  // (NOTE [Waits for a stream outlast the waits on it]), so that a wait's own missed deadline,
  // which names the ranks, comes first.
  template <typename Query>
  void poll_until(Query query, const char* op) {
    const Millis limit(timeout_ms_.load());
    auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
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
        // NOTE [Waits for a stream outlast the waits on it] in p2p_workspace/watchdog.cpp.
        if (const auto due = watchdog_->pending_deadline()) {
          if (*due + watchdog_->notice() > deadline) deadline = *due + watchdog_->notice();
        }
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

  // --- cuda_device_waits.cpp ---
  // A counted wait of a replayed graph that gave up (NOTE [Replay-safe signals]) fails the device
  // for good, naming the peers it gave up on, and releases the eager waits like any failure; so
  // does a peer's failure word (NOTE [Failure words]).
  void check_graph_give_up();
  // The give-up of a counted wait as the device's failure ("" while there is none).
  std::string graph_give_up() const;
  // What a wait kernel polls besides its words (NOTE [Failure words]).
  cuda::WaitEnds ends() const;
  // NOTE [Pinned pools]: a give-up record, once there is a free one.
  WaitResources::Record take_record(const std::string& context);

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

}  // namespace cuda_p2p::cuda
