// The CUDA kernels of the captured collectives run as one kernel each (NOTE [Captured collectives
// in one kernel] in ops/captured_collectives.cpp): the flag barriers of
// p2p_workspace/cuda/graph_barrier.cuh and the data between them, cut as ops/graph_layout.hpp
// says; the data steps are the body the host runs too (ops/graph_collective_body.hpp). Plain
// CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/graph_collective_body.hpp"
#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p::cuda {

// What the kernel moves (ops/graph_collective_body.hpp; NOTE [One kernel source] in
// ops/kernel_body.hpp).
using GraphCollective = ops::graph::KernelArgs;

// The op as one kernel of op.layout.blocks blocks on `stream`.
cudaError_t launch_graph_collective(const GraphCollective& op, const GraphLaunch& launch,
                                    cudaStream_t stream);
// Data step `step` of the op alone, every block, no flag barrier: for the kernel matrix on a GPU
// (tests/cpp/test_cuda_kernel_matrix.cpp), which orders the ranks' steps itself.
cudaError_t launch_graph_collective_step(const GraphCollective& op, int step,
                                         cudaStream_t stream);
// NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh.
cudaError_t load_graph_collective_kernels();

}  // namespace cuda_p2p::cuda
