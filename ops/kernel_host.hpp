// The host's instantiation of the kernel bodies (NOTE [One kernel source] in ops/kernel_body.hpp):
// HostBlock, memcpy loads, and the conversions of c10's half types. ops/captured_collectives.cpp
// runs the captured collectives' body inside the host device's task for the op, after each flag
// barrier, as one thread that is the whole block; tests/cpp/test_kernel_matrix.cpp runs it for W
// ranks in one process, step by step, and the eager reduction kernel's body, each with every
// thread of the GPU's launch shape.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "ops/graph_collective_body.hpp"
#include "ops/kernel_body.hpp"
#include "ops/reduce_arith.hpp"

namespace cuda_p2p::ops {

namespace arith {
// float32 accumulation, conversions rounded to nearest even (as __float2half_rn and
// __float2bfloat16_rn on the GPU).
template <>
struct AccOf<c10::Half> {
  using type = float;
};
template <>
struct AccOf<c10::BFloat16> {
  using type = float;
};
template <>
struct Convert<c10::Half> {
  static float to(c10::Half v) { return static_cast<float>(v); }
  static c10::Half from(float v) { return c10::Half(v); }
};
template <>
struct Convert<c10::BFloat16> {
  static float to(c10::BFloat16 v) { return static_cast<float>(v); }
  static c10::BFloat16 from(float v) { return c10::BFloat16(v); }
};
}  // namespace arith

namespace kernel {

// The policy: thread `t` of `n` (0 of 1: one thread that is the whole block, or the grid); what a
// barrier published is read with plain loads (the flag wait's acquire ordered it). A 16-byte pack
// at an address that is not a multiple of 16 raises, as the GPU's vector access faults there: a
// wrong alignment decision of the body shows in CI, not only on a GPU.
struct HostBlock {
  int t = 0;
  int n = 1;
  int thread() const { return t; }
  int threads() const { return n; }
  static void check_pack(const void* p) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                "cuda_p2p kernel body: a 16-byte pack at ", p,
                ", not 16-byte aligned (a GPU faults there)");
  }
  template <typename T>
  arith::Pack<T> load_pack(const T* p) const {
    check_pack(p);
    arith::Pack<T> r;
    std::memcpy(static_cast<void*>(&r), p, sizeof(r));
    return r;
  }
  template <typename T>
  void store_pack(T* p, const arith::Pack<T>& v) const {
    check_pack(p);
    std::memcpy(static_cast<void*>(p), &v, sizeof(v));
  }
  template <typename T>
  T load_one(const T* p) const {
    T r;
    std::memcpy(static_cast<void*>(&r), p, sizeof(T));
    return r;
  }
};

// The eager reduction kernel (ops/cuda/reduce_kernel.cu) on the host: plan_reduce's launch, every
// thread of every block run one after another; returns the plan.
ReducePlan host_reduce_kernel(const ReduceArgs& a);

}  // namespace kernel

namespace graph {

using kernel::HostBlock;

// What block b of `a` does after barrier `step`, on the host: the body instantiated for a.dtype,
// run by `threads` threads one after another (1: the host's own task; kThreads: the GPU's block).
void host_collective_step(const KernelArgs& a, int step, int b, int threads = 1);

// Whether every pointer of `a` is 16-byte aligned (KernelArgs::packed).
bool all_aligned(const KernelArgs& a);

}  // namespace graph
}  // namespace cuda_p2p::ops
