// The element arithmetic of the CUDA reductions (ops/cuda/reduce_kernel.cu, the kernel ops of
// ops/cuda/graph_collectives.cu): accumulate types (float32 for float16 / bfloat16, the type itself
// otherwise), the reduce ops as ATen computes them on CUDA (integer sums and products wrap, min and
// max propagate NaN, AVG divides the sum once), and packed 16-byte loads. Plain CUDA, device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/graph_layout.hpp"
#include "ops/reduce_op.hpp"

namespace cuda_p2p::cuda::reduce {

template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<__half> {
  using type = float;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};

template <typename T>
__device__ __forceinline__ typename Acc<T>::type to_acc(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

// Rounded to nearest even, as torch converts.
template <typename T>
__device__ __forceinline__ T from_acc(typename Acc<T>::type v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

template <typename A>
__device__ __forceinline__ A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename A>
__device__ __forceinline__ A wrap_mul(A a, A b) {
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
__device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) {
    return v != v;
  } else {
    return false;
  }
}

// a op b. Sums and averages take the first branch (kSum in the kernels' templates); the others
// are rare in tensor-parallel code and share one switch.
template <typename A>
__device__ __forceinline__ A combine(ops::ReduceOp op, A a, A b) {
  switch (op) {
    case ops::ReduceOp::kSum:
    case ops::ReduceOp::kAvg:
      return wrap_add(a, b);
    case ops::ReduceOp::kProduct:
      return wrap_mul(a, b);
    case ops::ReduceOp::kMin:
      return is_nan(a) ? a : (is_nan(b) ? b : (b < a ? b : a));
    case ops::ReduceOp::kMax:
      return is_nan(a) ? a : (is_nan(b) ? b : (a < b ? b : a));
    default:
      if constexpr (std::is_integral_v<A>) {
        if (op == ops::ReduceOp::kBand) return a & b;
        if (op == ops::ReduceOp::kBor) return a | b;
        return a ^ b;
      } else {
        return a;  // bitwise ops on floating types are refused before any kernel
      }
  }
}

// Applies `op`, or the sum without asking (kSum: the kernels' sum and average instantiation).
template <bool kSum, typename A>
__device__ __forceinline__ A apply(ops::ReduceOp op, A a, A b) {
  if constexpr (kSum) {
    return wrap_add(a, b);
  } else {
    return combine(op, a, b);
  }
}

// The AVG's division, once, in the accumulate type.
template <typename A>
__device__ __forceinline__ A finish(ops::ReduceOp op, A v, int64_t divisor) {
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ops::ReduceOp::kAvg) return v / static_cast<A>(divisor);
  }
  return v;
}

// 16 bytes of T: one packed load or store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(T));
  T v[kCount];
};

// Reads through L2 only (ld.global.cg): the data was written by another rank's GPU (or by this
// rank's copy engine, or an earlier kernel) and published by a flag or a stream wait, which an
// L1 line from an earlier op must not shadow.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
  Pack<T> r;
  static_assert(sizeof(r) == sizeof(u));
  memcpy(&r, &u, sizeof(u));
  return r;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  uint4 u;
  memcpy(&u, &v, sizeof(u));
  *reinterpret_cast<uint4*>(p) = u;
}

template <typename T>
__device__ __forceinline__ T load_one(const T* p) {
  using Bits = std::conditional_t<
      sizeof(T) == 1, unsigned char,
      std::conditional_t<sizeof(T) == 2, unsigned short,
                         std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>>>;
  static_assert(sizeof(Bits) == sizeof(T));
  const Bits bits = __ldcg(reinterpret_cast<const Bits*>(p));
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}

// Calls f.template operator()<T>() for the C++ type of `dtype`.
template <typename F>
cudaError_t with_type(ops::graph::Dtype dtype, F&& f) {
  using ops::graph::Dtype;
  switch (dtype) {
    case Dtype::kFloat:
      return f.template operator()<float>();
    case Dtype::kDouble:
      return f.template operator()<double>();
    case Dtype::kHalf:
      return f.template operator()<__half>();
    case Dtype::kBFloat16:
      return f.template operator()<__nv_bfloat16>();
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
  return cudaErrorInvalidValue;
}

}  // namespace cuda_p2p::cuda::reduce
