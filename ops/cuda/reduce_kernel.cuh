// The CUDA reduction of the workspace collectives (ops/reduction.cpp, reduce()): the W sources in
// one pass, packed 16-byte loads, float32 accumulation for float16 / bfloat16, instead of a chain
// of W binary ATen ops through an accumulator in memory. Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/graph_layout.hpp"
#include "ops/reduce_op.hpp"

namespace cuda_p2p::cuda {

inline constexpr int kMaxReduceSources = 64;

struct ReduceArgs {
  void* dst = nullptr;
  bool dst_acc = false;  // dst holds the accumulate type (a ring's partial)
  void* also = nullptr;  // or null: the same result again, in the result type
  const void* src[kMaxReduceSources] = {};
  uint64_t src_acc = 0;  // bit i: source i holds the accumulate type
  int count = 0;
  int64_t numel = 0;
  ops::graph::Dtype dtype = ops::graph::Dtype::kFloat;  // the result's type
  ops::ReduceOp op = ops::ReduceOp::kSum;
  int64_t divisor = 1;  // AVG
};

// dst = op(src[0], ..., src[count - 1]) on the stream: each element combined in source order in
// the accumulate type (the bits a chain of ATen ops on a float32 accumulator gives), AVG divided
// once, rounded once. dst (and also) may be one of the sources.
cudaError_t launch_reduce(const ReduceArgs& args, cudaStream_t stream);
// NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh.
cudaError_t load_reduce_kernels();

}  // namespace cuda_p2p::cuda
