// WorkspaceCollectives' rooted collectives gather, scatter and reduce (ops/gather.cpp,
// ops/scatter.cpp, ops/reduce.cpp; docs/collectives.md, "Gather and scatter", "Reduce").
#include <c10/util/Exception.h>

#include <utility>

#include "backend/tensor_args.hpp"
#include "backend/workspace_collectives.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

namespace {

// TORCH_CHECKs a root in [0, W).
void check_root(const char* what, int64_t root, int W) {
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p ", what, ": root must be a rank in [0, ", W,
              "), got ", root);
}

}  // namespace

// Capture would need the root's waits for several ranks replayed: not tested, so refused before
// the handshake (the group stays usable).
ops::Outcome WorkspaceCollectives::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                          int64_t root) {
  check_or_reject("gather", ops::OpId::kGather, [&] { check_root("gather", root, size_); });
  refuse_capture("gather", "");
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
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

ops::Outcome WorkspaceCollectives::scatter(at::Tensor& output,
                                           const std::vector<at::Tensor>& inputs, int64_t root) {
  check_or_reject("scatter", ops::OpId::kScatter, [&] { check_root("scatter", root, size_); });
  refuse_capture("scatter", "");
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(t.is_contiguous() ? t : t.contiguous());
  at::Tensor out = detail::contiguous_output(output);
  return run("scatter", [&](const ops::CollectiveContext& ctx) {
    keep(joined(ins, inputs));
    keep({out});
    const ops::Outcome o = ops::scatter(ctx, ins, out, static_cast<int>(root));
    copy_back(output, out);
    return o;
  });
}

// torch.distributed.reduce: only the root's tensor receives the result; the others' are left
// as they were (NOTE [Reduce at the root] in ops/reduce.cpp).
ops::Outcome WorkspaceCollectives::reduce(at::Tensor& t, int64_t root, ops::ReduceOp op) {
  check_or_reject("reduce", ops::OpId::kReduce, [&] {
    check_root("reduce", root, size_);
    ops::check_reduce_op(op, t.scalar_type(), "reduce");
  });
  refuse_capture("reduce", "");
  // Only the root's copy goes back into a non-contiguous tensor: the others' stay as they were.
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  return run("reduce", [&](const ops::CollectiveContext& ctx) {
    keep({work, t});
    const ops::Outcome o = ops::reduce(ctx, work, static_cast<int>(root), op);
    if (root == rank_) copy_back(t, work);
    return o;
  });
}

}  // namespace cuda_p2p
