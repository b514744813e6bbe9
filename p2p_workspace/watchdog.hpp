// How a device fails and how a failure reaches the host: the sticky failure state every device
// keeps, and the watchdog that enforces wait deadlines where the host does not run the waits
// itself (CUDA). Device-independent, so that the host tests exercise it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

// NOTE [Device failure]
// A device fails in one of two ways: abort() (ProcessGroupCudaP2P::abort()/shutdown(), from any
// thread, possibly while another thread is blocked in a wait), or a signal wait that missed its
// deadline. The first failure is kept and is sticky: every later op, wait, Work.wait() and
// synchronize() of the device raises it. Nothing un-fails a device; the group must be recreated
// (after a missed deadline the ranks no longer agree on the signal counts anyway).
//  - On the host every wait runs in a host thread, checks the failure on every pass (at least
//    every 10 ms) and raises: a rank blocked in a collective returns promptly after abort().
//  - On CUDA the waits run on GPU streams (cuStreamWaitValue32, or the wait kernel), which the
//    host cannot cancel. A per-device Watchdog thread (one per group: no process-wide state)
//    observes each wait through events recorded before and after it; when a stream has been at a
//    wait for longer than its timeout it records the failure, naming the op and the ranks whose
//    signals never arrived. The wait kernel (the fallback where stream memory operations are
//    missing) gives up at its own deadline and flags the peers it gave up on in host-mapped
//    memory; the watchdog turns the flag into the failure, so the stale data the stream then
//    computes on is never returned silently: the host raises for that op (Work.wait(),
//    synchronize, the next op). A stream blocked in cuStreamWaitValue32 stays blocked: the user
//    must treat the process's CUDA work as lost (destroy the group and exit, as with NCCL's
//    watchdog, or relaunch the job). A process blocked outside cuda_p2p behind that stream
//    (torch.cuda.synchronize(), .item()) never gets to raise, so the watchdog also says the
//    failure once on stderr (a warning) when it records it.
class FailureState {
 public:
  // Records `why` unless a failure was recorded already; returns whether this call recorded it.
  bool fail(const std::string& why);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string reason() const;
  // Raises "cuda_p2p <op>: <reason>" once failed (the test inline: on every op's path).
  void check(const char* op) const {
    if (failed()) raise(op);
  }

 private:
  [[noreturn]] void raise(const char* op) const;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// What the watchdog observes of one wait a stream executes.
class WatchedWait {
 public:
  virtual ~WatchedWait() = default;
  // The stream has reached the wait (all its earlier work has run): the deadline starts.
  virtual bool started() = 0;
  // The stream has passed the wait.
  virtual bool finished() = 0;
  // Once finished(): the peers a wait kernel gave up on at its deadline (empty: every signal
  // arrived).
  virtual std::vector<int> given_up() = 0;
  // The peers whose signals have not arrived yet (asked once the deadline has passed).
  virtual std::vector<int> missing() = 0;
};

// "rank 3" / "ranks 1, 2" / "rank ?" (the words had all arrived by the time they were read).
std::string describe_ranks(const std::vector<int>& ranks);

class Watchdog {
 public:
  // `thread_init` runs first in the watchdog's thread (CUDA: select the device, relax the
  // thread's graph-capture mode). `max_poll` bounds how late a missed deadline is noticed.
  // `report` is told the failure once, when the watchdog records it (default: a warning on
  // stderr): a process blocked outside cuda_p2p (torch.cuda.synchronize(), .item()) behind the
  // stuck stream would otherwise hang without a word, since only cuda_p2p's own calls raise it.
  Watchdog(FailureState& failure, std::function<void()> thread_init, Millis max_poll = Millis(100),
           std::function<void(const std::string&)> report = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `wait`: if the stream stays at it longer than `timeout` (from the first poll that
  // sees started()), or a kernel gave up on it, the device fails with an error naming `context`
  // and the missing ranks. Waits are retired in the order they were tracked. No-op once failed.
  void track(std::unique_ptr<WatchedWait> wait, Millis timeout, std::string context);
  // Waits not yet retired.
  size_t pending() const;
  // One pass now, in the calling thread: after a stream was seen idle, so that a wait kernel's
  // give-up on that stream becomes the device's failure before the caller returns.
  void poll_now();
  // Stops the thread and drops every pending wait (after abort(); also the destructor).
  void stop();

 private:
  struct Entry {
    std::unique_ptr<WatchedWait> wait;
    Millis timeout;
    std::string context;
    std::optional<std::chrono::steady_clock::time_point> started;
  };
  void loop();
  // One pass over the pending waits; returns whether any retired or started.
  bool poll();

  FailureState& failure_;
  std::function<void()> thread_init_;
  const Millis max_poll_;
  std::function<void(const std::string&)> report_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> entries_;
  bool stop_ = false;
  std::thread thread_;  // started by the first track()
};

}  // namespace cuda_p2p
