// The data steps of the captured collectives run as one kernel each (NOTE [Captured collectives in
// one kernel] in ops/captured_collectives.cpp), written once for the GPU and the host (NOTE [One
// kernel source] in ops/kernel_body.hpp): what block b of a kernel op does after each of its flag
// barriers. The CUDA kernel (ops/cuda/graph_collectives.cu) and the host's task
// (ops/kernel_host.hpp, run by ops/captured_collectives.cpp) instantiate these templates with
// their own memory operations. Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "ops/graph_layout.hpp"
#include "ops/kernel_body.hpp"
#include "ops/reduce_op.hpp"
#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p::ops::graph {

using kernel::copy_range;
using kernel::reduce_range;

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

// What block b does after barrier `step` (0: the op's open; NOTE [Captured collectives in one
// kernel]): block b of every rank stages and reads the same ranges (ops/graph_layout.hpp).
CUDA_P2P_POLICY_CALLS
template <typename T, bool kSum, typename M>
CUDA_P2P_HOST_DEVICE inline void collective_step(const KernelArgs& a, int step, int b, const M& m) {
  const Layout& l = a.layout;
  const int me = l.rank, W = l.world_size;
  const int64_t es = l.esize;
  const void* srcs[kMaxGraphRanks];
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
