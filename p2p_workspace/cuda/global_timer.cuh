// The GPU's global nanosecond timer (%globaltimer), for device-side timeouts and sleeps. Plain
// CUDA, device code only.
#pragma once

#include <cstdint>

namespace cuda_p2p::cuda {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace cuda_p2p::cuda
