// The "tiny sleep kernel" of the fused pipelines (NOTE [Launch order] in
// ops/fused_matmul_reduce_scatter.cpp). Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cuda_p2p::cuda {

// Enqueues a one-thread kernel on `stream` that sleeps for about `nanoseconds`.
cudaError_t launch_sleep(cudaStream_t stream, uint32_t nanoseconds);

}  // namespace cuda_p2p::cuda
