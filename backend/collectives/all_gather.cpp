// all_gather: the list form, all_gather_into_tensor (single and coalesced) under both of their
// names (NOTE [Canonical entries]), and the coalesced list form the wrapped backend runs.
#include "backend/entry_sequence.hpp"
#include "backend/hierarchy_entry.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

namespace {

// Why the workspace cannot take an all-gather of the list form (nullptr: it can).
const char* all_gather_screen(const WorkspaceCollectives& collectives,
                              const std::vector<std::vector<at::Tensor>>& outputs,
                              const std::vector<at::Tensor>& inputs, int W) {
  if (const char* why = collectives.rejects(inputs)) return why;
  if (inputs.size() != 1 || outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(W)) {
    return reason::kSeveralTensors;
  }
  if (const char* why = collectives.rejects(outputs[0])) return why;
  for (const at::Tensor& o : outputs[0]) {
    if (o.numel() != inputs[0].numel() || o.scalar_type() != inputs[0].scalar_type()) {
      return reason::kShapes;
    }
  }
  return nullptr;
}

// ... of the coalesced all_gather_into_tensor.
const char* all_gather_coalesced_screen(const WorkspaceCollectives& collectives,
                                        const std::vector<at::Tensor>& outputs,
                                        const std::vector<at::Tensor>& inputs) {
  if (const char* why = collectives.rejects(inputs)) return why;
  if (const char* why = collectives.rejects(outputs)) return why;
  return outputs.size() != inputs.size() ? reason::kShapes : nullptr;
}

// What the wrapped backend's future would hold for all_gather_into_tensor: Gloo's the W chunks of
// a CPU output, NCCL's the output.
std::vector<at::Tensor> all_gather_outputs(const at::Tensor& output, const at::Tensor& input,
                                           int W) {
  if (!output.is_cpu() || !output.is_contiguous()) return {output};
  std::vector<at::Tensor> views;
  for (int q = 0; q < W; ++q) views.push_back(detail::element_chunk(output, q, input.numel()));
  return views;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return serve(
      call(OpId::kAllGather), [&] { return hierarchy_->all_gather(outputs, inputs, opts); },
      {inputs, inputs, all_gather_screen(collectives_, outputs, inputs, getSize()), opts.asyncOp},
      detail::no_detail, [&] { return collectives_.all_gather(inputs[0], outputs[0]); },
      [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); },
      [&] { return outputs[0]; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_into_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return serve(
      calls::kAllGatherIntoTensor,
      detail::hierarchy_step(
          [&] { return hierarchy_->all_gather_into_tensor(output, input, opts); },
          [&] { return std::vector<at::Tensor>{output}; }),
      {input, input, collectives_.rejects({input, output}), opts.asyncOp}, detail::no_detail,
      [&] { return collectives_.all_gather_into_tensor(output, input); },
      [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); },
      [&] { return all_gather_outputs(output, input, getSize()); });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_into_tensor_coalesced_entry(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return serve(
      calls::kAllGatherIntoTensorCoalesced,
      [&] { return hierarchy_->all_gather_into_tensor_coalesced(outputs, inputs, opts); },
      {inputs, inputs, all_gather_coalesced_screen(collectives_, outputs, inputs), opts.asyncOp},
      detail::no_detail, [&] { return all_gather_pairs(outputs, inputs); },
      [&](c10d::Backend& b) { return b.allgather_into_tensor_coalesced(outputs, inputs, opts); },
      [&] { return outputs; });
}

// One workspace all-gather per pair, in order, each counted.
void ProcessGroupCudaP2P::all_gather_pairs(std::vector<at::Tensor>& outputs,
                                           std::vector<at::Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "all_gather_into_tensor (coalesced, tensor " + std::to_string(i) + ")";
    counters_.record(OpId::kAllGather,
                     collectives_.all_gather_into_tensor(outputs[i], inputs[i], what));
  }
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return all_gather_into_tensor_entry(output, input, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return all_gather_into_tensor_coalesced_entry(outputs, inputs, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return wrapped_only(
      calls::kAllGatherCoalesced, reason::kSeveralTensors, inputs,
      [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return all_gather_into_tensor_entry(output, input, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return all_gather_into_tensor_coalesced_entry(outputs, inputs, opts);
}
#endif

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::all_gather(const at::Tensor& input,
                                              const std::vector<at::Tensor>& outputs) {
  // Outputs are computed contiguously and copied back where the caller's are not.
  std::vector<at::Tensor> outs;
  for (const auto& o : outputs) outs.push_back(detail::contiguous_output(o));
  const at::Tensor in = detail::contiguous_input(input);
  return run("all_gather", [&](const ops::CollectiveContext& ctx) {
    keep({in, input});
    keep(outs);
    const ops::Outcome o = ops::all_gather(ctx, in, outs, ops::AllGatherAlgo::kAuto);
    for (size_t i = 0; i < outs.size(); ++i) copy_back(outputs[i], outs[i]);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::all_gather_into_tensor(at::Tensor& output,
                                                          const at::Tensor& input,
                                                          const std::string& what) {
  check_or_reject("all_gather_into_tensor", ops::OpId::kAllGather, [&] {
    detail::check_whole_of_parts(output, "output", input, "input", size_, what);
  });
  at::Tensor out = detail::contiguous_output(output);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < size_; ++q) chunks.push_back(detail::element_chunk(out, q, input.numel()));
  const ops::Outcome o = all_gather(input, chunks);
  copy_back(output, out);
  return o;
}

// --- on a group spanning hosts: the hierarchy's entry (NOTE [One hierarchical entry]) ------------

HierarchyOutcome Hierarchy::all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) {
  const size_t W = layout_.host.size();
  return enter(
      ops::OpId::kAllGather, inputs, opts.timeout,
      [&]() -> const char* {
        if (inputs.size() != 1 || outputs.size() != 1 || outputs[0].size() != W) {
          return reason::kSeveralTensors;
        }
        if (const char* why = rejects(inputs)) return why;
        if (const char* why = rejects(outputs[0])) return why;
        for (const auto& o : outputs[0]) {
          TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                      "cuda_p2p all_gather: every output must have the input's ", inputs[0].numel(),
                      " elements of ", inputs[0].scalar_type(), ", got ", o.numel(), " of ",
                      o.scalar_type());
        }
        return nullptr;
      },
      [&] { return ops::describe_tensors(inputs); },
      [&] {
        const at::Tensor& input = inputs[0];
        const int64_t n = input.numel();
        at::Tensor out = at::empty({n * static_cast<int64_t>(W)}, input.options());
        all_gather_two_level(input.contiguous().view(-1), out, opts.timeout);
        for (size_t r = 0; r < W; ++r) {
          outputs[0][r].copy_(
              out.narrow(0, static_cast<int64_t>(r) * n, n).view(outputs[0][r].sizes()));
        }
        return ran();
      });
}

HierarchyOutcome Hierarchy::all_gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) {
  return enter(
      ops::OpId::kAllGather, {input, output}, opts.timeout,
      [&] { return all_gather_rejects(output, input); },
      [&] { return ops::describe_tensors(input); },
      [&] {
        run_all_gather_into_tensor(output, input, opts.timeout);
        return ran();
      });
}

HierarchyOutcome Hierarchy::all_gather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  return enter(
      ops::OpId::kAllGather, inputs, opts.timeout,
      [&] {
        check_pairs(outputs, inputs, "all_gather_into_tensor");
        const char* why = nullptr;
        for (size_t i = 0; i < inputs.size() && !why; ++i) {
          why = all_gather_rejects(outputs[i], inputs[i]);
        }
        return why;
      },
      [&] { return "coalesced " + ops::describe_tensors(inputs); },
      [&] {
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_all_gather_into_tensor(outputs[i], inputs[i], opts.timeout);
        }
        return ran(static_cast<int>(inputs.size()));
      });
}

const char* Hierarchy::all_gather_rejects(const at::Tensor& output, const at::Tensor& input) const {
  if (const char* why = rejects({input, output})) return why;
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  TORCH_CHECK(output.numel() == input.numel() * W && output.scalar_type() == input.scalar_type(),
              "cuda_p2p all_gather_into_tensor: the output must have world size (", W,
              ") times the input's ", input.numel(), " elements of ", input.scalar_type(), ", got ",
              output.numel(), " of ", output.scalar_type());
  return nullptr;
}

void Hierarchy::run_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                           std::chrono::milliseconds timeout) {
  at::Tensor out = detail::contiguous_output(output);
  all_gather_two_level(input.contiguous().view(-1), out.view(-1), timeout);
  if (!out.is_same(output)) output.copy_(out);
}

}  // namespace cuda_p2p
