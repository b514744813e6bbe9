// all_to_all: all_to_all_single under both of its names (NOTE [Canonical entries]), the list
// form, and cuda_p2p's own all_to_all_v (its checks run on either route).
#include "backend/entry_sequence.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

namespace {

// Why the workspace cannot take all_to_all_single's call (nullptr: it can).
const char* all_to_all_single_screen(const WorkspaceCollectives& collectives,
                                     const at::Tensor& output, const at::Tensor& input) {
  if (const char* why = collectives.rejects({input, output})) return why;
  return input.scalar_type() != output.scalar_type() ? reason::kShapes : nullptr;
}

// ... of the list form's: W inputs and W outputs of one dtype.
const char* all_to_all_screen(const WorkspaceCollectives& collectives,
                              const std::vector<at::Tensor>& outputs,
                              const std::vector<at::Tensor>& inputs, int W) {
  if (const char* why = collectives.rejects(inputs)) return why;
  if (const char* why = collectives.rejects(outputs)) return why;
  if (static_cast<int>(inputs.size()) != W || static_cast<int>(outputs.size()) != W) {
    return reason::kShapes;
  }
  for (int q = 0; q < W; ++q) {
    if (inputs[q].scalar_type() != inputs[0].scalar_type() ||
        outputs[q].scalar_type() != inputs[0].scalar_type()) {
      return reason::kShapes;
    }
  }
  return nullptr;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_to_all_single_entry(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  return serve(
      call(OpId::kAllToAllSingle),
      {input, input, all_to_all_single_screen(collectives_, output, input), opts.asyncOp},
      detail::no_detail,
      [&] { return collectives_.all_to_all_single(output, input, output_splits, input_splits); },
      [&](c10d::Backend& b) {
        return b.alltoall_base(output, input, output_splits, input_splits, opts);
      },
      [&] { return std::vector<at::Tensor>{output}; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return all_to_all_single_entry(output, input, output_split_sizes, input_split_sizes, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  return serve(
      call(OpId::kAllToAll),
      {inputs, inputs, all_to_all_screen(collectives_, outputs, inputs, getSize()), opts.asyncOp},
      detail::no_detail, [&] { return collectives_.all_to_all(outputs, inputs); },
      [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); }, [&] { return outputs; });
}

std::pair<at::Tensor, std::vector<int64_t>> ProcessGroupCudaP2P::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& input_splits) {
  const char* why = input.defined() ? collectives_.rejects(input) : reason::kDevice;
  if (!why) {
    auto r = collectives_.all_to_all_v(input, input_splits);
    counters_.record(OpId::kAllToAllV, r.outcome);
    settle_cpu_outputs("all_to_all_v");
    return {std::move(r.output), std::move(r.recv)};
  }
  if (input.defined()) {
    collectives_.agree_on_route("all_to_all_v", OpId::kAllToAllV, input, detail::no_detail, why);
  }
  WorkspaceCollectives::check_all_to_all_v(input, input_splits, getSize());
  auto r = wrapped_.all_to_all_v(input, input_splits);
  counters_.fallback(OpId::kAllToAllV, why);
  return r;
}

#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_to_all_single(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return all_to_all_single_entry(output, input, output_split_sizes, input_split_sizes, opts);
}
#endif

}  // namespace cuda_p2p
