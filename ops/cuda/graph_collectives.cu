#include "ops/cuda/graph_collectives.cuh"
#include "ops/cuda/reduce_device.cuh"
#include "ops/graph_collective_body.hpp"
#include "p2p_workspace/cuda/graph_barrier.cuh"
#include "p2p_workspace/cuda/launch_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

using ops::graph::Kind;
using reduce::with_type;

using reduce::CudaBlock;

// NOTE [Captured collectives in one kernel] (ops/captured_collectives.cpp): after each flag
// barrier, the shared body's step (ops/graph_collective_body.hpp), block b of every rank on the
// same ranges.
template <typename T, bool kSum>
__global__ void __launch_bounds__(ops::graph::kThreads)
    graph_collective_kernel(GraphCollective a, GraphLaunch g) {
  const int b = static_cast<int>(blockIdx.x);
  const int barriers = a.layout.barriers();
  // NOTE [One captured op at a time]: the block holds the busy word from here to its end.
  if (!graph_enter(g)) return;
  for (int step = 0; step < barriers; ++step) {
    // Step 0 follows the op's open: every peer has ended its earlier ops, the region is free.
    if (!graph_barrier(g, step)) break;
    ops::graph::collective_step<T, kSum>(a, step, b, CudaBlock{});
  }
  graph_leave(g);
}

// One data step of the shared body alone, block b of one rank, no barrier: the kernel matrix on a
// GPU (tests/cpp/test_cuda_kernel_matrix.cpp) runs every rank's step s on one stream before any
// rank's step s + 1, as the host's matrix does, so the GPU's partitioning, tails, 16-byte packs
// and arithmetic are checked apart from the flag protocol.
template <typename T, bool kSum>
__global__ void __launch_bounds__(ops::graph::kThreads)
    graph_collective_step_kernel(GraphCollective a, int step) {
  ops::graph::collective_step<T, kSum>(a, step, static_cast<int>(blockIdx.x), CudaBlock{});
}

template <typename T>
cudaError_t launch_step_typed(const GraphCollective& a, int step, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.layout.blocks));
  return launch_kernel(ops::graph::sums(a) ? graph_collective_step_kernel<T, true>
                                           : graph_collective_step_kernel<T, false>,
                       grid, ops::graph::kThreads, stream, a, step);
}

template <typename T>
cudaError_t launch_collective_typed(const GraphCollective& a, const GraphLaunch& g,
                                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.layout.blocks));
  return launch_kernel(
      ops::graph::sums(a) ? graph_collective_kernel<T, true> : graph_collective_kernel<T, false>,
      grid, ops::graph::kThreads, stream, a, g);
}

template <typename T>
cudaError_t load_collective_typed() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, graph_collective_kernel<T, true>);
  if (err == cudaSuccess)
    err = cudaFuncGetAttributes(&attributes, graph_collective_kernel<T, false>);
  return err;
}

// with_type's calls.
struct LaunchCollective {
  const GraphCollective& op;
  const GraphLaunch& launch;
  cudaStream_t stream;
  template <typename T>
  cudaError_t operator()() const {
    return launch_collective_typed<T>(op, launch, stream);
  }
};
struct LaunchStep {
  const GraphCollective& op;
  int step;
  cudaStream_t stream;
  template <typename T>
  cudaError_t operator()() const {
    return launch_step_typed<T>(op, step, stream);
  }
};
struct LoadCollective {
  template <typename T>
  cudaError_t operator()() const {
    return load_collective_typed<T>();
  }
};

}  // namespace

cudaError_t launch_graph_collective(const GraphCollective& op, const GraphLaunch& launch,
                                    cudaStream_t stream) {
  if (op.layout.world_size > kMaxGraphRanks || op.layout.blocks < 1 ||
      op.layout.blocks > kMaxGraphBlocks || launch.blocks != op.layout.blocks ||
      launch.barriers != op.layout.barriers()) {
    return cudaErrorInvalidValue;
  }
  if (op.layout.kind == Kind::kAllGather) {
    return launch_collective_typed<uint8_t>(op, launch, stream);
  }
  return with_type(op.dtype, LaunchCollective{op, launch, stream});
}

cudaError_t launch_graph_collective_step(const GraphCollective& op, int step,
                                         cudaStream_t stream) {
  if (op.layout.world_size > kMaxGraphRanks || op.layout.blocks < 1 ||
      op.layout.blocks > kMaxGraphBlocks || step < 0 || step >= op.layout.barriers()) {
    return cudaErrorInvalidValue;
  }
  if (op.layout.kind == Kind::kAllGather) return launch_step_typed<uint8_t>(op, step, stream);
  return with_type(op.dtype, LaunchStep{op, step, stream});
}

cudaError_t load_graph_collective_kernels() {
  using ops::graph::Dtype;
  for (Dtype d : {Dtype::kFloat, Dtype::kDouble, Dtype::kHalf, Dtype::kBFloat16, Dtype::kInt8,
                  Dtype::kUInt8, Dtype::kInt16, Dtype::kInt32, Dtype::kInt64}) {
    const cudaError_t err = with_type(d, LoadCollective{});
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cuda_p2p::cuda
