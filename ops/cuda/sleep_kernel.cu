#include "ops/cuda/sleep_kernel.cuh"
#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/launch_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

__global__ void sleep_kernel(uint32_t nanoseconds) {
  // __nanosleep may return early (its duration is a hint): sleep until the timer says so.
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) __nanosleep(256);
}

}  // namespace

cudaError_t launch_sleep(cudaStream_t stream, uint32_t nanoseconds) {
  return launch_kernel(sleep_kernel, 1, 1, stream, nanoseconds);
}

cudaError_t load_sleep_kernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, sleep_kernel);
}

}  // namespace cuda_p2p::cuda
