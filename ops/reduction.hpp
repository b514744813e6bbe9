// Elementwise reduction of N sources into a destination: the compute of every reducing
// collective. float16 / bfloat16 are accumulated in float32 and rounded once; integers are
// reduced natively (wrapping like Gloo); AVG divides the accumulated sum once.
#pragma once

#include <ATen/ATen.h>

#include "ops/collectives.hpp"
#include "ops/graph_layout.hpp"

namespace cuda_p2p::ops {

// The dtypes the workspace reduces: float32, float64, float16, bfloat16, int8, uint8, int16,
// int32, int64. Others (bool, complex, ...) go to the wrapped backend.
bool is_reducible_dtype(at::ScalarType dtype);

// Whether `op` applies to `dtype`: AVG needs a floating-point dtype, the bitwise ops an integer
// one.
bool reduce_op_applies(ReduceOp op, at::ScalarType dtype);
// TORCH_CHECKs that `op` applies to `dtype`, failing like Gloo does for the same mistakes: AVG
// needs a floating-point dtype, the bitwise ops an integer one. `what` names the collective.
void check_reduce_op(ReduceOp op, at::ScalarType dtype, const char* what);

// Which build of the host reduction kernel runs on this CPU, for the diagnostic
// (python -m cuda_p2p): "avx2" (the AVX2+FMA+F16C build), or "baseline" with why in parentheses.
std::string host_reduction_isa();

// dst = op(srcs[0], srcs[1], ..., srcs[n-1]), combined left to right (so every rank that reduces
// the same sources in the same order gets the same bits). Every tensor is contiguous with dst's
// numel; a source has dst's dtype, or the accumulate type of the result's dtype (a partial of a
// ring). When op is kAvg the sum is divided by `divisor` (> 0) before it is stored; pass kSum for
// the partial steps of an average. dst may be one of the sources (the very same memory).
// `also`, when defined, receives the same result (dst's dtype and size, a source of none) in the
// same pass over the data. `scratch` holds accumulators between calls; on CUDA it lives on the
// device.
// On the host, a reduction of at least `parallel_min_bytes` (> 0) result bytes is split across
// the calling process's ATen intra-op threads when it has two or more (NOTE [Intra-op threads] in
// ops/collectives.cpp): each element is still reduced alone, in the same order: the same bits.
// Returns whether it was split.
bool reduce(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op, int64_t divisor,
            at::Tensor& scratch, const at::Tensor& also = {}, int64_t parallel_min_bytes = 0);

// The elements per piece when `bytes` of elements of `esize` bytes are split across the intra-op
// threads from `min_bytes` (> 0) on, or 0: not split (fewer bytes, one thread, or already inside
// a parallel region). Pieces are multiples of 64 elements (vector-aligned boundaries).
int64_t parallel_grain(int64_t bytes, int64_t esize, int64_t min_bytes);

// reduce() on raw host pointers, for a caller on the host thread that has no tensors (NOTE
// [Inline one-shot] in ops/all_reduce.cpp): dst = op(srcs[0], ..., srcs[n-1]) over `numel`
// elements of `dtype` (reducible, op valid for it: check_reduce_op), every pointer of that dtype,
// AVG divided by `divisor`. The same kernel and bits as reduce(); dst may be one of the sources.
void reduce_host(void* dst, const void* const* srcs, int n, int64_t numel, at::ScalarType dtype,
                 ReduceOp op, int64_t divisor);

namespace detail {
// The element type of the CUDA kernels (ops/graph_layout.hpp) for a reducible dtype.
graph::Dtype kernel_dtype(at::ScalarType dtype);
// The ATen path of reduce (CUDA's fallback beyond its kernel's sources); tests compare the host
// kernel with it.
void reduce_with_aten(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op,
                      int64_t divisor, at::Tensor& scratch);
}  // namespace detail

}  // namespace cuda_p2p::ops
