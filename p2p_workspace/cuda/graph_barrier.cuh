// The flag barrier on the GPU (NOTE [Graph flags] in p2p_workspace/graph_flags.hpp): the device
// function every kernel op calls between its data steps, and the whole of a kernel of barriers
// only. Its stores, polls and decisions are the host's GraphRun's (p2p_workspace/host/
// host_device_capture.cpp): one source, p2p_workspace/flag_barrier_body.hpp; what stays here is the
// block's threads (one per peer), the sleep between polls, the give-up record and the trap.
// Plain CUDA, device code only.
#pragma once

#include <cstdint>

#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/graph_flags.hpp"
#include "p2p_workspace/wait_pacing_body.hpp"

namespace cuda_p2p::cuda {

namespace graph_detail {

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* addr, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* addr) {
  return *static_cast<const volatile uint32_t*>(addr);
}

// The flag barrier's policy (p2p_workspace/flag_barrier_body.hpp): system-scope acquire and
// release on the flags; the failure words and the give-up record of `g`.
struct CudaFlags {
  const GraphLaunch& g;
  __device__ uint32_t load_acquire(const uint32_t* p) const { return load_acquire_sys(p); }
  __device__ void store_release(uint32_t* p, uint32_t v) const { store_release_sys(p, v); }
  __device__ void clear(uint32_t* p) const { *static_cast<volatile uint32_t*>(p) = 0; }
  __device__ void zero(uint32_t* p) const { *static_cast<volatile uint32_t*>(p) = 0; }
  __device__ bool peer_failed() const {
    if (g.peer_failed == nullptr) return false;
    const uint32_t failed = load_volatile(g.peer_failed);
    return failed != 0 && failed != static_cast<uint32_t>(g.rank) + 1;
  }
  // Only this GPU's kernels touch the busy word: a device-scope compare-and-swap, relaxed;
  // graph_enter and graph_leave give it the acquire and release order with their fences.
  __device__ uint32_t busy_cas(uint32_t* p, uint32_t expected, uint32_t desired) const {
    return atomicCAS(p, expected, desired);
  }
  __device__ bool ended() const {
    return (g.failed != nullptr && load_volatile(g.failed) != 0) ||
           load_volatile(&static_cast<const GraphGiveUp*>(g.give_up)->gave_up) != 0;
  }
};

}  // namespace graph_detail

// NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp: the calling block takes this
// rank's graph busy word where `g` takes it; every thread calls it first. False: another captured
// op holds it; the block must end at once, touching nothing (recorded in g.give_up, which fails
// the device: nobody traps).
__device__ __forceinline__ bool graph_enter(const GraphLaunch& g) {
  using namespace graph_detail;
  __shared__ int refused;
  if (threadIdx.x == 0) {
    const uint32_t holder = graph_take(g, CudaFlags{g});
    refused = holder != 0 ? 1 : 0;
    if (holder != 0) {
      auto* give_up = static_cast<GraphGiveUp*>(g.give_up);
      atomicCAS_system(&give_up->busy_tag, 0u, g.tag);
      atomicAdd_system(&give_up->busy, 1u);
      __threadfence_system();
      atomicAdd_system(&give_up->gave_up, 1u);
    }
    __threadfence();  // the holder's last writes before this block's first
  }
  __syncthreads();
  return refused == 0;
}

// The calling block gives the busy word back where `g` does, after everything it did (every
// thread calls it, after graph_enter returned true, however the block's barriers ended).
__device__ __forceinline__ void graph_leave(const GraphLaunch& g) {
  using namespace graph_detail;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // the block's writes before the next holder's
    graph_release(g, CudaFlags{g});
  }
}

// NOTE [Release after the block's barrier]
// What the block wrote before a barrier (its data steps: stores into peers' regions over NVLink,
// loads it must finish before a peer overwrites them) is published to a peer by one thread's
// st.release.sys of the flag, after the block's __syncthreads: in PTX's memory model the
// barrier orders every thread's earlier accesses before the storing thread's release
// (bar.sync is morally strong at CTA scope), and causality order is transitive across the two
// scopes, so the peer's ld.acquire.sys that reads the flag sees all of them. A fence.sc.sys
// before the release (issue 55: "for nothing") added a system-wide fence to every barrier. Not
// run on a GPU yet.

// Barrier `i` of `g` for the calling block; every thread of the block calls it (it synchronizes
// the block, so that what every thread wrote before is published by the stores, and what the
// peers published is visible to every thread after it). Thread q < world_size stores this rank's
// tag into peer q's slot and consumes peer q's word in its own. Returns true when the block goes
// on, false when the kernel must end quietly: this device failed, or another wait of it gave up,
// which its host knows, or a peer's failure reached this rank's failure word, which its host
// reads. Traps only where nobody else can know (NOTE [Who traps] in
// p2p_workspace/flag_barrier_body.hpp) - at the deadline, at a foreign tag; at a peer's failure
// word only where the group asked for it - after recording why in g.give_up, which the host reads.
__device__ __forceinline__ bool graph_barrier(const GraphLaunch& g, int i) {
  using namespace graph_detail;
  __shared__ int verdict;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const CudaFlags f{g};
  if (t == 0) verdict = static_cast<int>(FlagOutcome::kPass);
  flag_open(g, b, i, t, static_cast<int>(blockDim.x), f);
  __syncthreads();
  if (t < g.world_size && t != g.rank) {
    auto* give_up = static_cast<GraphGiveUp*>(g.give_up);
    flag_arrive(g, b, i, t, f);  // NOTE [Release after the block's barrier]
    WaitPacing pace = wait_pacing_start(global_timer_ns());
    while (true) {
      uint32_t seen = 0;
      const uint64_t now = global_timer_ns();
      const bool ask = wait_asks(pace, now);  // NOTE [Wait pacing]
      const FlagPoll p =
          flag_poll(g, b, i, t, ask && wait_past(pace, now, g.timeout_ns), f, &seen, ask);
      if (p == FlagPoll::kWaiting) {
        const uint32_t sleep_ns = wait_sleep_ns(pace, now);
        if (sleep_ns != 0) __nanosleep(sleep_ns);
        continue;
      }
      if (p == FlagPoll::kForeign) {
        atomicOr_system(&give_up->foreign_bits[t / 32], 1u << (t % 32));
        atomicCAS_system(&give_up->foreign_tag, 0u, seen);
        atomicExch_system(&give_up->own_tag, g.tag);
      } else if (p == FlagPoll::kTimedOut) {
        atomicOr_system(&give_up->peer_bits[t / 32], 1u << (t % 32));
      }
      if (p == FlagPoll::kForeign || p == FlagPoll::kTimedOut) {
        __threadfence_system();
        atomicAdd_system(&give_up->gave_up, 1u);
      }
      atomicMax(&verdict, static_cast<int>(flag_outcome(p, g.trap_on_peer_failure)));
      break;
    }
  }
  __syncthreads();
  const auto v = static_cast<FlagOutcome>(verdict);
  __syncthreads();  // every thread has read it before the next barrier sets it again
  if (v == FlagOutcome::kFail) {
    __threadfence_system();
    // A replay-only loop calls nothing of cuda_p2p's: the trap makes torch's next synchronize
    // raise, after the host-mapped record says why.
    __trap();
  }
  return v == FlagOutcome::kPass;
}

}  // namespace cuda_p2p::cuda
