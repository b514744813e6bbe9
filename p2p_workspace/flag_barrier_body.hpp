// The flag barrier's logic (NOTE [Graph flags] in p2p_workspace/graph_flags.hpp), written once for
// the GPU and the host (NOTE [One kernel source] in ops/kernel_body.hpp): what one peer's part of a
// barrier stores, what one poll of its flag decides, and in which order the poll asks. The CUDA
// barrier (p2p_workspace/cuda/graph_barrier.cuh) runs it with one thread per peer and traps where
// the poll says so; the host's GraphRun (p2p_workspace/host/host_device_capture.cpp) runs every peer of
// every block in one task and raises there. Plain C++ without torch headers, so that nvcc
// compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p {

// What a poll of one flag found, in the order the poll asks (a set flag first: a tag that came is
// used even when a failure came too).
enum class FlagPoll : uint8_t {
  kWaiting,     // not set yet: poll again
  kPassed,      // this op's tag: consumed (the word is back at zero)
  kForeign,     // another op's tag: the ranks are at different ops
  kPeerFailed,  // not set, and a peer's failure reached this rank's failure word
  kEnded,       // not set, and this device failed or gave up on another wait: end quietly
  kTimedOut,    // not set at the deadline
};

// What the block does after the barrier: go on, end quietly (its host knows why, or learns it
// from the failure word), or give up with an error (CUDA: trap after the record; the host's
// model of a trap: NOTE [Who traps]).
enum class FlagOutcome : uint8_t { kPass = 0, kEnd = 1, kFail = 2 };

// NOTE [Who traps]
// A trap loses the CUDA context: the process must restart, and under MPS every client of the GPU
// goes with it. So a kernel gives up with an error only where nobody else can know:
//  - at its own deadline, and at a foreign tag (the ranks are at different ops: a protocol
//    violation its host cannot see), after recording why in the host-mapped give-up record;
//  - not at a peer's failure: the failure word that ended the wait is host memory, and the
//    rank's host turns it into the group's failure (every check, the watchdog's scan), so the next
//    cuda_p2p call raises naming the rank and its reason, and cuda_p2p.check(group) says so
//    without a GPU synchronize in a loop that only replays graphs. The kernel ends quietly;
//  - not at this device's own failure or give-up elsewhere (an abort, a shutdown, an eager
//    timeout, a mismatch): its host knows.
// A job that prefers to die fast under an elastic launcher opts back in to trapping at a peer's
// failure (Options.trap_on_peer_failure, CUDA_P2P_TRAP_ON_PEER_FAILURE). The host device with
// CUDA's semantics models a trap as a lost context it records (Device::lost_context) before it
// raises into the stream, so that the suites assert no healthy peer ever reaches one.
CUDA_P2P_HOST_DEVICE inline FlagOutcome flag_outcome(FlagPoll p, bool trap_on_peer_failure) {
  switch (p) {
    case FlagPoll::kWaiting:
    case FlagPoll::kPassed:
      return FlagOutcome::kPass;
    case FlagPoll::kEnded:
      return FlagOutcome::kEnd;
    case FlagPoll::kPeerFailed:
      return trap_on_peer_failure ? FlagOutcome::kFail : FlagOutcome::kEnd;
    default:
      return FlagOutcome::kFail;
  }
}

// A policy F of the flag barrier provides (each side's memory operations, NOTE [One kernel
// source]):
//   uint32_t load_acquire(const uint32_t*) const   a flag's value (the host: without its sleeper
//                                                  bit), ordering what its store published
//   void store_release(uint32_t*, uint32_t) const  a flag set in a peer's pad, publishing what
//                                                  this rank wrote before (the host: and wakes)
//   void clear(uint32_t*) const                    a consumed flag back to zero
//   void zero(uint32_t*) const                     a word of the open's reset
//   bool peer_failed() const                       a peer's failure reached this rank's word
//   bool ended() const                             this device failed or gave up elsewhere
//   uint32_t busy_cas(uint32_t* p, uint32_t expected, uint32_t desired) const
//                                                  the graph busy word: an atomic compare-and-
//                                                  swap (acquire and release) that returns the
//                                                  value it found (NOTE [One captured op at a
//                                                  time])

