// scatter.
#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  auto r = detail::rooted(collectives_, outputs, inputs, opts.rootRank == getRank(), getSize());
  return serve(
      call(OpId::kScatter), {outputs, outputs, r.why, opts.asyncOp},
      [&] { return detail::root_text("from", opts.rootRank); },
      [&] { return collectives_.scatter(outputs[0], r.at_root, opts.rootRank); },
      [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); }, [&] { return outputs; });
}

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::scatter(at::Tensor& output,
                                           const std::vector<at::Tensor>& inputs, int64_t root) {
  check_or_reject("scatter", ops::OpId::kScatter,
                  [&] { detail::check_root("scatter", root, size_); });
  refuse_capture("scatter", "");
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(detail::contiguous_input(t));
  at::Tensor out = detail::contiguous_output(output);
  return run("scatter", [&](const ops::CollectiveContext& ctx) {
    keep(joined(ins, inputs));
    keep({out});
    const ops::Outcome o = ops::scatter(ctx, ins, out, static_cast<int>(root));
    copy_back(output, out);
    return o;
  });
}

}  // namespace cuda_p2p
