// Scatter on the workspace: in each round the root stages a round of every peer's input in a slot
// of its region per peer and ends the phase, which publishes the round to every rank at once
// (NOTE [Collective phases]: the root's done word); each rank pulls its slot. Broadcast's
// protocol with a slice per rank.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

Outcome scatter(const CollectiveContext& ctx, const std::vector<at::Tensor>& inputs,
                const at::Tensor& output, int root) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t bytes =
      detail::check_rooted(ctx, "scatter", root, output, "output", inputs, "input");
  detail::staged_only(ctx);
  const Outcome outcome{.algorithm = "direct"};
  char* out = detail::bytes_of(output);
  if (me == root) detail::copy(ctx, out, detail::bytes_of(inputs[me]), bytes);
  if (W == 1) return outcome;
  const detail::CaptureBracket bracket(ctx);
  // Nobody but the root publishes anything: a handshake of its own (NOTE [Op signatures]).
  detail::expect_signature(
      ctx, OpSignature::of(OpId::kScatter, std::to_string(output.numel()) + " x " +
                                               dtype_name(output.scalar_type()) + " from root " +
                                               std::to_string(root) + detail::config_suffix(ctx)));
  detail::handshake(ctx);
  // Slot q of the root's region holds rank q's round (the root's own slot stays unused).
  const int64_t piece = detail::round_bytes(ctx, 1, W);
  for (int64_t off = 0; off < bytes; off += piece) {
    const int64_t len = std::min(piece, bytes - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me == root) {
      for (int s = 1; s < W; ++s) {
        const int q = (root + s) % W;
        detail::copy(ctx, ph.region[me] + q * piece, detail::bytes_of(inputs[q]) + off, len);
      }
      detail::end_phase(ctx, ph);  // publishes the round to every rank at once
    } else {
      detail::wait_phase_ended(ctx, ph, {root}, "scatter: waiting for the root");
      detail::copy(ctx, out + off, ph.region[root] + me * piece, len);
      detail::end_phase(ctx, ph);
    }
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
