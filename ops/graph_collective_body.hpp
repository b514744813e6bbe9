// The data steps of the captured collectives run as one kernel each (NOTE [Captured collectives in
// one kernel] in ops/captured_collectives.cpp), written once for the GPU and the host (NOTE [One
// kernel source] below): what block b of a kernel op does after each of its flag barriers. The
// CUDA kernel (ops/cuda/graph_collectives.cu) and the host's task (ops/graph_collective_host.hpp,
// run by ops/captured_collectives.cpp) instantiate these templates with their own memory
// operations. Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "ops/graph_layout.hpp"
#include "ops/reduce_arith.hpp"
#include "ops/reduce_op.hpp"
#include "p2p_workspace/graph_flags.hpp"

// A __host__ __device__ template calls its policy's functions, which are __device__ only on the
// CUDA side: nvcc checks such a call only where it instantiates the template for the host, which
// it never does for the CUDA policy. Loops over a pack's elements unroll on the GPU.
#if defined(__CUDACC__)
#define CUDA_P2P_POLICY_CALLS _Pragma("nv_exec_check_disable")
#else
#define CUDA_P2P_POLICY_CALLS
#endif
#if defined(__CUDA_ARCH__)
#define CUDA_P2P_UNROLL _Pragma("unroll")
#else
#define CUDA_P2P_UNROLL
#endif

namespace cuda_p2p::ops::graph {

// NOTE [One kernel source]
// A kernel's logic - its partitioning into blocks, tails and 16-byte packs, its element
// arithmetic, the order of its steps - is written once, as a template over a memory-operations
// policy M, so that CI, which has no GPU, runs the very code a GPU runs. The CUDA kernel
// instantiates it with M = the calling thread of a CUDA block (threadIdx.x of blockDim.x threads,
// 16-byte loads through L2 with ld.global.cg); the host instantiates it with M = one thread that
// is the whole block (thread 0 of 1, memcpy loads) inside its device's task for the op, which runs
// block after block (blocks never wait for each other: block b of every rank pairs with block b of
// its peers only). A policy M provides:
//   int thread() const, int threads() const     the calling thread of the block, their count
//   Pack<T> load_pack(const T*) const            16 bytes, published by a barrier or a stream wait
//   void store_pack(T*, const Pack<T>&) const
//   T load_one(const T*) const                   one element, the same way
// and each side specializes arith::AccOf and arith::Convert for its half types. What stays with
// the side: how a block is launched and how its barriers wait (the flag barrier), and the
// conversion of its element types.

// What one kernel op moves: its layout and the pointers of every rank as this process maps them.
struct KernelArgs {
  Layout layout;
  Dtype dtype = Dtype::kFloat;  // all-gather: moved as bytes
  ReduceOp op = ReduceOp::kSum;
  int64_t divisor = 1;       // AVG
  const char* in = nullptr;  // one-shot, two-shot, all-gather
  char* out = nullptr;       // one-shot, two-shot, reduce-scatter
  // Reduce-scatter: this rank's contribution to rank c's chunk; all-gather: where rank q's input
  // lands; every rank's graph region as mapped here.
  const char* ins[kMaxGraphRanks] = {};
  char* outs[kMaxGraphRanks] = {};
  char* region[kMaxGraphRanks] = {};
  // Every pointer 16-byte aligned: the blocks' ranges start at whole 16-byte units of each, and
  // the data moves in 16-byte packs (then element by element for the tail).
  bool packed = false;
};

// n elements of T from src to dst by the calling block's threads.
CUDA_P2P_POLICY_CALLS
template <typename T, typename M>
CUDA_P2P_HOST_DEVICE inline void copy_range(char* dst, const char* src, int64_t n, bool packed,
                                            const M& m) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  int64_t done = 0;
  if (packed) {
    constexpr int V = arith::Pack<T>::kCount;
    const int64_t units = n / V;
    for (int64_t u = m.thread(); u < units; u += m.threads()) {
      m.store_pack(d + u * V, m.load_pack(s + u * V));
    }
    done = units * V;
  }
  for (int64_t i = done + m.thread(); i < n; i += m.threads()) d[i] = m.load_one(s + i);
}

