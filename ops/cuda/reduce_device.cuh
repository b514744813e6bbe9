// The CUDA side of the kernels' element arithmetic (ops/reduce_arith.hpp, one source with the
// host): CUDA's half types and their conversions, 16-byte loads through L2, the C++ type of each
// dtype (with_type), and the names ops/cuda/reduce_kernel.cu uses. Plain CUDA, device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ops/graph_layout.hpp"
#include "ops/kernel_body.hpp"
#include "ops/reduce_arith.hpp"
#include "ops/reduce_op.hpp"

namespace cuda_p2p::ops::arith {
// float32 accumulation for CUDA's half types, conversions rounded to nearest even, as torch
// converts (the host's c10 types: ops/kernel_host.hpp).
template <>
struct AccOf<__half> {
  using type = float;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct Convert<__half> {
  __device__ static float to(__half v) { return __half2float(v); }
  __device__ static __half from(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
}  // namespace cuda_p2p::ops::arith

namespace cuda_p2p::cuda::reduce {

// The shared arithmetic (ops/reduce_arith.hpp) under the names the CUDA kernels use.
using ops::arith::apply;
using ops::arith::finish;
using ops::arith::Pack;
template <typename T>
struct Acc {
  using type = ops::arith::Acc<T>;
};
template <typename T>
__device__ __forceinline__ typename Acc<T>::type to_acc(T v) {
  return ops::arith::Convert<T>::to(v);
}
template <typename T>
__device__ __forceinline__ T from_acc(typename Acc<T>::type v) {
  return ops::arith::Convert<T>::from(v);
}

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

// The CUDA policies of the shared bodies (NOTE [One kernel source] in ops/kernel_body.hpp): the
// calling thread of its block (CudaBlock) or of the whole grid (CudaGrid), 16-byte loads through
// L2.
struct CudaBlock {
  __device__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ int threads() const { return static_cast<int>(blockDim.x); }
  template <typename T>
  __device__ ops::arith::Pack<T> load_pack(const T* p) const {
    return reduce::load_pack(p);
  }
  template <typename T>
  __device__ void store_pack(T* p, const ops::arith::Pack<T>& v) const {
    reduce::store_pack(p, v);
  }
  template <typename T>
  __device__ T load_one(const T* p) const {
    return reduce::load_one(p);
  }
};
struct CudaGrid : CudaBlock {
  __device__ int thread() const { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }
  __device__ int threads() const { return static_cast<int>(gridDim.x * blockDim.x); }
};

// Calls f.template operator()<T>() for the C++ type of `dtype` (CUDA's half types).
template <typename F>
cudaError_t with_type(ops::graph::Dtype dtype, F&& f) {
  return ops::kernel::with_dtype<__half, __nv_bfloat16>(dtype, cudaErrorInvalidValue,
                                                        std::forward<F>(f));
}

}  // namespace cuda_p2p::cuda::reduce
