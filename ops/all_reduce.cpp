// All-reduce on the workspace: one-shot (every rank reduces the whole tensor from every rank's
// staged copy; one barrier, the lowest latency) and two-shot (a direct reduce-scatter, then an
// all-gather of the reduced chunks; each rank reads about 2x the tensor instead of W x).
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>

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

// Elements per two-shot round: the staged round and its largest chunk, each cache-line aligned,
// fit in the phase's region; at most `cap_bytes` (0: no cap) but at least W elements.
int64_t two_shot_round(const CollectiveContext& ctx, const Args& a, int64_t cap_bytes) {
  const int W = ctx.ws.world_size();
  const int64_t region = detail::phase_bytes(ctx);
  int64_t m = (region - 2 * detail::kAlign) / a.esize * W / (W + 1);
  if (cap_bytes > 0) m = std::min(m, std::max<int64_t>(cap_bytes / a.esize, W));
  auto fits = [&](int64_t e) {
    return detail::align_up(e * a.esize, detail::kAlign) +
               detail::align_up(detail::ceil_div(e, W) * a.esize, detail::kAlign) <=
           region;
  };
  while (m > 0 && !fits(m)) --m;
  TORCH_CHECK(m > 0, "cuda_p2p all_reduce: the workspace buffer (", ctx.ws.buffer_size(),
              " bytes) is too small for a two-shot round of ", a.dtype,
              "; grow it with ensure_min_buffer_size");
  return m;
}

// NOTE [Rounds chosen by rank 0]
// Rounds of chunk_bytes (1 MiB) keep what one rank wrote in its caches until the peer reads it,
// which is fastest while the ranks' cores share a last-level cache. On a virtual machine whose host
// moves the vCPUs for seconds at a time into a placement where they do not (NOTE [Core placement]
// in p2p_workspace/host/core_probe.cpp), and on any machine whose ranks sit in different core
// complexes, one large round is several times faster than chunked rounds there, and slower in the
// ordinary placement (docs/measurements/windows-cores-placement-2026-11-26.md). Neither size wins
// everywhere, and the guest cannot see the placement except by timing, so on a host workspace a
// two-shot of more than one chunked round, when the buffer holds rounds at least twice as large,
// runs in the rounds rank 0 chose from the times of its recent ops (RoundPolicy,
// ops/round_policy.cpp), one op ahead:
//  * every rank keeps, per size class, the rounds the next op of that class runs in (chunked
//    until rank 0 has chosen: RoundPolicy::agreed); the op runs all of its rounds in them;
//  * in the first round, before its first barrier, rank 0 writes into the first word of its own
//    region - the bytes of its own chunk, which it does not stage and no peer reads - the rounds
//    this op runs in and its choice for the next op of the class, tagged with the phase index;
//    the barrier publishes it (as it publishes the staged bytes), and every rank reads it, checks
//    the rounds against its own, and keeps the choice. So all ranks run the same rounds without a
//    barrier of their own, whatever each one measured, and no op is split into a chunked first
//    round and large ones after it;
//  * every rank reads the word in every such op, so the ranks' states stay equal as long as they
//    run the same ops, which the signature checks; it also carries the rounds (", rounds by rank
//    0: large"), so a rank that went astray raises a mismatch on every rank before any byte of
//    the op is read, and a rank with all_reduce_rounds = chunked (no suffix) beside one with auto
//    or large does too;
//  * only on streams that run inline (the host's), where the word can be read at once. Rank 0
//    times the whole op (waits for the peers included) and records it.
bool rounds_by_rank0(const CollectiveContext& ctx, const Args& a) {
  if (ctx.config.all_reduce_rounds == AllReduceRounds::kChunked || ctx.ws.world_size() < 2 ||
      inline_paths(ctx.ws.device(), ctx.stream) == nullptr) {
    return false;
  }
  const int64_t chunked = two_shot_round(ctx, a, ctx.config.chunk_bytes);
  // Rank 0's word fits in its own chunk of the first round, whichever the rounds.
  const bool word_fits = chunked / ctx.ws.world_size() * a.esize >= 8;
  return word_fits && a.numel > chunked && two_shot_round(ctx, a, 0) >= 2 * chunked;
}

constexpr uint64_t kRoundsWordTag = 0x52;  // 'R': a word written by rank 0's choice

