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
constexpr int kSpins = 256;  // ~6 us of PAUSE: long enough for a peer on another core
constexpr auto kSpinTime = std::chrono::microseconds(8);  // the same, for a scheduler's polling
constexpr int kYields = 4;  // oversubscribed: a few sched_yield, then sleep
constexpr auto kMaxSleep = std::chrono::milliseconds(10);
// A sleep with nothing to wake it early: a stream another thread is running, an old kernel.
constexpr auto kNap = std::chrono::microseconds(100);

// Sleeps in the kernel (futex on the shared word) until `word` reaches `value` (sequence-number
// order) or `deadline` passes. Returns whether it was reached.
bool futex_sleep_until(const uint32_t* word, uint32_t value,
                       std::chrono::steady_clock::time_point deadline);
// Sleeps until any of the words changes from the value it holds now, or `deadline` passes
// (futex_waitv; a short nap where the kernel lacks it). Returns at once if one already reached
// its target.
void futex_sleep_any(const std::vector<SignalWait>& waits,
                     std::chrono::steady_clock::time_point deadline);
// Stores `value` with release order and wakes every waiter (of any process).
void futex_store_and_wake(uint32_t* word, uint32_t value);

// True when every wait is satisfied; after `deadline`, throws an error naming every peer still
// missing (not only the first). Throws at once when the device failed (NOTE [Device failure]).
bool check_waits(const std::vector<SignalWait>& waits,
                 std::chrono::steady_clock::time_point deadline, Millis timeout,
                 const std::string& context, const FailureState& failure);
// The blocking wait of an executor thread (or of the inline stream of a threaded device). Sleeps
// at most kMaxSleep at a time, so that an abort is seen within that.
void block_on_waits(const std::vector<SignalWait>& waits, Millis timeout,
                    const std::string& context, bool oversubscribed, const FailureState& failure);

}  // namespace cuda_p2p::host
