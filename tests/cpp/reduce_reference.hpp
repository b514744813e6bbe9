// Inputs whose reduction is exact in every dtype, and the plain-ATen reference of a reduction
// over them: shared by the tests of the collectives (test_collectives) and of the captured ops
// (test_graphs).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "ops/common.hpp"
#include "ops/reduce_op.hpp"

namespace cuda_p2p::test {

// The input of `rank` for a case: small integers, so that every summation order gives the same
// bits in every dtype (PRODUCT takes -2..2, so products of up to 4 ranks stay exact in bfloat16;
// the bitwise ops take bytes; uint8 takes magnitudes).
inline at::Tensor reduce_input(int64_t seed, int rank, int64_t n, at::ScalarType dtype,
                               ops::ReduceOp op) {
  using ops::ReduceOp;
  auto i = at::arange(n, at::kLong);
  at::Tensor v;
  if (op == ReduceOp::kProduct) {
    v = (i * 7 + rank * 3 + seed) % 5 - 2;
  } else if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    v = (i * 2654435761LL + rank * 40503 + seed * 977) % 251;
  } else {
    v = (i * 7 + rank * 13 + seed) % 17 - 8;
  }
  if (dtype == at::kByte) v = v.abs();
  return v.to(dtype);
}

// `acc` op `x`, elementwise, in their (common) type: the one step of every reference reduction
// here and in tests/cpp/kernel_matrix.hpp (SUM and AVG add; AVG's division is the caller's).
inline at::Tensor combine(ops::ReduceOp op, const at::Tensor& acc, const at::Tensor& x) {
  using ops::ReduceOp;
  switch (op) {
    case ReduceOp::kProduct:
      return acc * x;
    case ReduceOp::kMin:
      return at::minimum(acc, x);
    case ReduceOp::kMax:
      return at::maximum(acc, x);
    case ReduceOp::kBand:
      return at::bitwise_and(acc, x);
    case ReduceOp::kBor:
      return at::bitwise_or(acc, x);
    case ReduceOp::kBxor:
      return at::bitwise_xor(acc, x);
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      break;
  }
  return acc + x;
}

// op over `xs` in rank order as ops::reduce defines it (float accumulation, AVG divided once in
// the accumulate type, integers wrapping like the collectives), with plain ATen.
inline at::Tensor reference_reduce(const std::vector<at::Tensor>& xs, ops::ReduceOp op) {
  const at::ScalarType dtype = xs[0].scalar_type();
  const bool floating = at::isFloatingType(dtype);
  at::Tensor r = xs[0].to(floating ? at::kDouble : at::kLong);
  for (size_t i = 1; i < xs.size(); ++i) r = combine(op, r, xs[i].to(r.scalar_type()));
  if (op == ops::ReduceOp::kAvg) {
    return (r.to(ops::accumulate_type(dtype)) / static_cast<double>(xs.size())).to(dtype);
  }
  return r.to(dtype);
}

}  // namespace cuda_p2p::test
