// scatter.
#include "backend/entry_sequence.hpp"

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

}  // namespace cuda_p2p
