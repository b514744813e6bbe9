#include "ops/cuda/graph_collectives.cuh"
#include "ops/cuda/reduce_device.cuh"
#include "p2p_workspace/cuda/graph_barrier.cuh"

namespace cuda_p2p::cuda {

namespace {

using ops::graph::Kind;
using ops::graph::Layout;
using ops::graph::Range;
using namespace reduce;

// n elements of T from src to dst by the calling block's threads.
template <typename T>
__device__ __forceinline__ void copy_range(char* dst, const char* src, int64_t n, bool packed) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  int64_t done = 0;
  if (packed) {
    constexpr int V = Pack<T>::kCount;
    const int64_t units = n / V;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      store_pack(d + u * V, load_pack(s + u * V));
    }
    done = units * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) d[i] = load_one(s + i);
}

// dst (and dst2, unless null) = op over the W sources, in rank order, by the calling block.
template <typename T, bool kSum>
__device__ __forceinline__ void reduce_range(char* dst, char* dst2, const char* const* srcs, int W,
                                             int64_t n, ops::ReduceOp op, int64_t divisor,
                                             bool packed) {
  using A = typename Acc<T>::type;
  T* d = reinterpret_cast<T*>(dst);
  T* d2 = reinterpret_cast<T*>(dst2);
  int64_t done = 0;
  if (packed) {
    constexpr int V = Pack<T>::kCount;
    const int64_t units = n / V;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      const Pack<T> p0 = load_pack(reinterpret_cast<const T*>(srcs[0]) + u * V);
      A acc[V];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = to_acc<T>(p0.v[j]);
      for (int q = 1; q < W; ++q) {
        const Pack<T> p = load_pack(reinterpret_cast<const T*>(srcs[q]) + u * V);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = apply<kSum>(op, acc[j], to_acc<T>(p.v[j]));
      }
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(finish(op, acc[j], divisor));
      store_pack(d + u * V, out);
      if (d2 != nullptr) store_pack(d2 + u * V, out);
    }
    done = units * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    A acc = to_acc<T>(load_one(reinterpret_cast<const T*>(srcs[0]) + i));
    for (int q = 1; q < W; ++q) {
      acc = apply<kSum>(op, acc, to_acc<T>(load_one(reinterpret_cast<const T*>(srcs[q]) + i)));
    }
    const T out = from_acc<T>(finish(op, acc, divisor));
    d[i] = out;
    if (d2 != nullptr) d2[i] = out;
  }
}

// NOTE [Captured collectives in one kernel] (ops/captured_collectives.cpp): step for step what
// its host body does, block b of every rank on the same ranges.
template <typename T, bool kSum>
__global__ void __launch_bounds__(ops::graph::kThreads)
    graph_collective_kernel(GraphCollective a, GraphLaunch g) {
  const Layout& l = a.layout;
  const int me = l.rank, W = l.world_size, b = static_cast<int>(blockIdx.x);
  const int64_t es = l.esize;
  const char* srcs[kMaxGraphRanks];
  if (!graph_barrier(g, 0)) return;  // every peer has ended its earlier ops: the region is free
  switch (l.kind) {
    case Kind::kOneShot: {
      const Range r = l.block(b);
      copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed);
      if (!graph_barrier(g, 1)) return;
      for (int q = 0; q < W; ++q) srcs[q] = a.region[q] + r.begin * es;
      reduce_range<T, kSum>(a.out + r.begin * es, nullptr, srcs, W, r.end - r.begin, a.op,
                            a.divisor, a.packed);
      return;
    }
    case Kind::kTwoShot: {
      for (int c = 0; c < W; ++c) {
        if (c == me) continue;
        const Range r = l.block_of(l.chunk(c), b);
        copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed);
      }
      if (!graph_barrier(g, 1)) return;
      const Range mine = l.chunk(me);
      const Range r = l.block_of(mine, b);
      for (int q = 0; q < W; ++q) srcs[q] = (q == me ? a.in : a.region[q]) + r.begin * es;
      reduce_range<T, kSum>(a.out + r.begin * es,
                            a.region[me] + l.reduced_offset() + (r.begin - mine.begin) * es, srcs,
                            W, r.end - r.begin, a.op, a.divisor, a.packed);
      if (!graph_barrier(g, 2)) return;
      for (int q = 0; q < W; ++q) {
        if (q == me) continue;
        const Range cq = l.chunk(q);
        const Range rq = l.block_of(cq, b);
        copy_range<T>(a.out + rq.begin * es,
                      a.region[q] + l.reduced_offset() + (rq.begin - cq.begin) * es,
                      rq.end - rq.begin, a.packed);
      }
      return;
    }
    case Kind::kAllGather: {
      const Range r = l.block(b);
      copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed);
      if (!graph_barrier(g, 1)) return;
      for (int q = 0; q < W; ++q) {
        const char* src = q == me ? a.in : a.region[q];
        if (a.outs[q] == src) continue;  // in place
        copy_range<T>(a.outs[q] + r.begin * es, src + r.begin * es, r.end - r.begin, a.packed);
      }
      return;
    }
    case Kind::kReduceScatter: {
      const Range r = l.block(b);
      const int64_t stride = l.chunk_stride();
      for (int c = 0; c < W; ++c) {
        if (c == me) continue;
        copy_range<T>(a.region[me] + c * stride + r.begin * es, a.ins[c] + r.begin * es,
                      r.end - r.begin, a.packed);
      }
      if (!graph_barrier(g, 1)) return;
      for (int q = 0; q < W; ++q) {
        srcs[q] = (q == me ? a.ins[me] : a.region[q] + me * stride) + r.begin * es;
      }
      reduce_range<T, kSum>(a.out + r.begin * es, nullptr, srcs, W, r.end - r.begin, a.op,
                            a.divisor, a.packed);
      return;
    }
  }
}

template <typename T>
cudaError_t launch_collective_typed(const GraphCollective& a, const GraphLaunch& g,
                                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.layout.blocks));
  if (a.op == ops::ReduceOp::kSum || a.op == ops::ReduceOp::kAvg ||
      a.layout.kind == Kind::kAllGather) {
    graph_collective_kernel<T, true><<<grid, ops::graph::kThreads, 0, stream>>>(a, g);
  } else {
    graph_collective_kernel<T, false><<<grid, ops::graph::kThreads, 0, stream>>>(a, g);
  }
  return cudaGetLastError();
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
