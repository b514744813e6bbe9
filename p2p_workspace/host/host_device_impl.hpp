// The host device's class, private to p2p_workspace/host/ (the backend and the tests make one with
// make_host_device and reach it through Device: host_device.hpp). Its members are defined in
//   host_device.cpp                 identity, blocks, streams, copies, signals, waits, events and
//                                   failure, as in device.hpp's sections;
//   host_device_capture.cpp         NOTE [Host capture] and the flag barriers' runs (graph_kernel);
//   host_device_cuda_semantics.cpp  NOTE [Host device with CUDA's semantics] in host_device.hpp:
//                                   the watched waits, the wait kernels' model, stream polls.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "p2p_workspace/device.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/host/host_stream.hpp"
#include "p2p_workspace/shared_block.hpp"
#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p::host {

// `s` as the host stream it must be (an error naming the mix-up otherwise).
HostStream& as_host(Stream& s);

// The task that makes `self` wait until `other` has run `seq` tasks (wait_event, and a replay's
// recorded waits). It holds `other`: as a CUDA event outlives its stream, a wait may still be
// queued when the stream it waits for has been dropped by its owner (a fused op's stream, with
// the ops returning queued: NOTE [Host device with CUDA's semantics]).
HostTask event_wait(HostStream& self, std::shared_ptr<HostStream> other, uint64_t seq);

// NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: the error of a flag barrier that found
// `seen` from `peer` where it expected `tag`.
std::string foreign_tag(int peer, uint32_t seen, uint32_t tag);

// The give-ups of counted waits (a replayed graph's wait kernels, NOTE [Replay-safe signals]) on
// a device with CUDA's semantics: CudaDevice's GraphGiveUp. Shared with the tasks, which a
// replay may run after the device is gone.
struct GraphGiveUps {
  std::atomic<uint32_t> count{0};
  alignas(4) uint32_t failed = 0;  // the device's failure (FailureState::mirror_to)
  // NOTE [Failure words]: this rank's word, and the rank (set_failure_words); `area`, the word's
  // mapping, is kept for the tasks.
  std::shared_ptr<Block> area;
  std::atomic<const uint32_t*> peer_word{nullptr};
  std::atomic<int> rank{-1};
  std::mutex mu;
  std::set<int> peers;
  // NOTE [Counted waits end with the failure] in p2p_workspace/watchdog.hpp: why a counted wait
  // ends before its signals arrived. A peer's failure comes first: the device fails from it too.
  enum class End { kNo, kPeerFailed, kGivenUp, kFailed };
  End ended() const {
    if (peer_failed()) return End::kPeerFailed;
    if (count.load(std::memory_order_acquire) != 0) return End::kGivenUp;
    if (std::atomic_ref<uint32_t>(const_cast<uint32_t&>(failed)).load(std::memory_order_acquire) !=
        0) {
      return End::kFailed;
    }
    return End::kNo;
  }
  bool peer_failed() const {
    const uint32_t* word = peer_word.load(std::memory_order_acquire);
    if (word == nullptr) return false;
    const uint32_t v =
        std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire);
    // A word naming this rank is its own failure coming back from a peer that adopted it.
    return v != 0 && static_cast<int>(v - 1) != rank.load(std::memory_order_relaxed);
  }
  // The peers a wait missed; `gave_up`: it gave up at its deadline (counted), not at a peer's
  // failure.
  void record(const std::vector<int>& missing, bool gave_up) {
    {
      std::lock_guard<std::mutex> lock(mu);
      peers.insert(missing.begin(), missing.end());
    }
    if (gave_up) count.fetch_add(1, std::memory_order_release);
  }
  // NOTE [Graph flags]: a flag barrier found `seen` from `peer` where it expected `tag`.
  std::set<int> foreign;
  uint32_t seen_tag = 0, own_tag = 0;
  void record_foreign(int peer, uint32_t seen, uint32_t tag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (foreign.empty()) {
        seen_tag = seen;
        own_tag = tag;
      }
      foreign.insert(peer);
    }
    count.fetch_add(1, std::memory_order_release);
  }
  // NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp: a run that found another
  // captured op holding the busy word, and the first one's tag (mu).
  uint32_t busy = 0, busy_tag = 0;
  void record_busy(uint32_t tag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (busy++ == 0) busy_tag = tag;
    }
    count.fetch_add(1, std::memory_order_release);
  }
  // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp: the group's choice, and the model of
  // a trap: why the first kernel that would have trapped did ("" while none did).
  std::atomic<bool> trap_on_peer_failure{false};
  std::string lost;  // mu
};