// NOTE [Two-shot all-reduce]
// A round of `len` elements is split into W chunks (split_range). Each rank stages the chunks
// of its peers at their natural offsets in its region (not its own: it reduces that one from its
// input), passes the phase barrier, reduces its chunk from every rank in rank order - the same
// bits one-shot computes - into the output and, in the same pass, behind the staged round in its
// region. A second barrier publishes the reduced chunks, which every rank then pulls. Both
// barriers belong to one phase, whose reuse guard (NOTE [Collective phases]) covered the bytes
// of the reduced chunks too.
// `rounds`: when rank 0 chooses them (rounds_by_rank0), the agreed rounds, as the signature said.
// Returns whether it ran large rounds.
bool two_shot(const CollectiveContext& ctx, const Args& a, ReduceOp op,
              std::optional<RoundSize> rounds) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t bytes = a.numel * a.esize;
  const bool large = rounds == RoundSize::kLarge;
  const int64_t m = two_shot_round(ctx, a, large ? 0 : ctx.config.chunk_bytes);
  // NOTE [Rounds chosen by rank 0]: rank 0's word, with its choice for the next op.
  uint64_t word = 0;
  if (rounds && me == 0) {
    const RoundSize next = ctx.config.all_reduce_rounds == AllReduceRounds::kLarge
                               ? RoundSize::kLarge
                               : ctx.state.round_policy.choose(bytes, *rounds);
    word =
        (kRoundsWordTag << 8) | (static_cast<uint64_t>(*rounds) << 1) | static_cast<uint64_t>(next);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t off = 0; off < a.numel;) {
    const int64_t len = std::min(m, a.numel - off);
    const detail::Phase ph = detail::begin_phase(ctx);
    const int64_t reduced = detail::align_up(len * a.esize, detail::kAlign);
    const auto [b, e] = split_range(len, W, me);
    char* in = a.in + off * a.esize;
    char* out = a.out + off * a.esize;
    if (rounds && off == 0 && me == 0) {
      const uint64_t tagged = (ph.index << 16) | word;
      std::memcpy(ph.region[0], &tagged, sizeof(tagged));
    }
    detail::copy(ctx, ph.region[me], in, b * a.esize);
    detail::copy(ctx, ph.region[me] + e * a.esize, in + e * a.esize, (len - e) * a.esize);
    detail::phase_barrier(ctx);
    if (rounds && off == 0) {
      uint64_t got = 0;
      std::memcpy(&got, ph.region[0], sizeof(got));
      const bool tagged = (got >> 16) == ph.index && ((got >> 8) & 0xff) == kRoundsWordTag;
      TORCH_CHECK(tagged && ((got >> 1) & 1) == static_cast<uint64_t>(*rounds),
                  "cuda_p2p all_reduce: rank ", me, " read rank 0's rounds as ", got, " in phase ",
                  ph.index, ", running ", to_string(*rounds),
                  " rounds (a bug: NOTE [Rounds chosen by rank 0])");
      ctx.state.round_policy.agree(bytes, static_cast<RoundSize>(got & 1));
    }
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
    off += len;
  }
  if (rounds && me == 0 && ctx.config.all_reduce_rounds == AllReduceRounds::kAuto) {
    ctx.state.round_policy.record(
        bytes, *rounds,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return large;
}

// What the ranks compare (NOTE [Op signatures]), for both implementations of every algorithm;
// `rounds`: the two-shot's rounds when rank 0 chooses them (NOTE [Rounds chosen by rank 0]).
OpSignature signature(const CollectiveContext& ctx, const Args& a, ReduceOp op, AllReduceAlgo algo,
                      std::optional<RoundSize> rounds = std::nullopt) {
  return OpSignature::of(
      OpId::kAllReduce,
      std::to_string(a.numel) + " x " + dtype_name(a.dtype) + " " + lower_name(op) + " (" +
          to_string(algo) + detail::config_suffix(ctx) +
          (rounds ? std::string(", rounds by rank 0: ") + to_string(*rounds) : std::string()) +
          ")");
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// The inline one-shot: the small-message path of the host.

// NOTE [Inline one-shot]
// A small all-reduce is all latency. The generic one-shot above spends most of a small op's CPU
// time on what it enqueues rather than on what it does: closures and their tasks, W + 1 tensor
// views, the wait contexts' strings, the signature's text and vector of slots, the workspace's
// mapping lock a dozen times (docs/measurements/against-deepspeed-issue15.md). On a stream that
// runs inline (the host's: NOTE [Inline signals] in p2p_workspace/device.hpp) one_shot runs this
// instead, when the tensor fits one round:
//
//  * the same protocol, word for word: the reuse guard on the peers' done words (phase p - 2
//    ended), staging into this rank's region of half p % 2, this rank's descriptor written into
//    every pad, the barrier on the collective channel (its signal counts advanced as
//    SymmetricWorkspace::barrier does), the comparison of the W descriptors in the own pad, the
//    reduction of the W staged copies in rank order with the same kernel (ops::reduce_host), and
//    the done words. So a rank on this path and a peer on the generic one - another algorithm,
//    size or op, one forced by a setting, a rejected argument - meet at the same barrier, read
//    the same descriptors and raise the same error, and the phases stay in step across any mix
//    of ops (a disagreement ends the open phase, as settle_and_raise does);
//  * on raw addresses taken once per workspace generation (a new buffer after growth takes them
//    again, as begin_phase restarts the phases), the descriptor's words encoded once per
//    (numel, dtype, op), every store and poll done by the calling thread: nothing is allocated
//    once warm;
//  * a wait that poll_signals_now did not see satisfied goes on through Device::wait_signals,
//    with the group's timeout, the back-off and sleep of every host wait and the device's
//    failure checks; a timeout raises the generic path's error.
struct InlineOneShot {
  // ws.mapping_version(), ws.buffer(rank) and the channel when the addresses were taken.
  uint64_t version = 0;
  const void* mine = nullptr;
  int channel = -1;
  int64_t half = 0;                   // detail::phase_bytes
  int64_t round = 0;                  // detail::round_bytes(ctx, 1): the most bytes of one round
  c10::SmallVector<char*, 8> buffer;  // by rank
  c10::SmallVector<uint32_t*, 8> done_in;     // peers' done words, in this rank's pad
  c10::SmallVector<uint32_t*, 8> done_out;    // this rank's done word, in each peer's pad
  c10::SmallVector<uint32_t*, 8> signal_in;   // peers' barrier signals, in this rank's pad
  c10::SmallVector<uint32_t*, 8> signal_out;  // this rank's barrier signal, in each peer's pad
  c10::SmallVector<uint32_t*, 8> descriptor_out[2];       // by parity, by rank: this rank's slot
  const uint32_t* descriptor_in[2] = {nullptr, nullptr};  // by parity: the W slots of own pad
  // The last signature and its descriptor (stamp excluded).
  int64_t numel = -1;
  at::ScalarType dtype = at::kFloat;
  ReduceOp op = ReduceOp::kSum;
  OpSignature sig;
  DescriptorWords words{};
  c10::SmallVector<SignalWait, 8> waits;
};

namespace {

void take_addresses(const CollectiveContext& ctx, InlineOneShot& c) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank(), ch = ctx.channel;
  c.version = ctx.ws.mapping_version();  // read first: a growth after it is noticed next time
  c.mine = ctx.ws.buffer(me);
  c.channel = ch;
  c.half = detail::phase_bytes(ctx);
  c.round = detail::round_bytes(ctx, 1);
  c.buffer.clear();
  c.done_in.clear();
  c.done_out.clear();
  c.signal_in.clear();
  c.signal_out.clear();
  for (int r = 0; r < W; ++r) {
    c.buffer.push_back(static_cast<char*>(ctx.ws.buffer(r)));
    c.done_in.push_back(ctx.ws.done_slot(me, ch, r));
    c.done_out.push_back(ctx.ws.done_slot(r, ch, me));
    c.signal_in.push_back(ctx.ws.signal_slot(me, ch, r));
    c.signal_out.push_back(ctx.ws.signal_slot(r, ch, me));
  }
  for (int parity = 0; parity < 2; ++parity) {
    c.descriptor_out[parity].clear();
    for (int r = 0; r < W; ++r) {
      c.descriptor_out[parity].push_back(ctx.ws.descriptor_slot(r, ch, parity, me));
    }
    c.descriptor_in[parity] = ctx.ws.descriptor_slot(me, ch, parity, 0);
  }
}

// Waits for c.waits: a brief poll, then the device's blocking wait (NOTE [Inline signals]).
// The timeout error names the wait as the generic path's does: the phase's reuse guard when
// `guard_phase` >= 0, else the barrier.
void inline_wait(const CollectiveContext& ctx, InlineOneShot& c, int64_t guard_phase) {
  Device& dev = ctx.ws.device();
  if (dev.host_paths()->poll_signals_now(c.waits)) return;  // try_inline_one_shot checked it
  const std::string rank = std::to_string(ctx.ws.rank());
  dev.wait_signals(
      ctx.stream, std::vector<SignalWait>(c.waits.begin(), c.waits.end()), ctx.ws.timeout(),
      guard_phase >= 0
          ? "collective buffer reuse guard (rank " + rank + ", phase " +
                std::to_string(guard_phase) + ")"
          : "barrier on channel " + std::to_string(ctx.channel) + " (rank " + rank + ")");
}

// One phase of a one-shot all-reduce of `a` (one round), on the calling thread. The order of
// steps is one_shot's (NOTE [Inline one-shot]).
void inline_one_shot(const CollectiveContext& ctx, InlineOneShot& c, const Args& a, ReduceOp op) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  HostPaths& host = *ctx.ws.device().host_paths();  // try_inline_one_shot checked it
  // begin_phase: a new buffer (growth) restarts the phases.
  if (ctx.state.buffer != c.mine) {
    ctx.state.buffer = c.mine;
    ctx.state.phase = 0;
  }
  const uint64_t phase = ctx.state.phase++;
  const int64_t offset = static_cast<int64_t>(phase % 2) * c.half;
  if (phase >= 2) {  // the reuse guard: every peer ended phase - 2
    c.waits.clear();
    const auto want = static_cast<uint32_t>(phase - 1);
    for (int r = 0; r < W; ++r) {
      if (r != me) c.waits.push_back({c.done_in[r], want, r});
    }
    inline_wait(ctx, c, static_cast<int64_t>(phase));
  }
  const int64_t bytes = a.numel * a.esize;
  std::memcpy(c.buffer[me] + offset, a.in, static_cast<size_t>(bytes));
  // The descriptor (publish_signature), then the barrier, whose release stores publish it and
  // the staged bytes.
  SignatureState& st = ctx.state.signature;
  const int parity = static_cast<int>(st.count % 2);
  c.words[0] = static_cast<uint32_t>(st.count + 1);  // encode()'s stamp
  for (int r = 0; r < W; ++r) {
    std::memcpy(c.descriptor_out[parity][r], c.words.data(), sizeof(DescriptorWords));
  }
  c.waits.clear();
  for (int s = 1; s < W; ++s) {  // from the next rank on, as end_phase does
    const int r = (me + s) % W;
    const auto [send, expect] = ctx.ws.next_barrier_signal(ctx.channel, r);
    host.write_signal_now(c.signal_out[r], send);
    c.waits.push_back({c.signal_in[r], expect, r});
  }
  inline_wait(ctx, c, -1);
  // compare_signatures
  ++st.count;
  const uint32_t* all = c.descriptor_in[parity];
  bool agree = true;
  for (int r = 0; r < W && agree; ++r) {
    agree = std::memcmp(all + r * SymmetricWorkspace::kDescriptorWords, c.words.data(),
                        sizeof(DescriptorWords)) == 0;
  }
  if (!agree) {
    const std::string error = signature_disagreement(all, W, c.words, c.sig);
    if (!error.empty()) {
      // settle_and_raise with the phase open: end it, as every peer ends one.
      for (int s = 1; s < W; ++s) {
        const int r = (me + s) % W;
        host.write_signal_now(c.done_out[r], static_cast<uint32_t>(phase + 1));
      }
      throw SignatureMismatch(error);
    }
  }
  const void* srcs[64];
  for (int r = 0; r < W; ++r) srcs[r] = c.buffer[r] + offset;
  reduce_host(a.out, srcs, W, a.numel, a.dtype, op, W);
  for (int s = 1; s < W; ++s) {  // end_phase
    const int r = (me + s) % W;
    host.write_signal_now(c.done_out[r], static_cast<uint32_t>(phase + 1));
  }
}

// Runs the one-shot all-reduce of `a` inline when it can (a stream that runs inline, one round,
// a world the host kernel reduces at once); false, having done nothing, otherwise.
bool try_inline_one_shot(const CollectiveContext& ctx, const Args& a, ReduceOp op) {
  const int W = ctx.ws.world_size();
  if (!ctx.config.inline_all_reduce || W < 2 || W > 64 || a.numel == 0 ||
      inline_paths(ctx.ws.device(), ctx.stream) == nullptr) {
    return false;
  }
  auto& c = ctx.state.inline_one_shot;
  if (!c) c = std::make_shared<InlineOneShot>();
  // A new workspace (growth) is noticed by its mapping version: one load, no lock.
  if (c->version != ctx.ws.mapping_version() || c->mine == nullptr || c->channel != ctx.channel) {
    take_addresses(ctx, *c);
  }
  if (a.numel * a.esize > c->round) return false;
  if (a.numel != c->numel || a.dtype != c->dtype || op != c->op) {
    c->numel = -1;  // until the new signature is in place
    c->sig = signature(ctx, a, op, AllReduceAlgo::kOneShot);
    c->words = encode_signature(c->sig, 0);
    c->numel = a.numel;
    c->dtype = a.dtype;
    c->op = op;
  }
  inline_one_shot(ctx, *c, a, op);
  return true;
}

}  // namespace

