// Reduce-scatter on the workspace: direct (each rank reduces its chunk from every peer's staged
// input) and a ring in S steps (S a multiple of the world size W).
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p::ops {

namespace {

using detail::bytes_of;
using detail::mod;
using detail::view;

struct Scatter {
  c10::SmallVector<char*, 8> in;  // by chunk: this rank's contribution to rank c's result
  char* out;
  int64_t numel;  // of every chunk and of the output
  at::ScalarType dtype;
  int64_t esize;
};

// Each rank stages the chunks its peers need (not its own), passes the phase barrier, and
// reduces its chunk from every rank in rank order.
void direct(const CollectiveContext& ctx, const Scatter& a, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t m = detail::round_bytes(ctx, a.esize, W) / a.esize;  // elements per chunk
  for (int64_t off = 0; off < a.numel; off += m) {
    const int64_t len = std::min(m, a.numel - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    for (int c = 0; c < W; ++c) {
      if (c != me)
        detail::copy(ctx, ph.region[me] + c * m * a.esize, a.in[c] + off * a.esize, len * a.esize);
    }
    detail::phase_barrier(ctx);
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      char* p = q == me ? a.in[me] + off * a.esize : ph.region[q] + me * m * a.esize;
      srcs.push_back(view(ctx, p, len, a.dtype));
    }
    detail::reduce_on_stream(ctx, view(ctx, a.out + off * a.esize, len, a.dtype), std::move(srcs),
                             op, W);
    detail::end_phase(ctx, ph);
  }
}

// Bytes of a peer's piece a cross-memory reduce-scatter reads before reducing: the W-1 pieces and
// the output stay in the core's L2 between the read and the reduction.
constexpr int64_t kReadPieceBytes = 64 << 10;

// The direct reduce-scatter reading, piece by piece, each peer's contribution to this rank's
// chunk straight from the peer's input into a local piece, then reducing the pieces with the own
// input in rank order, as direct() does (NOTE [Cross-memory reads]). One phase whatever the size.
void direct_read(const CollectiveContext& ctx, const Scatter& a, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t m = std::max<int64_t>(kReadPieceBytes / a.esize, 1);  // elements per piece
  const int64_t slot = detail::align_up(m * a.esize, detail::kAlign);
  at::Tensor& scratch = ctx.state.read_scratch;
  if (!scratch.defined() || scratch.nbytes() < static_cast<size_t>(slot * (W - 1))) {
    scratch = at::empty({slot * (W - 1)}, at::TensorOptions().dtype(at::kByte));
  }
  char* pieces = bytes_of(scratch);
  const detail::Phase ph = detail::begin_phase(ctx);
  std::vector<const void*> mine(a.in.begin(), a.in.end());
  detail::publish_addresses(ctx, ph, mine);
  detail::phase_barrier(ctx);
  for (int64_t off = 0; off < a.numel; off += m) {
    const int64_t len = std::min(m, a.numel - off);
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      if (q == me) {
        srcs.push_back(view(ctx, a.in[me] + off * a.esize, len, a.dtype));
        continue;
      }
      char* piece = pieces + mod(q - me - 1, W) * slot;
      detail::read_input_cross_memory(ctx, piece, ph, q, me, off * a.esize, len * a.esize);
      srcs.push_back(view(ctx, piece, len, a.dtype));
    }
    detail::reduce_on_stream(ctx, view(ctx, a.out + off * a.esize, len, a.dtype), std::move(srcs),
                             op, W);
  }
  detail::end_phase(ctx, ph);
  c10::SmallVector<int, 8> peers;
  for (int q = 0; q < W; ++q) {
    if (q != me) peers.push_back(q);
  }
  detail::wait_readers(ctx, ph, peers);
}

// NOTE [Reduce-scatter ring]
// Chunk c (rank c's result) is accumulated along the ring starting at rank c+1 and ends at rank
// c. Each chunk is cut into k = S / W slices; per slice, step t = 1 .. W-1 of rank r reduces
// chunk c = r-t-1: it adds its own input to the partial rank r-1 made at step t-1 and keeps the
// new partial in its region (slot c), or, at the last step (c = r), writes the output. Partials
// stay in the accumulate type (float32 for float16 / bfloat16), so the ring rounds once, at the
// end. Step 0 (the partial of chunk r-1, i.e. the input itself, for every slice) is staged first
// and signalled to the right neighbour; step t waits for the left neighbour's signal of its step
// t-1 (step 1 of the first slice for the staged partials; later slices find theirs staged
// already). A rank sends 1 + slices * (W-2) signals right and its right neighbour waits as many
// times, in the same order, so the sequence numbers match.
void ring(const CollectiveContext& ctx, const Scatter& a, ReduceOp op, int steps) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int left = mod(me - 1, W), right = mod(me + 1, W);
  const int64_t slices = steps / W;
  const at::ScalarType acc = accumulate_type(a.dtype);
  const int64_t asize = static_cast<int64_t>(c10::elementSize(acc));
  const int64_t m = detail::round_bytes(ctx, asize, W) / asize;  // elements per chunk
  const ReduceOp partial_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  detail::handshake(ctx);  // the ring starts with a signal, not a phase barrier
  for (int64_t off = 0; off < a.numel; off += m) {
    const int64_t len = std::min(m, a.numel - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    auto slot = [&](int rank, int64_t c, int64_t elem) {
      return ph.region[rank] + (c * m + elem) * asize;
    };
    const int c0 = mod(me - 1, W);
    if (acc == a.dtype) {
      detail::copy(ctx, slot(me, c0, 0), a.in[c0] + off * a.esize, len * a.esize);
    } else {
      detail::reduce_on_stream(ctx, view(ctx, slot(me, c0, 0), len, acc),
                               {view(ctx, a.in[c0] + off * a.esize, len, a.dtype)}, partial_op, 0);
    }
    detail::signal(ctx, right);
    for (int64_t j = 0; j < slices; ++j) {
      const auto [sb, se] = split_range(len, slices, j);
      const int64_t n = se - sb;
      for (int t = 1; t < W; ++t) {
        const int c = mod(me - t - 1, W);
        if (t >= 2 || j == 0) detail::wait(ctx, left);
        std::vector<at::Tensor> srcs{view(ctx, slot(left, c, sb), n, acc),
                                     view(ctx, a.in[c] + (off + sb) * a.esize, n, a.dtype)};
        if (t < W - 1) {
          detail::reduce_on_stream(ctx, view(ctx, slot(me, c, sb), n, acc), std::move(srcs),
                                   partial_op, 0);
          detail::signal(ctx, right);
        } else {
          detail::reduce_on_stream(ctx, view(ctx, a.out + (off + sb) * a.esize, n, a.dtype),
                                   std::move(srcs), op, W);
        }
      }
    }
    detail::end_phase(ctx, ph);
  }
}

}  // namespace

