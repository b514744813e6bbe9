// WorkspaceCollectives: the engine that runs a group's collectives on its P2P workspace
// (ops/collectives.hpp). It owns what they share - the collective lock, the CollectiveState
// (phases, signature handshakes, scratch, the inline all-reduce's cache) - and decides which
// calls the workspace serves (rejects), tells the peers of a local argument error
// (check_or_reject) or of a call routed to the wrapped backend (agree_on_route), and runs one
// collective at a time (run). Its bodies prepare the tensors (contiguous copies, chunks, split
// slices) and call ops/; each returns what the op did (ops::Outcome), which the router counts.
//
// The engine is defined in workspace_collectives.cpp, each op's body in its slice
// (backend/collectives/<op>.cpp), beside the op's c10d overrides.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/engine_context.hpp"
#include "ops/collectives.hpp"
#include "ops/failure_record.hpp"
#include "ops/outcome.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

class WorkspaceCollectives {
 public:
  // `failure` outlives this; `splits`: where the intra-op threads count their splits
  // (Counters::intra_op_splits).
  WorkspaceCollectives(const EngineContext& group, ops::FailureRecord& failure,
                       std::shared_ptr<std::atomic<int64_t>> splits);

  // Whether the collectives run on the workspace (available, not turned off, and on a CUDA
  // workspace opted in: NOTE [CUDA collectives are opt-in] in backend/ProcessGroupCudaP2P.cpp),
  // and why not ("" when they do).
  bool on() const {
    return config_.collectives && ws_ && ws_->available() &&
           (on_host() || config_.cuda_collectives);
  }
  std::string off_reason() const;
  // Whether the workspace is in host memory (its tensors are CPU tensors).
  bool on_host() const { return ws_ && ws_->device().tensor_device().is_cpu(); }
  // Whether its ops complete before they return (NOTE [Synchronous host devices] in
  // p2p_workspace/device.hpp): the host device, unless it has CUDA's semantics.
  bool synchronous() const { return ws_ && ws_->device().host_synchronous(); }

  // Why these tensors cannot take the workspace path (nullptr when they can): reason::
  // kWorkspaceOff, or reason::kDevice for a tensor not strided or not on the workspace's device.
  // Depends only on what every rank agrees on, so all ranks take the same path.
  const char* rejects(c10::ArrayRef<at::Tensor> tensors) const;
  // The same for an all-reduce of `t`, which also needs a dtype the workspace reduces.
  const char* all_reduce_rejects(const at::Tensor& t) const;

  // A local argument check of a workspace collective: when `checks` throws, this rank takes part
  // in the op's handshake with an invalid signature (ops::reject) before its error propagates,
  // so that its peers raise at once instead of waiting for the timeout.
  void check_or_reject(const char* what, ops::OpId kind, c10::function_ref<void()> checks);
  // A collective the workspace serves, routed to the wrapped backend on this rank (`why`): on a
  // host workspace, takes part in the op's handshake naming the route (NOTE [Routes agree]);
  // `detail` is the part of its text after the tensors (" sum", " from root 0").
  void agree_on_route(const char* what, ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                      c10::function_ref<std::string()> detail, const char* why);
  // Where the ops' signatures are compared in stream order (CUDA; the host with CUDA's semantics):
  // a check that raises the disagreement the comparisons recorded, if any, failing the group's
  // device with it (ops::check_signature_record), for the Work of an op to call once the op has
  // run (NOTE [Mismatches reach the Work] in backend/works.cpp); `what` names the caller in the
  // error. Empty where there is nothing to check.
  std::function<void()> recorded_mismatch_check(const char* what);
  // Runs fn(ctx) for one workspace collective (NOTE [Collectives of a group run one at a time])
  // and returns its Outcome, marked `graph` when it was enqueued under capture. A function_ref,
  // not a std::function: nothing to construct, copy or destroy on the small all-reduce's path
  // (NOTE [Inline one-shot] in ops/all_reduce.cpp).
  ops::Outcome run(const char* what,
                   c10::function_ref<ops::Outcome(const ops::CollectiveContext&)> fn);

