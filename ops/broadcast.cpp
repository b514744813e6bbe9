// Broadcast on the workspace: in each round the root stages a round of its tensor, every rank
// passes the phase barrier, and the other ranks pull the round from the root's region. With
// alternating halves (NOTE [Collective phases]) the root stages round i+1 while the others still
// read round i, so large tensors stream through the buffer.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

void broadcast(const CollectiveContext& ctx, const at::Tensor& tensor, int root) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p broadcast: root must be in [0, ", W, "), got ",
              root);
  TORCH_CHECK(tensor.is_contiguous(), "cuda_p2p broadcast: expected a contiguous tensor");
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (W == 1 || bytes == 0) return;
  char* data = detail::bytes_of(tensor);
  const int64_t piece = detail::round_bytes(ctx, 1);
  for (int64_t off = 0; off < bytes; off += piece) {
    const int64_t len = std::min(piece, bytes - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me == root) detail::copy(ctx, ph.region[me], data + off, len);
    detail::phase_barrier(ctx);
    if (me != root) detail::copy(ctx, data + off, ph.region[root], len);
  }
}

}  // namespace cuda_p2p::ops
