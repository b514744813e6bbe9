// Broadcast on the workspace: in each round the root stages a round of its tensor and ends the
// phase, which publishes the round to every other rank at once (NOTE [Collective phases]: the
// root's done word); they pull it from the root's region. Nobody waits for anyone but the root,
// and with alternating halves the root stages round i+1 while the others still read round i, so
// large tensors stream through the buffer.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

Outcome broadcast(const CollectiveContext& ctx, const at::Tensor& tensor, int root) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p broadcast: root must be in [0, ", W, "), got ",
              root);
  TORCH_CHECK(tensor.is_contiguous(), "cuda_p2p broadcast: expected a contiguous tensor");
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  Outcome outcome{.algorithm = "direct"};
  if (W == 1) return outcome;
  const detail::CaptureBracket bracket(ctx);
  const bool read = uses_cross_memory_reads(ctx.config, bytes, detail::cross_memory_reads(ctx));
  // NOTE [Zero-copy collectives], step 1': in the signature, when the group agrees that way (a
  // cross-memory broadcast reads the root's tensor wherever it is, so it never claims).
  std::string claim;
  if (read) {
    ctx.state.zero_copy_claim.reset();
  } else {
    claim = detail::claim_broadcast(ctx, detail::bytes_of(tensor), bytes);
  }
  // Nobody but the root publishes anything, so the signature needs a handshake of its own
  // before the root's first done word can release a reader (NOTE [Op signatures]).
  detail::expect_signature(
      ctx, OpSignature::of(OpId::kBroadcast, std::to_string(tensor.numel()) + " x " +
                                                 dtype_name(tensor.scalar_type()) + " from root " +
                                                 std::to_string(root) +
                                                 (read ? " (cross-memory" : " (staged") +
                                                 detail::config_suffix(ctx) + claim + ")"));
  detail::handshake(ctx);
  if (bytes == 0) return outcome;
  char* data = detail::bytes_of(tensor);
  if (read) {
    // The others read the root's tensor itself (NOTE [Cross-memory reads]); only the root waits
    // for its readers.
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me == root) {
      detail::publish_addresses(ctx, ph, {static_cast<const void*>(data)});
      c10::SmallVector<int, 8> readers;
      for (int q = 0; q < W; ++q) {
        if (q != root) readers.push_back(q);
      }
      detail::end_phase(ctx, ph);  // publishes the address
      detail::wait_readers(ctx, ph, readers);
    } else {
      detail::wait_phase_ended(ctx, ph, {root}, "broadcast: waiting for the root");
      detail::read_input_cross_memory(ctx, data, ph, root, 0, 0, bytes);
      detail::end_phase(ctx, ph);
    }
    outcome.cross_memory = true;
    return outcome;
  }
  // A root tensor in its symmetric heap: read where it lies (NOTE [Zero-copy collectives]).
  if (detail::broadcast_zero_copy(ctx, data, bytes, root)) {
    outcome.zero_copy = true;
    return outcome;
  }
  const int64_t piece = detail::round_bytes(ctx, 1);
  for (int64_t off = 0; off < bytes; off += piece) {
    const int64_t len = std::min(piece, bytes - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me == root) {
      detail::copy(ctx, ph.region[me], data + off, len);
      detail::end_phase(ctx, ph);  // publishes the round to every rank at once
    } else {
      detail::wait_phase_ended(ctx, ph, {root}, "broadcast: waiting for the root");
      detail::copy(ctx, data + off, ph.region[root], len);
      detail::end_phase(ctx, ph);
    }
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
