// reduce_scatter: the list form and reduce_scatter_tensor (single and coalesced) under both of
// their names (NOTE [Canonical entries]).
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

// Why the workspace cannot take a reduce-scatter of the list form (nullptr: it can).
const char* reduce_scatter_screen(const WorkspaceCollectives& collectives,
                                  const std::vector<at::Tensor>& outputs,
                                  const std::vector<std::vector<at::Tensor>>& inputs,
                                  const std::optional<ops::ReduceOp>& op, int W) {
  if (const char* why = collectives.rejects(outputs)) return why;
  if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(W)) {
    return reason::kSeveralTensors;
  }
  if (const char* why = collectives.rejects(inputs[0])) return why;
  if (!op) return reason::kReduceOp;
  if (!ops::is_reducible_dtype(outputs[0].scalar_type())) return reason::kDtype;
  for (const at::Tensor& t : inputs[0]) {
    if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type()) {
      return reason::kShapes;
    }
  }
  return nullptr;
}

// ... of reduce_scatter_tensor, single (one pair) or coalesced.
const char* reduce_scatter_tensor_screen(const WorkspaceCollectives& collectives,
                                         c10::ArrayRef<at::Tensor> outputs,
                                         c10::ArrayRef<at::Tensor> inputs,
                                         const std::optional<ops::ReduceOp>& op) {
  if (const char* why = collectives.rejects(inputs)) return why;
  if (const char* why = collectives.rejects(outputs)) return why;
  if (outputs.size() != inputs.size()) return reason::kShapes;
  if (!op) return reason::kReduceOp;
  for (const at::Tensor& o : outputs) {
    if (!ops::is_reducible_dtype(o.scalar_type())) return reason::kDtype;
  }
  return nullptr;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  return serve(
      call(OpId::kReduceScatter), [&] { return hierarchy_->reduce_scatter(outputs, inputs, opts); },
      {outputs, outputs, reduce_scatter_screen(collectives_, outputs, inputs, op, getSize()),
       opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] { return collectives_.reduce_scatter(inputs[0], outputs[0], *op); },
      [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); },
      [&] { return outputs; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  return serve(
      calls::kReduceScatterTensor,
      [&] { return hierarchy_->reduce_scatter_tensor(output, input, opts); },
      {output, input, reduce_scatter_tensor_screen(collectives_, output, input, op), opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] { return collectives_.reduce_scatter_tensor(output, input, *op); },
      [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); },
      [&] { return std::vector<at::Tensor>{output}; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced_entry(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto op = to_reduce_op(opts.reduceOp);
  return serve(
      calls::kReduceScatterTensorCoalesced,
      [&] { return hierarchy_->reduce_scatter_tensor_coalesced(outputs, inputs, opts); },
      {outputs, inputs, reduce_scatter_tensor_screen(collectives_, outputs, inputs, op),
       opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] { return reduce_scatter_pairs(outputs, inputs, *op); },
      [&](c10d::Backend& b) { return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts); },
      [&] { return outputs; });
}

void ProcessGroupCudaP2P::reduce_scatter_pairs(std::vector<at::Tensor>& outputs,
                                               std::vector<at::Tensor>& inputs, ops::ReduceOp op) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "reduce_scatter_tensor (coalesced, tensor " + std::to_string(i) + ")";
    counters_.record(OpId::kReduceScatter,
                     collectives_.reduce_scatter_tensor(outputs[i], inputs[i], op, what));
  }
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_tensor_entry(output, input, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_tensor_coalesced_entry(outputs, inputs, opts);
}

#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_tensor_entry(output, input, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_tensor_coalesced_entry(outputs, inputs, opts);
}
#endif

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::reduce_scatter(const std::vector<at::Tensor>& inputs,
                                                  const at::Tensor& output, ops::ReduceOp op) {
  check_or_reject("reduce_scatter", ops::OpId::kReduceScatter,
                  [&] { ops::check_reduce_op(op, output.scalar_type(), "reduce_scatter"); });
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(detail::contiguous_input(t));
  at::Tensor out = detail::contiguous_output(output);
  return run("reduce_scatter", [&](const ops::CollectiveContext& ctx) {
    keep(joined(ins, inputs));
    keep({out});
    const ops::Outcome o = ops::reduce_scatter(ctx, ins, out, op, ops::ReduceScatterAlgo::kAuto);
    copy_back(output, out);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::reduce_scatter_tensor(const at::Tensor& output,
                                                         const at::Tensor& input, ops::ReduceOp op,
                                                         const std::string& what) {
  check_or_reject("reduce_scatter_tensor", ops::OpId::kReduceScatter, [&] {
    detail::check_whole_of_parts(input, "input", output, "output", size_, what);
  });
  const at::Tensor in = detail::contiguous_input(input);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < size_; ++q) chunks.push_back(detail::element_chunk(in, q, output.numel()));
  return reduce_scatter(chunks, output, op);  // which keeps the chunks, so `in`
}

// --- on a group spanning hosts: the hierarchy's entry (NOTE [One hierarchical entry]) ------------

HierarchyOutcome Hierarchy::reduce_scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ReduceScatterOptions& opts) {
  const size_t W = layout_.host.size();
  return enter(
      ops::OpId::kReduceScatter, outputs, opts.timeout,
      [&]() -> const char* {
        if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].size() != W) {
          return reason::kSeveralTensors;
        }
        if (const char* why = rejects(outputs)) return why;
        if (const char* why = rejects(inputs[0])) return why;
        for (const auto& t : inputs[0]) {
          TORCH_CHECK(
              t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
              "cuda_p2p reduce_scatter: every input must have the output's ", outputs[0].numel(),
              " elements of ", outputs[0].scalar_type(), ", got ", t.numel(), " of ",
              t.scalar_type());
        }
        return rejects_reduction(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
      },
      [&] { return ops::describe_tensors(outputs) + " " + reduce_op_text(opts.reduceOp); },
      [&] {
        at::Tensor& output = outputs[0];
        const int64_t n = output.numel();
        at::Tensor in = at::empty({n * static_cast<int64_t>(W)}, output.options());
        for (size_t r = 0; r < W; ++r) {
          in.narrow(0, static_cast<int64_t>(r) * n, n).copy_(inputs[0][r].reshape(-1));
        }
        at::Tensor out = detail::contiguous_output(output);
        reduce_scatter_two_level(in, out.view(-1), opts.reduceOp, opts.timeout);
        if (!out.is_same(output)) output.copy_(out);
        return ran();
      });
}

