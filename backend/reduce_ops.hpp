// The reduce ops of c10d and of the workspace (ops/reduce_op.hpp), one to the other.
#pragma once

#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "ops/reduce_op.hpp"

namespace cuda_p2p {

// The workspace reduce op for a c10d one, or nullopt (PREMUL_SUM and unknown ops), and back.
std::optional<ops::ReduceOp> to_reduce_op(const c10d::ReduceOp& op);
c10d::ReduceOp to_c10d_reduce_op(ops::ReduceOp op);
// The reduce op as op signatures name it ("sum", ...; "premul_sum", which the workspace lacks).
std::string reduce_op_text(const c10d::ReduceOp& op);
// Whether `op` averages (a sum divided by the ranks that took part).
inline bool is_avg(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::AVG; }

}  // namespace cuda_p2p