// The open's reset (barrier 0 of block 0): this rank's graph counts start from zero, before its
// first store. Thread t of n zeroes its share.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void flag_open(const GraphLaunch& g, int block, int i, int t, int n,
                                           const F& f) {
  if (i != 0 || block != 0) return;
  for (uint32_t w = static_cast<uint32_t>(t); w < g.reset_words; w += static_cast<uint32_t>(n)) {
    f.zero(g.reset + w);
  }
}

// Peer q's part of barrier i of `block`: this rank's tag into its slot of peer q's pad.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void flag_arrive(const GraphLaunch& g, int block, int i, int q,
                                             const F& f) {
  f.store_release(g.theirs(block, i, q), g.tag);
}

// One poll of peer q's flag in barrier i of `block`; `past_deadline`: the wait has lasted longer
// than the group's timeout. `seen` gets the foreign tag (kForeign). `ask`: whether this poll asks
// the failure words and the deadline when the flag is not set (NOTE [Wait pacing] in
// p2p_workspace/wait_pacing_body.hpp: a GPU asks them on some polls only).
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline FlagPoll flag_poll(const GraphLaunch& g, int block, int i, int q,
                                               bool past_deadline, const F& f, uint32_t* seen,
                                               bool ask = true) {
  uint32_t* mine = g.mine(block, i, q);
  const uint32_t word = f.load_acquire(mine);
  if (word != 0) {
    if ((word & kGraphTagMask) == g.tag) {
      f.clear(mine);  // before this rank's next store into the peer's slot (NOTE [Graph flags])
      return FlagPoll::kPassed;
    }
    *seen = word & kGraphTagMask;
    return FlagPoll::kForeign;
  }
  if (!ask) return FlagPoll::kWaiting;
  if (f.peer_failed()) return FlagPoll::kPeerFailed;  // NOTE [Failure words]
  if (f.ended()) return FlagPoll::kEnded;
  if (past_deadline) return FlagPoll::kTimedOut;
  return FlagPoll::kWaiting;
}

// NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp: one block of `g` takes this
// rank's graph busy word at the kernel's entry. Returns 0 when the block may run (taken, or the
// kernel does not take it), else the owner that holds it.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline uint32_t graph_take(const GraphLaunch& g, const F& f) {
  if (!g.takes || g.busy == nullptr) return 0;
  uint32_t seen = 0;
  while (true) {
    const uint32_t holder = seen >> kGraphBusyCountBits;
    if (holder != 0 && holder != g.owner) return holder;
    const uint32_t want = (g.owner << kGraphBusyCountBits) | ((seen & kGraphBusyCountMask) + 1);
    const uint32_t found = f.busy_cas(g.busy, seen, want);
    if (found == seen) return 0;
    seen = found;
  }
}

// One block of `g` gives the word back at the kernel's end (a kernel that takes it, or an op's
// close). A word another owner holds is left alone: this op never took it (its open was refused).
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void graph_release(const GraphLaunch& g, const F& f) {
  if (!g.releases || g.busy == nullptr) return;
  uint32_t seen = (g.owner << kGraphBusyCountBits) | 1u;
  while (true) {
    if ((seen >> kGraphBusyCountBits) != g.owner || (seen & kGraphBusyCountMask) == 0) return;
    const uint32_t count = (seen & kGraphBusyCountMask) - 1;
    const uint32_t want = count == 0 ? 0u : (g.owner << kGraphBusyCountBits) | count;
    const uint32_t found = f.busy_cas(g.busy, seen, want);
    if (found == seen) return;
    seen = found;
  }
}

}  // namespace cuda_p2p
