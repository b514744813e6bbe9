#include "backend/reduce_ops.hpp"

#include <c10/util/Exception.h>

#include "ops/common.hpp"

namespace cuda_p2p {

c10d::ReduceOp to_c10d_reduce_op(ops::ReduceOp op) {
  switch (op) {
    case ops::ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ops::ReduceOp::kAvg:
      return c10d::ReduceOp::AVG;
    case ops::ReduceOp::kProduct:
      return c10d::ReduceOp::PRODUCT;
    case ops::ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ops::ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ops::ReduceOp::kBand:
      return c10d::ReduceOp::BAND;
    case ops::ReduceOp::kBor:
      return c10d::ReduceOp::BOR;
    case ops::ReduceOp::kBxor:
      return c10d::ReduceOp::BXOR;
  }
  TORCH_CHECK(false, "cuda_p2p: unknown reduce op ", static_cast<int>(op));
}

std::optional<ops::ReduceOp> to_reduce_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ops::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ops::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ops::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ops::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ops::ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ops::ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ops::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ops::ReduceOp::kBxor;
    default:
      return std::nullopt;  // PREMUL_SUM: the wrapped backend decides
  }
}

std::string reduce_op_text(const c10d::ReduceOp& op) {
  const auto mapped = to_reduce_op(op);
  return mapped ? ops::lower_name(*mapped) : std::string("premul_sum");
}

}  // namespace cuda_p2p
