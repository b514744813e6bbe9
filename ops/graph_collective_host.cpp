#include "ops/graph_collective_host.hpp"

#include <cstdint>

namespace cuda_p2p::ops::graph {

namespace {

template <typename T>
void step_typed(const KernelArgs& a, int step, int b) {
  if (sums(a)) {
    collective_step<T, true>(a, step, b, HostBlock{});
  } else {
    collective_step<T, false>(a, step, b, HostBlock{});
  }
}

bool aligned(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % kUnitBytes == 0;
}

}  // namespace

// The types of ops/cuda/reduce_device.cuh's with_type, the host's half types for CUDA's.
void host_collective_step(const KernelArgs& a, int step, int b) {
  if (a.layout.kind == Kind::kAllGather) return step_typed<uint8_t>(a, step, b);
  switch (a.dtype) {
    case Dtype::kFloat:
      return step_typed<float>(a, step, b);
    case Dtype::kDouble:
      return step_typed<double>(a, step, b);
    case Dtype::kHalf:
      return step_typed<c10::Half>(a, step, b);
    case Dtype::kBFloat16:
      return step_typed<c10::BFloat16>(a, step, b);
    case Dtype::kInt8:
      return step_typed<int8_t>(a, step, b);
    case Dtype::kUInt8:
      return step_typed<uint8_t>(a, step, b);
    case Dtype::kInt16:
      return step_typed<int16_t>(a, step, b);
    case Dtype::kInt32:
      return step_typed<int32_t>(a, step, b);
    case Dtype::kInt64:
      return step_typed<int64_t>(a, step, b);
  }
}

bool all_aligned(const KernelArgs& a) {
  bool ok = aligned(a.in) && aligned(a.out);
  for (int q = 0; q < a.layout.world_size; ++q) {
    ok = ok && aligned(a.ins[q]) && aligned(a.outs[q]) && aligned(a.region[q]);
  }
  return ok;
}

}  // namespace cuda_p2p::ops::graph
