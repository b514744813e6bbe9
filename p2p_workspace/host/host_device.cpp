// The host device: the device interface on memfd blocks (../shared_block.cpp), host streams
// (host_stream.cpp), futex waits (futex_wait.cpp) and cross-memory reads (cross_memory.cpp).
#include "p2p_workspace/host/host_device.hpp"

#include <c10/util/Exception.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/host/cross_memory.hpp"
#include "p2p_workspace/host/futex_wait.hpp"
#include "p2p_workspace/host/host_stream.hpp"
#include "p2p_workspace/shared_block.hpp"
#include "p2p_workspace/signal_store_body.hpp"
#include "p2p_workspace/signal_wait_body.hpp"
#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p::host {

namespace {

HostStream& as_host(Stream& s) {
  auto* h = dynamic_cast<HostStream*>(&s);
  TORCH_CHECK(h, "cuda_p2p: a host device was given a stream of another device");
  return *h;
}

// CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

HostStreams resolve_mode(HostStreams mode) {
  return mode == HostStreams::kDefault ? HostStreams::kCooperative : mode;
}

uint32_t read_counter(const uint32_t* counter) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(counter)).load(std::memory_order_relaxed);
}

// The signal stores' policy on the host (p2p_workspace/signal_store_body.hpp). NOTE [Replay-safe
// signals] in p2p_workspace/symmetric_workspace.cpp: a counter is read and written only by the
// tasks of the streams of one channel, one at a time (relaxed atomics, ordered by the streams' own
// order); the words they produce are published by futex_store_and_wake's release exchange, which
// wakes a sleeping waiter (NOTE [Sleeper bit]).
struct HostStores {
  uint32_t load(const uint32_t* p) const { return read_counter(p); }
  void store(uint32_t* p, uint32_t v) const {
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_relaxed);
  }
  void publish(uint32_t* addr, uint32_t value) const { futex_store_and_wake(addr, value); }
};

// The task that makes `self` wait until `other` has run `seq` tasks (wait_event, and a replay's
// recorded waits). It holds `other`: as a CUDA event outlives its stream, a wait may still be
// queued when the stream it waits for has been dropped by its owner (a fused op's stream, with
// the ops returning queued: NOTE [Host device with CUDA's semantics]).
HostTask event_wait(HostStream& self, std::shared_ptr<HostStream> other, uint64_t seq) {
  if (self.mode() == HostStream::Mode::kCooperative) {
    return HostTask::when([other, seq] {
      if (other->done() < seq) return false;
      if (auto err = other->error()) std::rethrow_exception(err);
      return true;
    });
  }
  // Blocks (the inline stream of a cooperative device runs the streams meanwhile).
  return HostTask::blocking([other, seq] {
    other->wait_done(seq, /*rethrow=*/false);
    if (auto err = other->error()) std::rethrow_exception(err);
  });
}

// NOTE [Host device with CUDA's semantics] in host_device.hpp: a signal wait as the watchdog sees
// it - the count of its stream's tasks before the wait task. Its release writes a word as
// CudaWatchedWait::release does from the auxiliary stream.
class HostWatchedWait : public WatchedWait {
 public:
  HostWatchedWait(std::shared_ptr<HostStream> stream, uint64_t before,
                  std::vector<SignalWait> waits)
      : stream_(std::move(stream)), before_(before), waits_(std::move(waits)) {}
  bool started() override { return stream_->done() >= before_; }
  bool finished() override { return stream_->done() > before_; }
  std::vector<int> given_up() override { return {}; }
  std::vector<int> missing() override {
    std::vector<int> peers;
    for (const auto& w : waits_) {
      if (!arrived(w)) peers.push_back(w.peer);
    }
    return peers;
  }
  std::vector<SignalWait> awaited() const override { return waits_; }
  void release(uint32_t* word, uint32_t value) override { futex_store_and_wake(word, value); }
  const void* stream() const override { return stream_.get(); }

 private:
  std::shared_ptr<HostStream> stream_;
  uint64_t before_;
  std::vector<SignalWait> waits_;
};

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

// The waits' policy on the host (p2p_workspace/signal_wait_body.hpp), for a counted wait of a
// device with CUDA's semantics: the host's 31-bit sequence order (NOTE [Sleeper bit]), the
// device's give-up record and failure words; a device being destroyed ends every wait quietly.
struct HostWaits {
  const GraphGiveUps* give_ups;
  const std::atomic<bool>* gone;
  bool reached(const uint32_t* addr, uint32_t value) const {
    return arrived(SignalWait{addr, value, -1});
  }
  bool peer_failed() const {
    return !gone->load(std::memory_order_acquire) && give_ups->peer_failed();
  }
  bool ended() const {
    return gone->load(std::memory_order_acquire) || give_ups->ended() != GraphGiveUps::End::kNo;
  }
};
struct HostWaitList {
  const std::vector<SignalWait>& w;
  int count() const { return static_cast<int>(w.size()); }
  const uint32_t* addr(int i) const { return w[i].addr; }
  uint32_t value(int i) const { return w[i].value; }
};

// What a kernel's trap is on a host stream (NOTE [Who traps] in p2p_workspace/
// flag_barrier_body.hpp): the lost context it stands for, recorded (Device::lost_context), then
// the error of the stream, which skips the rest of its queue.
[[noreturn]] void trap(GraphGiveUps& give_ups, const std::string& context, const std::string& why) {
  const std::string what = "cuda_p2p " + context + ": " + why;
  {
    std::lock_guard<std::mutex> lock(give_ups.mu);
    if (give_ups.lost.empty()) give_ups.lost = what;
  }
  TORCH_CHECK(false, what, "; the kernel trapped (NOTE [Who traps])");
}
constexpr const char* kPeerFailedWhy =
    "a peer's failure reached this rank's failure word (NOTE [Failure words])";

bool all_arrived(const std::vector<SignalWait>& waits) {
  return std::all_of(waits.begin(), waits.end(), [](const SignalWait& w) { return arrived(w); });
}

