// gather: the list form and gather_single / gather_into_tensor (one tensor on the root).
#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const int64_t root = opts.rootRank;
  const bool is_root = root == getRank();
  const char* why = detail::rooted_rejects(collectives_, inputs, outputs, is_root, getSize());
  std::vector<at::Tensor> none;
  std::vector<at::Tensor>& at_root = !why && is_root ? outputs[0] : none;
  return serve(
      call(OpId::kGather), {inputs, inputs, why, opts.asyncOp},
      [&] { return " to root " + std::to_string(root); },
      [&] { return collectives_.gather(at_root, inputs[0], root); },
      [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); }, [&] { return at_root; });
}

// gather_single: the gather above, into W chunks of one tensor on the root. The root's output
// must be contiguous with W times the input's elements, as NCCL's gather_single requires; the
// other ranks pass an empty placeholder. Gloo has no gather_single, so its route is Gloo's gather
// into those chunks.
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::gather_into_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  const int W = getSize();
  const int64_t root = opts.rootRank;
  const bool is_root = root == getRank();
  std::vector<at::Tensor> inputs{input};
  auto checks = [&] {
    if (!is_root) return;
    TORCH_CHECK(
        input.defined() && output.defined() && output.is_contiguous() &&
            output.numel() == W * input.numel() && output.scalar_type() == input.scalar_type(),
        "cuda_p2p gather_single: expected the root's output to be a contiguous tensor of ", W,
        " x the input's elements and its dtype, got ",
        output.defined() ? std::to_string(output.numel()) + " elements of " +
                               c10::toString(output.scalar_type()) +
                               (output.is_contiguous() ? "" : ", not contiguous")
                         : std::string("None"),
        " for an input of ",
        input.defined()
            ? std::to_string(input.numel()) + " elements of " + c10::toString(input.scalar_type())
            : std::string("None"));
  };
  // The root's output is checked before any route is taken: on the workspace's route it tells the
  // peers (NOTE [Op signatures]), which would otherwise wait for it until the timeout.
  if (!collectives_.rejects(inputs)) {
    collectives_.check_or_reject("gather_single", OpId::kGather, checks);
  } else {
    checks();
  }
  std::vector<std::vector<at::Tensor>> outputs;
  if (is_root) {
    outputs.emplace_back();
    for (int q = 0; q < W; ++q) {
      outputs[0].push_back(detail::element_chunk(output, q, input.numel()).view(input.sizes()));
    }
  }
  const char* why = detail::rooted_rejects(collectives_, inputs, outputs, is_root, W);
  std::vector<at::Tensor> none;
  std::vector<at::Tensor>& at_root = !why && is_root ? outputs[0] : none;
  return serve(
      calls::kGatherSingle, {inputs, inputs, why, opts.asyncOp},
      [&] { return " to root " + std::to_string(root); },
      [&] { return collectives_.gather(at_root, inputs[0], root); },
      [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); },
      [&] { return is_root ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{}; });
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

}  // namespace cuda_p2p
