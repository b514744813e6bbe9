// reduce_scatter: the list form and reduce_scatter_tensor (single and coalesced) under both of
// their names (NOTE [Canonical entries]).
#include "backend/entry_sequence.hpp"
#include "backend/reduce_ops.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;
namespace calls = ops::calls;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ && ran_hierarchically(call(OpId::kReduceScatter),
                                       hierarchy_->reduce_scatter(outputs, inputs, opts))) {
    return hierarchical_done(call(OpId::kReduceScatter), outputs);
  }
  const auto op = to_reduce_op(opts.reduceOp);
  const char* why = collectives_.rejects(outputs);
  if (!why && (outputs.size() != 1 || inputs.size() != 1 ||
               inputs[0].size() != static_cast<size_t>(getSize()))) {
    why = reason::kSeveralTensors;
  }
  if (!why) why = collectives_.rejects(inputs[0]);
  if (!why && !op) why = reason::kReduceOp;
  if (!why && !ops::is_reducible_dtype(outputs[0].scalar_type())) why = reason::kDtype;
  for (size_t q = 0; !why && q < inputs[0].size(); ++q) {
    const at::Tensor& t = inputs[0][q];
    if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type()) {
      why = reason::kShapes;
    }
  }
  return serve(
      call(OpId::kReduceScatter), {outputs, outputs, why, opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] { return collectives_.reduce_scatter(inputs[0], outputs[0], *op); },
      [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); },
      [&] { return outputs; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_entry(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ && ran_hierarchically(calls::kReduceScatterTensor,
                                       hierarchy_->reduce_scatter_tensor(output, input, opts))) {
    return hierarchical_done(calls::kReduceScatterTensor, {output});
  }
  const auto op = to_reduce_op(opts.reduceOp);
  const char* why = collectives_.rejects({input, output});
  if (!why && !op) why = reason::kReduceOp;
  if (!why && !ops::is_reducible_dtype(output.scalar_type())) why = reason::kDtype;
  return serve(
      calls::kReduceScatterTensor, {output, input, why, opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] {
        return collectives_.reduce_scatter_tensor(output, input, *op, "reduce_scatter_tensor");
      },
      [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); },
      [&] { return std::vector<at::Tensor>{output}; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced_entry(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(calls::kReduceScatterTensorCoalesced,
                         hierarchy_->reduce_scatter_tensor_coalesced(outputs, inputs, opts))) {
    return hierarchical_done(calls::kReduceScatterTensorCoalesced, outputs);
  }
  const auto op = to_reduce_op(opts.reduceOp);
  const char* why = collectives_.rejects(inputs);
  if (!why) why = collectives_.rejects(outputs);
  if (!why && outputs.size() != inputs.size()) why = reason::kShapes;
  if (!why && !op) why = reason::kReduceOp;
  for (size_t i = 0; !why && i < outputs.size(); ++i) {
    if (!ops::is_reducible_dtype(outputs[i].scalar_type())) why = reason::kDtype;
  }
  return serve(
      calls::kReduceScatterTensorCoalesced, {outputs, inputs, why, opts.asyncOp},
      [&] { return " " + reduce_op_text(opts.reduceOp); },
      [&] {  // one workspace reduce-scatter per pair, in order
        for (size_t i = 0; i < inputs.size(); ++i) {
          counters_.record(OpId::kReduceScatter, collectives_.reduce_scatter_tensor(
                                                     outputs[i], inputs[i], *op,
                                                     "reduce_scatter_tensor (coalesced, tensor " +
                                                         std::to_string(i) + ")"));
        }
      },
      [&](c10d::Backend& b) { return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts); },
      [&] { return outputs; });
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

}  // namespace cuda_p2p
