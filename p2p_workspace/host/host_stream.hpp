// Host streams: ordered task queues, each run by an executor thread of its own or cooperatively by
// the threads that wait for them (NOTE [Cooperative host streams] in host_stream.cpp), and their
// events. The host device's streams; exposed for tests, algorithms use Device.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::host {

// One unit of stream work. `run` is the work itself (empty for a pure wait). `ready`, when set,
// says whether the task may start: an executor thread or the inline stream blocks in `block`
// instead; a cooperative stream calls `ready` and, while it is false, sleeps on `waits`.
// `ready` may throw (a wait that timed out), which fails the stream like a throwing `run`.
struct HostTask {
  std::function<void()> run;
  std::function<bool()> ready;
  std::function<void()> block;
  std::vector<SignalWait> waits;
  // What `ready` waits for when its values are known only once it first runs (a counted wait:
  // NOTE [Replay-safe signals]); filled by `ready`, read by the same stepping thread.
  std::shared_ptr<const std::vector<SignalWait>> late_waits;

  static HostTask work(std::function<void()> fn) {
    HostTask t;
    t.run = std::move(fn);
    return t;
  }
  static HostTask when(std::function<bool()> ready, std::vector<SignalWait> waits = {}) {
    HostTask t;
    t.ready = std::move(ready);
    t.waits = std::move(waits);
    return t;
  }
  static HostTask blocking(std::function<void()> block) {
    HostTask t;
    t.block = std::move(block);
    return t;
  }
};

class CooperativeScheduler;

// A host stream, in one of three modes:
//  - inline: the caller's "current stream"; work runs at once in the calling thread;
//  - thread: work runs in order on the stream's own executor thread;
//  - cooperative: work is queued and run by whichever thread waits for it (synchronize, an event
//    on the inline stream), interleaved with the device's other cooperative streams
//    (NOTE [Cooperative host streams] in host_stream.cpp).
class HostStream : public Stream, public std::enable_shared_from_this<HostStream> {
 public:
  enum class Mode { kInline, kThread, kCooperative };
  HostStream(Mode mode, bool high_priority, std::shared_ptr<CooperativeScheduler> scheduler);
  ~HostStream() override;

  Mode mode() const { return mode_; }
  bool high_priority() const { return high_priority_; }
  void enqueue(HostTask task);
  // Tasks enqueued so far; an event records this number.
  uint64_t enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  // Tasks finished (or skipped after an error) so far.
  uint64_t done() const;
  // Blocks until `seq` tasks have finished (or been skipped after an error); rethrows the
  // stream's first error if `rethrow` (and clears it: the stream is usable again).
  void wait_done(uint64_t seq, bool rethrow);
  std::exception_ptr error() const;

  // Cooperative mode: what one attempt to run the head task did.
  enum class Step { kRan, kBlocked, kEmpty, kBusy };
  // Runs the head task if it may start; a blocked task appends what it waits for to `waits`.
  // kBusy: another thread is running this stream's task right now.
  Step step(std::vector<SignalWait>& waits);

 private:
  void loop();

  const Mode mode_;
  const bool high_priority_;
  const std::shared_ptr<CooperativeScheduler> scheduler_;  // cooperative mode only
  // Atomic: the inline stream is every calling thread's, and several may enqueue at once (one
  // window's puts and waits from two threads); the other streams have one enqueuing thread.
  std::atomic<uint64_t> enqueued_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HostTask> queue_;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<bool> stepping_{false};  // cooperative mode: a thread is in step()
  std::thread thread_;
};

// Runs the cooperative streams of one device (there is one per HostDevice: no process-wide
// state). NOTE [Cooperative host streams] in host_stream.cpp.
class CooperativeScheduler {
 public:
  explicit CooperativeScheduler(bool oversubscribed) : oversubscribed_(oversubscribed) {}
  void set_oversubscribed(bool over) { oversubscribed_.store(over, std::memory_order_relaxed); }
  void add(const std::shared_ptr<HostStream>& stream);
  // Runs the ready tasks of every cooperative stream, high-priority streams first, until
  // `finished()` holds; while none can run, backs off and sleeps on `waits` (the caller's own
  // signal words, if any) and on what the blocked tasks wait for. `finished` may throw.
  void drive(const std::function<bool()>& finished, const std::vector<SignalWait>& waits = {});

 private:
  std::vector<std::shared_ptr<HostStream>> snapshot();
  std::atomic<bool> oversubscribed_;
  std::mutex mu_;
  std::vector<std::weak_ptr<HostStream>> streams_;
  std::atomic<uint64_t> version_{0};  // bumped by add(): drive() then takes a new snapshot
};

class HostEvent : public Event {
 public:
  HostEvent(std::shared_ptr<HostStream> stream, uint64_t seq, uint64_t capture = 0)
      : stream(std::move(stream)), seq(seq), capture(capture) {}
  bool captured() const override { return capture != 0; }
  std::shared_ptr<HostStream> stream;
  // Outside a capture: the stream's task count at the record. Recorded in a capture (`capture`
  // is its id): the count of the stream's captured tasks before it, which a replay offsets by
  // the stream's count at the replay (NOTE [Host capture] in host_device_capture.cpp).
  uint64_t seq;
  uint64_t capture;
};

}  // namespace cuda_p2p::host
