#include "ops/reduction.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "ops/reduction_kernel.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "ops/cuda/reduce_kernel.cuh"
#endif

namespace cuda_p2p::ops {

bool is_reducible_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

bool reduce_op_applies(ReduceOp op, at::ScalarType dtype) {
  const bool floating = at::isFloatingType(dtype);
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  return floating ? !bitwise : op != ReduceOp::kAvg;
}

void check_reduce_op(ReduceOp op, at::ScalarType dtype, const char* what) {
  const bool floating = at::isFloatingType(dtype);
  TORCH_CHECK(!(op == ReduceOp::kAvg && !floating), "cuda_p2p ", what,
              ": ReduceOp.AVG needs a floating-point dtype (as with Gloo), got ", dtype);
  TORCH_CHECK(
      !(floating && (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor)),
      "cuda_p2p ", what, ": Cannot use ReduceOp.", to_string(op),
      " with non-integral dtype: expected an integer dtype, got ", dtype);
}

namespace {

// Whether the AVX2 build of the host kernel can run here (a constant of the CPU).
bool host_has_avx2() {
#if defined(__x86_64__)
  static const bool has = detail::host_reduce_avx2_compiled() && __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

}  // namespace

std::string host_reduction_isa() {
  if (host_has_avx2()) return "avx2";
  return detail::host_reduce_avx2_compiled() ? "baseline (this CPU lacks AVX2, FMA or F16C)"
                                             : "baseline (the AVX2 build is not compiled in)";
}

namespace {

bool same_memory(const at::Tensor& a, const at::Tensor& b) { return a.data_ptr() == b.data_ptr(); }

// out = op(a, b) with ATen's type promotion (a float partial with a bfloat16 input gives float).
void apply(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      at::add_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kProduct:
      at::mul_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kMin:
      at::minimum_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kMax:
      at::maximum_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kBand:
      at::bitwise_and_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kBor:
      at::bitwise_or_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case ReduceOp::kBxor:
      at::bitwise_xor_out(const_cast<at::Tensor&>(out), a, b);
      return;
  }
}

// An accumulator of `numel` elements of `dtype` in `scratch` (grown as needed, never shrunk).
at::Tensor scratch_view(at::Tensor& scratch, const at::Tensor& like, at::ScalarType dtype) {
  const int64_t bytes = like.numel() * static_cast<int64_t>(c10::elementSize(dtype));
  if (!scratch.defined() || scratch.device() != like.device() ||
      scratch.nbytes() < static_cast<size_t>(bytes)) {
    scratch = at::empty({std::max<int64_t>(bytes, 1 << 16)},
                        at::TensorOptions().dtype(at::kByte).device(like.device()));
  }
  return at::from_blob(scratch.data_ptr(), {like.numel()},
                       at::TensorOptions().dtype(dtype).device(like.device()));
}

}  // namespace

namespace detail {

graph::Dtype kernel_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return graph::Dtype::kFloat;
    case at::kDouble:
      return graph::Dtype::kDouble;
    case at::kHalf:
      return graph::Dtype::kHalf;
    case at::kBFloat16:
      return graph::Dtype::kBFloat16;
    case at::kChar:
      return graph::Dtype::kInt8;
    case at::kByte:
      return graph::Dtype::kUInt8;
    case at::kShort:
      return graph::Dtype::kInt16;
    case at::kInt:
      return graph::Dtype::kInt32;
    case at::kLong:
      return graph::Dtype::kInt64;
    default:
      TORCH_CHECK(false, "cuda_p2p: the workspace does not reduce ", dtype,
                  " (expected a float, integer, float16 or bfloat16 dtype)");
  }
}

// The result's dtype: the narrowest dtype among dst and the sources (float partials of a ring are
// wider than the bfloat16 / float16 result they accumulate).
at::ScalarType result_dtype(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs) {
  at::ScalarType dtype = dst.scalar_type();
  for (const auto& s : srcs) {
    if (c10::elementSize(s.scalar_type()) < c10::elementSize(dtype)) dtype = s.scalar_type();
  }
  return dtype;
}

