// gather: the list form and gather_single / gather_into_tensor (one tensor on the root).
#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

namespace {

std::string gather_single_text(const at::Tensor& t) {
  return t.defined() ? std::to_string(t.numel()) + " elements of " + c10::toString(t.scalar_type())
                     : std::string("None");
}

// gather_single's own argument check: the root's output is a contiguous tensor of W times the
// input's elements and its dtype.
void check_gather_single(const at::Tensor& output, const at::Tensor& input, int W, bool is_root) {
  if (!is_root) return;
  TORCH_CHECK(input.defined() && output.defined() && output.is_contiguous() &&
                  output.numel() == W * input.numel() &&
                  output.scalar_type() == input.scalar_type(),
              "cuda_p2p gather_single: expected the root's output to be a contiguous tensor of ", W,
              " x the input's elements and its dtype, got ", gather_single_text(output),
              output.defined() && !output.is_contiguous() ? ", not contiguous" : "",
              " for an input of ", gather_single_text(input));
}

// gather_single's output as the list form's: on the root, its W chunks shaped as the input.
std::vector<std::vector<at::Tensor>> gather_single_chunks(const at::Tensor& output,
                                                          const at::Tensor& input, int W,
                                                          bool is_root) {
  std::vector<std::vector<at::Tensor>> outputs;
  if (!is_root) return outputs;
  outputs.emplace_back();
  for (int q = 0; q < W; ++q) {
    outputs[0].push_back(detail::element_chunk(output, q, input.numel()).view(input.sizes()));
  }
  return outputs;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return gather_to_root(call(OpId::kGather), outputs, inputs, opts, std::nullopt);
}

// gather_single: the gather above, into W chunks of one tensor on the root. The root's output
// must be contiguous with W times the input's elements, as NCCL's gather_single requires; the
// other ranks pass an empty placeholder. Gloo has no gather_single, so its route is Gloo's gather
// into those chunks. The root's output is checked before any route is taken: on the workspace's
// route it tells the peers (NOTE [Op signatures]), which would otherwise wait for it until the
// timeout.
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather_into_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  const bool is_root = opts.rootRank == getRank();
  std::vector<at::Tensor> inputs{input};
  const auto checks = [&] { check_gather_single(output, input, getSize(), is_root); };
  collectives_.rejects(inputs)
      ? checks()
      : collectives_.check_or_reject("gather_single", OpId::kGather, checks);
  auto outputs = gather_single_chunks(output, input, getSize(), is_root);
  return gather_to_root(calls::kGatherSingle, outputs, inputs, opts, output);
}

// Both forms' entry sequence; `whole`: gather_single's output, which its Work holds on the root
// (the list form's Work holds the root's list).
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather_to_root(
    const ops::OpCall& entry, std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts,
    const std::optional<at::Tensor>& whole) {
  const bool is_root = opts.rootRank == getRank();
  auto r = detail::rooted(collectives_, inputs, outputs, is_root, getSize());
  return serve(
      entry, {inputs, inputs, r.why, opts.asyncOp},
      [&] { return detail::root_text("to", opts.rootRank); },
      [&] { return collectives_.gather(r.at_root, inputs[0], opts.rootRank); },
      [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); },
      [&] {
        return !whole ? r.at_root : is_root ? std::vector{*whole} : std::vector<at::Tensor>{};
      });
}

#ifdef CUDA_P2P_C10D_HAS_GATHER_SINGLE
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather_single(at::Tensor& output,
                                                                at::Tensor& input,
                                                                const c10d::GatherOptions& opts) {
  return gather_into_tensor_entry(output, input, opts);
}
#endif

#ifdef CUDA_P2P_C10D_HAS_GATHER_INTO_TENSOR
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather_into_tensor(
    at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  return gather_into_tensor_entry(output, input, opts);
}
#endif

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

// Capture would need the root's waits for several ranks replayed: not tested, so refused before
// the handshake (the group stays usable).
ops::Outcome WorkspaceCollectives::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                          int64_t root) {
  check_or_reject("gather", ops::OpId::kGather, [&] { detail::check_root("gather", root, size_); });
  refuse_capture("gather", "");
  const at::Tensor in = detail::contiguous_input(input);
  std::vector<at::Tensor> outs;
  for (const auto& o : outputs) outs.push_back(detail::contiguous_output(o));
  return run("gather", [&](const ops::CollectiveContext& ctx) {
    keep({in, input});
    keep(outs);
    const ops::Outcome o = ops::gather(ctx, in, outs, static_cast<int>(root));
    for (size_t q = 0; q < outs.size(); ++q) copy_back(outputs[q], outs[q]);
    return o;
  });
}

}  // namespace cuda_p2p
