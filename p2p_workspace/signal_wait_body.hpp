// The signal waits' logic, written once for the GPU and the host (NOTE [One kernel source] in
// ops/kernel_body.hpp): the eager wait (Device::wait_signals: values known when it is enqueued) and
// the counted wait of a captured op (Device::wait_counted, NOTE [Replay-safe signals]: values read
// from counters when it runs). One poll decides, in one order, whether the wait holds or why it
// ends; what each kind then does with the decision, and which waits it records as missing, is
// here too. The CUDA kernels (p2p_workspace/cuda/signal_kernels.cu) run it in one thread with a
// sleep between polls and record into host-mapped memory; the host device's waits with CUDA's
// semantics (p2p_workspace/host/host_device_cuda_semantics.cpp) run it as a task of the stream and record into
// its give-up record. Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p {

// What an eager wait writes into its give-up record's gave_up word when it ends early.
constexpr uint32_t kWaitGaveUp = 1;  // at its deadline
constexpr uint32_t kWaitEnded = 2;   // at a failure: the device's own or a peer's

// A policy F of the waits provides (each side's memory operations):
//   bool reached(const uint32_t* word, uint32_t value) const  the word is at `value` or past it
//       in its sequence order (an acquire load: what its writer published before is visible;
//       CUDA: 32-bit order; the host: 31-bit, its top bit being NOTE [Sleeper bit]'s)
//   bool peer_failed() const   a peer's failure reached this rank's failure word
//   bool ended() const         this device failed, or (counted waits) gave up on another wait
// A wait list W provides int count() const, const uint32_t* addr(int) const and
// uint32_t value(int) const.

// One poll of the waits from *next on: every wait reached steps *next past it; kPassed once all
// are. Else the decision for wait *next, in this order: a peer's failure, this device's end, the
// deadline (`past_deadline`: the wait has lasted longer than its timeout), else kWaiting; a poll
// that does not `ask` (NOTE [Wait pacing] in p2p_workspace/wait_pacing_body.hpp) reads none of
// them: kWaiting. The kinds kForeign never comes from a wait.
CUDA_P2P_POLICY_CALLS
template <typename W, typename F>
CUDA_P2P_HOST_DEVICE inline FlagPoll signal_wait_poll(const W& w, int* next, bool past_deadline,
                                                      const F& f, bool ask = true) {
  while (*next < w.count() && f.reached(w.addr(*next), w.value(*next))) ++*next;
  if (*next == w.count()) return FlagPoll::kPassed;
  if (!ask) return FlagPoll::kWaiting;
  if (f.peer_failed()) return FlagPoll::kPeerFailed;  // NOTE [Failure words]
  if (f.ended()) return FlagPoll::kEnded;
  if (past_deadline) return FlagPoll::kTimedOut;
  return FlagPoll::kWaiting;
}

// An eager wait never gives up with an error of its own: it records why it ended (the deadline,
// or a failure) and which waits are missing, and ends; the device's watchdog reads the record and
// fails the device, whose host raises (NOTE [Device failure] in p2p_workspace/watchdog.hpp).
CUDA_P2P_HOST_DEVICE inline FlagOutcome eager_wait_outcome(FlagPoll p) {
  return p == FlagPoll::kWaiting || p == FlagPoll::kPassed ? FlagOutcome::kPass : FlagOutcome::kEnd;
}
CUDA_P2P_HOST_DEVICE inline uint32_t eager_wait_give_up(FlagPoll p) {
  return p == FlagPoll::kTimedOut ? kWaitGaveUp : kWaitEnded;
}

// A counted wait (a replayed graph's) decides as the flag barrier does (NOTE [Who traps] in
// p2p_workspace/flag_barrier_body.hpp): it fails at its deadline; it ends quietly at a peer's
// failure (unless the group traps on one) and where this device failed or gave up on another
// wait, which its host knows.
CUDA_P2P_HOST_DEVICE inline FlagOutcome counted_wait_outcome(FlagPoll p,
                                                             bool trap_on_peer_failure) {
  return flag_outcome(p, trap_on_peer_failure);
}

// What a wait that ends early records as missing: mark(j) for every wait j from `next` on not
// reached now.
CUDA_P2P_POLICY_CALLS
template <typename W, typename F, typename Mark>
CUDA_P2P_HOST_DEVICE inline void signal_wait_missing(const W& w, int next, const F& f,
                                                     Mark&& mark) {
  for (int j = next; j < w.count(); ++j) {
    if (!f.reached(w.addr(j), w.value(j))) mark(j);
  }
}

}  // namespace cuda_p2p