Outcome all_reduce(const CollectiveContext& ctx, const at::Tensor& input, const at::Tensor& output,
                   ReduceOp op, AllReduceAlgo algo) {
  const int W = ctx.ws.world_size();
  TORCH_CHECK(input.is_contiguous() && output.is_contiguous() && input.numel() == output.numel() &&
                  input.scalar_type() == output.scalar_type(),
              "cuda_p2p all_reduce: expected a contiguous input and output of one size and "
              "dtype, got ",
              input.sizes(), " ", input.scalar_type(), " and ", output.sizes(), " ",
              output.scalar_type());
  Args a{detail::bytes_of(input), detail::bytes_of(output), input.numel(), input.scalar_type(),
         static_cast<int64_t>(input.element_size())};
  const detail::CaptureBracket bracket(ctx);
  if (algo == AllReduceAlgo::kAuto) algo = select_all_reduce(ctx.config, a.numel * a.esize, W);
  Outcome outcome{.algorithm = to_string(algo)};
  outcome.ran_inline = algo == AllReduceAlgo::kOneShot && try_inline_one_shot(ctx, a, op);
  if (outcome.ran_inline) return outcome;
  // Compared at the first phase barrier of either algorithm (NOTE [Op signatures]), with the
  // two-shot's zero-copy claim when the group agrees by signature (NOTE [Zero-copy collectives]).
  std::optional<RoundSize> rounds;
  if (algo == AllReduceAlgo::kTwoShot && rounds_by_rank0(ctx, a)) {
    rounds = ctx.state.round_policy.agreed(a.numel * a.esize);
  }
  OpSignature sig = signature(ctx, a, op, algo, rounds);
  if (algo == AllReduceAlgo::kTwoShot) {
    sig.text += detail::claim_all_reduce(ctx, a.in, a.numel, a.esize);
  }
  // NOTE [Captured collectives in one kernel]
  if (detail::all_reduce_kernel(ctx, a.in, a.out, a.numel, a.dtype, op, algo, sig)) {
    return outcome;
  }
  detail::expect_signature(ctx, std::move(sig));
  if (a.numel == 0) {
    detail::handshake(ctx);
    return outcome;
  }
  if (W == 1) {
    detail::reduce_on_stream(ctx, output, {input}, op, 1);
    return outcome;
  }
  // An input in the peers' symmetric heaps is not staged (NOTE [Zero-copy collectives]).
  if (algo == AllReduceAlgo::kTwoShot &&
      detail::all_reduce_zero_copy(ctx, a.in, a.out, a.numel, a.dtype, op)) {
    outcome.zero_copy = true;
    return outcome;
  }
  if (algo == AllReduceAlgo::kTwoShot) {
    outcome.large_rounds = two_shot(ctx, a, op, rounds);
  } else {
    one_shot(ctx, a, op);
  }
  return outcome;
}

}  // namespace cuda_p2p::ops
