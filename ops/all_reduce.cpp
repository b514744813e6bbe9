// All-reduce on the workspace: one-shot (every rank reduces the whole tensor from every rank's
// staged copy; one barrier, the lowest latency) and two-shot (a direct reduce-scatter, then an
// all-gather of the reduced chunks; each rank reads about 2x the tensor instead of W x).
#include <c10/util/Exception.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p::ops {

namespace {

using detail::view;

struct Args {
  char* in;
  char* out;
  int64_t numel;
  at::ScalarType dtype;
  int64_t esize;
};

void one_shot(const CollectiveContext& ctx, const Args& a, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t m = detail::round_bytes(ctx, a.esize) / a.esize;
  for (int64_t off = 0; off < a.numel; off += m) {
    const int64_t len = std::min(m, a.numel - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    detail::copy(ctx, ph.region[me], a.in + off * a.esize, len * a.esize);
    detail::phase_barrier(ctx);
    // Every source is a staged copy, in rank order: every rank computes the same bits, and the
    // output may be the input.
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) srcs.push_back(view(ctx, ph.region[q], len, a.dtype));
    detail::reduce_on_stream(ctx, view(ctx, a.out + off * a.esize, len, a.dtype), std::move(srcs),
                             op, W);
    detail::end_phase(ctx, ph);
  }
}

// NOTE [Two-shot all-reduce]
// A round of `len` elements is split into W chunks (split_range). Each rank stages the chunks
// of its peers at their natural offsets in its region (not its own: it reduces that one from its
// input), passes the phase barrier, reduces its chunk from every rank in rank order - the same
// bits one-shot computes - into the output and, in the same pass, behind the staged round in its
// region. A second barrier publishes the reduced chunks, which every rank then pulls. Both
// barriers belong to one phase, whose reuse guard (NOTE [Collective phases]) covered the bytes
// of the reduced chunks too.
void two_shot(const CollectiveContext& ctx, const Args& a, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t region = detail::phase_bytes(ctx);
  // The staged round and its largest chunk, each cache-line aligned, fit in the region.
  int64_t m = (region - 2 * detail::kAlign) / a.esize * W / (W + 1);
  if (ctx.config.chunk_bytes > 0)
    m = std::min(m, std::max<int64_t>(ctx.config.chunk_bytes / a.esize, W));
  auto fits = [&](int64_t e) {
    return detail::align_up(e * a.esize, detail::kAlign) +
               detail::align_up(detail::ceil_div(e, W) * a.esize, detail::kAlign) <=
           region;
  };
  while (m > 0 && !fits(m)) --m;
  TORCH_CHECK(m > 0, "cuda_p2p all_reduce: the workspace buffer (", ctx.ws.buffer_size(),
              " bytes) is too small for a two-shot round of ", a.dtype,
              "; grow it with ensure_min_buffer_size");
  for (int64_t off = 0; off < a.numel; off += m) {
    const int64_t len = std::min(m, a.numel - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    const int64_t reduced = detail::align_up(len * a.esize, detail::kAlign);
    const auto [b, e] = split_range(len, W, me);
    char* in = a.in + off * a.esize;
    char* out = a.out + off * a.esize;
    detail::copy(ctx, ph.region[me], in, b * a.esize);
    detail::copy(ctx, ph.region[me] + e * a.esize, in + e * a.esize, (len - e) * a.esize);
    detail::phase_barrier(ctx);
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      srcs.push_back(
          view(ctx, q == me ? in + b * a.esize : ph.region[q] + b * a.esize, e - b, a.dtype));
    }
    detail::reduce_on_stream(ctx, view(ctx, out + b * a.esize, e - b, a.dtype), std::move(srcs), op,
                             W, view(ctx, ph.region[me] + reduced, e - b, a.dtype));
    detail::phase_barrier(ctx);
    for (int s = 1; s < W; ++s) {
      const int q = (me + s) % W;
      const auto [bq, eq] = split_range(len, W, q);
      detail::copy(ctx, out + bq * a.esize, ph.region[q] + reduced, (eq - bq) * a.esize);
    }
    detail::end_phase(ctx, ph);
  }
}

}  // namespace

AllReduceAlgo all_reduce(const CollectiveContext& ctx, const at::Tensor& input,
                         const at::Tensor& output, ReduceOp op, AllReduceAlgo algo) {
  const int W = ctx.ws.world_size();
  TORCH_CHECK(input.is_contiguous() && output.is_contiguous() && input.numel() == output.numel() &&
                  input.scalar_type() == output.scalar_type(),
              "cuda_p2p all_reduce: expected a contiguous input and output of one size and "
              "dtype, got ",
              input.sizes(), " ", input.scalar_type(), " and ", output.sizes(), " ",
              output.scalar_type());
  Args a{detail::bytes_of(input), detail::bytes_of(output), input.numel(), input.scalar_type(),
         static_cast<int64_t>(input.element_size())};
  if (algo == AllReduceAlgo::kAuto) algo = select_all_reduce(ctx.config, a.numel * a.esize, W);
  // Compared at the first phase barrier of either algorithm (NOTE [Op signatures]).
  detail::expect_signature(
      ctx,
      OpSignature::of(OpKind::kAllReduce, std::to_string(a.numel) + " x " + dtype_name(a.dtype) +
                                              " " + lower_name(op) + " (" + to_string(algo) +
                                              detail::config_suffix(ctx) + ")"));
  if (a.numel == 0) {
    detail::handshake(ctx);
    return algo;
  }
  if (W == 1) {
    detail::reduce_on_stream(ctx, output, {input}, op, 1);
    return algo;
  }
  ctx.state.last_zero_copy = false;
  // An input in the peers' symmetric heaps is not staged (NOTE [Zero-copy collectives]).
  if (algo == AllReduceAlgo::kTwoShot &&
      detail::all_reduce_zero_copy(ctx, a.in, a.out, a.numel, a.dtype, op)) {
    return algo;
  }
  if (algo == AllReduceAlgo::kTwoShot) {
    two_shot(ctx, a, op);
  } else {
    one_shot(ctx, a, op);
  }
  return algo;
}

}  // namespace cuda_p2p::ops