  // The group's symmetric heap, once created (NOTE [Zero-copy collectives] in ops/zero_copy.cpp).
  void set_heap(SymmetricWorkspace* heap);

  // --- the bodies: tensors accepted by rejects(); each checks the rest of its arguments (told
  // to the peers), runs, and copies back into non-contiguous outputs --------------------------
  ops::Outcome all_reduce(at::Tensor& t, ops::ReduceOp op);
  ops::Outcome all_gather(const at::Tensor& input, const std::vector<at::Tensor>& outputs);
  ops::Outcome reduce_scatter(const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                              ops::ReduceOp op);
  // One flat output (input) holding the W chunks: all_gather_into_tensor and
  // reduce_scatter_tensor, single or coalesced. `what` names the call in argument errors.
  ops::Outcome all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                      const std::string& what = "all_gather_into_tensor");
  ops::Outcome reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                     ops::ReduceOp op,
                                     const std::string& what = "reduce_scatter_tensor");
  ops::Outcome broadcast(at::Tensor& t, int64_t root);
  // Blocks the caller until every rank arrived, also on a GPU.
  ops::Outcome barrier(std::optional<Millis> timeout);
  // The rows of cuda_p2p.all_gather_v and all_to_all_v, in rank order, and how many came from
  // each rank (all_to_all_v).
  struct Rows {
    at::Tensor output;
    std::vector<int64_t> recv;
    ops::Outcome outcome;
  };
  // sizes[q] rows of rank q (the caller checked them: check_or_reject first).
  Rows all_gather_v(const at::Tensor& input, const std::vector<int64_t>& sizes);
  ops::Outcome all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                 const std::vector<int64_t>& output_split_sizes,
                                 const std::vector<int64_t>& input_split_sizes);
  ops::Outcome all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);
  Rows all_to_all_v(const at::Tensor& input, const std::vector<int64_t>& input_splits);
  // The argument checks of all_to_all_v on a group of W ranks, on either route.
  static void check_all_to_all_v(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                                 int W);
  // The rooted ones; `outputs` / `inputs`: the root's W tensors (none
  // elsewhere).
  ops::Outcome gather(std::vector<at::Tensor>& outputs, const at::Tensor& input, int64_t root);
  ops::Outcome scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int64_t root);
  ops::Outcome reduce(at::Tensor& t, int64_t root, ops::ReduceOp op);

 private:
  // An op that cannot be captured in a graph (`why`: " (what it reads back)" or ""), refused
  // before its handshake, so the group stays usable (inside the op the error would mark the group
  // failed: NOTE [Failed groups]).
  void refuse_capture(const char* what, const char* why) const;
  // NOTE [Tensors in stream order] in backend/workspace_collectives.cpp: `dst` receives `src`
  // after the op on the current stream (nothing when they are one tensor, which the body kept).
  void copy_back(const at::Tensor& dst, const at::Tensor& src) const;
  // Called in an op's body before the op: `tensors` live until the op's stream has passed the op,
  // whichever way it leaves (run() calls keep_in_flight on every path).
  void keep(std::initializer_list<at::Tensor> tensors);
  void keep(const std::vector<at::Tensor>& tensors);
  void keep_in_flight(Stream& stream, bool failed) noexcept;
  // The tensors of both lists, for one `keep` of a list op's inputs and their contiguous copies.
  static std::vector<at::Tensor> joined(std::vector<at::Tensor> a,
                                        const std::vector<at::Tensor>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  const EngineContext group_;
  SymmetricWorkspace* const ws_;  // group_.workspace
  const Config& config_;          // group_.config
  ops::FailureRecord& failure_;   // NOTE [Failed groups], shared with the fused ops
  const int rank_, size_;
  // Guards state_ and the collective channel's signal counts (host callers on several threads):
  // NOTE [Collectives of a group run one at a time].
  std::mutex mutex_;
  ops::CollectiveState state_;
};

}  // namespace cuda_p2p
