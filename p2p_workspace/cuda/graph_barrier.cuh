// The flag barrier on the GPU (NOTE [Graph flags] in p2p_workspace/graph_flags.hpp): the device
// function every kernel op calls between its data steps, and the whole of a kernel of barriers
// only. A translation, step for step, of the host's GraphRun (p2p_workspace/host/host_device.cpp):
// a change to one is a change to both (where each has run: docs/testing.md). Plain CUDA, device
// code only.
#pragma once

#include <cstdint>

#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/graph_flags.hpp"

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

// What a block does after a barrier: go on, end quietly, or trap.
constexpr int kPass = 0;
constexpr int kEnd = 1;
constexpr int kTrap = 2;

}  // namespace graph_detail

// Barrier `i` of `g` for the calling block; every thread of the block calls it (it synchronizes
// the block, so that what every thread wrote before is published by the stores, and what the
// peers published is visible to every thread after it). Thread q < world_size stores this rank's
// tag into peer q's slot and consumes peer q's word in its own. Returns true when the block goes
// on, false when the kernel must end quietly: this device failed, or another wait of it gave up,
// which its host knows. Traps where the host device raises - at the deadline, at a foreign tag,
// at a peer's failure word (NOTE [Counted waits end with the failure] in watchdog.hpp) - after
// recording why in g.give_up, which the host reads.
__device__ __forceinline__ bool graph_barrier(const GraphLaunch& g, int i) {
  using namespace graph_detail;
  __shared__ int verdict;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) verdict = kPass;
  if (i == 0 && blockIdx.x == 0) {  // an open: this rank's graph counts start from zero
    for (uint32_t w = static_cast<uint32_t>(t); w < g.reset_words; w += blockDim.x) {
      *static_cast<volatile uint32_t*>(g.reset + w) = 0;
    }
  }
  __syncthreads();
  if (t < g.world_size && t != g.rank) {
    auto* give_up = static_cast<GraphGiveUp*>(g.give_up);
    const int b = static_cast<int>(blockIdx.x);
    __threadfence_system();  // with the block's barrier above: the block's writes come first
    store_release_sys(g.theirs(b, i, t), g.tag);
    uint32_t* mine = g.mine(b, i, t);
    const uint64_t start = global_timer_ns();
    unsigned sleep_ns = 32;
    while (true) {
      const uint32_t seen = load_acquire_sys(mine);
      if (seen != 0) {
        if ((seen & kGraphTagMask) == g.tag) {
          *static_cast<volatile uint32_t*>(mine) = 0;  // before this thread's next store
        } else {
          atomicOr_system(&give_up->foreign_bits[t / 32], 1u << (t % 32));
          atomicCAS_system(&give_up->foreign_tag, 0u, seen & kGraphTagMask);
          atomicExch_system(&give_up->own_tag, g.tag);
          __threadfence_system();
          atomicAdd_system(&give_up->gave_up, 1u);
          atomicMax(&verdict, kTrap);
        }
        break;
      }
      if (g.peer_failed != nullptr) {
        const uint32_t failed = load_volatile(g.peer_failed);
        if (failed != 0 && failed != static_cast<uint32_t>(g.rank) + 1) {
          atomicMax(&verdict, kTrap);  // NOTE [Failure words]: a peer failed
          break;
        }
      }
      if ((g.failed != nullptr && load_volatile(g.failed) != 0) ||
          load_volatile(&give_up->gave_up) != 0) {
        atomicMax(&verdict, kEnd);
        break;
      }
      if (global_timer_ns() - start > g.timeout_ns) {
        atomicOr_system(&give_up->peer_bits[t / 32], 1u << (t % 32));
        __threadfence_system();
        atomicAdd_system(&give_up->gave_up, 1u);
        atomicMax(&verdict, kTrap);
        break;
      }
      __nanosleep(sleep_ns);
      if (sleep_ns < 8192) sleep_ns *= 2;
    }
  }
  __syncthreads();
  const int v = verdict;
  __syncthreads();  // every thread has read it before the next barrier sets it again
  if (v == kTrap) {
    __threadfence_system();
    // A replay-only loop calls nothing of cuda_p2p's: the trap makes torch's next synchronize
    // raise, after the host-mapped record says why.
    __trap();
  }
  return v == kPass;
}

}  // namespace cuda_p2p::cuda
