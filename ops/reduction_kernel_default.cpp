// The host reduction kernel for the baseline ISA (see reduction_kernel.hpp).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "ops/reduction_kernel.hpp"

namespace {
#include "ops/reduction_kernel.inc"
}  // namespace

namespace cuda_p2p::ops::detail {
void host_reduce_default(const HostReduction& r) { reduce_dispatch(r); }
}  // namespace cuda_p2p::ops::detail
