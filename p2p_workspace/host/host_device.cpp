#include "p2p_workspace/host/host_device.hpp"

#include <c10/util/Exception.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "p2p_workspace/watchdog.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CUDA_P2P_CPU_RELAX() _mm_pause()
#else
#define CUDA_P2P_CPU_RELAX() std::this_thread::yield()
#endif

namespace cuda_p2p::host {

// NOTE [Host signal ordering]
// A signal word lives in shared memory mapped by several processes. The writer publishes its
// earlier writes (a copy into a peer's buffer, or its own buffer's contents) with a release store
// of the new sequence number; the waiter's acquire load of a value >= the expected one makes
// those writes visible to everything it does next. std::atomic_ref on a lock-free 32-bit word is
// address-free, so this holds across processes. The futex is only a sleep/wake hint: correctness
// never depends on a wake arriving (waiters re-check at least every kMaxSleep).

namespace {

constexpr int kSpins = 256;  // ~6 us of PAUSE: long enough for a peer on another core
constexpr auto kSpinTime = std::chrono::microseconds(8);  // the same, for a scheduler's polling
constexpr int kYields = 4;  // oversubscribed: a few sched_yield, then sleep
constexpr auto kMaxSleep = std::chrono::milliseconds(10);
// A sleep with nothing to wake it early: a stream another thread is running, an old kernel.
constexpr auto kNap = std::chrono::microseconds(100);

uint32_t load_acquire(const uint32_t* word) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire);
}

long futex(const uint32_t* addr, int op, uint32_t val, const timespec* ts) {
  // Shared (not FUTEX_PRIVATE) operations: the word is shared between processes.
  return syscall(SYS_futex, addr, op, val, ts, nullptr, 0);
}

}  // namespace

// NOTE [Host waits on shared cores]
// A waiter first polls (a peer on another core usually arrives within microseconds), then sleeps
// in the kernel. How it polls depends on whether the ranks fit the CPUs this process may use.
// With a core each, it spins with PAUSE for ~6 us. When more ranks than CPUs share them (4 ranks
// on 2 cores), a spinning waiter holds the very core that a peer it waits for needs: it polls
// with sched_yield a few times only (a peer queued on this CPU runs meanwhile), then sleeps.
// Every word of one wait is polled in the same loop, so a barrier's polling budget is shared by
// all its peers instead of being spent once per peer.
bool poll_all(const std::vector<SignalWait>& waits, bool oversubscribed) {
  const int rounds = oversubscribed ? kYields : kSpins;
  for (int i = 0; i < rounds; ++i) {
    bool all = true;
    for (const auto& w : waits) {
      if (!signal_reached(load_acquire(w.addr), w.value)) {
        all = false;
        break;
      }
    }
    if (all) return true;
    if (oversubscribed) {
      sched_yield();
    } else {
      CUDA_P2P_CPU_RELAX();
    }
  }
  return false;
}

bool futex_sleep_until(const uint32_t* word, uint32_t value,
                       std::chrono::steady_clock::time_point deadline) {
  while (true) {
    const uint32_t current = load_acquire(word);
    if (signal_reached(current, value)) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto nap = std::min<std::chrono::nanoseconds>(deadline - now, kMaxSleep);
    timespec ts{static_cast<time_t>(nap.count() / 1000000000),
                static_cast<long>(nap.count() % 1000000000)};
    // Sleeps only while the word still holds `current`: a store in between returns at once.
    futex(word, FUTEX_WAIT, current, &ts);
  }
}