Outcome reduce_scatter(const CollectiveContext& ctx, const std::vector<at::Tensor>& inputs,
                       const at::Tensor& output, ReduceOp op, ReduceScatterAlgo algo) {
  const int W = ctx.ws.world_size();
  TORCH_CHECK(static_cast<int>(inputs.size()) == W, "cuda_p2p reduce_scatter: expected ", W,
              " input chunks (one per rank), got ", inputs.size());
  TORCH_CHECK(output.is_contiguous(), "cuda_p2p reduce_scatter: expected a contiguous output");
  Scatter a{{},
            bytes_of(output),
            output.numel(),
            output.scalar_type(),
            static_cast<int64_t>(output.element_size())};
  for (const auto& t : inputs) {
    TORCH_CHECK(t.numel() == a.numel && t.scalar_type() == a.dtype && t.is_contiguous(),
                "cuda_p2p reduce_scatter: every input chunk must be contiguous with the output's ",
                a.numel, " elements of ", a.dtype, ", got ", t.numel(), " of ", t.scalar_type());
    a.in.push_back(bytes_of(t));
  }
  const detail::CaptureBracket bracket(ctx);
  if (algo == ReduceScatterAlgo::kAuto) {
    algo = select_reduce_scatter(ctx.config, a.numel * a.esize * W, W,
                                 detail::cross_memory_reads(ctx));
  }
  Outcome outcome{.algorithm = to_string(algo)};
  const int steps = ctx.config.ring_steps > 0 ? ctx.config.ring_steps : W;
  const bool ring_algo = algo == ReduceScatterAlgo::kRing;
  TORCH_CHECK(!ring_algo || steps % W == 0,
              "cuda_p2p reduce_scatter: ring_steps must be a multiple of the "
              "world size ",
              W, ", got ", steps);
  const bool read = !ring_algo && uses_cross_memory_reads(ctx.config, a.numel * a.esize * W,
                                                          detail::cross_memory_reads(ctx));
  // NOTE [Zero-copy collectives], step 1': in the signature, when the group agrees that way.
  const std::string claim = detail::claim_reduce_scatter(ctx, a.in, a.numel * a.esize);
  // Compared at the first phase barrier of the direct algorithms, at a handshake of its own
  // before the ring (NOTE [Op signatures]).
  OpSignature sig = OpSignature::of(
      OpId::kReduceScatter,
      std::to_string(a.numel) + " x " + dtype_name(a.dtype) + " " + lower_name(op) + " (" +
          to_string(algo) + (ring_algo ? ", " + std::to_string(steps) + " steps" : "") +
          (read ? ", cross-memory" : "") + detail::config_suffix(ctx) + claim + ")");
  // NOTE [Captured collectives in one kernel]: one kernel reduces directly, whatever the algorithm.
  if (W > 1 && detail::reduce_scatter_kernel(ctx, a.in, a.out, a.numel, a.dtype, op, sig)) {
    outcome.algorithm = to_string(ReduceScatterAlgo::kDirect);
    return outcome;
  }
  detail::expect_signature(ctx, std::move(sig));
  if (a.numel == 0) {
    detail::handshake(ctx);
    return outcome;
  }
  if (W == 1) {
    detail::reduce_on_stream(ctx, output, {inputs[0]}, op, 1);
    return outcome;
  }
  // Inputs in the peers' symmetric heaps: no staging (NOTE [Zero-copy collectives]).
  if (detail::reduce_scatter_zero_copy(ctx, a.in, a.out, a.numel, a.dtype, op)) {
    return {.algorithm = to_string(ReduceScatterAlgo::kDirect), .zero_copy = true};
  }
  if (ring_algo) {
    ring(ctx, a, op, steps);
  } else if (read) {
    direct_read(ctx, a, op);
    outcome.cross_memory = true;
  } else {
    direct(ctx, a, op);
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
