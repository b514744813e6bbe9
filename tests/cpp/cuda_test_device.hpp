// The CUDA device a GPU test builds a workspace on itself, as the backend makes one: with the
// ops' kernels loaded into its context before the first op (ops/cuda/op_kernels.cuh). A kernel
// loaded lazily at its first launch behind a blocked wait waits for that stream (NOTE [Kernels
// loaded up front] in p2p_workspace/cuda/signal_kernels.cuh): the GPU run of 2026-12-04 hung so
// in the stall test run alone. Only with CUDA_P2P_WITH_CUDA.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <memory>

#include "ops/cuda/op_kernels.cuh"
#include "p2p_workspace/cuda/cuda_device.hpp"

namespace cuda_p2p::test {

inline std::shared_ptr<Device> cuda_device_with_op_kernels(int dev) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
  auto device = make_cuda_device(dev);
  const cudaError_t err = cuda::load_op_kernels();
  TORCH_CHECK(err == cudaSuccess, "loading the ops' CUDA kernels: ", cudaGetErrorString(err));
  return device;
}

}  // namespace cuda_p2p::test
