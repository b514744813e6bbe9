// All-gather on the workspace: direct and ring. Every algorithm moves bytes only (any dtype), in
// rounds of at most a phase's region (NOTE [Collective phases]).
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

namespace {

using detail::copy;
using detail::mod;

struct Gather {
  const char* input;
  int64_t bytes;                   // of every rank's shard
  c10::SmallVector<char*, 8> out;  // by rank
};

// Where a rank keeps shard j of a ring phase: slot j of its region.
inline char* slot(const detail::Phase& ph, int rank, int64_t j, int64_t piece) {
  return ph.region[rank] + j * piece;
}

// NOTE [All-gather rings]
// In a ring phase every rank stages its own piece in slot `rank` of its region and signals the
// next rank (step 0); then at step s = 1..W-1 it waits for its left neighbour's signal, pulls the
// slot that neighbour filled at step s-1 (its own piece at s = 1) into the same slot of its own
// region, signals its right neighbour (unless nobody pulls from it any more), and copies the slot
// to the output. Signals per ordered pair match exactly: the rank after me waits at steps 1.. for
// what I signal at steps 0... Each step depends only on earlier steps of its left neighbour, so
// there is no cycle. (No bidirectional ring: docs/measurements/pruned-algorithms.md says why.)
void ring(const CollectiveContext& ctx, const Gather& g) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int left = mod(me - 1, W), right = mod(me + 1, W);
  const int64_t piece = detail::round_bytes(ctx, 1, W);
  detail::handshake(ctx);  // a ring starts with signals, not a phase barrier
  copy(ctx, g.out[me], g.input, g.bytes);
  for (int64_t off = 0; off < g.bytes; off += piece) {
    const int64_t len = std::min(piece, g.bytes - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    copy(ctx, slot(ph, me, me, piece), g.input + off, len);
    detail::signal(ctx, right);  // step 0: the staged piece is what `right` pulls at step 1
    for (int s = 1; s < W; ++s) {
      const int64_t j = mod(me - s, W);
      detail::wait(ctx, left);
      copy(ctx, slot(ph, me, j, piece), slot(ph, left, j, piece), len);
      if (s < W - 1) detail::signal(ctx, right);
      copy(ctx, g.out[j] + off, slot(ph, me, j, piece), len);
    }
    detail::end_phase(ctx, ph);
  }
}

// The direct all-gather reading every peer's input straight into the output, in one phase
// (NOTE [Cross-memory reads]). Reading first and ending the phase before copying the own shard lets
// the peers' wait for their readers overlap with that copy.
void direct_read(const CollectiveContext& ctx, const Gather& g) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const detail::Phase ph = detail::begin_phase(ctx);
  detail::publish_addresses(ctx, ph, {static_cast<const void*>(g.input)});
  detail::phase_barrier(ctx);
  c10::SmallVector<int, 8> peers;
  for (int s = 1; s < W; ++s) {
    const int q = (me + s) % W;
    detail::read_input_cross_memory(ctx, g.out[q], ph, q, 0, 0, g.bytes);
    peers.push_back(q);
  }
  detail::end_phase(ctx, ph);
  copy(ctx, g.out[me], g.input, g.bytes);
  detail::wait_readers(ctx, ph, peers);
}

}  // namespace

Outcome all_gather(const CollectiveContext& ctx, const at::Tensor& input,
                   const std::vector<at::Tensor>& outputs, AllGatherAlgo algo) {
  const int W = ctx.ws.world_size();
  TORCH_CHECK(static_cast<int>(outputs.size()) == W, "cuda_p2p all_gather: expected ", W,
              " outputs (one per rank), got ", outputs.size());
  Gather g{detail::bytes_of(input), static_cast<int64_t>(input.nbytes()), {}};
  for (const auto& o : outputs) {
    TORCH_CHECK(static_cast<int64_t>(o.nbytes()) == g.bytes && o.is_contiguous(),
                "cuda_p2p all_gather: every output must be contiguous with the input's ", g.bytes,
                " bytes, got ", o.nbytes(), " bytes");
    g.out.push_back(detail::bytes_of(o));
  }
  const detail::CaptureBracket bracket(ctx);
  if (algo == AllGatherAlgo::kAuto) {
    algo = select_all_gather(ctx.config, g.bytes * W, W, detail::cross_memory_reads(ctx));
  }
  Outcome outcome{.algorithm = to_string(algo)};
  if (W == 1) {
    copy(ctx, g.out[0], g.input, g.bytes);
    return outcome;
  }
  const bool read =
      algo == AllGatherAlgo::kDirect &&
      uses_cross_memory_reads(ctx.config, g.bytes * W, detail::cross_memory_reads(ctx));
  // NOTE [Zero-copy collectives], step 1': in the signature, when the group agrees that way.
  const std::string claim = detail::claim_all_gather(ctx, g.input, g.bytes, g.out);
  // Compared at the first phase barrier of the direct algorithms, at a handshake of their own
  // before the rings (NOTE [Op signatures]).
  OpSignature sig = OpSignature::of(
      OpId::kAllGather, std::to_string(input.numel()) + " x " + dtype_name(input.scalar_type()) +
                            " (" + to_string(algo) + (read ? ", cross-memory" : "") +
                            detail::config_suffix(ctx) + claim + ")");
  // NOTE [Captured collectives in one kernel]
  if (detail::all_gather_kernel(ctx, g.input, g.bytes, g.out, sig)) {
    return {.algorithm = to_string(AllGatherAlgo::kDirect)};
  }
  detail::expect_signature(ctx, std::move(sig));
  if (g.bytes == 0) {
    detail::handshake(ctx);
    return outcome;
  }
  // Inputs in the peers' symmetric heaps: no staging (NOTE [Zero-copy collectives]).
  const c10::SmallVector<int64_t, 8> equal(W, g.bytes);
  if (detail::all_gather_zero_copy(ctx, g.input, equal, g.out)) {
    return {.algorithm = to_string(AllGatherAlgo::kDirect), .zero_copy = true};
  }
  switch (algo) {
    case AllGatherAlgo::kDirect: {
      if (read) {
        direct_read(ctx, g);
        outcome.cross_memory = true;
        break;
      }
      detail::gather_direct(ctx, g.input, equal, g.out);
      break;
    }
    case AllGatherAlgo::kRing:
      ring(ctx, g);
      break;
    case AllGatherAlgo::kAuto:
      break;
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
