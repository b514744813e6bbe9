// The entry sequence (NOTE [The entry sequence]): the steps every c10d call the workspace may
// serve takes, as templates that the router's slices (backend/collectives/<op>.cpp: each op's c10d
// overrides, each a description of its call) instantiate. Private to backend/: the router and its
// slices include it.
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"

namespace cuda_p2p {

// NOTE [The entry sequence]
// Every c10d call the workspace may serve takes the same steps, written once here (serve,
// on_workspace) and in each override (backend/collectives/<op>.cpp) only as a description of the
// call, which names its op by an OpCall (NOTE [One identity per op] in ops/op_spec.hpp):
//  1. a group spanning hosts runs it hierarchically when it can (the Hierarchy entry the override
//     names, for an op whose OpSpec row says `hierarchy`), counted;
//  2. the reason the workspace cannot take it (the op's screen, a function of its slice), from
//     what every rank agrees on (its tensors' device and layout, their number, the dtype, the
//     reduce op, the shapes), checked in a fixed order per op, so that ranks routing alike name
//     the same reason (NOTE [Routes agree]);
//  3. with a reason: the route's handshake (WorkspaceCollectives::agree_on_route), the fallback
//     counted ("<op>.wrapped", its debug line) and the wrapped backend's Work, handed back as it
//     is (a CPU one tracked while coalescing);
//  4. without: the workspace body - its own argument checks told to the peers, the op run under
//     the collective lock - whose Outcome is counted (Counters::record), and a completed Work
//     over the call's outputs, or none for a synchronous call (NOTE [No Work for a synchronous
//     call]).
// The steps are templates over the call's lambdas: the small all-reduce's path constructs no
// std::function and allocates nothing for them (NOTE [Inline one-shot] in ops/all_reduce.cpp).
// The barrier (no route handshake: NOTE [Barriers order the GPU]), send/recv (the mailboxes)
// and cuda_p2p's own all_gather_v / all_to_all_v (checks that run on either route) spell their
// variants out beside them.

// NOTE [Canonical entries]
// torch 2.14 renamed the single-tensor collectives after torchcomms (all_gather_single for
// _allgather_base, reduce_scatter_single, all_to_all_single, gather_single and the coalesced
// forms), keeping the old names as forwarders that may go: c10d's Backend forwards each name to
// the other when a backend overrides one. A backend built against 2.14 overrides the canonical
// names, and a backend built against torch 2.11 has only the old ones, so both names are
// overridden wherever the headers declare them (CUDA_P2P_C10D_HAS_*, detected in CMakeLists.txt),
// in the op's slice (backend/collectives/all_gather.cpp, reduce_scatter.cpp, all_to_all.cpp,
// gather.cpp), and both call one body (*_entry): one path, the same counters ("all_gather.direct"
// whatever the name), no forwarding through c10d's thread-local guard.

namespace detail {

// One call: the tensors the route's handshake describes, those that choose the wrapped backend,
// the reason it goes there (null: the workspace runs it), and its options' asyncOp.
struct Call {
  c10::ArrayRef<at::Tensor> described;
  c10::ArrayRef<at::Tensor> routed;
  const char* why;
  bool async_op;
};

// The route's text of a call whose signature names its tensors only.
inline std::string no_detail() { return {}; }

// The route's text of a rooted call: " to root 3", " from root 0".
inline std::string root_text(const char* direction, int64_t root) {
  return std::string(" ") + direction + " root " + std::to_string(root);
}

// Whether `list` (the root's W tensors) matches `one` (numel, dtype): else the wrapped backend
// runs the call and reports what it finds.
inline bool matches_every_rank(const std::vector<at::Tensor>& list, const at::Tensor& one, int W) {
  if (static_cast<int>(list.size()) != W) return false;
  for (const auto& t : list) {
    if (!t.defined() || t.numel() != one.numel() || t.scalar_type() != one.scalar_type()) {
      return false;
    }
  }
  return true;
}

// Why a rooted call cannot take the workspace (nullptr when it can): gather's `mine` are its
// inputs and `at_root` its outputs, scatter's the other way round; the root passes one list of
// W tensors like `mine`, the others none.
inline const char* rooted_rejects(const WorkspaceCollectives& collectives,
                                  const std::vector<at::Tensor>& mine,
                                  const std::vector<std::vector<at::Tensor>>& at_root, bool is_root,
                                  int W) {
  const char* why = collectives.rejects(mine);
  if (!why && mine.size() != 1) why = reason::kSeveralTensors;
  if (!why && is_root) {
    const bool ok = at_root.size() == 1 && matches_every_rank(at_root[0], mine[0], W);
    why = ok ? collectives.rejects(at_root[0]) : reason::kShapes;
  }
  if (!why && !is_root && !(at_root.empty() || (at_root.size() == 1 && at_root[0].empty()))) {
    why = reason::kShapes;
  }
  return why;
}

// A call's hierarchy step whose Work holds other tensors than its workspace route's
// (all_gather_into_tensor: the output whole, where the workspace's Work holds Gloo's chunks).
template <typename Run, typename Outputs>
struct HierarchyStep {
  Run run;
  Outputs outputs;
};
template <typename Run, typename Outputs>
HierarchyStep<Run, Outputs> hierarchy_step(Run run, Outputs outputs) {
  return {std::move(run), std::move(outputs)};
}
// The step of an op the hierarchy does not take.
struct NoHierarchy {};
template <typename T>
inline constexpr bool kIsHierarchyStep = false;
template <typename Run, typename Outputs>
inline constexpr bool kIsHierarchyStep<HierarchyStep<Run, Outputs>> = true;

// A rooted call's route (rooted_rejects) and the root's W tensors the workspace moves (none on
// the other ranks, or when it goes to the wrapped backend).
struct Rooted {
  const char* why;
  std::vector<at::Tensor> at_root;
};
inline Rooted rooted(const WorkspaceCollectives& collectives, const std::vector<at::Tensor>& mine,
                     const std::vector<std::vector<at::Tensor>>& at_root, bool is_root, int W) {
  const char* why = rooted_rejects(collectives, mine, at_root, is_root, W);
  return {why, !why && is_root ? at_root[0] : std::vector<at::Tensor>{}};
}

}  // namespace detail

template <typename Detail, typename Body>
bool ProcessGroupCudaP2P::on_workspace(const ops::OpCall& entry, const detail::Call& call,
                                       Detail&& detail, Body&& body) {
  if (call.why) {
    collectives_.agree_on_route(entry.name, entry.id, call.described, detail, call.why);
    counters_.fallback(entry.id, call.why);
    return false;
  }
  // A body that runs several ops (the coalesced calls) counts each as it runs.
  if constexpr (std::is_void_v<decltype(body())>) {
    body();
  } else {
    counters_.record(entry.id, body());
  }
  return true;
}

template <typename Detail, typename Body, typename Wrapped, typename Outputs>
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::serve(const ops::OpCall& entry,
                                                        const detail::Call& call, Detail&& detail,
                                                        Body&& body, Wrapped&& wrapped,
                                                        Outputs&& outputs) {
  TORCH_INTERNAL_ASSERT(!hierarchy_ || !ops::spec(entry.id).hierarchy, "cuda_p2p: ", entry.name,
                        " is an op the hierarchy runs: its entry must name its hierarchy step");
  return serve(entry, detail::NoHierarchy{}, call, detail, body, wrapped, outputs);
}

template <typename Hierarchical, typename Detail, typename Body, typename Wrapped, typename Outputs>
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::serve(const ops::OpCall& entry,
                                                        Hierarchical&& hierarchical,
                                                        const detail::Call& call, Detail&& detail,
                                                        Body&& body, Wrapped&& wrapped,
                                                        Outputs&& outputs) {
  using H = std::decay_t<Hierarchical>;
  if constexpr (detail::kIsHierarchyStep<H>) {
    if (hierarchy_ && ran_hierarchically(entry, hierarchical.run())) {
      return hierarchical_done(entry, hierarchical.outputs());
    }
  } else if constexpr (!std::is_same_v<H, detail::NoHierarchy>) {
    if (hierarchy_ && ran_hierarchically(entry, hierarchical())) {
      return hierarchical_done(entry, outputs());
    }
  }
  bool ran = false;
  try {
    ran = on_workspace(entry, call, detail, body);
  } catch (...) {
    hooks_on_device_failure();  // NOTE [Abort hooks]
    throw;
  }
  if (!ran) return wrapped_.delegate(call.routed, entry.c10d_name, wrapped);
  return completed(entry.type, outputs, call.async_op);
}

template <typename Wrapped>
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::wrapped_only(const ops::OpCall& entry,
                                                               const char* why,
                                                               c10::ArrayRef<at::Tensor> tensors,
                                                               Wrapped&& wrapped) {
  counters_.fallback(entry.id, why);
  return wrapped_.delegate(tensors, entry.c10d_name, wrapped);
}

template <typename Outputs>
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::completed(c10d::OpType type, Outputs&& outputs,
                                                            bool async_op) {
  if (returns_no_work(async_op)) return {};  // NOTE [No Work for a synchronous call]
  return event_work(type, outputs());
}

}  // namespace cuda_p2p
