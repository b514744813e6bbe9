#include "ops/kernel_host.hpp"

#include <cstdint>
#include <utility>

namespace cuda_p2p::ops {

namespace {

// Calls f.template operator()<T>() for the C++ type of `dtype`, the host's half types.
template <typename F>
void with_host_type(graph::Dtype dtype, F&& f) {
  (void)kernel::with_dtype<c10::Half, c10::BFloat16>(dtype, 0, std::forward<F>(f));
}

struct CollectiveStep {
  const graph::KernelArgs& a;
  int step, b, threads;
  template <typename T>
  int operator()() const {
    for (int t = 0; t < threads; ++t) {
      if (graph::sums(a)) {
        graph::collective_step<T, true>(a, step, b, kernel::HostBlock{t, threads});
      } else {
        graph::collective_step<T, false>(a, step, b, kernel::HostBlock{t, threads});
      }
    }
    return 0;
  }
};

struct ReduceKernel {
  const kernel::ReduceArgs& a;
  kernel::ReducePlan* plan;
  template <typename T>
  int operator()() const {
    *plan = kernel::plan_reduce(a, arith::Pack<T>::kCount);
    const int n = plan->blocks * kernel::kReduceThreads;
    for (int t = 0; t < n; ++t) {
      if (kernel::sums(a.op)) {
        kernel::reduce_kernel_body<T, true>(a, plan->packed, kernel::HostBlock{t, n});
      } else {
        kernel::reduce_kernel_body<T, false>(a, plan->packed, kernel::HostBlock{t, n});
      }
    }
    return 0;
  }
};

// A pointer the body may take 16-byte packs at (kernel::aligned16), or none.
bool aligned(const void* p) { return p == nullptr || kernel::aligned16(p); }

}  // namespace

namespace kernel {

ReducePlan host_reduce_kernel(const ReduceArgs& a) {
  ReducePlan plan;
  if (a.numel == 0) return plan;
  with_host_type(a.dtype, ReduceKernel{a, &plan});
  return plan;
}

}  // namespace kernel

namespace graph {

void host_collective_step(const KernelArgs& a, int step, int b, int threads) {
  // The all-gather moves bytes.
  const Dtype dtype = a.layout.kind == Kind::kAllGather ? Dtype::kUInt8 : a.dtype;
  with_host_type(dtype, CollectiveStep{a, step, b, threads});
}

bool all_aligned(const KernelArgs& a) {
  bool ok = aligned(a.in) && aligned(a.out);
  for (int q = 0; q < a.layout.world_size; ++q) {
    ok = ok && aligned(a.ins[q]) && aligned(a.outs[q]) && aligned(a.region[q]);
  }
  return ok;
}

}  // namespace graph
}  // namespace cuda_p2p::ops