void futex_store_and_wake(uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
  futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

// Sleeps on several words at once (futex_waitv, Linux 5.16+): a blocked cooperative scheduler
// waits for whichever of its streams' peers signals first.
void futex_sleep_any(const std::vector<SignalWait>& waits,
                     std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return;
  if (waits.empty()) {
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(deadline - now, kNap));
    return;
  }
  const size_t n = std::min<size_t>(waits.size(), FUTEX_WAITV_MAX);
  std::vector<futex_waitv> vec(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t current = load_acquire(waits[i].addr);
    if (signal_reached(current, waits[i].value)) return;
    vec[i] = {current, reinterpret_cast<uint64_t>(waits[i].addr), FUTEX_32, 0};
  }
  // steady_clock is CLOCK_MONOTONIC on Linux; futex_waitv takes an absolute timeout.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::min(deadline, now + kMaxSleep).time_since_epoch())
                      .count();
  timespec abs{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  if (syscall(SYS_futex_waitv, vec.data(), static_cast<unsigned>(n), 0, &abs, CLOCK_MONOTONIC) <
          0 &&
      errno == ENOSYS) {
    // An older kernel: sleep on the first word, briefly, and let the caller poll the rest.
    futex_sleep_until(waits[0].addr, waits[0].value,
                      std::min(deadline, std::chrono::steady_clock::now() + kNap));
  }
}

namespace {

// True when every wait is satisfied; after `deadline`, throws an error naming every peer still
// missing (not only the first). Throws at once when the device failed (NOTE [Device failure]).
bool check_waits(const std::vector<SignalWait>& waits,
                 std::chrono::steady_clock::time_point deadline, Millis timeout,
                 const std::string& context, const FailureState& failure) {
  failure.check(context.c_str());
  const auto reached = [](const SignalWait& w) {
    return signal_reached(load_acquire(w.addr), w.value);
  };
  if (std::all_of(waits.begin(), waits.end(), reached)) return true;
  if (std::chrono::steady_clock::now() < deadline) return false;
  // Polled on every scheduler pass: the message is built only once the wait has failed.
  std::ostringstream missing;
  int count = 0;
  for (const auto& w : waits) {
    if (!reached(w)) missing << (count++ ? ", " : "") << w.peer;
  }
  TORCH_CHECK(count == 0, "cuda_p2p: ", context, " timed out after ", timeout.count(), " ms: rank",
              count > 1 ? "s " : " ", missing.str(), " never arrived");
  return true;  // every word arrived just as the deadline passed
}

// The blocking wait of an executor thread (or of the inline stream of a threaded device). Sleeps
// at most kMaxSleep at a time, so that an abort is seen within that.
void block_on_waits(const std::vector<SignalWait>& waits, Millis timeout,
                    const std::string& context, bool oversubscribed, const FailureState& failure) {
  failure.check(context.c_str());
  if (poll_all(waits, oversubscribed)) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!check_waits(waits, deadline, timeout, context, failure)) {
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + kMaxSleep);
    for (const auto& w : waits) {
      if (!futex_sleep_until(w.addr, w.value, until)) break;
    }
  }
}

}  // namespace

// NOTE [Cooperative host streams]
// A GPU runs a stream's work on its own engines; a CPU has only the cores the ranks already
// occupy. Executor threads (HostStreams::kThreads) give the host the GPU's concurrency, but every
// hand-off to a thread that sleeps on a busy machine waits for the OS scheduler (0.3-1 ms per
// pipeline step measured with 2 ranks on 2 cores, more than a small GEMM). So by default a host
// device's streams are cooperative: enqueueing only queues a task, and the thread that waits for
// a stream (synchronize, or an event joined into the caller's inline stream) runs the tasks of
// all the device's cooperative streams itself:
//  - it always runs the first task that may start, scanning the high-priority streams first
//    and starting over after every task, so communication goes ahead of computation as on a GPU
//    with a high-priority communication stream;
//  - a task may start when the tasks before it on its stream are done and, for a wait, its
//    signals have arrived (or, for an event, the other stream has done the recorded task count);
//    a wait times out from the first time it is tried, with the usual error;
//  - when no task may start, it backs off like every host wait (NOTE [Host waits on shared
//    cores]), then sleeps on all the awaited signal words at once (futex_waitv), at most
//    kMaxSleep at a time.
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
    // NOTE [Host waits on shared cores]: poll briefly (a few yields when oversubscribed, else
    // about as long as poll_all spins), then sleep on every awaited word. A stream run by another
    // thread (busy) signals nothing we can sleep on: nap briefly.
    if (idle++ == 0) idle_since = std::chrono::steady_clock::now();
    if (oversubscribed_ ? idle <= kYields
                        : std::chrono::steady_clock::now() - idle_since < kSpinTime) {
      if (oversubscribed_) {
        sched_yield();
      } else {
        CUDA_P2P_CPU_RELAX();
      }
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    futex_sleep_any(busy ? std::vector<SignalWait>{} : blocked, now + (busy ? kNap : kMaxSleep));
  }
}

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

class HostDevice : public Device {
 public:
  HostDevice(int processes, HostStreams mode)
      : oversubscribed_(processes > usable_cpus()),
        cooperative_(resolve_mode(mode) == HostStreams::kCooperative),
        scheduler_(cooperative_ ? std::make_shared<CooperativeScheduler>(oversubscribed_)
                                : nullptr),
        inline_stream_(std::make_shared<HostStream>(HostStream::Mode::kInline, false, nullptr)) {}

  std::string name() const override { return "cpu"; }
  at::Device tensor_device() const override { return at::Device(at::kCPU); }
  int device_index() const override { return -1; }
  bool blocks_outlive_owner() const override { return true; }

