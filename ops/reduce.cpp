// Reduce on the workspace: gather's protocol (ops/gather.cpp) with a reduction at the root. In
// each round every rank but the root stages a round of its tensor and ends the phase, which
// publishes it to the root (NOTE [Collective phases]: the done words); the root waits for every
// peer's done word and reduces the round from every rank, in rank order, into its own tensor.
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

// NOTE [Reduce at the root]
// * Bits: the root reduces round by round with the kernel every reducing collective uses
//   (detail::reduce_on_stream), its sources in rank order, its own being its tensor itself and
//   the others the peers' staged rounds: the same values in the same order as the one-shot
//   all-reduce (ops/all_reduce.cpp), hence the same bits; AVG divides the sum by W once.
// * In place: the root's tensor is both its source and the destination. reduce() allows that (each
//   element is read before it is written), and the rounds are disjoint slices, so no round reads
//   what an earlier one wrote.
// * Buffer reuse: a non-root rank ends the phase as soon as it has staged (that is the
//   publication), so nothing but the reuse guard holds it back: it stages round i+2 into the
//   half of round i only once the root's done word says the root has ended phase i, and the root
//   ends a phase only after its reduction, in stream order (on CUDA the done-word stores follow
//   the reduction kernel on the same stream). So the senders run at most one round ahead of the
//   root, and the root never reads a region that is being rewritten.
// * The others' tensors are left as they were: only the root writes anything outside the
//   workspace (torch leaves them unspecified; Gloo's may hold partial results).
// * Ordering with the group's other workspace ops (FSDP's streams, a fused op) is NOTE [One order
//   per group] in p2p_workspace/symmetric_workspace.cpp, as for every collective.
Outcome reduce(const CollectiveContext& ctx, const at::Tensor& tensor, int root, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p reduce: root must be in [0, ", W, "), got ", root);
  TORCH_CHECK(tensor.is_contiguous(), "cuda_p2p reduce: expected a contiguous tensor");
  const at::ScalarType dtype = tensor.scalar_type();
  const int64_t numel = tensor.numel();
  const int64_t esize = static_cast<int64_t>(tensor.element_size());
  detail::staged_only(ctx);
  const Outcome outcome{.algorithm = "direct"};
  if (W == 1) return outcome;  // the reduction of one tensor is itself (AVG: divided by 1)
  const detail::CaptureBracket bracket(ctx);
  // The root reads what the others publish with their done words, so the signature needs a
  // handshake of its own before it reads anything (NOTE [Op signatures]).
  detail::expect_signature(
      ctx, OpSignature::of(OpId::kReduce, std::to_string(numel) + " x " + dtype_name(dtype) + " " +
                                              lower_name(op) + " to root " + std::to_string(root) +
                                              detail::config_suffix(ctx)));
  detail::handshake(ctx);
  char* data = detail::bytes_of(tensor);
  const int64_t m = detail::round_bytes(ctx, esize) / esize;  // elements per round
  c10::SmallVector<int, 8> peers;
  for (int s = 1; s < W; ++s) peers.push_back((root + s) % W);
  for (int64_t off = 0; off < numel; off += m) {
    const int64_t len = std::min(m, numel - off);
    char* mine = data + off * esize;
    const detail::Phase ph = detail::begin_phase(ctx);
    if (me != root) {
      detail::copy(ctx, ph.region[me], mine, len * esize);
      detail::end_phase(ctx, ph);  // publishes the round to the root
      continue;
    }
    detail::wait_phase_ended(ctx, ph, peers, "reduce: the root waiting for its senders");
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      srcs.push_back(detail::view(ctx, q == root ? mine : ph.region[q], len, dtype));
    }
    // NOTE [Reduce at the root]: in place, in rank order.
    detail::reduce_on_stream(ctx, detail::view(ctx, mine, len, dtype), std::move(srcs), op, W);
    detail::end_phase(ctx, ph);
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
