// all_reduce: dist.all_reduce, torch.ops.cuda_p2p.all_reduce_'s entry (no Work), and the
// coalesced and sparse calls the wrapped backend runs.
#include "backend/entry_sequence.hpp"
#include "backend/hierarchy_entry.hpp"
#include "backend/reduce_ops.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

namespace {

// Why the workspace cannot take dist.all_reduce's call (nullptr: it can).
const char* all_reduce_screen(const WorkspaceCollectives& collectives,
                              const std::vector<at::Tensor>& tensors,
                              const std::optional<ops::ReduceOp>& op) {
  if (tensors.size() != 1) return reason::kSeveralTensors;
  if (!op) return reason::kReduceOp;
  return collectives.all_reduce_rejects(tensors[0]);
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  return serve(
      call(OpId::kAllReduce), [&] { return hierarchy_->all_reduce(tensors, opts); },
      {tensors, tensors, all_reduce_screen(collectives_, tensors, op), opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] { return collectives_.all_reduce(tensors[0], *op); },
      [&](c10d::Backend& b) { return b.allreduce(tensors, opts); }, [&] { return tensors; });
}

// The all-reduce of torch.ops.cuda_p2p.all_reduce_: dist.all_reduce's paths, in its order, with
// no Work. The c10d options only where they are used: not on the small all-reduce's path.
void ProcessGroupCudaP2P::check_all_reduce_in_place(const at::Tensor& tensor,
                                                    c10::function_ref<void()> checks) {
  // The calls all_reduce_in_place serves on the workspace (a group spanning hosts has its own
  // steps): their peers take part in the rejection's handshake.
  if (hierarchy_ || tensor.layout() != at::kStrided || collectives_.all_reduce_rejects(tensor)) {
    return checks();
  }
  collectives_.check_or_reject("all_reduce", OpId::kAllReduce, checks);
}

void ProcessGroupCudaP2P::all_reduce_in_place(at::Tensor& tensor, ops::ReduceOp op) {
  TORCH_CHECK(tensor.layout() == at::kStrided,
              "cuda_p2p all_reduce_: expected a strided (dense) tensor, got layout ",
              tensor.layout());
  const auto options = [op] {
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d_reduce_op(op);
    return opts;
  };
  // A group spanning hosts copies a non-contiguous tensor back itself.
  if (hierarchy_) {
    std::vector<at::Tensor> tensors{tensor};
    if (ran_hierarchically(call(OpId::kAllReduce), hierarchy_->all_reduce(tensors, options()))) {
      return;
    }
  }
  const char* why = collectives_.all_reduce_rejects(tensor);
  if (on_workspace(
          call(OpId::kAllReduce), {tensor, tensor, why, false},
          [&] { return " " + ops::lower_name(op); },
          [&] { return collectives_.all_reduce(tensor, op); })) {
    settle_cpu_outputs("all_reduce_");
    return;
  }
  // The wrapped backends expect contiguous tensors, as they do from dist.all_reduce.
  std::vector<at::Tensor> tensors{detail::contiguous_input(tensor)};
  wrapped_.route(tensors, "all_reduce_").allreduce(tensors, options())->wait();
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return wrapped_only(calls::kAllReduceCoalesced, reason::kSeveralTensors, tensors,
                      [&](c10d::Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return wrapped_only(call(OpId::kAllReduceSparse), reason::kNoWorkspaceOp, tensors,
                      [&](c10d::Backend& b) { return b.allreduce_sparse(tensors, opts); });
}

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::all_reduce(at::Tensor& t, ops::ReduceOp op) {
  // Checked first without the closures check_or_reject takes: this is the small all-reduce's
  // path (NOTE [Inline one-shot] in ops/all_reduce.cpp), and they allocate.
  if (!ops::reduce_op_applies(op, t.scalar_type())) {
    check_or_reject("all_reduce", ops::OpId::kAllReduce,
                    [&] { ops::check_reduce_op(op, t.scalar_type(), "all_reduce"); });
  }
  struct {
    at::Tensor& t;
    at::Tensor work;
    ops::ReduceOp op;
  } call{t, detail::contiguous_input(t), op};
  return run("all_reduce", [this, &call](const ops::CollectiveContext& ctx) {
    // The small all-reduce's path allocates nothing: on an inline stream nothing is queued.
    if (!inline_paths(ws_->device(), ctx.stream)) keep({call.work});
    const ops::Outcome o =
        ops::all_reduce(ctx, call.work, call.work, call.op, ops::AllReduceAlgo::kAuto);
    copy_back(call.t, call.work);
    return o;
  });
}

// --- on a group spanning hosts: the hierarchy's entry (NOTE [One hierarchical entry]) ------------

HierarchyOutcome Hierarchy::all_reduce(std::vector<at::Tensor>& tensors,
                                       const c10d::AllreduceOptions& opts) {
  return enter(
      ops::OpId::kAllReduce, tensors, opts.timeout,
      [&]() -> const char* {
        if (tensors.size() != 1) return reason::kSeveralTensors;
        if (const char* why = rejects(tensors)) return why;
        return rejects_reduction(opts.reduceOp, tensors[0].scalar_type(), "all_reduce");
      },
      [&] { return ops::describe_tensors(tensors) + " " + reduce_op_text(opts.reduceOp); },
      [&](at::Tensor& work, bool in_agreement) {
        at::Tensor& t = tensors[0];
        if (!work.defined()) work = t.contiguous();
        if (!in_agreement) all_reduce_two_level(work.view(-1), opts.reduceOp, opts.timeout);
        if (!work.is_same(t)) t.copy_(work);
        HierarchyOutcome outcome = ran();
        outcome.in_agreement = in_agreement;
        return outcome;
      },
      &opts.reduceOp);
}

}  // namespace cuda_p2p
