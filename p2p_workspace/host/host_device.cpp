#include "p2p_workspace/host/host_device.hpp"

#include <c10/util/Exception.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <sstream>

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
constexpr int kYields = 4;   // oversubscribed: a few sched_yield, then sleep
constexpr auto kMaxSleep = std::chrono::milliseconds(10);

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

bool futex_wait_until(const uint32_t* word, uint32_t value,
                      std::chrono::steady_clock::time_point deadline) {
  for (int i = 0; i < kSpins; ++i) {
    if (signal_reached(load_acquire(word), value)) return true;
    CUDA_P2P_CPU_RELAX();
  }
  return futex_sleep_until(word, value, deadline);
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

// --- HostStream -----------------------------------------------------------------------------

HostStream::HostStream(bool inline_mode) : inline_(inline_mode) {
  if (!inline_) thread_ = std::thread([this] { loop(); });
}

HostStream::~HostStream() {
  if (inline_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostStream::enqueue(std::function<void()> fn) {
  ++enqueued_;
  if (inline_) {
    // The caller's own thread: run now; errors reach the caller directly.
    std::exception_ptr err;
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (err) std::rethrow_exception(err);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

void HostStream::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr err;
    if (!failed) {  // after an error the rest of the queue is skipped, but still counted done
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
      }
    }
    fn = nullptr;  // release captures outside the lock
    lock.lock();
    if (err && !error_) error_ = err;
    ++done_;
    cv_.notify_all();
  }
}

void HostStream::wait_done(uint64_t seq, bool rethrow) {
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

class HostDevice : public Device {
 public:
  explicit HostDevice(int processes)
      : inline_stream_(std::make_shared<HostStream>(/*inline_mode=*/true)),
        oversubscribed_(processes > usable_cpus()) {}

  std::string name() const override { return "cpu"; }
  at::Device tensor_device() const override { return at::Device(at::kCPU); }
  int device_index() const override { return -1; }

  std::shared_ptr<Block> allocate(size_t bytes) override { return allocate_shared_block(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override {
    return export_shared_block(block, max_peers);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override {
    return import_shared_block(handle, bytes, timeout);
  }
  std::shared_ptr<void> upload_pointer_table(const std::vector<void*>&) override { return {}; }
  std::shared_ptr<PrivateMemoryReader> private_memory_reader() override {
    return make_cross_memory_reader();  // host/cross_memory.cpp
  }

  // One inline stream per device object: it carries no state but its counters.
  std::shared_ptr<Stream> current_stream() override { return inline_stream_; }
  std::shared_ptr<Stream> new_stream(bool) override {
    return std::make_shared<HostStream>(/*inline_mode=*/false);
  }

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    as_host(s).enqueue([dst, src, n] { std::memcpy(dst, src, n); });
  }

  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    as_host(s).enqueue([addr, value] { futex_store_and_wake(addr, value); });
  }

  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    as_host(s).enqueue([waits = std::move(waits), timeout, context = std::move(context),
                        oversubscribed = oversubscribed_] {
      if (poll_all(waits, oversubscribed)) return;
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + timeout;
      for (const auto& w : waits) {
        if (futex_sleep_until(w.addr, w.value, deadline)) continue;
        // Timed out: name every peer still missing, not only the first.
        std::ostringstream missing;
        int count = 0;
        for (const auto& m : waits) {
          if (!signal_reached(load_acquire(m.addr), m.value)) {
            missing << (count++ ? ", " : "") << m.peer;
          }
        }
        TORCH_CHECK(false, "cuda_p2p: ", context, " timed out after ", timeout.count(), " ms: rank",
                    count > 1 ? "s " : " ", missing.str(), " never arrived");
      }
    });
  }

  void run(Stream& s, std::function<void()> fn) override { as_host(s).enqueue(std::move(fn)); }

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
    self.enqueue([other, seq] {
      other->wait_done(seq, /*rethrow=*/false);
      if (auto err = other->error()) std::rethrow_exception(err);
    });
  }

  void synchronize(Stream& s) override {
    auto& h = as_host(s);
    h.wait_done(h.enqueued(), /*rethrow=*/true);
  }

 private:
  std::shared_ptr<HostStream> inline_stream_;
  const bool oversubscribed_;  // more ranks than usable CPUs: NOTE [Host waits on shared cores]
};

}  // namespace

}  // namespace cuda_p2p::host

namespace cuda_p2p {
std::shared_ptr<Device> make_host_device(int processes) {
  return std::make_shared<host::HostDevice>(processes);
}
}  // namespace cuda_p2p