// The blocking form of a CUDA-semantics wait (an executor thread's): polls until every word has
// arrived or `ended()` holds (true), or `deadline` passes (false).
bool block_until_arrived(const std::vector<SignalWait>& waits,
                         std::optional<std::chrono::steady_clock::time_point> deadline,
                         const std::function<bool()>& ended) {
  while (!all_arrived(waits)) {
    if (ended()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (deadline && now >= *deadline) return false;
    auto until = now + kMaxSleep;
    if (deadline) until = std::min(until, *deadline);
    for (const auto& w : waits) {
      if (!futex_sleep_until(w.addr, w.value, until)) break;
    }
  }
  return true;
}

// NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: "0x2a5f..." for the errors.
std::string tag_text(uint32_t tag) {
  char out[16];
  std::snprintf(out, sizeof(out), "0x%08x", tag);
  return out;
}

std::string foreign_tag(int peer, uint32_t seen, uint32_t tag) {
  return "rank " + std::to_string(peer) + " is at another captured op (its tag " + tag_text(seen) +
         ", this rank's " + tag_text(tag) +
         "): the ranks replayed different graphs, or one replayed a graph more or fewer times "
         "than its peers (NOTE [Graph flags])";
}

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

// The flag barrier's policy (p2p_workspace/flag_barrier_body.hpp) on the host: a flag's sleeper
// bit (NOTE [Sleeper bit]) is not its value, a store wakes the peer's sleeping thread, and the
// failures are the device's GraphEnds::check (which raises a peer's failure itself).
struct HostFlags {
  const GraphEnds* ends;
  uint32_t load_acquire(const uint32_t* p) const {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire) &
           0x7fffffffu;
  }
  // An exchange: its release publishes what this rank did before, the clears of its earlier
  // slots included.
  void store_release(uint32_t* p, uint32_t v) const { futex_store_and_wake(p, v); }
  void clear(uint32_t* p) const {
    std::atomic_ref<uint32_t>(*p).store(0, std::memory_order_relaxed);
  }
  void zero(uint32_t* p) const { clear(p); }
  uint32_t busy_cas(uint32_t* p, uint32_t expected, uint32_t desired) const {
    std::atomic_ref<uint32_t>(*p).compare_exchange_strong(expected, desired,
                                                          std::memory_order_acq_rel);
    return expected;  // the value found
  }
  bool peer_failed() const { return false; }
  // Asked once per pass over the flags (the first unset flag asks).
  bool ended() const {
    if (ended_ < 0) ended_ = ends->check() ? 1 : 0;
    return ended_ == 1;
  }
  mutable int ended_ = -1;
};

// NOTE [Graph flags]: one run of Device::graph_kernel on the host, as the kernel runs it, with the
// kernel's own stores, polls and decisions (p2p_workspace/flag_barrier_body.hpp): per barrier,
// store the tag into every peer's slot of every block, poll every flag still unset once per
// advance (a flag with this op's tag is consumed, another tag raises), then run the body's step
// on every block. advance() goes as far as the flags allow; it is copied with the task that holds
// it, so that every replay of a captured run starts afresh.
class GraphRun {
 public:
  GraphRun(const GraphLaunch& g, std::shared_ptr<const std::function<void(int, int)>> body,
           Millis timeout)
      : g_(g), body_(std::move(body)), timeout_(timeout) {}

  // True when the run is over (every barrier passed and the body ran, or it ended quietly).
  bool advance(const GraphEnds& ends) {
    if (!entered_) {
      // NOTE [One captured op at a time]: the kernel's entry.
      if (graph_take(g_, HostFlags{&ends}) != 0) return ends.busy();
      entered_ = true;
    }
    while (step_ < g_.barriers) {
      const HostFlags f{&ends};
      if (!stored_) store(f);
      const auto now = std::chrono::steady_clock::now();
      if (!deadline_) deadline_ = now + timeout_;
      const bool past_deadline = now >= *deadline_;
      size_t kept = 0;
      bool ended = false;
      for (size_t k = 0; k < waits_.size(); ++k) {
        uint32_t seen = 0;
        switch (flag_poll(g_, blocks_[k], step_, waits_[k].peer, past_deadline, f, &seen)) {
          case FlagPoll::kPassed:
            continue;
          case FlagPoll::kForeign:
            leave(f);
            ends.foreign(waits_[k].peer, seen);
            return true;  // not reached: foreign throws
          case FlagPoll::kTimedOut: {
            // Those not yet polled, and those kept: every flag still unset.
            std::vector<SignalWait> unset(waits_.begin(), waits_.begin() + kept);
            unset.insert(unset.end(), waits_.begin() + k, waits_.end());
            leave(f);
            ends.timed_out(unset);
            return true;  // not reached: timed_out throws
          }
          case FlagPoll::kEnded:
            ended = true;
            break;
          case FlagPoll::kWaiting:
          case FlagPoll::kPeerFailed:  // HostFlags: GraphEnds::check raised it
            break;
        }
        waits_[kept] = waits_[k];
        blocks_[kept] = blocks_[k];
        ++kept;
      }
      waits_.resize(kept);
      blocks_.resize(kept);
      if (ended) return leave(f);
      if (!waits_.empty()) return false;
      if (body_ && *body_) {
        for (int b = 0; b < g_.blocks; ++b) (*body_)(step_, b);
      }
      ++step_;
      stored_ = false;
    }
    return leave(HostFlags{&ends});
  }
  // The flags the current barrier still waits for.
  const std::vector<SignalWait>& waits() const { return waits_; }

 private:
  // The kernel's end, however it ends: the busy word back where the run gives it back.
  bool leave(const HostFlags& f) {
    if (entered_ && !left_) graph_release(g_, f);
    left_ = true;
    return true;
  }
  void store(const HostFlags& f) {
    waits_.clear();
    blocks_.clear();
    for (int b = 0; b < g_.blocks; ++b) {
      flag_open(g_, b, step_, 0, 1, f);
      for (int q = 0; q < g_.world_size; ++q) {
        if (q == g_.rank) continue;
        flag_arrive(g_, b, step_, q, f);
        waits_.push_back(SignalWait{g_.mine(b, step_, q), 1, q});  // set: a tag is >= 1
        blocks_.push_back(b);
      }
    }
    stored_ = true;
    deadline_.reset();
  }

