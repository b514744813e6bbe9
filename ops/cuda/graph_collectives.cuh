// The CUDA kernels of the captured collectives run as one kernel each (NOTE [Captured collectives
// in one kernel] in ops/captured_collectives.cpp): the flag barriers of
// p2p_workspace/cuda/graph_barrier.cuh and the data between them, cut as ops/graph_layout.hpp
// says. A translation of the host's body of the same ops (ops/captured_collectives.cpp): a change
// to one is a change to both (where each has run: docs/testing.md). Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/graph_layout.hpp"
#include "ops/reduce_op.hpp"
#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p::cuda {

struct GraphCollective {
  ops::graph::Layout layout;
  ops::graph::Dtype dtype = ops::graph::Dtype::kFloat;  // all-gather: moved as bytes
  ops::ReduceOp op = ops::ReduceOp::kSum;
  int64_t divisor = 1;       // AVG
  const char* in = nullptr;  // one-shot, two-shot, all-gather
  char* out = nullptr;       // one-shot, two-shot, reduce-scatter
  // Reduce-scatter: this rank's contribution to rank c's chunk; all-gather: where rank q's input
  // lands; every rank's graph region as mapped here.
  const char* ins[kMaxGraphRanks] = {};
  char* outs[kMaxGraphRanks] = {};
  char* region[kMaxGraphRanks] = {};
  // Every pointer 16-byte aligned: the blocks' ranges start at whole 16-byte units of each.
  bool packed = false;
};

// The op as one kernel of op.layout.blocks blocks on `stream`.
cudaError_t launch_graph_collective(const GraphCollective& op, const GraphLaunch& launch,
                                    cudaStream_t stream);
// NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh.
cudaError_t load_graph_collective_kernels();

}  // namespace cuda_p2p::cuda
