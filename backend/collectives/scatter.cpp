// scatter.
#include "backend/entry_sequence.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const int64_t root = opts.rootRank;
  const bool is_root = root == getRank();
  const char* why = detail::rooted_rejects(collectives_, outputs, inputs, is_root, getSize());
  const std::vector<at::Tensor> none;
  const std::vector<at::Tensor>& at_root = !why && is_root ? inputs[0] : none;
  return serve(
      call(OpId::kScatter), {outputs, outputs, why, opts.asyncOp},
      [&] { return " from root " + std::to_string(root); },
      [&] { return collectives_.scatter(outputs[0], at_root, root); },
      [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); }, [&] { return outputs; });
}

}  // namespace cuda_p2p
