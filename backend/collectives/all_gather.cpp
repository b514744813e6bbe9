// all_gather: the list form, all_gather_into_tensor (single and coalesced) under both of their
// names (NOTE [Canonical entries]), and the coalesced list form the wrapped backend runs.
#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(call(OpId::kAllGather), hierarchy_->all_gather(outputs, inputs, opts))) {
    return hierarchical_done(call(OpId::kAllGather), outputs[0]);
  }
  const char* why = collectives_.rejects(inputs);
  if (!why && (inputs.size() != 1 || outputs.size() != 1 ||
               outputs[0].size() != static_cast<size_t>(getSize()))) {
    why = reason::kSeveralTensors;
  }
  if (!why) why = collectives_.rejects(outputs[0]);
  for (size_t q = 0; !why && q < outputs[0].size(); ++q) {
    const at::Tensor& o = outputs[0][q];
    if (o.numel() != inputs[0].numel() || o.scalar_type() != inputs[0].scalar_type()) {
      why = reason::kShapes;
    }
  }
  return serve(
      call(OpId::kAllGather), {inputs, inputs, why, opts.asyncOp}, detail::no_detail,
      [&] { return collectives_.all_gather(inputs[0], outputs[0]); },
      [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); },
      [&] { return outputs[0]; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_into_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  if (hierarchy_ && ran_hierarchically(calls::kAllGatherIntoTensor,
                                       hierarchy_->all_gather_into_tensor(output, input, opts))) {
    return hierarchical_done(calls::kAllGatherIntoTensor, {output});
  }
  const char* why = collectives_.rejects({input, output});
  return serve(
      calls::kAllGatherIntoTensor, {input, input, why, opts.asyncOp}, detail::no_detail,
      [&] { return collectives_.all_gather_into_tensor(output, input, "all_gather_into_tensor"); },
      [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); },
      [&] {
        // What the wrapped backend's future would hold: Gloo's the W chunks, NCCL's the output.
        if (!output.is_cpu() || !output.is_contiguous()) return std::vector<at::Tensor>{output};
        std::vector<at::Tensor> views;
        for (int q = 0; q < getSize(); ++q)
          views.push_back(detail::element_chunk(output, q, input.numel()));
        return views;
      });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_gather_into_tensor_coalesced_entry(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(calls::kAllGatherIntoTensorCoalesced,
                         hierarchy_->all_gather_into_tensor_coalesced(outputs, inputs, opts))) {
    return hierarchical_done(calls::kAllGatherIntoTensorCoalesced, outputs);
  }
  const char* why = collectives_.rejects(inputs);
  if (!why) why = collectives_.rejects(outputs);
  if (!why && outputs.size() != inputs.size()) why = reason::kShapes;
  return serve(
      calls::kAllGatherIntoTensorCoalesced, {inputs, inputs, why, opts.asyncOp}, detail::no_detail,
      [&] {  // one workspace all-gather per pair, in order
        for (size_t i = 0; i < inputs.size(); ++i) {
          counters_.record(OpId::kAllGather, collectives_.all_gather_into_tensor(
                                                 outputs[i], inputs[i],
                                                 "all_gather_into_tensor (coalesced, tensor " +
                                                     std::to_string(i) + ")"));
        }
      },
      [&](c10d::Backend& b) { return b.allgather_into_tensor_coalesced(outputs, inputs, opts); },
      [&] { return outputs; });
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

}  // namespace cuda_p2p
