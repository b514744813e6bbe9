#include "p2p_workspace/host/futex_wait.hpp"

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
#include <optional>
#include <sstream>

#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p::host {

// NOTE [Host signal ordering]
// A signal word lives in shared memory mapped by several processes. The writer publishes its
// earlier writes (a copy into a peer's buffer, or its own buffer's contents) with a release store
// of the new sequence number; the waiter's acquire load of a value >= the expected one makes
// those writes visible to everything it does next. std::atomic_ref on a lock-free 32-bit word is
// address-free, so this holds across processes. The futex is only a sleep/wake hint: correctness
// never depends on a wake arriving (waiters re-check at least every kMaxSleep).

// NOTE [Sleeper bit]
// A FUTEX_WAKE on a shared word is a system call that looks the page up (get_user_pages) even when
// nobody sleeps, and most waits end while polling (NOTE [Host waits on shared cores]): a small
// all-reduce would pay two such calls per rank. So a host signal word holds a 31-bit sequence
// number and, in its top bit, "a waiter may be asleep on me": a waiter sets the bit with a
// compare-and-swap on the exact value it saw before it sleeps, and sleeps only while the word holds
// that value with the bit; a writer exchanges the word for the new number (bit clear) and wakes
// only when the old word had the bit. Both are read-modify-writes of one word, so one of them comes
// first in its modification order: either the writer sees the bit, or the waiter's swap fails and
// it sees the new number - no wake is lost. Sequence numbers compare in 31-bit wrap-around order
// (reached()); each word has one writer and is waited on by its owner only, and only this device
// writes host pads.

namespace {

uint32_t load_acquire(const uint32_t* word) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire);
}

long futex(const uint32_t* addr, int op, uint32_t val, const timespec* ts) {
  // Shared (not FUTEX_PRIVATE) operations: the word is shared between processes.
  return syscall(SYS_futex, addr, op, val, ts, nullptr, 0);
}

constexpr uint32_t kSleeper = 0x80000000u;
constexpr uint32_t kSequence = 0x7fffffffu;

// signal_reached (device.hpp) in the 31-bit space of host words, whatever the sleeper bit.
bool reached(uint32_t word, uint32_t value) { return ((word - value) & kSequence) < (1u << 30); }

// Sets the sleeper bit of `word` (NOTE [Sleeper bit]) unless it has reached `value`. Returns the
// word to sleep on (bit set), or nullopt when it has reached `value`.
std::optional<uint32_t> mark_sleeper(const uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t> ref(*const_cast<uint32_t*>(word));
  uint32_t current = ref.load(std::memory_order_acquire);
  while (true) {
    if (reached(current, value)) return std::nullopt;
    if (current & kSleeper) return current;
    // On failure `current` is reloaded: a new number, or the bit set by another waiting thread.
    if (ref.compare_exchange_weak(current, current | kSleeper, std::memory_order_acq_rel,
                                  std::memory_order_acquire)) {
      return current | kSleeper;
    }
  }
}

}  // namespace

// NOTE [Host waits on shared cores]
// A waiter first polls (a peer usually arrives within microseconds), then sleeps in the kernel:
//  - with a core of its own it spins with PAUSE for kSpinTime;
//  - then, and from the start when more ranks than CPUs share them (4 ranks on 2 cores; the CPUs
//    of all the ranks' affinities together, NOTE [CPUs of the ranks] in
//    p2p_workspace/symmetric_workspace.cpp), it polls with sched_yield, which hands the core to
//    any runnable task and returns at once when there is none, until kYieldTime has passed since
//    the wait began;
//  - only then does it sleep on the futex.
// Why: a spinning waiter would hold the very core a peer it waits for needs; a sleeper runs again
// only when the scheduler gets to it, often longer than the whole collective on a loaded machine
// (a small all-reduce is two waits per rank); a yielding poller gives its core away as readily but
// is back as soon as nothing else wants it (docs/measurements/against-deepspeed-issue15.md;
// DeepSpeed's waits spin without yielding, which starves 4 ranks on 2 cores). Every word of one
// wait is polled in the same loop: a barrier's polling budget is shared by all its peers.
bool poll_more(std::chrono::steady_clock::duration waited, bool oversubscribed) {
  if (waited >= kYieldTime) return false;
  if (!oversubscribed && waited < kSpinTime) {
    CUDA_P2P_CPU_RELAX();
  } else {
    sched_yield();
  }
  return true;
}

