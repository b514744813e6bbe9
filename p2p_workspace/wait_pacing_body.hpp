// How a GPU wait paces its polls (NOTE [Wait pacing]): when it sleeps, for how long, and which
// polls ask the failure words and the deadline. Written once for the GPU and the host (NOTE [One
// kernel source] in ops/kernel_body.hpp): the flag barrier (p2p_workspace/cuda/graph_barrier.cuh)
// and the signal waits (p2p_workspace/cuda/signal_kernels.cu) run it with %globaltimer, and
// tests/cpp/test_kernel_matrix.cpp runs the same functions on made-up times. Plain C++ without
// torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"  // CUDA_P2P_HOST_DEVICE

namespace cuda_p2p {

// NOTE [Wait pacing]
// A waiting GPU thread polls its flag, a word of its own GPU's memory that the peer writes over
// NVLink, at every spin. The other things it must notice - a peer's failure, this device's
// failure or give-up elsewhere (NOTE [Failure words] in watchdog.hpp), the deadline - are words
// of host memory, each read a PCIe round trip (about 1 us) that a spin would wait for in order
// before it looks at the flag again. So:
//  - the first kWaitSpinNs of a wait spin without sleeping: ranks that arrive together meet
//    within a few microseconds, and a sleep there (at least the scheduler's granularity) would
//    be added to the op's latency;
//  - later polls sleep between them, doubling from kWaitFirstSleepNs up to kWaitMaxSleepNs: a
//    late peer is seen within about a microsecond of its arrival, and a long wait costs the SM
//    little;
//  - a poll asks the host words (failure words, then the deadline) only once kWaitAskEveryNs has
//    passed since the wait began or since the last poll that asked them. A failure is then seen
//    within about that much of its record; nothing waits for a failure faster than the watchdog's
//    scan (milliseconds) anyway, and the deadline is the group's timeout (seconds). A flag that is
//    set is taken at every poll, before any host word, as before (NOTE [Who traps]: a tag that
//    came is used even when a failure came too).
// The host device's waits do not pace (they sleep in the kernel: futex_wait.cpp) and ask the host
// words at every poll.
inline constexpr uint64_t kWaitSpinNs = 16000;
inline constexpr uint32_t kWaitFirstSleepNs = 64;
inline constexpr uint32_t kWaitMaxSleepNs = 1024;
inline constexpr uint64_t kWaitAskEveryNs = 20000;

struct WaitPacing {
  uint64_t start_ns = 0;
  uint64_t asked_ns = 0;  // when a poll last asked the host words (the start, before any)
  uint32_t sleep_ns = 0;  // the last sleep (0: spinning)
};

CUDA_P2P_HOST_DEVICE inline WaitPacing wait_pacing_start(uint64_t now_ns) {
  WaitPacing p;
  p.start_ns = now_ns;
  p.asked_ns = now_ns;
  return p;
}

// Whether the poll at now_ns asks the host words (and then it counts as asked).
CUDA_P2P_HOST_DEVICE inline bool wait_asks(WaitPacing& p, uint64_t now_ns) {
  if (now_ns - p.asked_ns < kWaitAskEveryNs) return false;
  p.asked_ns = now_ns;
  return true;
}

// Whether the wait, at now_ns, has lasted longer than timeout_ns.
CUDA_P2P_HOST_DEVICE inline bool wait_past(const WaitPacing& p, uint64_t now_ns,
                                           uint64_t timeout_ns) {
  return now_ns - p.start_ns > timeout_ns;
}

// How long to sleep after an unsuccessful poll at now_ns (0: spin on).
CUDA_P2P_HOST_DEVICE inline uint32_t wait_sleep_ns(WaitPacing& p, uint64_t now_ns) {
  if (now_ns - p.start_ns < kWaitSpinNs) return 0;
  p.sleep_ns = p.sleep_ns == 0                     ? kWaitFirstSleepNs
               : p.sleep_ns >= kWaitMaxSleepNs / 2 ? kWaitMaxSleepNs
                                                   : p.sleep_ns * 2;
  return p.sleep_ns;
}

}  // namespace cuda_p2p
