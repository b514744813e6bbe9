// The CUDA reduction of the workspace collectives (ops/reduction.cpp, reduce()): the W sources in
// one pass, packed 16-byte loads, float32 accumulation for float16 / bfloat16, instead of a chain
// of W binary ATen ops through an accumulator in memory; its body is one source with the host
// (ops/kernel_body.hpp: reduce_kernel_body). Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/kernel_body.hpp"

namespace cuda_p2p::cuda {

// The arguments and the body are the host's too (ops/kernel_body.hpp).
using ops::kernel::kMaxReduceSources;
using ops::kernel::ReduceArgs;

// dst = op(src[0], ..., src[count - 1]) on the stream: each element combined in source order in
// the accumulate type (the bits a chain of ATen ops on a float32 accumulator gives), AVG divided
// once, rounded once. dst (and also) may be one of the sources.
cudaError_t launch_reduce(const ReduceArgs& args, cudaStream_t stream);
// NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh.
cudaError_t load_reduce_kernels();

}  // namespace cuda_p2p::cuda
