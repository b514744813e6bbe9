// The "tiny sleep kernel" of the fused pipelines (NOTE [Launch order] in
// ops/fused_matmul_reduce_scatter.cpp). Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cuda_p2p::cuda {

// Enqueues a one-thread kernel on `stream` that sleeps for about `nanoseconds`.
cudaError_t launch_sleep(cudaStream_t stream, uint32_t nanoseconds);
// Loads it now (NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh).
cudaError_t load_sleep_kernel();

}  // namespace cuda_p2p::cuda
