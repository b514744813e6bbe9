// torch.ops.cuda_p2p.all_reduce_ / all_reduce: the workspace all-reduce as dispatcher ops, called
// the way vLLM's custom all-reduce and DeepSpeed's inference_all_reduce_ are (no Work, no
// torch.distributed Python layer), with CPU, CUDA and Meta kernels and a functionalization
// kernel, so that torch.compile traces them (docs/collectives.md, "The dispatcher op").
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/library.h>

#include <string>
#include <string_view>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/dispatcher_group.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

namespace {

constexpr const char* kOp = "all_reduce_";

ops::ReduceOp parse_reduce_op(c10::string_view name) {
  using ops::ReduceOp;
  if (name == "sum") return ReduceOp::kSum;  // the default, compared inline
  return ops::parse_reduce_op(std::string_view(name.data(), name.size()),
                              {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                               ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor},
                              kOp);
}

void check_tensor(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "cuda_p2p ", kOp, ": expected a tensor, got None");
  TORCH_CHECK(!tensor.is_complex(), "cuda_p2p ", kOp, ": complex tensors are not supported, got ",
              tensor.scalar_type(), " (all-reduce a torch.view_as_real view instead)");
}

at::Tensor& all_reduce_(at::Tensor& tensor, c10::string_view reduce_op,
                        c10::string_view group_name) {
  check_tensor(tensor);
  const auto backend = resolve_backend(std::string_view(group_name.data(), group_name.size()),
                                       tensor.device().type(), kOp);
  ops::ReduceOp op = ops::ReduceOp::kSum;  // the default: nothing to check
  if (reduce_op != "sum") {
    // A wrong name on one rank: its peers raise at once naming it (issue 58).
    backend->check_all_reduce_in_place(tensor, [&] { op = parse_reduce_op(reduce_op); });
  }
  backend->all_reduce_in_place(tensor, op);
  return tensor;
}

// NOTE [The one-argument op]
// all_reduce_sum_(t) is all_reduce_(t) - the sum over the default group - with a schema of the
// tensor alone, as DeepSpeed's inference_all_reduce_ and vLLM's custom all-reduce have. From
// Python every argument a call leaves to its default costs: torch's createStackForSchema looks
// each one up in the keyword arguments by a Python string it builds from the argument's name
// (~300 instructions and ~20 lines of code each; docs/collectives.md, "The whole call").
at::Tensor& all_reduce_sum_(at::Tensor& tensor) {
  check_tensor(tensor);
  resolve_backend("", tensor.device().type(), "all_reduce_sum_")
      ->all_reduce_in_place(tensor, ops::ReduceOp::kSum);
  return tensor;
}

at::Tensor all_reduce(const at::Tensor& tensor, c10::string_view reduce_op,
                      c10::string_view group_name) {
  check_tensor(tensor);
  at::Tensor out = tensor.clone(at::MemoryFormat::Contiguous);
  all_reduce_(out, reduce_op, group_name);
  return out;
}

at::Tensor& all_reduce__meta(at::Tensor& tensor, c10::string_view reduce_op,
                             c10::string_view /*group_name*/) {
  check_tensor(tensor);
  parse_reduce_op(reduce_op);
  return tensor;
}

at::Tensor& all_reduce_sum__meta(at::Tensor& tensor) {
  check_tensor(tensor);
  return tensor;
}

at::Tensor all_reduce_meta(const at::Tensor& tensor, c10::string_view reduce_op,
                           c10::string_view /*group_name*/) {
  check_tensor(tensor);
  parse_reduce_op(reduce_op);
  return at::empty_like(tensor, at::MemoryFormat::Contiguous);
}

// Functionalization cannot turn a custom op that returns an alias of its input (Tensor(a!))
// into a functional one by itself (torch.compile raises "Found a custom (non-ATen) operator
// whose output has alias annotations"): this kernel maps all_reduce_ onto the out-of-place
// all_reduce and tells functionalization that the input was overwritten with its result.
at::Tensor& all_reduce__functionalize(at::Tensor& tensor, c10::string_view reduce_op,
                                      c10::string_view group_name) {
  TORCH_INTERNAL_ASSERT(at::functionalization::impl::isFunctionalTensor(tensor));
  at::functionalization::impl::sync(tensor);
  const at::Tensor unwrapped = at::functionalization::impl::from_functional_tensor(tensor);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cuda_p2p::all_reduce", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
  at::Tensor result;
  {
    at::AutoDispatchSkipFunctionalize guard;
    result = op.call(unwrapped, reduce_op, group_name);
  }
  at::functionalization::impl::replace_(tensor, result);
  at::functionalization::impl::commit_update(tensor);
  at::functionalization::impl::sync(tensor);
  return tensor;
}

at::Tensor& all_reduce_sum__functionalize(at::Tensor& tensor) {
  return all_reduce__functionalize(tensor, "sum", "");
}

}  // namespace
}  // namespace cuda_p2p

TORCH_LIBRARY_FRAGMENT(cuda_p2p, m) {
  // Defaults: a sum over the default group, called with no strings (NOTE [The default group's
  // name] in backend/dispatcher_group.cpp).
  m.def("all_reduce_(Tensor(a!) tensor, str reduce_op=\"sum\", str group_name=\"\") -> Tensor(a!)");
  m.def("all_reduce(Tensor tensor, str reduce_op=\"sum\", str group_name=\"\") -> Tensor");
  // NOTE [The one-argument op]
  m.def("all_reduce_sum_(Tensor(a!) tensor) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(cuda_p2p, CPU, m) {
  m.impl("all_reduce_", &cuda_p2p::all_reduce_);
  m.impl("all_reduce_sum_", &cuda_p2p::all_reduce_sum_);
  m.impl("all_reduce", &cuda_p2p::all_reduce);
}

#ifdef CUDA_P2P_WITH_CUDA
TORCH_LIBRARY_IMPL(cuda_p2p, CUDA, m) {
  m.impl("all_reduce_", &cuda_p2p::all_reduce_);
  m.impl("all_reduce_sum_", &cuda_p2p::all_reduce_sum_);
  m.impl("all_reduce", &cuda_p2p::all_reduce);
}
#endif

TORCH_LIBRARY_IMPL(cuda_p2p, Meta, m) {
  m.impl("all_reduce_", &cuda_p2p::all_reduce__meta);
  m.impl("all_reduce_sum_", &cuda_p2p::all_reduce_sum__meta);
  m.impl("all_reduce", &cuda_p2p::all_reduce_meta);
}

TORCH_LIBRARY_IMPL(cuda_p2p, Functionalize, m) {
  m.impl("all_reduce_", &cuda_p2p::all_reduce__functionalize);
  m.impl("all_reduce_sum_", &cuda_p2p::all_reduce_sum__functionalize);
}