  GraphLaunch g_;
  std::shared_ptr<const std::function<void(int, int)>> body_;
  Millis timeout_;
  int step_ = 0;
  bool stored_ = false;
  bool entered_ = false, left_ = false;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  std::vector<SignalWait> waits_;  // the flags still unset, and their blocks
  std::vector<int> blocks_;
};

// NOTE [Host capture]
// The host device's stand-in for CUDA graph capture, so that CI runs what a replayed graph runs
// (NOTE [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp). Between begin_capture
// and end_capture, work enqueued on the captured stream - and on every stream that waits for an
// event recorded in the capture, which joins it, as on CUDA - is recorded instead of run:
// each task as it was built, with the values and addresses it was given then. A replay
// enqueues the recorded tasks again, in the recorded order, each on its own stream; a recorded
// wait for a captured event becomes a wait for the same position of that stream's replayed
// tasks. Like a CUDA graph, a replay is ordered after the work already queued on those streams,
// and a capture may not depend on work outside it (waiting for an outside event raises) nor
// synchronize a captured stream. The inline stream cannot be captured: its work runs at once.
struct CaptureEntry {
  HostStream* stream;
  HostTask task;
  HostStream* other;  // is_wait: the stream whose captured tasks it waits for
  uint64_t seq;       // is_wait: how many of them
  bool is_wait;
};

class HostGraphImpl : public HostGraph {
 public:
  HostGraphImpl(std::vector<CaptureEntry> entries, std::set<std::shared_ptr<HostStream>> keep)
      : entries_(std::move(entries)), keep_(std::move(keep)) {}
  void replay() override {
    std::map<HostStream*, uint64_t> base;
    for (const auto& s : keep_) base[s.get()] = s->enqueued();
    for (const auto& e : entries_) {
      e.stream->enqueue(
          e.is_wait ? event_wait(*e.stream, e.other->shared_from_this(), base[e.other] + e.seq)
                    : e.task);
    }
  }
  size_t tasks() const override { return entries_.size(); }

 private:
  std::vector<CaptureEntry> entries_;
  std::set<std::shared_ptr<HostStream>> keep_;  // every stream the capture recorded tasks of
};

class HostDevice : public Device, public HostPaths {
 public:
  // Until rendezvous says how many CPUs the ranks share (set_ranks_cpus), this process's own
  // affinity stands for all of them.
  HostDevice(int processes, HostStreams mode, HostSemantics semantics)
      : processes_(processes),
        oversubscribed_(processes > usable_cpus()),
        cooperative_(resolve_mode(mode) == HostStreams::kCooperative),
        scheduler_(cooperative_ ? std::make_shared<CooperativeScheduler>(oversubscribed_.load())
                                : nullptr),
        inline_stream_(std::make_shared<HostStream>(HostStream::Mode::kInline, false, nullptr)) {
    failure_.mirror_to(&give_ups_->failed);  // NOTE [Counted waits end with the failure]
    if (semantics == HostSemantics::kCuda) use_cuda_semantics();
  }
  ~HostDevice() override {
    gone_->store(true, std::memory_order_release);  // CUDA-semantics waits still queued exit
    watchdog_.reset();
  }

  // NOTE [Host device with CUDA's semantics] in host_device.hpp.
  void use_cuda_semantics() {
    if (cuda_.load(std::memory_order_acquire)) return;
    watchdog_ = std::make_unique<Watchdog>(failure_, nullptr);
    watchdog_->set_probe([this] { return graph_give_up(); });
    cuda_.store(true, std::memory_order_release);
  }
  // NOTE [Host fast paths]. The device is its own capability.
  HostPaths* host_paths() const override { return const_cast<HostDevice*>(this); }
  bool synchronous() const override { return !cuda(); }
  // Ordinary memory serves: the host's work reads and writes any of it. Kept for the device's
  // life, as the CUDA device keeps its pinned pool.
  HostWords host_words(size_t n) override {
    auto words = std::make_unique<uint32_t[]>(n);  // zeroed
    uint32_t* p = words.get();
    std::lock_guard<std::mutex> lock(streams_mu_);
    host_words_.push_back(std::move(words));
    return {p, p};
  }

  std::string name() const override { return "cpu"; }
  at::Device tensor_device() const override { return at::Device(at::kCPU); }
  int device_index() const override { return -1; }
  bool blocks_outlive_owner() const override { return true; }
  std::string block_memory() const override { return "memfd"; }

