// Gather on the workspace: in each round every rank but the root stages a round of its input and
// ends the phase, which publishes it to the root (NOTE [Collective phases]: the done words); the
// root waits for every peer's done word and pulls the rounds into its outputs. Nobody waits for
// anyone but the root waits for everyone: broadcast's protocol, the other way round.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

Outcome gather(const CollectiveContext& ctx, const at::Tensor& input,
               const std::vector<at::Tensor>& outputs, int root) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t bytes =
      detail::check_rooted(ctx, "gather", root, input, "input", outputs, "output");
  detail::staged_only(ctx);
  const Outcome outcome{.algorithm = "direct"};
  const char* in = detail::bytes_of(input);
  if (me == root) detail::copy(ctx, detail::bytes_of(outputs[me]), in, bytes);
  if (W == 1) return outcome;
  const detail::CaptureBracket bracket(ctx);
  // The root reads what the others publish with their done words, so the signature needs a
  // handshake of its own before it reads anything (NOTE [Op signatures]).
  detail::expect_signature(
      ctx, OpSignature::of(OpId::kGather, std::to_string(input.numel()) + " x " +
                                              dtype_name(input.scalar_type()) + " to root " +
                                              std::to_string(root) + detail::config_suffix(ctx)));
  detail::handshake(ctx);
  const int64_t piece = detail::round_bytes(ctx, 1);
  c10::SmallVector<int, 8> peers;
  for (int s = 1; s < W; ++s) peers.push_back((root + s) % W);
  for (int64_t off = 0; off < bytes; off += piece) {
    const int64_t len = std::min(piece, bytes - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me != root) {
      detail::copy(ctx, ph.region[me], in + off, len);
      detail::end_phase(ctx, ph);  // publishes the round to the root
    } else {
      detail::wait_phase_ended(ctx, ph, peers, "gather: the root waiting for its senders");
      for (int q : peers) detail::copy(ctx, detail::bytes_of(outputs[q]) + off, ph.region[q], len);
      detail::end_phase(ctx, ph);
    }
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
