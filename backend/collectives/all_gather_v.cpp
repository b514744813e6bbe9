// all_gather_v, cuda_p2p's own: rows of a size per rank (its checks run on either route).
#include <numeric>

#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::OpId;

at::Tensor ProcessGroupCudaP2P::all_gather_v(const at::Tensor& input,
                                             const std::vector<int64_t>& sizes) {
  const int W = getSize(), me = getRank();
  auto checks = [&] {
    TORCH_CHECK(input.defined() && input.dim() >= 1,
                "cuda_p2p all_gather_v: expected a tensor with at least one dimension (rows), got ",
                input.defined() ? std::to_string(input.dim()) + " dimensions" : "None");
    TORCH_CHECK(static_cast<int>(sizes.size()) == W, "cuda_p2p all_gather_v: expected ", W,
                " sizes (rows of every rank), got ", sizes.size());
    for (int q = 0; q < W; ++q) {
      TORCH_CHECK(sizes[q] >= 0, "cuda_p2p all_gather_v: sizes must be >= 0, got ", sizes[q],
                  " for rank ", q);
    }
    TORCH_CHECK(input.size(0) == sizes[me], "cuda_p2p all_gather_v: rank ", me, " has ",
                input.size(0), " rows, but sizes[", me, "] is ", sizes[me]);
  };
  // No route handshake: the flat path's checks agree instead (across hosts) or raise locally.
  const char* why = collectives_.rejects(input);
  if (!why) {
    collectives_.check_or_reject("all_gather_v", OpId::kAllGatherV, checks);
    auto r = collectives_.all_gather_v(input, sizes);
    counters_.record(OpId::kAllGatherV, r.outcome);
    settle_cpu_outputs("all_gather_v");
    return r.output;
  }
  if (hierarchy_) {
    // NOTE [Hierarchical agreement]: the flat path's Gloo all-gather takes the largest size.
    hierarchy_->agree_flat(
        OpId::kAllGatherV, {input}, checks,
        [&] {
          const int64_t row_bytes =
              c10::multiply_integers(input.sizes().slice(1)) * input.element_size();
          std::string text = ops::dtype_name(input.scalar_type()) + ", bytes [";
          for (int q = 0; q < W; ++q)
            text += (q ? ", " : "") + std::to_string(sizes[q] * row_bytes);
          return text + "]";
        },
        options_->timeout);
  } else {
    checks();
  }
  at::Tensor output = wrapped_.all_gather_v(input, sizes, me);
  counters_.fallback(OpId::kAllGatherV, why);
  return output;
}

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

WorkspaceCollectives::Rows WorkspaceCollectives::all_gather_v(const at::Tensor& input,
                                                              const std::vector<int64_t>& sizes) {
  std::vector<int64_t> out_sizes = input.sizes().vec();
  out_sizes[0] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  Rows r;
  r.output = at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t row_elems = detail::row_elements(input);
  const at::Tensor in = detail::contiguous_input(input);
  std::vector<int64_t> bytes;
  std::vector<at::Tensor> outs;
  int64_t row = 0;
  for (int q = 0; q < size_; ++q) {
    bytes.push_back(sizes[q] * row_elems * static_cast<int64_t>(input.element_size()));
    outs.push_back(r.output.narrow(0, row, sizes[q]));
    row += sizes[q];
  }
  r.outcome = run("all_gather_v", [&](const ops::CollectiveContext& ctx) {
    keep({in, input, r.output});
    const ops::Outcome o = ops::all_gather_v(ctx, in, bytes, outs);
    return o;
  });
  return r;
}

}  // namespace cuda_p2p