// The device-independent path: a chain of binary ATen ops (vectorised on the CPU, kernels on
// CUDA) on an accumulator of the accumulate type.
void reduce_with_aten(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op,
                      int64_t divisor, at::Tensor& scratch) {
  const at::ScalarType acc = accumulate_type(result_dtype(dst, srcs));
  // The accumulator is written before sources 1.. are read: it is dst itself only when dst has
  // the accumulate type and is none of those sources.
  bool direct = dst.scalar_type() == acc;
  for (size_t i = 1; i < srcs.size() && direct; ++i) direct = !same_memory(dst, srcs[i]);
  at::Tensor target = direct ? dst : scratch_view(scratch, dst, acc);
  // copy_ first: a float accumulator makes every later op compute in float (type promotion).
  if (!same_memory(target, srcs[0])) target.copy_(srcs[0]);
  for (size_t i = 1; i < srcs.size(); ++i) apply(target, target, srcs[i], op);
  if (op == ReduceOp::kAvg && divisor > 0) target.div_(divisor);
  if (!same_memory(target, dst)) dst.copy_(target);
}

}  // namespace detail

namespace {

// The host kernel on `r`, whose pointers the caller set; in pieces on the intra-op threads from
// `parallel_min_bytes` on (NOTE [Intra-op threads] in ops/collectives.cpp).
bool run_host_reduction(detail::HostReduction& r, int64_t numel, at::ScalarType dtype, ReduceOp op,
                        int64_t divisor, int64_t parallel_min_bytes = 0) {
  r.numel = numel;
  r.dtype = dtype;
  r.op = op;
  r.divisor = op == ReduceOp::kAvg ? divisor : 0;
  const auto kernel = host_has_avx2() ? &detail::host_reduce_avx2 : &detail::host_reduce_default;
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t grain = parallel_grain(numel * esize, esize, parallel_min_bytes);
  if (grain == 0) {
    kernel(r);
    return false;
  }
  const auto acc_size = static_cast<int64_t>(c10::elementSize(accumulate_type(dtype)));
  at::parallel_for(0, numel, grain, [&](int64_t b, int64_t e) {
    c10::SmallVector<const void*, 8> srcs(static_cast<size_t>(r.num_srcs));
    for (int i = 0; i < r.num_srcs; ++i) {
      srcs[i] = static_cast<const char*>(r.srcs[i]) + b * (r.src_is_acc[i] ? acc_size : esize);
    }
    detail::HostReduction piece = r;
    piece.srcs = srcs.data();
    piece.numel = e - b;
    piece.dst = static_cast<char*>(r.dst) + b * (r.dst_is_acc ? acc_size : esize);
    if (r.dst2) piece.dst2 = static_cast<char*>(r.dst2) + b * esize;
    kernel(piece);
  });
  return true;
}

}  // namespace

#ifdef CUDA_P2P_WITH_CUDA
namespace {

// reduce() on CUDA tensors in one kernel (ops/cuda/reduce_kernel.cu) on the current stream: the
// sources in one pass instead of a chain of binary ATen ops through an accumulator in memory.
// False, having done nothing, for what the kernel does not take (more sources than it holds,
// tensors that are not contiguous with dst's numel).
bool reduce_on_cuda(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op,
                    int64_t divisor, const at::Tensor& also) {
  if (srcs.size() > static_cast<size_t>(cuda::kMaxReduceSources) || !dst.is_contiguous()) {
    return false;
  }
  const at::ScalarType dtype = detail::result_dtype(dst, srcs);
  const at::ScalarType acc = accumulate_type(dtype);
  if (!is_reducible_dtype(dtype) || (dst.scalar_type() != dtype && dst.scalar_type() != acc)) {
    return false;
  }
  cuda::ReduceArgs a;
  a.dst = dst.data_ptr();
  a.dst_acc = dst.scalar_type() != dtype;
  if (also.defined()) {
    if (a.dst_acc) return false;
    a.also = also.data_ptr();
  }
  for (const auto& s : srcs) {
    if (s.numel() != dst.numel() || !s.is_contiguous() || !s.is_cuda() ||
        (s.scalar_type() != dtype && s.scalar_type() != acc)) {
      return false;
    }
    if (s.scalar_type() != dtype) a.src_acc |= uint64_t{1} << a.count;
    a.src[a.count++] = s.data_ptr();
  }
  a.numel = dst.numel();
  a.dtype = detail::kernel_dtype(dtype);
  a.op = op;
  a.divisor = divisor > 0 ? divisor : 1;
  const cudaError_t err = cuda::launch_reduce(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess,
              "cuda_p2p reduce: launching the reduction kernel failed: ", cudaGetErrorString(err));
  return true;
}

}  // namespace
#endif