// How a run of flag barriers ends early, by the device's semantics (Device::graph_kernel).
struct GraphEnds {
  // Asked on every pass that waits: true ends the run quietly (CUDA's semantics: this device's
  // own failure, which its host knows); throws to end it with an error.
  std::function<bool()> check;
  // The wait for `waits` passed its deadline, or found a foreign tag: fail and throw.
  std::function<void(const std::vector<SignalWait>& waits)> timed_out;
  std::function<void(int peer, uint32_t seen)> foreign;
  // Another captured op holds the busy word (NOTE [One captured op at a time]): true ends the run
  // quietly, having recorded why (CUDA's semantics); throws to end it with an error.
  std::function<bool()> busy;
};

// NOTE [Host capture] in host_device_capture.cpp: a recorded task, or a recorded wait for the
// first `seq` captured tasks of `other`.
struct CaptureEntry {
  HostStream* stream;
  HostTask task;
  HostStream* other;  // is_wait: the stream whose captured tasks it waits for
  uint64_t seq;       // is_wait: how many of them
  bool is_wait;
};

class HostDevice final : public Device, public HostPaths {
 public:
  // Until rendezvous says how many CPUs the ranks share (set_ranks_cpus), this process's own
  // affinity stands for all of them.
  HostDevice(int processes, HostStreams mode, HostSemantics semantics);
  ~HostDevice() override;

  // --- identity ---
  std::string name() const override { return "cpu"; }
  at::Device tensor_device() const override { return at::Device(at::kCPU); }
  int device_index() const override { return -1; }
  std::string device_uuid() const override { return "host"; }
  // Every rank of a host maps its peers' memfds.
  std::string peer_access_problem(const std::string& /*peer_uuid*/) override { return ""; }

