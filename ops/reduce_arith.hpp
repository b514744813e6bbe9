// The element arithmetic of the kernels' reductions, one source for the GPU and the host (NOTE
// [One kernel source] in ops/kernel_body.hpp): the reduce ops as ATen computes them on
// CUDA (integer sums and products wrap, min and max propagate NaN, AVG divides the sum once, in the
// accumulate type), 16-byte packs, and the accumulate type of each element type (float32 for
// float16 / bfloat16: each side specializes AccOf and Convert for its own half types - __half and
// __nv_bfloat16 in ops/cuda/reduce_device.cuh, c10::Half and c10::BFloat16 in
// ops/kernel_host.hpp). Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/reduce_op.hpp"
#include "p2p_workspace/graph_flags.hpp"  // CUDA_P2P_HOST_DEVICE

namespace cuda_p2p::ops::arith {

// The type a reduction accumulates T in, and the conversions (rounded to nearest even, as torch
// converts); specialized for the half types by each side.
template <typename T>
struct AccOf {
  using type = T;
};
template <typename T>
struct Convert {
  CUDA_P2P_HOST_DEVICE static typename AccOf<T>::type to(T v) { return v; }
  CUDA_P2P_HOST_DEVICE static T from(typename AccOf<T>::type v) { return v; }
};

template <typename T>
using Acc = typename AccOf<T>::type;

template <typename A>
CUDA_P2P_HOST_DEVICE inline A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename A>
CUDA_P2P_HOST_DEVICE inline A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<A>(
        static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}

template <typename A>
CUDA_P2P_HOST_DEVICE inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) {
    return v != v;
  } else {
    return false;
  }
}

// a op b. Sums and averages take the first branch (kSum in the kernels' templates); the others
// are rare in tensor-parallel code and share one switch.
template <typename A>
CUDA_P2P_HOST_DEVICE inline A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return wrap_add(a, b);
    case ReduceOp::kProduct:
      return wrap_mul(a, b);
    case ReduceOp::kMin:
      return is_nan(a) ? a : (is_nan(b) ? b : (b < a ? b : a));
    case ReduceOp::kMax:
      return is_nan(a) ? a : (is_nan(b) ? b : (a < b ? b : a));
    default:
      if constexpr (std::is_integral_v<A>) {
        if (op == ReduceOp::kBand) return a & b;
        if (op == ReduceOp::kBor) return a | b;
        return a ^ b;
      } else {
        return a;  // bitwise ops on floating types are refused before any kernel
      }
  }
}

// Applies `op`, or the sum without asking (kSum: the kernels' sum and average instantiation).
template <bool kSum, typename A>
CUDA_P2P_HOST_DEVICE inline A apply(ReduceOp op, A a, A b) {
  if constexpr (kSum) {
    return wrap_add(a, b);
  } else {
    return combine(op, a, b);
  }
}

// The AVG's division, once, in the accumulate type.
template <typename A>
CUDA_P2P_HOST_DEVICE inline A finish(ReduceOp op, A v, int64_t divisor) {
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ReduceOp::kAvg) return v / static_cast<A>(divisor);
  }
  return v;
}

// 16 bytes of T: one packed load or store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(T));
  T v[kCount];
};

}  // namespace cuda_p2p::ops::arith