  std::shared_ptr<Block> allocate(size_t bytes) override { return allocate_shared_block(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override {
    return export_shared_block(block, max_peers);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override {
    return import_shared_block(handle, bytes, timeout);
  }
  std::shared_ptr<CrossMemoryReader> cross_memory_reader(bool deny) override {
    return make_cross_memory_reader(deny);  // host/cross_memory.cpp
  }

  // One inline stream per device object: it carries no state but its counters. A thread that
  // chose another (set_current_stream) gets that one.
  // With CUDA's semantics a thread without a stream of its choice gets a stream of its own, made
  // on first use, as a CUDA thread gets its default stream.
  std::shared_ptr<Stream> current_stream() override {
    if (!cuda() && !any_callers_.load(std::memory_order_acquire)) return inline_stream_;
    std::lock_guard<std::mutex> lock(streams_mu_);
    const auto self = std::this_thread::get_id();
    for (const auto& [thread, stream] : callers_) {
      if (thread == self) return stream;
    }
    if (!cuda()) return inline_stream_;
    for (const auto& [thread, stream] : defaults_) {
      if (thread == self) return stream;
    }
    auto s = make_stream_locked(false);
    defaults_.emplace_back(self, s);
    return s;
  }
  std::shared_ptr<Stream> new_stream(bool high_priority) override {
    std::lock_guard<std::mutex> lock(streams_mu_);
    return make_stream_locked(high_priority);
  }

  void set_current_stream(std::shared_ptr<Stream> stream) {
    TORCH_CHECK(!stream || stream == inline_stream_ || own(*stream),
                "cuda_p2p: set_current_stream needs a stream of this device (new_stream)");
    std::lock_guard<std::mutex> lock(streams_mu_);
    const auto self = std::this_thread::get_id();
    std::erase_if(callers_, [&](const auto& c) { return c.first == self; });
    if (stream && stream != inline_stream_) callers_.emplace_back(self, std::move(stream));
    any_callers_.store(!callers_.empty(), std::memory_order_release);
  }

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    enqueue(s, HostTask::work([dst, src, n] { std::memcpy(dst, src, n); }));
  }

  // The signal stores' bodies are the CUDA kernels' (p2p_workspace/signal_store_body.hpp).
  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    check_not_captured(as_host(s), "write_signal (a sequence number; NOTE [Replay-safe signals])");
    enqueue(s, HostTask::work([addr, value] { signal_write(addr, value, HostStores{}); }));
  }
  void advance_counter(Stream& s, uint32_t* counter, uint32_t delta) override {
    enqueue(s, HostTask::work([counter, delta] { counter_advance(counter, delta, HostStores{}); }));
  }
  void write_counted(Stream& s, uint32_t* addr, const uint32_t* counter, uint32_t offset) override {
    enqueue(s, HostTask::work([addr, counter, offset] {
              counted_write(addr, counter, offset, HostStores{});
            }));
  }
  void wait_counted(Stream& s, std::vector<CountedWait> counted, Millis timeout,
                    std::string context) override {
    if (cuda()) {
      check_healthy(context.c_str());
    } else {
      failure_.check(context.c_str());
    }
    if (counted.empty()) return;
    auto& h = as_host(s);
    // The values are read when the stream reaches the wait, then it is an ordinary wait.
    auto resolve = [counted = std::move(counted)] {
      std::vector<SignalWait> waits;
      waits.reserve(counted.size());
      for (const auto& c : counted) {
        waits.push_back(SignalWait{c.addr, read_counter(c.counter) + c.offset, c.peer});
      }
      return waits;
    };
    if (cuda()) {
      enqueue_cuda_counted_wait(s, std::move(resolve), timeout, std::move(context));
      return;
    }
    if (h.mode() == HostStream::Mode::kCooperative) {
      // `late` is shared by the copies a replay enqueues of a captured task: they run one after
      // another on the stream, and only the one at its head fills or reads it.
      auto late = std::make_shared<std::vector<SignalWait>>();
      HostTask t = HostTask::when(
          [resolve, late, timeout, context = std::move(context),
           deadline = std::optional<std::chrono::steady_clock::time_point>(), this]() mutable {
            if (!deadline) {
              *late = resolve();
              deadline = std::chrono::steady_clock::now() + timeout;
            }
            return check_waits(*late, *deadline, timeout, context, failure_);
          });
      t.late_waits = late;
      enqueue(s, std::move(t));
      return;
    }
    if (h.mode() == HostStream::Mode::kInline && cooperative_) {
      enqueue(s, HostTask::blocking([this, resolve, timeout, context = std::move(context)] {
                const auto waits = resolve();
                const auto deadline = std::chrono::steady_clock::now() + timeout;
                scheduler_->drive(
                    [&] { return check_waits(waits, deadline, timeout, context, failure_); },
                    waits);
              }));
      return;
    }
    enqueue(s, HostTask::blocking([resolve, timeout, context = std::move(context),
                                   oversubscribed = oversubscribed_.load(std::memory_order_relaxed),
                                   this] {
              block_on_waits(resolve(), timeout, context, oversubscribed, failure_);
            }));
  }

  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: the whole run is one task of `s`.
  void graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body, Millis timeout,
                    std::string context) override {
    if (cuda()) {
      check_healthy(context.c_str());
    } else {
      failure_.check(context.c_str());
    }
    auto& h = as_host(s);
    GraphRun run(launch,
                 body.host
                     ? std::make_shared<const std::function<void(int, int)>>(std::move(body.host))
                     : nullptr,
                 timeout);
    const GraphEnds ends = cuda() ? cuda_graph_ends(launch.tag, timeout, std::move(context))
                                  : graph_ends(launch.tag, timeout, std::move(context));
    if (h.mode() == HostStream::Mode::kCooperative) {
      // `late` is shared by the copies a replay enqueues: they run one after another on the
      // stream, and only the one at its head fills or reads it (as in wait_counted).
      auto late = std::make_shared<std::vector<SignalWait>>();
      HostTask t = HostTask::when([run, ends, late]() mutable {
        if (run.advance(ends)) return true;
        *late = run.waits();
        return false;
      });
      t.late_waits = late;
      enqueue(s, std::move(t));
      return;
    }
    if (h.mode() == HostStream::Mode::kInline && cooperative_) {
      enqueue(s, HostTask::blocking([this, run, ends]() mutable {
                scheduler_->drive([&] { return run.advance(ends); });
              }));
      return;
    }
    enqueue(s, HostTask::blocking(
                   [run, ends,
                    oversubscribed = oversubscribed_.load(std::memory_order_relaxed)]() mutable {
                     while (!run.advance(ends)) {
                       if (poll_briefly(run.waits(), oversubscribed)) continue;
                       const auto until = std::chrono::steady_clock::now() + kMaxSleep;
                       for (const auto& w : run.waits()) {
                         if (!futex_sleep_until(w.addr, w.value, until)) break;
                       }
                     }
                   }));
  }

  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    failure_.check(context.c_str());
    auto& h = as_host(s);
    check_not_captured(h, "wait_signals (a sequence number; NOTE [Replay-safe signals])");
    if (cuda()) {
      if (waits.empty()) return;
      enqueue_cuda_wait(h, std::move(waits), timeout, std::move(context));
      return;
    }
    if (h.mode() == HostStream::Mode::kCooperative) {
      // Tried by the scheduler until it holds; the timeout counts from the first try.
      std::optional<std::chrono::steady_clock::time_point> deadline;
      enqueue(s, HostTask::when(
                     [waits, timeout, context = std::move(context), deadline, this]() mutable {
                       if (!deadline) deadline = std::chrono::steady_clock::now() + timeout;
                       return check_waits(waits, *deadline, timeout, context, failure_);
                     },
                     waits));
      return;
    }
    if (h.mode() == HostStream::Mode::kInline && cooperative_) {
      // The caller waits, and runs the cooperative streams meanwhile.
      enqueue(s, HostTask::blocking(
                     [this, waits = std::move(waits), timeout, context = std::move(context)] {
                       const auto deadline = std::chrono::steady_clock::now() + timeout;
                       scheduler_->drive(
                           [&] { return check_waits(waits, deadline, timeout, context, failure_); },
                           waits);
                     }));
      return;
    }
    enqueue(s, HostTask::blocking(
                   [waits = std::move(waits), timeout, context = std::move(context),
                    oversubscribed = oversubscribed_.load(std::memory_order_relaxed),
                    this] { block_on_waits(waits, timeout, context, oversubscribed, failure_); }));
  }

  // On the host, device work is host work: both run the closure in stream order.
  void launch(Stream& s, std::function<void()> fn) override {
    enqueue(s, HostTask::work(std::move(fn)));
  }
  void host_task(Stream& s, std::function<void()> fn) override {
    enqueue(s, HostTask::work(std::move(fn)));
  }

  // A closure queued on a host stream reads raw pointers: a no-op task after it, holding `t`,
  // keeps the tensor's memory until the stream has passed this point (NOTE [Tensors in stream
  // order] in backend/workspace_collectives.cpp). Work on a synchronous device or the inline
  // stream has run already.
  void record_stream(const at::Tensor& t, Stream& s) override {
    if (!cuda() || runs_inline(s)) return;
    enqueue(s, HostTask::work([t] {}));
  }

  std::shared_ptr<Event> record(Stream& s) override {
    auto& h = as_host(s);
    if (capturing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(capture_mu_);
      if (capture_ && capture_->counts.count(&h)) {  // NOTE [Host capture]
        return std::make_shared<HostEvent>(h.shared_from_this(), capture_->counts[&h],
                                           capture_->id);
      }
    }
    // The event keeps the stream alive for whoever waits on it.
    return std::make_shared<HostEvent>(h.shared_from_this(), h.enqueued());
  }

  void wait_event(Stream& s, const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    auto& self = as_host(s);
    if (ev->stream.get() == &self) return;
    if (ev->capture != 0 || capturing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(capture_mu_);
      const bool active = capture_ && capture_->id == ev->capture;
      if (active) {  // NOTE [Host capture]: `s` joins the capture, the wait is recorded
        capture_->counts.try_emplace(&self, 0);
        capture_->keep.insert(self.shared_from_this());
        capture_->entries.push_back(
            CaptureEntry{&self, HostTask{}, ev->stream.get(), ev->seq, /*is_wait=*/true});
        ++capture_->counts[&self];
        return;
      }
      TORCH_CHECK(ev->capture == 0, "cuda_p2p: a host stream waits for an event recorded in ",
                  "a capture that has ended; wait for work after its replay instead");
      TORCH_CHECK(!capture_ || !capture_->counts.count(&self),
                  "cuda_p2p: a stream being captured waits for an event recorded outside the ",
                  "capture (a replay could not depend on it; NOTE [Host capture])");
    }
    self.enqueue(event_wait(self, ev->stream, ev->seq));
  }

  void synchronize(Stream& s) override {
    auto& h = as_host(s);
    check_not_captured(h, "synchronize");
    if (cuda()) await_stream(h, h.enqueued(), "synchronize");
    h.wait_done(h.enqueued(), /*rethrow=*/true);
  }

  void synchronize(const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    check_event_not_captured(e, "synchronize");  // as CUDA refuses it
    if (cuda()) await_stream(*ev->stream, ev->seq, "synchronize");
    ev->stream->wait_done(ev->seq, /*rethrow=*/false);
    if (auto err = ev->stream->error()) std::rethrow_exception(err);
    failure_.check("synchronize");
  }

  // With CUDA's semantics nothing runs unless someone waits: a query runs at most one task of the
  // cooperative streams first, so that polling it makes progress.
  bool query(const Event& e) override {
    check_event_not_captured(e, "Work.is_completed");  // as CUDA refuses it
    if (!cuda()) return true;
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    if (ev->stream->mode() == HostStream::Mode::kCooperative && ev->stream->done() < ev->seq) {
      bool once = false;
      scheduler_->drive([&] { return std::exchange(once, true); });
    }
    return ev->stream->done() >= ev->seq;
  }

  // An op on the inline stream drains its streams before it returns (pipeline::end), so nothing
  // is in flight; one on a stream of set_current_stream may be, as on a GPU.
  void quiesce() override {
    if (cuda()) {
      for (auto& s : live_streams()) await_stream(*s, s->enqueued(), "quiesce");
      return;
    }
    if (!any_callers_.load(std::memory_order_acquire)) return;
    for (auto& s : live_streams()) {
      if (s->mode() == HostStream::Mode::kCooperative) {
        const uint64_t target = s->enqueued();
        scheduler_->drive([&] { return s->done() >= target; });
      } else {
        s->wait_done(s->enqueued(), /*rethrow=*/false);
      }
    }
  }

  // NOTE [Teardown drains] in p2p_workspace/symmetric_workspace.cpp.
  bool drain(Millis limit) noexcept override {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    try {
      for (auto& s : live_streams()) {
        const uint64_t target = s->enqueued();
        auto on_time = [&] {
          if (s->done() >= target) return true;
          if (std::chrono::steady_clock::now() >= deadline) throw std::runtime_error("late");
          return false;
        };
        if (s->mode() == HostStream::Mode::kCooperative) {
          scheduler_->drive(on_time);
        } else {
          while (!on_time()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    } catch (...) {
      return false;
    }
    return true;
  }

  // NOTE [Inline signals] in p2p_workspace/device.hpp. The inline stream counts no task for
  // these: an event recorded on it is complete whatever its count, as everything on it is.
  bool runs_inline(const Stream& s) const override { return &s == inline_stream_.get(); }
  void write_signal_now(uint32_t* addr, uint32_t value) override {
    futex_store_and_wake(addr, value);
  }
  bool poll_signals_now(c10::ArrayRef<SignalWait> waits) override {
    return poll_briefly(waits, oversubscribed_.load(std::memory_order_relaxed));
  }

  // --- NOTE [Host capture] ---
  uint64_t capture_id(Stream& s) override {
    if (!capturing_.load(std::memory_order_acquire)) return 0;
    auto& h = as_host(s);
    std::lock_guard<std::mutex> lock(capture_mu_);
    return capture_ && capture_->counts.count(&h) ? capture_->id : 0;
  }
  void begin_capture(const std::shared_ptr<Stream>& stream) {
    TORCH_CHECK(stream && own(*stream),
                "cuda_p2p begin_capture: needs a stream of this device made by new_stream (the "
                "inline stream runs its work at once and cannot be captured)");
    auto h = std::dynamic_pointer_cast<HostStream>(stream);
    std::lock_guard<std::mutex> lock(capture_mu_);
    TORCH_CHECK(!capture_,
                "cuda_p2p begin_capture: a capture is already in progress on this "
                "device (end it first)");
    capture_.emplace();
    capture_->id = ++captures_;
    capture_->counts[h.get()] = 0;
    capture_->keep.insert(h);
    capturing_.store(true, std::memory_order_release);
  }
  std::shared_ptr<HostGraph> end_capture() {
    std::lock_guard<std::mutex> lock(capture_mu_);
    TORCH_CHECK(capture_, "cuda_p2p end_capture: no capture is in progress on this device");
    auto graph =
        std::make_shared<HostGraphImpl>(std::move(capture_->entries), std::move(capture_->keep));
    capture_.reset();
    capturing_.store(false, std::memory_order_release);
    return graph;
  }

  // NOTE [Device failure]: every wait loop of this device checks failure_ on each pass (at most
  // kMaxSleep apart) and raises. With CUDA's semantics the watchdog releases the waits instead.
  void abort(const std::string& why) override {
    if (cuda()) {
      watchdog_->fail(why);
    } else {
      failure_.fail(why);
    }
  }
  // NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp.
  bool retire(const std::string& why, Millis limit) override {
    const bool drained = drain(limit);
    if (cuda()) {
      watchdog_->fail(why, drained);
    } else {
      failure_.fail(why, drained);
    }
    return drained;
  }
  void check_healthy(const char* op) override {
    if (cuda()) check_graph_give_up();
    failure_.check(op);
  }
  void check_work(const char* op) override {
    if (cuda()) check_graph_give_up();
    failure_.check_work(op);
  }
  std::string lost_context() const override {
    std::lock_guard<std::mutex> lock(give_ups_->mu);
    return give_ups_->lost;
  }
  // NOTE [Failure words] in p2p_workspace/watchdog.hpp.
  bool has_failure_words() const override { return failure_.has_words(); }
  void set_failure_words(FailureWords words) override {
    if (failure_.has_words()) return;
    {
      std::lock_guard<std::mutex> lock(streams_mu_);
      areas_ = std::move(words.areas);
    }
    give_ups_->area = areas_.empty() ? nullptr : areas_.front();
    give_ups_->trap_on_peer_failure.store(words.trap_on_peer_failure, std::memory_order_release);
    give_ups_->rank.store(words.rank, std::memory_order_relaxed);
    give_ups_->peer_word.store(words.own, std::memory_order_release);
    failure_.set_words(words.rank, words.own, std::move(words.peers));
  }
  void forget_failure_peers(const std::vector<int>& ranks) override {
    failure_.forget_peers(ranks);  // first: no word of theirs is written once it returns
    std::vector<std::shared_ptr<Block>> gone;  // unmapped after the lock is released
    std::lock_guard<std::mutex> lock(streams_mu_);
    const int rank = give_ups_->rank.load(std::memory_order_relaxed);
    for (int r : ranks) {
      const size_t i = FailureWords::area_index(rank, r);
      if (r != rank && i < areas_.size() && areas_[i]) gone.push_back(std::move(areas_[i]));
    }
  }
  void set_timeout(Millis timeout) override {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }
  void set_ranks_cpus(int cpus) override {
    ranks_cpus_.store(cpus, std::memory_order_relaxed);
    const bool over = processes_ > std::max(1, cpus);
    oversubscribed_.store(over, std::memory_order_relaxed);
    if (scheduler_) scheduler_->set_oversubscribed(over);
  }
  int ranks_cpus() const override { return ranks_cpus_.load(std::memory_order_relaxed); }
  bool oversubscribed() const override { return oversubscribed_.load(std::memory_order_relaxed); }

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

  bool cuda() const { return cuda_.load(std::memory_order_acquire); }

  std::shared_ptr<HostStream> make_stream_locked(bool high_priority) {
    std::shared_ptr<HostStream> s;
    if (!cooperative_) {
      s = std::make_shared<HostStream>(HostStream::Mode::kThread, high_priority, nullptr);
    } else {
      s = std::make_shared<HostStream>(HostStream::Mode::kCooperative, high_priority, scheduler_);
      scheduler_->add(s);
    }
    std::erase_if(streams_, [](const auto& w) { return w.expired(); });
    streams_.push_back(s);
    return s;
  }

  // --- NOTE [Host device with CUDA's semantics] in host_device.hpp ---
  // cuStreamWaitValue32: no deadline and no failure check of its own; the watchdog tracks it.
  void enqueue_cuda_wait(HostStream& h, std::vector<SignalWait> waits, Millis timeout,
                         std::string context) {
    TORCH_CHECK(h.mode() != HostStream::Mode::kInline,
                "cuda_p2p: a host device with CUDA's semantics waits on its inline stream");
    const uint64_t before = h.enqueued();
    if (h.mode() == HostStream::Mode::kCooperative) {
      enqueue(h, HostTask::when(
                     [waits, gone = gone_] {
                       return gone->load(std::memory_order_acquire) || all_arrived(waits);
                     },
                     waits));
    } else {
      enqueue(h, HostTask::blocking([waits, gone = gone_] {
                (void)block_until_arrived(waits, std::nullopt,
                                          [&] { return gone->load(std::memory_order_acquire); });
              }));
    }
    watchdog_->track(
        std::make_unique<HostWatchedWait>(h.shared_from_this(), before, std::move(waits)), timeout,
        std::move(context));
  }
  // A replayed graph's wait kernel, its poll and decisions the kernel's own
  // (p2p_workspace/signal_wait_body.hpp): gives up at its own deadline, from when the stream
  // reaches it, flags the peers it missed and traps; ends at once at the device's failure or
  // give-up and at a peer's, trapping there only where the group asked for it (NOTE [Who traps]).
  void enqueue_cuda_counted_wait(Stream& s, std::function<std::vector<SignalWait>()> resolve,
                                 Millis timeout, std::string context) {
    auto& h = as_host(s);
    TORCH_CHECK(h.mode() != HostStream::Mode::kInline,
                "cuda_p2p: a host device with CUDA's semantics waits on its inline stream");
    watchdog_->arm();  // NOTE [Counted waits end with the failure]
    // One poll from wait *next on: true when the wait is over; traps where the kernel would,
    // after recording what it records.
    auto poll = [timeout, context, give_ups = give_ups_, gone = gone_](
                    const std::vector<SignalWait>& waits, int* next, bool past_deadline) {
      const HostWaits f{give_ups.get(), gone.get()};
      const HostWaitList list{waits};
      const FlagPoll p = signal_wait_poll(list, next, past_deadline, f);
      switch (
          counted_wait_outcome(p, give_ups->trap_on_peer_failure.load(std::memory_order_acquire))) {
        case FlagOutcome::kPass:
          return p == FlagPoll::kPassed;
        case FlagOutcome::kEnd:
          return true;
        case FlagOutcome::kFail:
          break;
      }
      std::vector<int> missing;
      signal_wait_missing(list, *next, f, [&](int j) { missing.push_back(waits[j].peer); });
      give_ups->record(missing, p == FlagPoll::kTimedOut);
      if (p == FlagPoll::kPeerFailed) {
        trap(*give_ups, context, kPeerFailedWhy);
      }
      trap(*give_ups, context,
           "timed out after " + std::to_string(timeout.count()) +
               " ms: " + describe_ranks(missing) + " never arrived");
    };
    if (h.mode() == HostStream::Mode::kCooperative) {
      auto late = std::make_shared<std::vector<SignalWait>>();  // as in wait_counted
      HostTask t = HostTask::when(
          [resolve, late, timeout, poll, next = 0,
           deadline = std::optional<std::chrono::steady_clock::time_point>()]() mutable {
            if (!deadline) {
              *late = resolve();
              deadline = std::chrono::steady_clock::now() + timeout;
            }
            return poll(*late, &next, std::chrono::steady_clock::now() >= *deadline);
          });
      t.late_waits = late;
      enqueue(s, std::move(t));
      return;
    }
    enqueue(s, HostTask::blocking([resolve, timeout, poll] {
              const auto waits = resolve();
              const auto deadline = std::chrono::steady_clock::now() + timeout;
              int next = 0;
              while (true) {
                const auto now = std::chrono::steady_clock::now();
                if (poll(waits, &next, now >= deadline)) return;
                // Not over: wait `next` is missing. Asleep at most kMaxSleep, so that the ends are
                // seen.
                (void)futex_sleep_until(waits[next].addr, waits[next].value,
                                        std::min(now + kMaxSleep, deadline));
              }
            }));
  }
  // NOTE [Graph flags]: the synchronous host's flag waits raise into their stream, as its other
  // waits do, and fail the device first: the peers learn it from their failure words, and no op
  // after an abandoned one could pair with a stale flag of it.
  GraphEnds graph_ends(uint32_t tag, Millis timeout, std::string context) {
    auto why = std::make_shared<const std::string>(std::move(context));
    GraphEnds e;
    e.check = [this, why] {
      failure_.check(why->c_str());
      return false;
    };
    e.timed_out = [this, why, timeout](const std::vector<SignalWait>& waits) {
      std::vector<int> missing;
      for (const auto& w : waits) {
        if (!arrived(w)) missing.push_back(w.peer);
      }
      const std::string what = *why + " timed out after " + std::to_string(timeout.count()) +
                               " ms: " + describe_ranks(missing) + " never arrived";
      failure_.fail(what);
      TORCH_CHECK(false, "cuda_p2p ", what);
    };
    e.foreign = [this, why, tag](int peer, uint32_t seen) {
      const std::string what = *why + ": " + foreign_tag(peer, seen, tag);
      failure_.fail(what);
      TORCH_CHECK(false, "cuda_p2p ", what);
    };
    e.busy = [this, why, tag]() -> bool {
      const std::string what = *why + ": " + graph_busy_text(tag, "graph");
      failure_.fail(what);
      TORCH_CHECK(false, "cuda_p2p ", what);
    };
    return e;
  }
  // CUDA's semantics: the kernel's waits (NOTE [Counted waits end with the failure]).
  GraphEnds cuda_graph_ends(uint32_t tag, Millis timeout, std::string context) {
    watchdog_->arm();
    auto why = std::make_shared<const std::string>(std::move(context));
    GraphEnds e;
    e.check = [why, give_ups = give_ups_, gone = gone_] {
      if (gone->load(std::memory_order_acquire)) return true;
      switch (give_ups->ended()) {
        case GraphGiveUps::End::kNo:
          return false;
        case GraphGiveUps::End::kPeerFailed:
          // NOTE [Who traps]: quietly, unless the group traps at a peer's failure.
          if (flag_outcome(FlagPoll::kPeerFailed,
                           give_ups->trap_on_peer_failure.load(std::memory_order_acquire)) ==
              FlagOutcome::kFail) {
            trap(*give_ups, *why, kPeerFailedWhy);
          }
          return true;
        default:
          return true;
      }
    };
    e.timed_out = [why, timeout, give_ups = give_ups_](const std::vector<SignalWait>& waits) {
      std::vector<int> missing;
      for (const auto& w : waits) {
        if (!arrived(w)) missing.push_back(w.peer);
      }
      give_ups->record(missing, true);
      trap(*give_ups, *why,
           "timed out after " + std::to_string(timeout.count()) +
               " ms: " + describe_ranks(missing) + " never arrived");
    };
    e.foreign = [why, tag, give_ups = give_ups_](int peer, uint32_t seen) {
      give_ups->record_foreign(peer, seen, tag);
      trap(*give_ups, *why, foreign_tag(peer, seen, tag));
    };
    // NOTE [One captured op at a time]: recorded, quietly (the watchdog fails the device).
    e.busy = [tag, give_ups = give_ups_] {
      give_ups->record_busy(tag);
      return true;
    };
    return e;
  }
  // The give-ups of counted waits as the device's failure ("" while there is none).
  std::string graph_give_up() {
    if (give_ups_->count.load(std::memory_order_acquire) == 0) return "";
    std::vector<int> peers;
    std::string foreign;
    {
      std::lock_guard<std::mutex> lock(give_ups_->mu);
      // NOTE [One captured op at a time]: nothing ran, and the waits it caused say less.
      if (give_ups_->busy != 0) return graph_busy_text(give_ups_->busy_tag, "graph");
      peers.assign(give_ups_->peers.begin(), give_ups_->peers.end());
      if (!give_ups_->foreign.empty()) {
        foreign = "a flag barrier of a replayed graph met another op: " +
                  foreign_tag(*give_ups_->foreign.begin(), give_ups_->seen_tag, give_ups_->own_tag);
      }
    }
    if (!foreign.empty()) return foreign;
    return "a wait of a replayed graph timed out: " + describe_ranks(peers) +
           " never arrived (the graph's work went on with stale data; NOTE [Replay-safe "
           "signals])";
  }
  // CudaDevice::check_graph_give_up: a counted wait that gave up fails the device for good, and
  // a peer's failure word fails it now (NOTE [Failure words]), both releasing the waits.
  void check_graph_give_up() {
    if (failure_.failed()) return;
    if (failure_.peer_failure() >= 0 || give_ups_->count.load(std::memory_order_acquire) != 0) {
      watchdog_->check_memory_now();
    }
  }
  // CudaDevice::poll_until: until `h` has run `target` tasks; raises the device's failure as soon
  // as there is one, and gives up at the group's timeout (after the watchdog's notice).
  void await_stream(HostStream& h, uint64_t target, const char* op) {
    const Millis limit(timeout_ms_.load(std::memory_order_relaxed));
    const auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
    auto finished = [&] {
      if (h.done() >= target) return true;
      check_healthy(op);
      if (std::chrono::steady_clock::now() < deadline) return false;
      // A wait on the stream that passed its own deadline names the ranks it awaited: give the
      // watchdog a pass here first, since its thread may not have run (a loaded machine) since.
      watchdog_->poll_now();
      check_healthy(op);
      TORCH_CHECK(false, "cuda_p2p ", op, " on ", name(),
                  ": the stream did not finish within the group's timeout of ", limit.count(),
                  " ms (work queued on it before this group's op - a long task, or a wait of "
                  "another group - still holds it)");
      return false;
    };
    if (h.mode() == HostStream::Mode::kCooperative) {
      scheduler_->drive(finished);
    } else {
      auto nap = std::chrono::microseconds(1);
      while (!finished()) {
        std::this_thread::sleep_for(nap);
        nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
      }
    }
    watchdog_->poll_now();
    check_healthy(op);
  }

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

  // Every task of this device goes through here: recorded when its stream is being captured.
  void enqueue(Stream& s, HostTask task) {
    auto& h = as_host(s);
    if (capturing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(capture_mu_);
      if (capture_ && capture_->counts.count(&h)) {
        capture_->entries.push_back(CaptureEntry{&h, std::move(task), nullptr, 0, false});
        ++capture_->counts[&h];
        return;
      }
    }
    h.enqueue(std::move(task));
  }
  void check_not_captured(HostStream& h, const char* what) {
    if (!capturing_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(capture_mu_);
    TORCH_CHECK(!capture_ || !capture_->counts.count(&h), "cuda_p2p ", what,
                ": the stream is being captured (NOTE [Host capture]): its work runs at replay");
  }

  bool own(const Stream& s) {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (const auto& w : streams_) {
      if (w.lock().get() == &s) return true;
    }
    return false;
  }
  std::vector<std::shared_ptr<HostStream>> live_streams() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::vector<std::shared_ptr<HostStream>> live;
    for (const auto& w : streams_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    return live;
  }
};

}  // namespace

}  // namespace cuda_p2p::host

namespace cuda_p2p {
HostStreams parse_host_streams(const std::string& value, const std::string& what) {
  if (value == "auto") return HostStreams::kDefault;
  if (value == "cooperative") return HostStreams::kCooperative;
  if (value == "threads") return HostStreams::kThreads;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'cooperative' or 'threads', got '",
                    value, "'");
}

HostSemantics parse_host_semantics(const std::string& value, const std::string& what) {
  if (value == "auto" || value == "synchronous") return HostSemantics::kSynchronous;
  if (value == "cuda") return HostSemantics::kCuda;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'synchronous' or 'cuda', got '",
                    value, "'");
}

std::shared_ptr<Device> make_host_device(int processes, HostStreams streams,
                                         HostSemantics semantics) {
  return std::make_shared<host::HostDevice>(processes, streams, semantics);
}

void use_cuda_semantics(Device& device) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: use_cuda_semantics needs a host device, got ", device.name());
  host->use_cuda_semantics();
}

void set_current_stream(Device& device, std::shared_ptr<Stream> stream) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: set_current_stream needs a host device, got ", device.name());
  host->set_current_stream(std::move(stream));
}

void begin_capture(Device& device, const std::shared_ptr<Stream>& stream) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: begin_capture needs a host device, got ", device.name());
  host->begin_capture(stream);
}

std::shared_ptr<HostGraph> end_capture(Device& device) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: end_capture needs a host device, got ", device.name());
  return host->end_capture();
}
}  // namespace cuda_p2p
