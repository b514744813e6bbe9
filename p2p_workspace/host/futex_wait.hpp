// Host waits on signal words: poll with back-off, then sleep in the kernel on the word's futex
// (NOTE [Host waits on shared cores] and NOTE [Host signal ordering] in futex_wait.cpp). Used by
// the host streams (host_stream.cpp) and the host device (host_device.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "p2p_workspace/device.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CUDA_P2P_CPU_RELAX() _mm_pause()
#else
#define CUDA_P2P_CPU_RELAX() std::this_thread::yield()
#endif

namespace cuda_p2p {
class FailureState;  // p2p_workspace/watchdog.hpp
}  // namespace cuda_p2p

namespace cuda_p2p::host {

// The back-off of every host wait (NOTE [Host waits on shared cores] in futex_wait.cpp).
constexpr auto kSpinTime = std::chrono::microseconds(8);     // PAUSE, with a core of one's own
constexpr auto kYieldTime = std::chrono::microseconds(100);  // then sched_yield, then sleep
constexpr auto kMaxSleep = std::chrono::milliseconds(10);
// A sleep with nothing to wake it early: a stream another thread is running, an old kernel.
constexpr auto kNap = std::chrono::microseconds(100);

// Whether a waiter that has polled for `waited` keeps polling; if so it polls once more (a PAUSE,
// or a sched_yield when oversubscribed or past kSpinTime) before returning true.
bool poll_more(std::chrono::steady_clock::duration waited, bool oversubscribed);

// Polls until every wait is satisfied (true) or kSpinTime has passed (false), backing off as
// poll_more does; never sleeps. The first step of an inline wait (NOTE [Inline signals] in
// p2p_workspace/device.hpp), which then goes on with the blocking wait.
bool poll_briefly(c10::ArrayRef<SignalWait> waits, bool oversubscribed);

// Sleeps in the kernel (futex on the shared word) until `word` reaches `value` (31-bit
// sequence-number order: NOTE [Sleeper bit]) or `deadline` passes. Returns whether it was reached.
bool futex_sleep_until(const uint32_t* word, uint32_t value,
                       std::chrono::steady_clock::time_point deadline);
// Sleeps until any of the words changes from the value it holds now, or `deadline` passes
// (futex_waitv; a short nap where the kernel lacks it). Returns at once if one already reached
// its target.
void futex_sleep_any(const std::vector<SignalWait>& waits,
                     std::chrono::steady_clock::time_point deadline);
// Stores `value` (its low 31 bits: NOTE [Sleeper bit] in futex_wait.cpp) with release order and
// wakes the waiters (of any process) that may sleep on the word.
void futex_store_and_wake(uint32_t* word, uint32_t value);

// Whether `w`'s word has reached its value (an acquire load: the writer's earlier stores are
// visible once it has).
bool arrived(const SignalWait& w);

// True when every wait is satisfied; after `deadline`, throws an error naming every peer still
// missing (not only the first). Throws at once when the device failed (NOTE [Device failure]).
bool check_waits(const std::vector<SignalWait>& waits,
                 std::chrono::steady_clock::time_point deadline, Millis timeout,
                 const std::string& context, FailureState& failure);
// The blocking wait of an executor thread (or of the inline stream of a threaded device). Sleeps
// at most kMaxSleep at a time, so that an abort is seen within that.
void block_on_waits(const std::vector<SignalWait>& waits, Millis timeout,
                    const std::string& context, bool oversubscribed, FailureState& failure);

}  // namespace cuda_p2p::host
