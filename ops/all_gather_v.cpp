// All-gather of a different number of bytes per rank (all_gather_v), and the direct all-gather
// it generalises: in each round every rank stages up to one round of its contribution, passes
// the phase barrier, and pulls every peer's round straight into the output.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

namespace detail {

void gather_direct(const CollectiveContext& ctx, const char* input, c10::ArrayRef<int64_t> bytes,
                   c10::ArrayRef<char*> out) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  if (W == 1) {
    copy(ctx, out[me], input, bytes[me]);
    return;
  }
  // Rounds follow the largest contribution, which every rank knows: every rank runs as many
  // phases (NOTE [Collective phases]), staging nothing once its own bytes are exhausted.
  const int64_t largest = *std::max_element(bytes.begin(), bytes.end());
  const int64_t piece = round_bytes(ctx, 1);
  auto part = [&](int q, int64_t off) { return std::clamp<int64_t>(bytes[q] - off, 0, piece); };
  for (int64_t off = 0; off < largest; off += piece) {
    const Phase ph = begin_phase(ctx);
    copy(ctx, ph.region[me], input + off, part(me, off));
    // The own round right after staging it, while it is in cache: one read from memory per
    // byte of the input instead of two (a whole-shard copy up front read it cold).
    copy(ctx, out[me] + off, input + off, part(me, off));
    phase_barrier(ctx);
    // Start with the next rank, so that the ranks do not all read rank 0 first.
    for (int s = 1; s < W; ++s) {
      const int q = (me + s) % W;
      copy(ctx, out[q] + off, ph.region[q], part(q, off));
    }
    end_phase(ctx, ph);
  }
}

}  // namespace detail

Outcome all_gather_v(const CollectiveContext& ctx, const at::Tensor& input,
                     const std::vector<int64_t>& bytes, const std::vector<at::Tensor>& outputs) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  Outcome outcome{.algorithm = "direct"};
  TORCH_CHECK(static_cast<int>(bytes.size()) == W && static_cast<int>(outputs.size()) == W,
              "cuda_p2p all_gather_v: expected ", W, " sizes and outputs (one per rank), got ",
              bytes.size(), " and ", outputs.size());
  TORCH_CHECK(static_cast<int64_t>(input.nbytes()) == bytes[me], "cuda_p2p all_gather_v: rank ", me,
              "'s input has ", input.nbytes(), " bytes, but its size says ", bytes[me]);
  c10::SmallVector<char*, 8> out;
  for (int q = 0; q < W; ++q) {
    TORCH_CHECK(bytes[q] >= 0, "cuda_p2p all_gather_v: sizes must be >= 0, got ", bytes[q],
                " for rank ", q);
    TORCH_CHECK(static_cast<int64_t>(outputs[q].nbytes()) == bytes[q] && outputs[q].is_contiguous(),
                "cuda_p2p all_gather_v: the output of rank ", q, " must be contiguous with ",
                bytes[q], " bytes, got ", outputs[q].nbytes());
    out.push_back(detail::bytes_of(outputs[q]));
  }
  const detail::CaptureBracket bracket(ctx);
  ctx.state.zero_copy_claim.reset();  // it never claims (NOTE [Zero-copy collectives])
  std::string sizes;
  for (int q = 0; q < W; ++q) sizes += (q ? ", " : "") + std::to_string(bytes[q]);
  // Compared at the first phase barrier (NOTE [Op signatures]).
  detail::expect_signature(
      ctx, OpSignature::of(OpId::kAllGatherV, dtype_name(input.scalar_type()) + ", bytes [" +
                                                  sizes + "]" + detail::config_suffix(ctx)));
  if (*std::max_element(bytes.begin(), bytes.end()) == 0) {
    detail::handshake(ctx);
    return outcome;
  }
  // Inputs in the peers' symmetric heaps: no staging (NOTE [Zero-copy collectives]).
  outcome.zero_copy = detail::all_gather_zero_copy(ctx, detail::bytes_of(input), bytes, out);
  if (!outcome.zero_copy) detail::gather_direct(ctx, detail::bytes_of(input), bytes, out);
  return outcome;
}

}  // namespace cuda_p2p::ops
