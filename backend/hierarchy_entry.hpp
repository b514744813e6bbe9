// The hierarchy's entry (NOTE [One hierarchical entry]): the steps every hierarchical collective
// takes, as a template of Hierarchy that each op's entry, in its slice
// (backend/collectives/<op>.cpp), instantiates. Private to backend/.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/counters.hpp"  // reason::
#include "backend/hierarchical.hpp"

namespace cuda_p2p {

namespace hierarchy_detail {

// What a rank's own argument checks raised: its message (the invalid signature's text) and the
// error itself, thrown again once the group has agreed.
struct Checked {
  std::string error;
  std::exception_ptr thrown;
  void rethrow() const {
    if (thrown) std::rethrow_exception(thrown);
  }
};

template <typename F>
Checked run_checks(F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    return {e.what_without_backtrace(), std::current_exception()};
  }
  return {};
}

}  // namespace hierarchy_detail

// NOTE [One hierarchical entry]
// Every hierarchical collective takes the same steps, in this order, on every rank:
//  1. CUDA tensors on a group that wraps NCCL decline (reason::kDevice) without communicating (NOTE
//     [Hierarchical agreement]: not agreed).
//  2. `screen` says why the call cannot take the hierarchical path (nullptr: it can); its
//     TORCH_CHECKs are the rank's own argument checks, caught, making its signature invalid.
//  3. Under mutex_ the group agrees on the signature: kind, `text` (asked only of a rank whose
//     checks passed), the route. An all-reduce that fits rides in it (`inline_op`).
//  4. The checks' error, if any, is raised; a call with a reason declines with it (the caller runs
//     it flat); else `run` runs the algorithm, still under mutex_, and says what ran.
// Each op's entry (in its slice, backend/collectives/<op>.cpp) states only what differs: the kind,
// the tensors, the screen, the text, the run.
template <typename Screen, typename Text, typename Run>
HierarchyOutcome Hierarchy::enter(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                                  std::chrono::milliseconds timeout, Screen&& screen, Text&& text,
                                  Run&& run, const c10d::ReduceOp* inline_op) {
  constexpr bool kRides = std::is_invocable_v<Run&, at::Tensor&, bool>;
  TORCH_INTERNAL_ASSERT(kRides == (inline_op != nullptr));
  if (on_nccl(tensors)) return decline(reason::kDevice);
  const char* why = nullptr;
  const hierarchy_detail::Checked checked = hierarchy_detail::run_checks([&] { why = screen(); });
  // Small enough, an all-reduce rides in the agreement itself (NOTE [Hierarchical agreement]).
  at::Tensor carried;
  if (inline_op && !why && !checked.thrown && HierarchyAgreement::fits_inline(tensors[0])) {
    carried = tensors[0].contiguous();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const bool in_agreement =
      agree(signature(kind, checked.thrown ? std::string() : text(), why, checked.error), timeout,
            carried.defined() ? carried.view(-1) : at::Tensor(),
            inline_op ? *inline_op : c10d::ReduceOp());
  checked.rethrow();
  if (why) return decline(why);
  if constexpr (kRides) {
    return run(carried, in_agreement);
  } else {
    return run();
  }
}

}  // namespace cuda_p2p