// dst (and dst2, unless null) = op over the W sources, in rank order, in the accumulate type, by
// the calling block.
CUDA_P2P_POLICY_CALLS
template <typename T, bool kSum, typename M>
CUDA_P2P_HOST_DEVICE inline void reduce_range(char* dst, char* dst2, const char* const* srcs, int W,
                                              int64_t n, ReduceOp op, int64_t divisor, bool packed,
                                              const M& m) {
  using A = arith::Acc<T>;
  using C = arith::Convert<T>;
  T* d = reinterpret_cast<T*>(dst);
  T* d2 = reinterpret_cast<T*>(dst2);
  int64_t done = 0;
  if (packed) {
    constexpr int V = arith::Pack<T>::kCount;
    const int64_t units = n / V;
    for (int64_t u = m.thread(); u < units; u += m.threads()) {
      const arith::Pack<T> p0 = m.load_pack(reinterpret_cast<const T*>(srcs[0]) + u * V);
      A acc[V];
      CUDA_P2P_UNROLL
      for (int j = 0; j < V; ++j) acc[j] = C::to(p0.v[j]);
      for (int q = 1; q < W; ++q) {
        const arith::Pack<T> p = m.load_pack(reinterpret_cast<const T*>(srcs[q]) + u * V);
        CUDA_P2P_UNROLL
        for (int j = 0; j < V; ++j) acc[j] = arith::apply<kSum>(op, acc[j], C::to(p.v[j]));
      }
      arith::Pack<T> out;
      CUDA_P2P_UNROLL
      for (int j = 0; j < V; ++j) out.v[j] = C::from(arith::finish(op, acc[j], divisor));
      m.store_pack(d + u * V, out);
      if (d2 != nullptr) m.store_pack(d2 + u * V, out);
    }
    done = units * V;
  }
  for (int64_t i = done + m.thread(); i < n; i += m.threads()) {
    A acc = C::to(m.load_one(reinterpret_cast<const T*>(srcs[0]) + i));
    for (int q = 1; q < W; ++q) {
      acc = arith::apply<kSum>(op, acc, C::to(m.load_one(reinterpret_cast<const T*>(srcs[q]) + i)));
    }
    const T out = C::from(arith::finish(op, acc, divisor));
    d[i] = out;
    if (d2 != nullptr) d2[i] = out;
  }
}

// What block b does after barrier `step` (0: the op's open; NOTE [Captured collectives in one
// kernel]): block b of every rank stages and reads the same ranges (ops/graph_layout.hpp).
CUDA_P2P_POLICY_CALLS
template <typename T, bool kSum, typename M>
CUDA_P2P_HOST_DEVICE inline void collective_step(const KernelArgs& a, int step, int b, const M& m) {
  const Layout& l = a.layout;
  const int me = l.rank, W = l.world_size;
  const int64_t es = l.esize;
  const char* srcs[kMaxGraphRanks];
  switch (l.kind) {
    case Kind::kOneShot: {
      const Range r = l.block(b);
      if (step == 0) {
        copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed,
                      m);
      } else {
        for (int q = 0; q < W; ++q) srcs[q] = a.region[q] + r.begin * es;
        reduce_range<T, kSum>(a.out + r.begin * es, nullptr, srcs, W, r.end - r.begin, a.op,
                              a.divisor, a.packed, m);
      }
      return;
    }
    case Kind::kTwoShot: {
      if (step == 0) {
        for (int c = 0; c < W; ++c) {
          if (c == me) continue;
          const Range r = l.block_of(l.chunk(c), b);
          copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed,
                        m);
        }
      } else if (step == 1) {
        const Range mine = l.chunk(me);
        const Range r = l.block_of(mine, b);
        for (int q = 0; q < W; ++q) srcs[q] = (q == me ? a.in : a.region[q]) + r.begin * es;
        reduce_range<T, kSum>(a.out + r.begin * es,
                              a.region[me] + l.reduced_offset() + (r.begin - mine.begin) * es, srcs,
                              W, r.end - r.begin, a.op, a.divisor, a.packed, m);
      } else {
        for (int q = 0; q < W; ++q) {
          if (q == me) continue;
          const Range cq = l.chunk(q);
          const Range rq = l.block_of(cq, b);
          copy_range<T>(a.out + rq.begin * es,
                        a.region[q] + l.reduced_offset() + (rq.begin - cq.begin) * es,
                        rq.end - rq.begin, a.packed, m);
        }
      }
      return;
    }
    case Kind::kAllGather: {
      const Range r = l.block(b);
      if (step == 0) {
        copy_range<T>(a.region[me] + r.begin * es, a.in + r.begin * es, r.end - r.begin, a.packed,
                      m);
      } else {
        for (int q = 0; q < W; ++q) {
          const char* src = q == me ? a.in : a.region[q];
          if (a.outs[q] == src) continue;  // in place
          copy_range<T>(a.outs[q] + r.begin * es, src + r.begin * es, r.end - r.begin, a.packed, m);
        }
      }
      return;
    }
    case Kind::kReduceScatter: {
      const Range r = l.block(b);
      const int64_t stride = l.chunk_stride();
      if (step == 0) {
        for (int c = 0; c < W; ++c) {
          if (c == me) continue;
          copy_range<T>(a.region[me] + c * stride + r.begin * es, a.ins[c] + r.begin * es,
                        r.end - r.begin, a.packed, m);
        }
      } else {
        for (int q = 0; q < W; ++q) {
          srcs[q] = (q == me ? a.ins[me] : a.region[q] + me * stride) + r.begin * es;
        }
        reduce_range<T, kSum>(a.out + r.begin * es, nullptr, srcs, W, r.end - r.begin, a.op,
                              a.divisor, a.packed, m);
      }
      return;
    }
  }
}

// Whether the op instantiates the sum-only template (kSum): sums, averages and the all-gather.
CUDA_P2P_HOST_DEVICE inline bool sums(const KernelArgs& a) {
  return a.op == ReduceOp::kSum || a.op == ReduceOp::kAvg || a.layout.kind == Kind::kAllGather;
}

}  // namespace cuda_p2p::ops::graph
