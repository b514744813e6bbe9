#include "ops/reduction.hpp"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "ops/reduction_kernel.hpp"

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

// The host kernel on `r`, whose pointers the caller set.
void run_host_reduction(detail::HostReduction& r, int64_t numel, at::ScalarType dtype, ReduceOp op,
                        int64_t divisor) {
  r.numel = numel;
  r.dtype = dtype;
  r.op = op;
  r.divisor = op == ReduceOp::kAvg ? divisor : 0;
  if (host_has_avx2()) {
    detail::host_reduce_avx2(r);
  } else {
    detail::host_reduce_default(r);
  }
}

}  // namespace

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

void reduce(const at::Tensor& dst, c10::ArrayRef<at::Tensor> srcs, ReduceOp op, int64_t divisor,
            at::Tensor& scratch, const at::Tensor& also) {
  TORCH_CHECK(!srcs.empty(), "cuda_p2p reduce: expected at least one source, got none");
  TORCH_CHECK(op != ReduceOp::kAvg || divisor > 0,
              "cuda_p2p reduce: AVG needs a positive divisor, got ", divisor);
  if (dst.numel() == 0) return;
  if (also.defined()) {
    TORCH_CHECK(also.numel() == dst.numel() && also.scalar_type() == dst.scalar_type() &&
                    also.is_contiguous() && also.device() == dst.device(),
                "cuda_p2p reduce: the second destination must match the first (", dst.scalar_type(),
                "[", dst.numel(), "]), got ", also.scalar_type(), "[", also.numel(), "]");
  }
  if (!dst.is_cpu()) {
    detail::reduce_with_aten(dst, srcs, op, divisor, scratch);
    if (also.defined()) also.copy_(dst);
    return;
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
      return;
    }
    r.dst2 = also.data_ptr();
  }
  r.srcs = ptrs.data();
  r.src_is_acc = is_acc.data();
  r.num_srcs = static_cast<int>(ptrs.size());
  run_host_reduction(r, dst.numel(), dtype, op, divisor);
}

}  // namespace cuda_p2p::ops
