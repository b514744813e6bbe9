// The reduce operations of the workspace ops, in a header of their own so that the host
// reduction kernel (ops/reduction_kernel.hpp) names them without the ATen headers: its AVX2 build
// takes no precompiled header, and ATen.h would be most of its compile time.
#pragma once

#include <cstdint>

namespace cuda_p2p::ops {

enum class ReduceOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };
// "SUM", "AVG", ... (c10d's names, as in ReduceOp.AVG).
const char* to_string(ReduceOp op);

}  // namespace cuda_p2p::ops
