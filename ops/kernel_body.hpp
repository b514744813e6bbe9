// What the kernels do to memory, written once for the GPU and the host (NOTE [One kernel source]
// below): the copies and the one-pass reduction of the captured collectives' kernel
// (ops/graph_collective_body.hpp) and of the eager reduction kernel (ops/cuda/reduce_kernel.cu),
// as templates over a memory-operations policy. The host instantiates them in ops/kernel_host.cpp.
// Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "ops/graph_layout.hpp"  // Dtype
#include "ops/reduce_arith.hpp"
#include "ops/reduce_op.hpp"
#include "p2p_workspace/graph_flags.hpp"  // CUDA_P2P_HOST_DEVICE, CUDA_P2P_POLICY_CALLS

namespace cuda_p2p::ops::kernel {

// NOTE [One kernel source]
// A kernel's logic - its partitioning among threads and blocks, its tails and 16-byte packs, its
// element arithmetic, the order of its steps - is written once, as a template over a
// memory-operations policy M, so that CI, which has no GPU, runs the very code a GPU runs. The
// CUDA kernels instantiate it with M = the calling CUDA thread (ops/cuda/reduce_device.cuh:
// CudaBlock, the thread of its block; CudaGrid, the thread of the whole grid, for grid-stride
// loops; 16-byte loads through L2 with ld.global.cg). The host instantiates it with M = HostBlock
// (ops/kernel_host.hpp: memcpy loads; a 16-byte pack off alignment raises, as the GPU faults),
// whose thread t of n the caller chooses: the host's own ops run one thread that is the whole block
// (0 of 1), and tests/cpp/test_kernel_matrix.cpp runs every thread of the GPU's launch shape one
// after another, so a thread that skips or repeats an element shows. A policy M provides:
//   int thread() const, int threads() const     the calling thread, how many share the loop
//   Pack<T> load_pack(const T*) const            16 bytes, published by a barrier or a stream wait
//   void store_pack(T*, const Pack<T>&) const
//   T load_one(const T*) const                   one element, the same way
// and each side specializes arith::AccOf and arith::Convert for its half types. What stays with
// the side: how a kernel is launched and how its barriers wait (the flag barrier), and the
// conversion of its element types.

// n elements of T from src to dst by the policy's threads.
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

// Element i of a source that holds T, or the accumulate type where `acc` (a ring's partial), as
// the accumulate type.
CUDA_P2P_POLICY_CALLS
template <typename T, typename M>
CUDA_P2P_HOST_DEVICE inline arith::Acc<T> load_acc(const void* p, bool acc, int64_t i, const M& m) {
  if (acc) return m.load_one(static_cast<const arith::Acc<T>*>(p) + i);
  return arith::Convert<T>::to(m.load_one(static_cast<const T*>(p) + i));
}

// NOTE [Loads before adds]
// A small op's reduction reads W-1 peers' memory over NVLink: a round trip each, which a loop over
// a run-time count issues one after another when each add needs its load first. So the sources
// are read in groups of kLoadsInFlight: a group's loads (16-byte packs, or one element each on
// the element-wise path) go into registers in a loop the GPU unrolls with a constant bound, all
// before the group's first add, so that they are in flight together (one round trip for W <= 9
// with the own source among them). The adds stay in the sources' order, so the results are the
// same bits as one load and one add at a time. Only the sums and averages (the kSum
// instantiation) do so: the other ops (product, min, max, bitwise; rare in tensor-parallel code)
// load one source at a time, since eight unrolled copies of their switch doubled the CUDA compile
// (graph_collectives.cu: 41 -> 88 s per architecture). Not timed on a GPU yet.
inline constexpr int kLoadsInFlight = 8;

// dst (and dst2, unless null) = op over the n sources, in source order, in the accumulate type,
// rounded once, by the policy's threads. Source q holds the accumulate type where bit q of
// src_acc is set, dst where dst_acc (then dst2 holds T); `packed` (16-byte packs: every pointer
// 16-byte aligned) needs neither. dst and dst2 may be sources: each element is read before it is
// written, by the same thread. Loads before adds: NOTE [Loads before adds].
CUDA_P2P_POLICY_CALLS
template <typename T, bool kSum, typename M>
CUDA_P2P_HOST_DEVICE inline void reduce_range(void* dst, void* dst2, const void* const* srcs,
                                              int n_srcs, int64_t n, ReduceOp op, int64_t divisor,
                                              bool packed, const M& m, uint64_t src_acc = 0,
                                              bool dst_acc = false) {
  using A = arith::Acc<T>;
  using C = arith::Convert<T>;
  T* d = static_cast<T*>(dst);
  T* d2 = static_cast<T*>(dst2);
  int64_t done = 0;
  if (packed) {
    constexpr int V = arith::Pack<T>::kCount;
    const int64_t units = n / V;
    for (int64_t u = m.thread(); u < units; u += m.threads()) {
      A acc[V] = {};
      if constexpr (kSum) {
        for (int q0 = 0; q0 < n_srcs; q0 += kLoadsInFlight) {
          arith::Pack<T> p[kLoadsInFlight] = {};
          CUDA_P2P_UNROLL
          for (int k = 0; k < kLoadsInFlight; ++k) {
            if (q0 + k < n_srcs) p[k] = m.load_pack(static_cast<const T*>(srcs[q0 + k]) + u * V);
          }
          CUDA_P2P_UNROLL
          for (int k = 0; k < kLoadsInFlight; ++k) {
            if (q0 + k >= n_srcs) continue;
            CUDA_P2P_UNROLL
            for (int j = 0; j < V; ++j) {
              const A x = C::to(p[k].v[j]);
              acc[j] = q0 + k == 0 ? x : arith::wrap_add(acc[j], x);
            }
          }
        }
      } else {
        const arith::Pack<T> p0 = m.load_pack(static_cast<const T*>(srcs[0]) + u * V);
        CUDA_P2P_UNROLL
        for (int j = 0; j < V; ++j) acc[j] = C::to(p0.v[j]);
        for (int q = 1; q < n_srcs; ++q) {
          const arith::Pack<T> p = m.load_pack(static_cast<const T*>(srcs[q]) + u * V);
          CUDA_P2P_UNROLL
          for (int j = 0; j < V; ++j) acc[j] = arith::combine(op, acc[j], C::to(p.v[j]));
        }
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
    A acc{};
    if constexpr (kSum) {
      for (int q0 = 0; q0 < n_srcs; q0 += kLoadsInFlight) {
        A x[kLoadsInFlight] = {};
        CUDA_P2P_UNROLL
        for (int k = 0; k < kLoadsInFlight; ++k) {
          if (q0 + k < n_srcs) x[k] = load_acc<T>(srcs[q0 + k], (src_acc >> (q0 + k)) & 1u, i, m);
        }
        CUDA_P2P_UNROLL
        for (int k = 0; k < kLoadsInFlight; ++k) {
          if (q0 + k >= n_srcs) continue;
          acc = q0 + k == 0 ? x[k] : arith::wrap_add(acc, x[k]);
        }
      }
    } else {
      acc = load_acc<T>(srcs[0], src_acc & 1u, i, m);
      for (int q = 1; q < n_srcs; ++q) {
        acc = arith::combine(op, acc, load_acc<T>(srcs[q], (src_acc >> q) & 1u, i, m));
      }
    }
    acc = arith::finish(op, acc, divisor);
    if (dst_acc) {
      static_cast<A*>(dst)[i] = acc;
    } else {
      d[i] = C::from(acc);
    }
    if (d2 != nullptr) d2[i] = C::from(acc);
  }
}

// Calls f.template operator()<T>() for the C++ type of `dtype`, with each side's half types (CUDA's
// __half and __nv_bfloat16, the host's c10 types); `otherwise` for a value outside the enum.
template <typename Half, typename BFloat16, typename R, typename F>
R with_dtype(graph::Dtype dtype, R otherwise, F&& f) {
  using graph::Dtype;
  switch (dtype) {
    case Dtype::kFloat:
      return f.template operator()<float>();
    case Dtype::kDouble:
      return f.template operator()<double>();
    case Dtype::kHalf:
      return f.template operator()<Half>();
    case Dtype::kBFloat16:
      return f.template operator()<BFloat16>();
    case Dtype::kInt8:
      return f.template operator()<int8_t>();
    case Dtype::kUInt8:
      return f.template operator()<uint8_t>();
    case Dtype::kInt16:
      return f.template operator()<int16_t>();
    case Dtype::kInt32:
      return f.template operator()<int32_t>();
    case Dtype::kInt64:
      return f.template operator()<int64_t>();
  }
  return otherwise;
}

// The eager one-pass reduction (ops/reduction.cpp on CUDA tensors; ops/cuda/reduce_kernel.cu).
inline constexpr int kMaxReduceSources = 64;
inline constexpr int kReduceThreads = 256;
inline constexpr int kMaxReduceBlocks = 1024;

struct ReduceArgs {
  void* dst = nullptr;
  bool dst_acc = false;  // dst holds the accumulate type (a ring's partial)
  void* also = nullptr;  // or null: the same result again, in the result type
  const void* src[kMaxReduceSources] = {};
  uint64_t src_acc = 0;  // bit i: source i holds the accumulate type
  int count = 0;
  int64_t numel = 0;
  graph::Dtype dtype = graph::Dtype::kFloat;  // the result's type
  ReduceOp op = ReduceOp::kSum;
  int64_t divisor = 1;  // AVG
};

// How the reduction of `a` launches: in 16-byte packs when every operand holds the result type
// and is 16-byte aligned, on as many blocks of kReduceThreads as its packs or elements fill (1 to
// kMaxReduceBlocks; the threads then stride over the rest).
struct ReducePlan {
  bool packed = false;
  int blocks = 1;
};

CUDA_P2P_HOST_DEVICE inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

CUDA_P2P_HOST_DEVICE inline ReducePlan plan_reduce(const ReduceArgs& a, int pack_count) {
  ReducePlan p;
  p.packed =
      !a.dst_acc && a.src_acc == 0 && aligned16(a.dst) && (a.also == nullptr || aligned16(a.also));
  for (int s = 0; s < a.count && p.packed; ++s) p.packed = aligned16(a.src[s]);
  const int64_t per = p.packed ? pack_count : 1;
  const int64_t items = (a.numel + per - 1) / per;
  int64_t blocks = (items + kReduceThreads - 1) / kReduceThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxReduceBlocks) blocks = kMaxReduceBlocks;
  p.blocks = static_cast<int>(blocks);
  return p;
}

// Whether the reduction instantiates the sum-only template (kSum).
CUDA_P2P_HOST_DEVICE inline bool sums(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kAvg;
}

// The reduction kernel's body: every thread of the grid (M: CudaGrid) strides over the elements.
CUDA_P2P_POLICY_CALLS
template <typename T, bool kSum, typename M>
CUDA_P2P_HOST_DEVICE inline void reduce_kernel_body(const ReduceArgs& a, bool packed, const M& m) {
  reduce_range<T, kSum>(a.dst, a.also, a.src, a.count, a.numel, a.op, a.divisor, packed, m,
                        a.src_acc, a.dst_acc);
}

}  // namespace cuda_p2p::ops::kernel