bool poll_all(const std::vector<SignalWait>& waits, bool oversubscribed) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    bool all = true;
    for (const auto& w : waits) {
      if (!reached(load_acquire(w.addr), w.value)) {
        all = false;
        break;
      }
    }
    if (all) return true;
    if (!poll_more(std::chrono::steady_clock::now() - start, oversubscribed)) return false;
  }
}

bool arrived(const SignalWait& w) { return reached(load_acquire(w.addr), w.value); }

bool poll_briefly(c10::ArrayRef<SignalWait> waits, bool oversubscribed) {
  const auto arrived = [&] {
    for (const auto& w : waits) {
      if (!reached(load_acquire(w.addr), w.value)) return false;
    }
    return true;
  };
  if (arrived()) return true;  // the common case: no clock read
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= kSpinTime || !poll_more(waited, oversubscribed)) return false;
    if (arrived()) return true;
  }
}

bool futex_sleep_until(const uint32_t* word, uint32_t value,
                       std::chrono::steady_clock::time_point deadline) {
  while (true) {
    const std::optional<uint32_t> current = mark_sleeper(word, value);
    if (!current) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto nap = std::min<std::chrono::nanoseconds>(deadline - now, kMaxSleep);
    timespec ts{static_cast<time_t>(nap.count() / 1000000000),
                static_cast<long>(nap.count() % 1000000000)};
    // Sleeps only while the word still holds `current`: a store in between returns at once.
    futex(word, FUTEX_WAIT, *current, &ts);
  }
}

void futex_store_and_wake(uint32_t* word, uint32_t value) {
  const uint32_t old =
      std::atomic_ref<uint32_t>(*word).exchange(value & kSequence, std::memory_order_acq_rel);
  if (old & kSleeper) futex(word, FUTEX_WAKE, INT_MAX, nullptr);
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
    const std::optional<uint32_t> current = mark_sleeper(waits[i].addr, waits[i].value);
    if (!current) return;
    vec[i] = {*current, reinterpret_cast<uint64_t>(waits[i].addr), FUTEX_32, 0};
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

bool check_waits(const std::vector<SignalWait>& waits,
                 std::chrono::steady_clock::time_point deadline, Millis timeout,
                 const std::string& context, FailureState& failure) {
  failure.check(context.c_str());
  const auto arrived = [](const SignalWait& w) { return reached(load_acquire(w.addr), w.value); };
  if (std::all_of(waits.begin(), waits.end(), arrived)) return true;
  if (std::chrono::steady_clock::now() < deadline) return false;
  // Polled on every scheduler pass: the message is built only once the wait has failed.
  std::ostringstream missing;
  int count = 0;
  for (const auto& w : waits) {
    if (!arrived(w)) missing << (count++ ? ", " : "") << w.peer;
  }
  TORCH_CHECK(count == 0, "cuda_p2p: ", context, " timed out after ", timeout.count(), " ms: rank",
              count > 1 ? "s " : " ", missing.str(), " never arrived");
  return true;  // every word arrived just as the deadline passed
}

// The blocking wait of an executor thread (or of the inline stream of a threaded device). Sleeps
// at most kMaxSleep at a time, so that an abort is seen within that.
void block_on_waits(const std::vector<SignalWait>& waits, Millis timeout,
                    const std::string& context, bool oversubscribed, FailureState& failure) {
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

}  // namespace cuda_p2p::host
