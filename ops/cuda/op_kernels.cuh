// Every kernel of ops/cuda/, loaded now into the current device's context (NOTE [Kernels loaded
// up front] in p2p_workspace/cuda/signal_kernels.cuh): what makes a CUDA workspace for ops must
// call it before its first op - the backend, and the tests that build a workspace themselves (the
// GPU run of 2026-12-04: test_cuda_collectives' stall test run alone, with no earlier test to load
// them, hung with its first reduction launched behind a blocked wait). Plain CUDA: no torch
// headers. Returns the first error.
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/graph_collectives.cuh"
#include "ops/cuda/reduce_kernel.cuh"
#include "ops/cuda/signature_kernel.cuh"
#include "ops/cuda/sleep_kernel.cuh"

namespace cuda_p2p::cuda {

inline cudaError_t load_op_kernels() {
  cudaError_t err = load_signature_kernels();
  if (err == cudaSuccess) err = load_sleep_kernel();
  if (err == cudaSuccess) err = load_reduce_kernels();
  if (err == cudaSuccess) err = load_graph_collective_kernels();
  return err;
}

}  // namespace cuda_p2p::cuda
