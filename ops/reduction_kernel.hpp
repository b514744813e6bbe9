// The host reduction kernel: one pass over N sources, in blocks that stay in L1, with float32
// accumulation of float16 / bfloat16. Written as plain loops that the compiler vectorises; built
// twice (reduction_kernel_default.cpp for the baseline ISA, reduction_kernel_avx2.cpp with
// -mavx2 -mfma -mf16c) and chosen at run time by ops/reduction.cpp.
#pragma once

// Light headers only (NOTE in ops/reduce_op.hpp): not ATen.h, not ops/collectives.hpp.
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "ops/reduce_op.hpp"

namespace cuda_p2p::ops::detail {

// One reduction on raw host pointers; see ops::reduce for the semantics.
struct HostReduction {
  void* dst = nullptr;
  bool dst_is_acc = false;  // dst holds the accumulate type (a ring partial)
  void* dst2 = nullptr;     // optional second destination of the result (not with dst_is_acc)
  const void* const* srcs = nullptr;
  const bool* src_is_acc = nullptr;
  int num_srcs = 0;
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;  // the result's dtype (not the accumulate type)
  ReduceOp op = ReduceOp::kSum;
  int64_t divisor = 0;  // > 0: divide (kAvg)
};

void host_reduce_default(const HostReduction& r);
// Only where the CPU has AVX2, FMA and F16C (host_reduce_avx2_supported()).
void host_reduce_avx2(const HostReduction& r);
bool host_reduce_avx2_compiled();

}  // namespace cuda_p2p::ops::detail