  std::shared_ptr<Block> allocate(size_t bytes) override { return allocate_shared_block(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override {
    return export_shared_block(block, max_peers);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override {
    return import_shared_block(handle, bytes, timeout);
  }
  std::shared_ptr<PrivateMemoryReader> private_memory_reader() override {
    return make_cross_memory_reader();  // host/cross_memory.cpp
  }

  // One inline stream per device object: it carries no state but its counters.
  std::shared_ptr<Stream> current_stream() override { return inline_stream_; }
  std::shared_ptr<Stream> new_stream(bool high_priority) override {
    if (!cooperative_) {
      return std::make_shared<HostStream>(HostStream::Mode::kThread, high_priority, nullptr);
    }
    auto s =
        std::make_shared<HostStream>(HostStream::Mode::kCooperative, high_priority, scheduler_);
    scheduler_->add(s);
    return s;
  }

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    as_host(s).enqueue(HostTask::work([dst, src, n] { std::memcpy(dst, src, n); }));
  }

  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    as_host(s).enqueue(HostTask::work([addr, value] { futex_store_and_wake(addr, value); }));
  }

  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    failure_.check(context.c_str());
    auto& h = as_host(s);
    if (h.mode() == HostStream::Mode::kCooperative) {
      // Tried by the scheduler until it holds; the timeout counts from the first try.
      std::optional<std::chrono::steady_clock::time_point> deadline;
      h.enqueue(HostTask::when(
          [waits, timeout, context = std::move(context), deadline, this]() mutable {
            if (!deadline) deadline = std::chrono::steady_clock::now() + timeout;
            return check_waits(waits, *deadline, timeout, context, failure_);
          },
          waits));
      return;
    }
    if (h.mode() == HostStream::Mode::kInline && cooperative_) {
      // The caller waits, and runs the cooperative streams meanwhile.
      h.enqueue(HostTask::blocking(
          [this, waits = std::move(waits), timeout, context = std::move(context)] {
            const auto deadline = std::chrono::steady_clock::now() + timeout;
            scheduler_->drive(
                [&] { return check_waits(waits, deadline, timeout, context, failure_); }, waits);
          }));
      return;
    }
    h.enqueue(HostTask::blocking([waits = std::move(waits), timeout, context = std::move(context),
                                  oversubscribed = oversubscribed_, this] {
      block_on_waits(waits, timeout, context, oversubscribed, failure_);
    }));
  }

  void run(Stream& s, std::function<void()> fn) override {
    as_host(s).enqueue(HostTask::work(std::move(fn)));
  }

  std::shared_ptr<Event> record(Stream& s) override {
    auto& h = as_host(s);
    // The event keeps the stream alive for whoever waits on it.
    return std::make_shared<HostEvent>(h.shared_from_this(), h.enqueued());
  }

  void wait_event(Stream& s, const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    HostStream* other = ev->stream.get();
    const uint64_t seq = ev->seq;
    auto& self = as_host(s);
    if (other == &self) return;
    if (self.mode() == HostStream::Mode::kCooperative) {
      self.enqueue(HostTask::when([other, seq] {
        if (other->done() < seq) return false;
        if (auto err = other->error()) std::rethrow_exception(err);
        return true;
      }));
      return;
    }
    // Blocks (the inline stream of a cooperative device runs the streams meanwhile).
    self.enqueue(HostTask::blocking([other, seq] {
      other->wait_done(seq, /*rethrow=*/false);
      if (auto err = other->error()) std::rethrow_exception(err);
    }));
  }

  void synchronize(Stream& s) override {
    auto& h = as_host(s);
    h.wait_done(h.enqueued(), /*rethrow=*/true);
  }

  void synchronize(const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    ev->stream->wait_done(ev->seq, /*rethrow=*/false);
    if (auto err = ev->stream->error()) std::rethrow_exception(err);
    failure_.check("synchronize");
  }

  // Every host op drains its streams before it returns (pipeline::end), so nothing is in flight.
  void quiesce() override {}

  // NOTE [Device failure]: every wait loop of this device checks failure_ on each pass (at most
  // kMaxSleep apart) and raises.
  void abort(const std::string& why) override { failure_.fail(why); }
  void check_healthy(const char* op) override { failure_.check(op); }

 private:
  const bool oversubscribed_;  // more ranks than usable CPUs: NOTE [Host waits on shared cores]
  const bool cooperative_;     // NOTE [Cooperative host streams]
  const std::shared_ptr<CooperativeScheduler> scheduler_;
  std::shared_ptr<HostStream> inline_stream_;
  FailureState failure_;  // NOTE [Device failure]
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

std::shared_ptr<Device> make_host_device(int processes, HostStreams streams) {
  return std::make_shared<host::HostDevice>(processes, streams);
}
}  // namespace cuda_p2p
