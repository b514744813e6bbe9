// The host device with CUDA's semantics (NOTE [Host device with CUDA's semantics] in
// host_device.hpp; the class: host_device_impl.hpp): signal waits watched as cuStreamWaitValue32,
// the wait kernels' model (p2p_workspace/signal_wait_body.hpp), and the stream polls of
// CudaDevice::poll_until.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>

#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/host/futex_wait.hpp"
#include "p2p_workspace/host/host_device_impl.hpp"
#include "p2p_workspace/signal_wait_body.hpp"

namespace cuda_p2p::host {

namespace {

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

}  // namespace

void HostDevice::use_cuda_semantics() {
  if (cuda_.load(std::memory_order_acquire)) return;
  watchdog_ = std::make_unique<Watchdog>(failure_, nullptr);
  watchdog_->add_probe([this] { return graph_give_up(); });
  cuda_.store(true, std::memory_order_release);
}

void HostDevice::enqueue_cuda_wait(HostStream& h, std::vector<SignalWait> waits, Millis timeout,
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

void HostDevice::enqueue_cuda_counted_wait(Stream& s,
                                           std::function<std::vector<SignalWait>()> resolve,
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
         "timed out after " + std::to_string(timeout.count()) + " ms: " + describe_ranks(missing) +
             " never arrived");
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

GraphEnds HostDevice::cuda_graph_ends(uint32_t tag, Millis timeout, std::string context) {
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
         "timed out after " + std::to_string(timeout.count()) + " ms: " + describe_ranks(missing) +
             " never arrived");
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

std::string HostDevice::graph_give_up() {
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

void HostDevice::check_graph_give_up() {
  if (failure_.failed()) return;
  if (failure_.peer_failure() >= 0 || give_ups_->count.load(std::memory_order_acquire) != 0) {
    watchdog_->check_memory_now();
  }
}

void HostDevice::await_stream(HostStream& h, uint64_t target, const char* op) {
  const Millis limit(timeout_ms_.load(std::memory_order_relaxed));
  auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
  auto finished = [&] {
    if (h.done() >= target) return true;
    check_healthy(op);
    if (std::chrono::steady_clock::now() < deadline) return false;
    // A wait on the stream that passed its own deadline names the ranks it awaited: give the
    // watchdog a pass here first, since its thread may not have run (a loaded machine) since.
    watchdog_->poll_now();
    check_healthy(op);
    // NOTE [Waits for a stream outlast the waits on it] in p2p_workspace/watchdog.cpp.
    if (const auto due = watchdog_->pending_deadline()) {
      if (*due + watchdog_->notice() > deadline) {
        deadline = *due + watchdog_->notice();
        return false;
      }
    }
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

}  // namespace cuda_p2p::host
