// The sleep kernel's body (ops/cuda/sleep_kernel.cu: the ~2 us delay before a fused pipeline's
// second stream, NOTE [Launch order] in ops/fused_matmul_reduce_scatter.cpp), written once for the
// GPU and the host (NOTE [One kernel source] in ops/kernel_body.hpp): the CUDA kernel runs it with
// %globaltimer and __nanosleep, tests/cpp/test_kernel_matrix.cpp with a made-up clock. Plain C++
// without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"  // CUDA_P2P_HOST_DEVICE, CUDA_P2P_POLICY_CALLS

namespace cuda_p2p::ops::kernel {

// The longest single sleep: a sleep's duration is a hint (__nanosleep may return early or late, up
// to about twice it), so the body sleeps in short steps and asks the clock after each.
inline constexpr uint32_t kSleepStepNs = 256;

// Sleeps until the clock says `ns` have passed since the call. A policy C provides
//   uint64_t now_ns() const       the clock
//   void sleep(uint32_t) const    a sleep of about that many nanoseconds
CUDA_P2P_POLICY_CALLS
template <typename C>
CUDA_P2P_HOST_DEVICE inline void sleep_for(uint32_t ns, const C& c) {
  const uint64_t start = c.now_ns();
  while (c.now_ns() - start < ns) c.sleep(kSleepStepNs);
}

}  // namespace cuda_p2p::ops::kernel