void reduce_host(void* dst, const void* const* srcs, int n, int64_t numel, at::ScalarType dtype,
                 ReduceOp op, int64_t divisor) {
  constexpr int kMaxSources = 64;
  TORCH_CHECK(n >= 1 && n <= kMaxSources, "cuda_p2p reduce_host: expected 1 to ", kMaxSources,
              " sources, got ", n);
  TORCH_CHECK(op != ReduceOp::kAvg || divisor > 0,
              "cuda_p2p reduce_host: AVG needs a positive divisor, got ", divisor);
  if (numel == 0) return;
  static constexpr bool kNoAcc[kMaxSources] = {};
  detail::HostReduction r;
  r.dst = dst;
  r.srcs = srcs;
  r.src_is_acc = kNoAcc;
  r.num_srcs = n;
  run_host_reduction(r, numel, dtype, op, divisor);
}

int64_t parallel_grain(int64_t bytes, int64_t esize, int64_t min_bytes) {
  if (min_bytes <= 0 || bytes < min_bytes || at::in_parallel_region()) return 0;
  const int threads = at::get_num_threads();
  if (threads < 2) return 0;
  const int64_t numel = bytes / esize;
  constexpr int64_t kAlignElems = 64;
  const int64_t grain = (numel + threads - 1) / threads;
  return (grain + kAlignElems - 1) / kAlignElems * kAlignElems;
}

bool reduce(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op, int64_t divisor,
            at::Tensor& scratch, const at::Tensor& also, int64_t parallel_min_bytes) {
  TORCH_CHECK(!srcs.empty(), "cuda_p2p reduce: expected at least one source, got none");
  TORCH_CHECK(op != ReduceOp::kAvg || divisor > 0,
              "cuda_p2p reduce: AVG needs a positive divisor, got ", divisor);
  if (dst.numel() == 0) return false;
  if (also.defined()) {
    TORCH_CHECK(also.numel() == dst.numel() && also.scalar_type() == dst.scalar_type() &&
                    also.is_contiguous() && also.device() == dst.device(),
                "cuda_p2p reduce: the second destination must match the first (", dst.scalar_type(),
                "[", dst.numel(), "]), got ", also.scalar_type(), "[", also.numel(), "]");
  }
  if (!dst.is_cpu()) {
#ifdef CUDA_P2P_WITH_CUDA
    if (dst.is_cuda() && reduce_on_cuda(dst, srcs, op, divisor, also)) return false;
#endif
    detail::reduce_with_aten(dst, srcs, op, divisor, scratch);
    if (also.defined()) also.copy_(dst);
    return false;
  }
  const at::ScalarType dtype = detail::result_dtype(dst, srcs);
  const at::ScalarType acc = accumulate_type(dtype);
  c10::SmallVector<const void*, 8> ptrs;
  c10::SmallVector<bool, 8> is_acc;
  for (const auto& s : srcs) {
    TORCH_CHECK(s.numel() == dst.numel() && s.is_contiguous(),
                "cuda_p2p reduce: sources must be contiguous with ", dst.numel(), " elements, got ",
                s.sizes());
    TORCH_CHECK(s.scalar_type() == dtype || s.scalar_type() == acc, "cuda_p2p reduce: a ", dtype,
                " reduction got a ", s.scalar_type(), " source");
    ptrs.push_back(s.data_ptr());
    is_acc.push_back(s.scalar_type() != dtype);
  }
  TORCH_CHECK(dst.scalar_type() == dtype || dst.scalar_type() == acc, "cuda_p2p reduce: a ", dtype,
              " reduction got a ", dst.scalar_type(), " destination");
  detail::HostReduction r;
  r.dst = dst.data_ptr();
  r.dst_is_acc = dst.scalar_type() != dtype;
  if (also.defined()) {
    if (r.dst_is_acc) {  // not a case the collectives use: keep the kernel simple
      detail::reduce_with_aten(dst, srcs, op, divisor, scratch);
      also.copy_(dst);
      return false;
    }
    r.dst2 = also.data_ptr();
  }
  r.srcs = ptrs.data();
  r.src_is_acc = is_acc.data();
  r.num_srcs = static_cast<int>(ptrs.size());
  return run_host_reduction(r, dst.numel(), dtype, op, divisor, parallel_min_bytes);
}

}  // namespace cuda_p2p::ops