HierarchyOutcome Hierarchy::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  return enter(
      ops::OpId::kReduceScatter, {input, output}, opts.timeout,
      [&] { return reduce_scatter_rejects(output, input, opts.reduceOp); },
      [&] { return ops::describe_tensors(output) + " " + reduce_op_text(opts.reduceOp); },
      [&] {
        run_reduce_scatter_tensor(output, input, opts.reduceOp, opts.timeout);
        return ran();
      });
}

HierarchyOutcome Hierarchy::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return enter(
      ops::OpId::kReduceScatter, inputs, opts.timeout,
      [&] {
        check_pairs(outputs, inputs, "reduce_scatter_tensor");
        const char* why = nullptr;
        for (size_t i = 0; i < inputs.size() && !why; ++i) {
          why = reduce_scatter_rejects(outputs[i], inputs[i], opts.reduceOp);
        }
        return why;
      },
      [&] {
        return "coalesced " + ops::describe_tensors(outputs) + " " + reduce_op_text(opts.reduceOp);
      },
      [&] {
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_reduce_scatter_tensor(outputs[i], inputs[i], opts.reduceOp, opts.timeout);
        }
        return ran(static_cast<int>(inputs.size()));
      });
}

const char* Hierarchy::reduce_scatter_rejects(const at::Tensor& output, const at::Tensor& input,
                                              const c10d::ReduceOp& op) const {
  if (const char* why = rejects({input, output})) return why;
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  TORCH_CHECK(input.numel() == output.numel() * W && output.scalar_type() == input.scalar_type(),
              "cuda_p2p reduce_scatter_tensor: the input must have world size (", W,
              ") times the output's ", output.numel(), " elements of ", output.scalar_type(),
              ", got ", input.numel(), " of ", input.scalar_type());
  return rejects_reduction(op, output.scalar_type(), "reduce_scatter_tensor");
}

void Hierarchy::run_reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                          const c10d::ReduceOp& op,
                                          std::chrono::milliseconds timeout) {
  at::Tensor out = detail::contiguous_output(output);
  reduce_scatter_two_level(input.contiguous().view(-1), out.view(-1), op, timeout);
  if (!out.is_same(output)) output.copy_(out);
}

}  // namespace cuda_p2p
