#include "ops/cuda/sleep_kernel.cuh"
#include "ops/sleep_body.hpp"
#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/launch_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

// The sleep body's policy (ops/sleep_body.hpp): the GPU's timer and __nanosleep.
struct CudaClock {
  __device__ uint64_t now_ns() const { return global_timer_ns(); }
  __device__ void sleep(uint32_t ns) const { __nanosleep(ns); }
};

__global__ void sleep_kernel(uint32_t nanoseconds) {
  ops::kernel::sleep_for(nanoseconds, CudaClock{});
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
