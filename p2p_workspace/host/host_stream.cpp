#include "p2p_workspace/host/host_stream.hpp"

#include <c10/util/Exception.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "p2p_workspace/host/futex_wait.hpp"

namespace cuda_p2p::host {

// NOTE [Cooperative host streams]
// A GPU runs a stream's work on its own engines; a CPU has only the cores the ranks already occupy.
// Executor threads (HostStreams::kThreads) give the host the GPU's concurrency, but every hand-off
// to a thread that sleeps on a busy machine waits for the OS scheduler, longer than a small GEMM
// (docs/measurements/pipelines-reference-figures.md). So by default a host device's streams are
// cooperative: enqueueing only queues a task, and the thread that waits for a stream (synchronize,
// or an event joined into the caller's inline stream) runs the tasks of all the device's
// cooperative streams itself:
//  - it always runs the first task that may start, scanning the high-priority streams first
//    and starting over after every task, so communication goes ahead of computation as on a GPU
//    with a high-priority communication stream;
//  - a task may start when the tasks before it on its stream are done and, for a wait, its
//    signals have arrived (or, for an event, the other stream has done the recorded task count);
//    a wait times out from the first time it is tried, with the usual error;
//  - when no task may start, it backs off like every host wait (NOTE [Host waits on shared
//    cores] in futex_wait.cpp), then sleeps on all the awaited signal words at once
//    (futex_waitv), at most kMaxSleep at a time.
// What overlaps on a CPU is waiting, not work: while one stream waits for a peer, the other's
// GEMM runs. Per-stream order and every cross-stream dependency hold exactly as on a GPU, since
// a task starts only after its stream's earlier tasks and the events it waits for. Ordering
// between streams that the schedule does not state is, however, far more regular than on a GPU;
// the tests run the pipelines with kThreads too, where a missing join shows up as a race.
// Only one thread runs a given stream's task at a time (`stepping_`); a task that itself waits
// (re-entrantly) sees its own stream busy and runs the others.

// --- HostStream -----------------------------------------------------------------------------

HostStream::HostStream(Mode mode, bool high_priority,
                       std::shared_ptr<CooperativeScheduler> scheduler)
    : mode_(mode), high_priority_(high_priority), scheduler_(std::move(scheduler)) {
  TORCH_INTERNAL_ASSERT(mode_ != Mode::kCooperative || scheduler_);
  if (mode_ == Mode::kThread) thread_ = std::thread([this] { loop(); });
}

HostStream::~HostStream() {
  if (mode_ != Mode::kThread) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostStream::enqueue(HostTask task) {
  ++enqueued_;
  if (mode_ == Mode::kInline) {
    // The caller's own thread: run now; errors reach the caller directly.
    std::exception_ptr err;
    try {
      if (task.block) task.block();
      if (task.run) task.run();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (err) std::rethrow_exception(err);
    return;
  }
  // A cooperative stream never blocks its driver: its waits are `ready` predicates.
  TORCH_INTERNAL_ASSERT(mode_ != Mode::kCooperative || !task.block);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  if (mode_ == Mode::kThread) cv_.notify_all();
}

void HostStream::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto task = std::move(queue_.front());
    queue_.pop_front();
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr err;
    if (!failed) {  // after an error the rest of the queue is skipped, but still counted done
      try {
        if (task.block) task.block();
        if (task.run) task.run();
      } catch (...) {
        err = std::current_exception();
      }
    }
    task = {};  // release captures outside the lock
    lock.lock();
    if (err && !error_) error_ = err;
    ++done_;
    cv_.notify_all();
  }
}

HostStream::Step HostStream::step(std::vector<SignalWait>& waits) {
  bool expected = false;
  if (!stepping_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
    return Step::kBusy;
  }
  struct Release {
    std::atomic<bool>& flag;
    ~Release() { flag.store(false, std::memory_order_release); }
  } release{stepping_};

  const HostTask* head = nullptr;
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return Step::kEmpty;
    // Stays valid outside the lock: only a stepping thread pops, and push_back keeps references.
    head = &queue_.front();
    failed = error_ != nullptr;
  }
  std::exception_ptr err;
  if (!failed && head->ready) {
    bool ready = false;
    try {
      ready = head->ready();
    } catch (...) {
      err = std::current_exception();
    }
    if (!ready && !err) {
      waits.insert(waits.end(), head->waits.begin(), head->waits.end());
      if (head->late_waits) {
        waits.insert(waits.end(), head->late_waits->begin(), head->late_waits->end());
      }
      return Step::kBlocked;
    }
  }
  HostTask task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    task = std::move(queue_.front());
    queue_.pop_front();
  }
  if (!failed && !err && task.run) {  // after an error the rest is skipped, but counted done
    try {
      task.run();
    } catch (...) {
      err = std::current_exception();
    }
  }
  task = {};  // release captures outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (err && !error_) error_ = err;
    ++done_;
  }
  return Step::kRan;
}

uint64_t HostStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void HostStream::wait_done(uint64_t seq, bool rethrow) {
  if (mode_ == Mode::kCooperative) {
    scheduler_->drive([&] { return done() >= seq; });
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= seq; });
  if (rethrow && error_) {
    auto err = error_;
    error_ = nullptr;  // reported once; the stream is usable again
    std::rethrow_exception(err);
  }
}

std::exception_ptr HostStream::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// --- CooperativeScheduler -------------------------------------------------------------------

void CooperativeScheduler::add(const std::shared_ptr<HostStream>& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  version_.fetch_add(1, std::memory_order_release);
  std::erase_if(streams_, [](const auto& w) { return w.expired(); });
  // High-priority streams first: drive() scans in this order.
  auto pos = stream->high_priority() ? std::find_if(streams_.begin(), streams_.end(),
                                                    [](const auto& w) {
                                                      auto s = w.lock();
                                                      return !s || !s->high_priority();
                                                    })
                                     : streams_.end();
  streams_.insert(pos, stream);
}

std::vector<std::shared_ptr<HostStream>> CooperativeScheduler::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<HostStream>> out;
  out.reserve(streams_.size());
  for (const auto& w : streams_) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

void CooperativeScheduler::drive(const std::function<bool()>& finished,
                                 const std::vector<SignalWait>& waits) {
  // NOTE [Cooperative host streams]
  int idle = 0;  // scans in a row that ran nothing
  std::chrono::steady_clock::time_point idle_since;
  std::vector<SignalWait> blocked;
  std::vector<std::shared_ptr<HostStream>> streams;
  uint64_t seen = 0;
  while (!finished()) {
    if (streams.empty() || version_.load(std::memory_order_acquire) != seen) {
      seen = version_.load(std::memory_order_acquire);
      streams = snapshot();
    }
    blocked = waits;
    bool ran = false, busy = false;
    for (const auto& s : streams) {
      const auto step = s->step(blocked);
      if (step == HostStream::Step::kRan) {
        ran = true;
        break;  // start over from the high-priority streams
      }
      busy |= step == HostStream::Step::kBusy;
    }
    if (ran) {
      idle = 0;
      continue;
    }
    // NOTE [Host waits on shared cores] in futex_wait.cpp: poll as every host wait does, then
    // sleep on every awaited word. A stream run by another thread (busy) signals nothing we can
    // sleep on: nap briefly.
    const auto now = std::chrono::steady_clock::now();
    if (idle++ == 0) idle_since = now;
    if (poll_more(now - idle_since, oversubscribed_.load(std::memory_order_relaxed))) continue;
    futex_sleep_any(busy ? std::vector<SignalWait>{} : blocked, now + (busy ? kNap : kMaxSleep));
  }
}

}  // namespace cuda_p2p::host