  // --- blocks ---
  std::shared_ptr<Block> allocate(size_t bytes) override { return allocate_shared_block(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override;
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override;
  bool blocks_outlive_owner() const override { return true; }
  std::string block_memory() const override { return "memfd"; }

  // --- streams ---
  // One inline stream per device object: it carries no state but its counters. A thread that
  // chose another (set_current_stream) gets that one. With CUDA's semantics a thread without a
  // stream of its choice gets a stream of its own, made on first use, as a CUDA thread gets its
  // default stream.
  std::shared_ptr<Stream> current_stream() override;
  std::shared_ptr<Stream> new_stream(bool high_priority) override;
  // host_device.hpp's set_current_stream.
  void set_current_stream(std::shared_ptr<Stream> stream);

  void copy(Stream& s, void* dst, const void* src, size_t n) override;
  // The signal stores' bodies are the CUDA kernels' (p2p_workspace/signal_store_body.hpp).
  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override;
  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override;
  // On the host, device work is host work: both run the closure in stream order.
  void launch(Stream& s, std::function<void()> fn) override;
  void host_task(Stream& s, std::function<void()> fn) override;

  std::shared_ptr<Event> record(Stream& s) override;
  void wait_event(Stream& s, const Event& e) override;
  void synchronize(Stream& s) override;
  void synchronize(const Event& e) override;
  // With CUDA's semantics nothing runs unless someone waits: a query runs at most one task of the
  // cooperative streams first, so that polling it makes progress.
  bool query(const Event& e) override;
  // An op on the inline stream drains its streams before it returns (pipeline::end), so nothing
  // is in flight; one on a stream of set_current_stream may be, as on a GPU.
  void quiesce() override;
  // NOTE [Teardown drains] in p2p_workspace/symmetric_workspace.cpp.
  bool drain(Millis limit) noexcept override;
  void set_timeout(Millis timeout) override;

  // --- failure ---
  // NOTE [Device failure]: every wait loop of this device checks failure_ on each pass (at most
  // kMaxSleep apart) and raises. With CUDA's semantics the watchdog releases the waits instead.
  void abort(const std::string& why) override;
  // NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp.
  bool retire(const std::string& why, Millis limit) override;
  void check_healthy(const char* op) override;
  void check_work(const char* op) override;
  std::string lost_context() const override;
  // NOTE [Failure words] in p2p_workspace/watchdog.hpp.
  bool has_failure_words() const override { return failure_.has_words(); }
  void set_failure_words(FailureWords words) override;
  void forget_failure_peers(const std::vector<int>& ranks) override;
  void add_failure_probe(std::function<std::string()> probe) override;

  // --- capture (NOTE [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp) ---
  uint64_t capture_id(Stream& s) override;
  void advance_counter(Stream& s, uint32_t* counter, uint32_t delta) override;
  void write_counted(Stream& s, uint32_t* addr, const uint32_t* counter, uint32_t offset) override;
  void wait_counted(Stream& s, std::vector<CountedWait> counted, Millis timeout,
                    std::string context) override;
  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: the whole run is one task of `s`.
  void graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body, Millis timeout,
                    std::string context) override;
  // host_device.hpp's begin_capture and end_capture (NOTE [Host capture] in
  // host_device_capture.cpp).
  void begin_capture(const std::shared_ptr<Stream>& stream);
  std::shared_ptr<HostGraph> end_capture();

  // A closure queued on a host stream reads raw pointers: a no-op task after it, holding `t`,
  // keeps the tensor's memory until the stream has passed this point (NOTE [Tensors in stream
  // order] in backend/workspace_collectives.cpp). Work on a synchronous device or the inline
  // stream has run already.
  void record_stream(const at::Tensor& t, Stream& s) override;

  // --- NOTE [Host fast paths]: the device is its own capability ---
  HostPaths* host_paths() const override { return const_cast<HostDevice*>(this); }
  bool synchronous() const override { return !cuda(); }
  std::shared_ptr<CrossMemoryReader> cross_memory_reader(bool deny) override;
  void set_ranks_cpus(int cpus) override;
  int ranks_cpus() const override { return ranks_cpus_.load(std::memory_order_relaxed); }
  bool oversubscribed() const override { return oversubscribed_.load(std::memory_order_relaxed); }
  // NOTE [Inline signals] in p2p_workspace/device.hpp. The inline stream counts no task for
  // these: an event recorded on it is complete whatever its count, as everything on it is.
  bool runs_inline(const Stream& s) const override { return &s == inline_stream_.get(); }
  void write_signal_now(uint32_t* addr, uint32_t value) override;
  bool poll_signals_now(c10::ArrayRef<SignalWait> waits) override;

  // Ordinary memory serves: the host's work reads and writes any of it. Kept for the device's
  // life, as the CUDA device keeps its pinned pool.
  HostWords host_words(size_t n) override;

  // NOTE [Host device with CUDA's semantics] in host_device.hpp (host_device_cuda_semantics.cpp).
  void use_cuda_semantics();

 private:
  const int processes_;                                  // the ranks of this host
  std::vector<std::unique_ptr<uint32_t[]>> host_words_;  // host_words(), under streams_mu_
  // More ranks than the CPUs they share: NOTE [Host waits on shared cores] in
  // host/futex_wait.cpp; the CPUs are ranks_cpus_ once rendezvous told them.
  std::atomic<bool> oversubscribed_;
  std::atomic<int> ranks_cpus_{0};
  const bool cooperative_;  // NOTE [Cooperative host streams] in host/host_stream.cpp
  const std::shared_ptr<CooperativeScheduler> scheduler_;
  std::shared_ptr<HostStream> inline_stream_;
  // NOTE [Failure words]: the failure areas' mappings, this rank's and its peers'.
  std::vector<std::shared_ptr<Block>> areas_;
  FailureState failure_;  // NOTE [Device failure]
  // NOTE [Host device with CUDA's semantics] in host_device.hpp: set once, before any op.
  std::atomic<bool> cuda_{false};
  std::unique_ptr<Watchdog> watchdog_;  // with CUDA's semantics; destroyed before failure_
  std::shared_ptr<GraphGiveUps> give_ups_ = std::make_shared<GraphGiveUps>();
  // Set by the destructor: the CUDA-semantics waits still queued on streams that outlive the
  // device pass (the streams would otherwise never drain: nobody releases them any more).
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int64_t> timeout_ms_{30 * 60 * 1000};  // set_timeout: the group's
  // The streams new_stream made (kept alive by their users), and the threads' chosen current
  // streams (set_current_stream); any_callers_ spares current_stream() the lock while none is.
  std::mutex streams_mu_;
  std::vector<std::weak_ptr<HostStream>> streams_;
  std::vector<std::pair<std::thread::id, std::shared_ptr<Stream>>> callers_;
  std::atomic<bool> any_callers_{false};
  // With CUDA's semantics: each thread's own current stream (current_stream()).
  std::vector<std::pair<std::thread::id, std::shared_ptr<Stream>>> defaults_;
  // NOTE [Host capture]
  struct Capture {
    uint64_t id = 0;
    std::map<HostStream*, uint64_t> counts;  // the captured streams: tasks recorded so far
    std::set<std::shared_ptr<HostStream>> keep;
    std::vector<CaptureEntry> entries;
  };
  std::mutex capture_mu_;
  std::optional<Capture> capture_;
  std::atomic<bool> capturing_{false};  // spares enqueue() the lock outside captures
  uint64_t captures_ = 0;

  bool cuda() const { return cuda_.load(std::memory_order_acquire); }
  std::shared_ptr<HostStream> make_stream_locked(bool high_priority);
  bool own(const Stream& s);
  std::vector<std::shared_ptr<HostStream>> live_streams();

  // Every task of this device goes through here: recorded when its stream is being captured.
  void enqueue(Stream& s, HostTask task);
  void check_not_captured(HostStream& h, const char* what);
  // NOTE [Graph flags]: the synchronous host's flag waits raise into their stream, as its other
  // waits do, and fail the device first: the peers learn it from their failure words, and no op
  // after an abandoned one could pair with a stale flag of it.
  GraphEnds graph_ends(uint32_t tag, Millis timeout, std::string context);

  // --- NOTE [Host device with CUDA's semantics] (host_device_cuda_semantics.cpp) ---
  // cuStreamWaitValue32: no deadline and no failure check of its own; the watchdog tracks it.
  void enqueue_cuda_wait(HostStream& h, std::vector<SignalWait> waits, Millis timeout,
                         std::string context);
  // A replayed graph's wait kernel, its poll and decisions the kernel's own
  // (p2p_workspace/signal_wait_body.hpp): gives up at its own deadline, from when the stream
  // reaches it, flags the peers it missed and traps; ends at once at the device's failure or
  // give-up and at a peer's, trapping there only where the group asked for it (NOTE [Who traps]).
  void enqueue_cuda_counted_wait(Stream& s, std::function<std::vector<SignalWait>()> resolve,
                                 Millis timeout, std::string context);
  // CUDA's semantics: the kernel's waits (NOTE [Counted waits end with the failure]).
  GraphEnds cuda_graph_ends(uint32_t tag, Millis timeout, std::string context);
  // The give-ups of counted waits as the device's failure ("" while there is none).
  std::string graph_give_up();
  // CudaDevice::check_graph_give_up: a counted wait that gave up fails the device for good, and
  // a peer's failure word fails it now (NOTE [Failure words]), both releasing the waits.
  void check_graph_give_up();
  // CudaDevice::poll_until: until `h` has run `target` tasks; raises the device's failure as soon
  // as there is one, and gives up at the group's timeout (after the watchdog's notice).
  void await_stream(HostStream& h, uint64_t target, const char* op);
};

}  // namespace cuda_p2p::host
