// The host reduction kernel built with -mavx2 -mfma -mf16c (CMakeLists.txt sets the flags for
// this file on x86-64); ops/reduction.cpp calls it only where the CPU has them.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "ops/reduction_kernel.hpp"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
namespace {
#include "ops/reduction_kernel.inc"
}  // namespace

namespace cuda_p2p::ops::detail {
void host_reduce_avx2(const HostReduction& r) { reduce_dispatch(r); }
bool host_reduce_avx2_compiled() { return true; }
}  // namespace cuda_p2p::ops::detail
#else
namespace cuda_p2p::ops::detail {
void host_reduce_avx2(const HostReduction& r) { host_reduce_default(r); }
bool host_reduce_avx2_compiled() { return false; }
}  // namespace cuda_p2p::ops::detail
#endif
