// ProcessGroupCudaP2P's rooted collectives gather, scatter and reduce: on the workspace
// (ops/gather.cpp, ops/scatter.cpp, ops/reduce.cpp) when it serves the tensors, else on the
// wrapped backend, counted (docs/collectives.md, "Gather and scatter", "Reduce").
#include <c10/util/Exception.h>

#include <utility>

#include "backend/CompletedWork.hpp"
#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Op = Counters::Op;

namespace {

at::Tensor gs_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// Whether `list` (the root's W tensors) matches `one` (numel, dtype): else the wrapped backend
// runs the call and reports what it finds.
bool gs_matches(const std::vector<at::Tensor>& list, const at::Tensor& one, int W) {
  if (static_cast<int>(list.size()) != W) return false;
  for (const auto& t : list) {
    if (!t.defined() || t.numel() != one.numel() || t.scalar_type() != one.scalar_type()) {
      return false;
    }
  }
  return true;
}

// Capture would need the root's waits for several ranks replayed: not tested, so refused before
// the handshake (the group stays usable).
void gs_refuse_capture(SymmetricWorkspace& ws, const char* what) {
  TORCH_CHECK(ws.device().capture_id(*ws.device().current_stream()) == 0, "cuda_p2p ", what,
              ": cannot be captured in a graph; call it outside the capture");
}

}  // namespace

WorkPtr ProcessGroupCudaP2P::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                    std::vector<at::Tensor>& inputs,
                                    const c10d::GatherOptions& opts) {
  const int W = getSize(), me = getRank();
  const int64_t root = opts.rootRank;
  const char* why = workspace_rejects(inputs);
  if (!why && inputs.size() != 1) why = "several tensors";
  if (!why && root == me) {
    if (outputs.size() != 1 || !gs_matches(outputs[0], inputs[0], W)) {
      why = "shapes";  // the wrapped backend reports it
    } else {
      why = workspace_rejects(outputs[0]);
    }
  }
  if (!why && root != me && !(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()))) {
    why = "shapes";
  }
  if (why) {
    agree_on_route("gather", ops::OpKind::kGather, inputs, " to root " + std::to_string(root), why);
    counters_->fallback(Op::kGather, why);
    return delegate(inputs, "gather",
                    [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); });
  }
  check_or_reject("gather", ops::OpKind::kGather, [&] {
    TORCH_CHECK(root >= 0 && root < W, "cuda_p2p gather: root must be a rank in [0, ", W, "), got ",
                root);
  });
  gs_refuse_capture(*workspace_, "gather");
  const at::Tensor in = inputs[0].is_contiguous() ? inputs[0] : inputs[0].contiguous();
  std::vector<at::Tensor> outs;
  if (root == me) {
    for (const auto& o : outputs[0]) outs.push_back(gs_output(o));
  }
  counters_->record(Op::kGather, run_collective("gather", [&](const ops::CollectiveContext& ctx) {
                      const ops::Outcome o = ops::gather(ctx, in, outs, static_cast<int>(root));
                      for (size_t q = 0; q < outs.size(); ++q) {
                        if (!outs[q].is_same(outputs[0][q])) outputs[0][q].copy_(outs[q]);
                      }
                      return o;
                    }));
  return completed(c10d::OpType::GATHER, root == me ? outputs[0] : std::vector<at::Tensor>{},
                   opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::scatter(std::vector<at::Tensor>& outputs,
                                     std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ScatterOptions& opts) {
  const int W = getSize(), me = getRank();
  const int64_t root = opts.rootRank;
  const char* why = workspace_rejects(outputs);
  if (!why && outputs.size() != 1) why = "several tensors";
  if (!why && root == me) {
    if (inputs.size() != 1 || !gs_matches(inputs[0], outputs[0], W)) {
      why = "shapes";  // the wrapped backend reports it
    } else {
      why = workspace_rejects(inputs[0]);
    }
  }
  if (!why && root != me && !(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()))) {
    why = "shapes";
  }
  if (why) {
    agree_on_route("scatter", ops::OpKind::kScatter, outputs, " from root " + std::to_string(root),
                   why);
    counters_->fallback(Op::kScatter, why);
    return delegate(outputs, "scatter",
                    [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); });
  }
  check_or_reject("scatter", ops::OpKind::kScatter, [&] {
    TORCH_CHECK(root >= 0 && root < W, "cuda_p2p scatter: root must be a rank in [0, ", W,
                "), got ", root);
  });
  gs_refuse_capture(*workspace_, "scatter");
  std::vector<at::Tensor> ins;
  if (root == me) {
    for (const auto& t : inputs[0]) ins.push_back(t.is_contiguous() ? t : t.contiguous());
  }
  at::Tensor& output = outputs[0];
  at::Tensor out = gs_output(output);
  counters_->record(Op::kScatter, run_collective("scatter", [&](const ops::CollectiveContext& ctx) {
                      const ops::Outcome o = ops::scatter(ctx, ins, out, static_cast<int>(root));
                      if (!out.is_same(output)) output.copy_(out);
                      return o;
                    }));
  return completed(c10d::OpType::SCATTER, outputs, opts.asyncOp);
}

// torch.distributed.reduce: only the root's tensor receives the result; the others' are left
// as they were (NOTE [Reduce at the root] in ops/reduce.cpp).
WorkPtr ProcessGroupCudaP2P::reduce(std::vector<at::Tensor>& tensors,
                                    const c10d::ReduceOptions& opts) {
  const int W = getSize(), me = getRank();
  const int64_t root = opts.rootRank;
  const auto op = to_reduce_op(opts.reduceOp);
  // The reasons in all_reduce's order, so that ranks routing alike name the same one (NOTE
  // [Routes agree]).
  const char* why = tensors.size() != 1 || opts.rootTensor != 0 ? "several tensors"
                    : !op                                       ? "reduce op"
                                                                : nullptr;
  if (!why) why = workspace_rejects(tensors);
  if (!why && !ops::is_reducible_dtype(tensors[0].scalar_type())) why = "dtype";
  if (why) {
    agree_on_route("reduce", ops::OpKind::kReduce, tensors,
                   " " + (op ? ops::lower_name(*op) : std::string("premul_sum")) + " to root " +
                       std::to_string(root),
                   why);
    counters_->fallback(Op::kReduce, why);
    return delegate(tensors, "reduce", [&](c10d::Backend& b) { return b.reduce(tensors, opts); });
  }
  at::Tensor& t = tensors[0];
  check_or_reject("reduce", ops::OpKind::kReduce, [&] {
    TORCH_CHECK(root >= 0 && root < W, "cuda_p2p reduce: root must be a rank in [0, ", W, "), got ",
                root);
    ops::check_reduce_op(*op, t.scalar_type(), "reduce");
  });
  gs_refuse_capture(*workspace_, "reduce");
  // Only the root's copy goes back into a non-contiguous tensor: the others' stay as they were.
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  counters_->record(Op::kReduce, run_collective("reduce", [&](const ops::CollectiveContext& ctx) {
                      const ops::Outcome o = ops::reduce(ctx, work, static_cast<int>(root), *op);
                      if (root == me && !work.is_same(t)) t.copy_(work);
                      return o;
                    }));
  return completed(c10d::OpType::REDUCE, tensors, opts.asyncOp);
}

}  // namespace cuda_p2p
