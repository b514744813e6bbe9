// All-to-all on the workspace (all_to_all_single, the list all_to_all, all_to_all_v): every rank
// stages what it sends to its peers in its own region, passes the phase barrier, and pulls the
// slices addressed to it from every peer's region into its output; in rounds when the bytes sent
// exceed a region. The split sizes travel in a header with the first round (NOTE [All-to-all
// headers]), so a receiver need not know what it receives.
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <cstring>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"

namespace cuda_p2p::ops {

namespace {

using detail::copy;

// NOTE [All-to-all headers]
// Why: a receiver must know where its slice lies in each sender's region and how long it is, and
// all_to_all_v's receiver does not even know the lengths.
// The header: in the op's first phase every rank writes, at the start of its region, a magic
// word, the bytes of one unit (row), the units it sends to each rank and the units it expects
// from each rank (-1: unknown); the phase barrier that publishes the staged bytes (and compares
// the op signatures) publishes it too.
// Reading it:
//  - every rank copies all W headers to host memory (a device copy and a synchronize, so the
//    algorithm is the same on the host and on CUDA; on CUDA a host round trip per op, which is
//    also why the op cannot be captured; on an inline stream, NOTE [Inline signals] in
//    p2p_workspace/device.hpp, a memcpy into the caller's stack) and checks them;
//  - every rank reads the same W headers and reaches the same verdict: when a rank expects other
//    than what its sender sends, every rank ends the phase and raises the same SignatureMismatch
//    naming both ranks, and the group stays usable (NOTE [Op signatures]);
//  - otherwise the number of rounds follows from the largest sender's bytes, which every rank now
//    knows, so every rank runs as many phases (NOTE [Collective phases]); the header space stays
//    reserved in every round (the same piece size) and is covered by the reuse guard.
//
// Staging: a rank stages only what goes to its peers, the concatenation of its send slices
// without its own, in rank order (its "stream"), round k staging bytes [k * piece, (k + 1) *
// piece) of it. Its own slice is copied straight from its input to its output.
//
// Cross-memory reads: the header also holds the address of each of the rank's send slices (NOTE
// [Cross-memory reads] in ops/collectives.cpp).
//  - when the op needs more than one round and the bytes all ranks send to their peers reach
//    cross_memory_min_bytes on a group with cross-memory reads (a verdict every rank reaches
//    alike from the same W headers), the receivers take round 0 from the staged region as usual
//    and read the rest of each slice from the sender's input where it lies, in the same phase:
//    one copy per byte instead of a staging copy and a pull, one phase barrier instead of one per
//    round;
//  - each rank then waits for its readers (wait_readers) before it returns, so its input stays as
//    it was until every peer has read it.
//
// NOTE [All-to-all zero-copy]
// A sender whose input lies in its symmetric heap (cuda_p2p.empty; NOTE [Zero-copy collectives]
// in ops/zero_copy.cpp) stages nothing: its peers read their slices from its heap mapping. Unlike
// the other zero-copy collectives the ranks need not agree first, as each sender decides for
// itself and says so in its header: the heap offset of each of its slices for a peer (0 for an
// empty one), or -1 in every word when it stages (its input outside its heap, or the heap not
// readable zero-copy now: zero-copy off, under capture). The header is read on the host by every
// rank anyway (on CUDA after a synchronize), so this works alike on both devices and whatever the
// zero_copy_agreement, except "off". Then:
//  * the phase barrier that publishes the header publishes the input too (release/acquire on the
//    host; stream order on CUDA): its contents are final when the caller passes it, and no peer
//    reads it before the barrier;
//  * readers copy a zero-copy sender's whole slice in the first phase, whatever the rounds; the
//    rounds follow from the largest stream that is staged (zero-copy senders stage 0 bytes), so
//    every rank still runs the same phases, and an op whose senders are all zero-copy runs one;
//  * a zero-copy sender waits, after its last phase, until every peer ended that phase
//    (wait_readers): they read its slices in the first phase, so its caller may then overwrite
//    the input. Inputs never overlap outputs (the backend clones an input that does), so a rank
//    writes its output while peers read its input.
// One copy per byte crosses ranks instead of two (staging, pull). The own slice is copied from
// the input as before.
constexpr int64_t kMagic = 0x6132613148647233;  // a header of this layout

int64_t header_words(int W) { return 2 + 4 * static_cast<int64_t>(W); }
// The header word holding the address of rank r's slice for rank q (in r's address space).
int64_t address_word(int W, int q) { return 2 + 2 * static_cast<int64_t>(W) + q; }
// The header word holding the heap offset of rank r's slice for rank q, or -1 (NOTE [All-to-all
// zero-copy]).
int64_t heap_word(int W, int q) { return 2 + 3 * static_cast<int64_t>(W) + q; }
constexpr int64_t kStaged = -1;
int64_t header_bytes(int W) {
  return detail::align_up(header_words(W) * static_cast<int64_t>(sizeof(int64_t)), detail::kAlign);
}

// Host words the device copies to and from in stream order (pinned on CUDA).
at::Tensor host_words(const CollectiveContext& ctx, int64_t n) {
  auto options = at::TensorOptions().dtype(at::kLong);
  if (!ctx.ws.device().tensor_device().is_cpu()) options = options.pinned_memory(true);
  return at::empty({n}, options);
}

// The W headers every rank read back.
struct Headers {
  int W;
  const int64_t* words;
  const int64_t* of(int r) const { return words + r * header_words(W); }
  int64_t magic(int r) const { return of(r)[0]; }
  int64_t unit(int r) const { return of(r)[1]; }
  int64_t sends(int r, int q) const { return of(r)[2 + q]; }           // units r sends q
  int64_t expects(int q, int r) const { return of(q)[2 + W + r]; }     // units q expects from r
  int64_t heap(int r, int q) const { return of(r)[heap_word(W, q)]; }  // r's slice for q
  // Whether rank r's peers read its input zero-copy (NOTE [All-to-all zero-copy]).
  bool zero_copy(int r) const { return heap(r, (r + 1) % W) != kStaged; }
  // Where rank r's slice for q starts in r's stream (bytes), and the stream's length.
  int64_t stream_offset(int r, int q) const {
    int64_t off = 0;
    for (int p = 0; p < q; ++p) off += p == r ? 0 : sends(r, p) * unit(r);
    return off;
  }
  int64_t stream_bytes(int r) const { return stream_offset(r, W); }
  // What rank r staged: its stream, or nothing when it sends zero-copy.
  int64_t staged_bytes(int r) const { return zero_copy(r) ? 0 : stream_bytes(r); }
};

std::string units(int64_t n, int64_t unit_bytes, const char* unit) {
  return std::to_string(n) + " " + unit + " (" + std::to_string(n * unit_bytes) + " bytes)";
}

// The error every rank raises for these headers ("" when they agree): the same on every rank.
// `heap_bytes`: the size of each rank's symmetric heap (0: none), which zero-copy slices must lie
// in (NOTE [All-to-all zero-copy]).
std::string split_disagreement(const Headers& h, OpId kind, const char* unit, int64_t heap_bytes) {
  for (int r = 0; r < h.W; ++r) {
    if (h.magic(r) != kMagic || h.unit(r) < 0) {
      return std::string("cuda_p2p ") + name(kind) + ": rank " + std::to_string(r) +
             " wrote no all-to-all header (a protocol error); the op did not run on any rank";
    }
    for (int q = 0; q < h.W && h.zero_copy(r); ++q) {
      const int64_t off = h.heap(r, q), len = h.sends(r, q) * h.unit(r);
      if (q != r && (off < 0 || len < 0 || len > heap_bytes || off > heap_bytes - len)) {
        return std::string("cuda_p2p ") + name(kind) + ": rank " + std::to_string(r) +
               " wrote a slice for rank " + std::to_string(q) + " at heap offset " +
               std::to_string(off) + " (" + std::to_string(len) + " bytes) outside a heap of " +
               std::to_string(heap_bytes) +
               " bytes (a protocol error); the op did not run on any rank";
      }
    }
  }
  for (int r = 1; r < h.W; ++r) {
    // The signature compares the units too; this keeps the copies in bounds where it is compared
    // asynchronously (CUDA).
    if (h.unit(r) != h.unit(0)) {
      return std::string("cuda_p2p ") + name(kind) + ": ranks disagree on the bytes of " + unit +
             ": rank 0 has " + std::to_string(h.unit(0)) + ", rank " + std::to_string(r) + " " +
             std::to_string(h.unit(r)) + "; the op did not run on any rank";
    }
  }
  std::string pairs;
  int shown = 0, more = 0;
  for (int q = 0; q < h.W; ++q) {
    for (int r = 0; r < h.W; ++r) {
      const int64_t sent = h.sends(r, q), want = h.expects(q, r);
      if (want < 0 || want == sent) continue;
      if (shown == 4) {
        ++more;
        continue;
      }
      pairs += (shown++ ? "; rank " : "rank ") + std::to_string(r) + " sends " +
               units(sent, h.unit(r), unit) + " to rank " + std::to_string(q) + ", but rank " +
               std::to_string(q) + " expects " + units(want, h.unit(q), unit) + " from rank " +
               std::to_string(r);
    }
  }
  if (pairs.empty()) return "";
  if (more > 0) pairs += " (and " + std::to_string(more) + " more pairs)";
  return std::string("cuda_p2p ") + name(kind) + ": ranks disagree on the split sizes: " + pairs +
         "; the op did not run on any rank";
}

// Copies bytes [a, b) of this rank's stream (its send slices without its own) to `dst`.
void stage_window(const CollectiveContext& ctx, const AllToAllArgs& args, char* dst, int64_t a,
                  int64_t b) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  int64_t off = 0;
  for (int q = 0; q < W && off < b; ++q) {
    if (q == me) continue;
    const int64_t len = args.send_counts[q] * args.unit_bytes;
    const int64_t lo = std::max(off, a), hi = std::min(off + len, b);
    if (lo < hi) copy(ctx, dst + (lo - a), args.send[q] + (lo - off), hi - lo);
    off += len;
  }
}

}  // namespace

AllToAllResult all_to_all(const CollectiveContext& ctx, const AllToAllArgs& args,
                          AllToAllOutputs outputs) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const char* what = name(args.kind);
  TORCH_CHECK(static_cast<int>(args.send.size()) == W &&
                  static_cast<int>(args.send_counts.size()) == W &&
                  (args.recv_counts.empty() || static_cast<int>(args.recv_counts.size()) == W),
              "cuda_p2p ", what, ": expected ", W, " send slices and sizes (one per rank), got ",
              args.send.size(), " and ", args.send_counts.size());
  TORCH_CHECK(args.unit_bytes >= 0, "cuda_p2p ", what, ": unit bytes must be >= 0, got ",
              args.unit_bytes);
  for (int q = 0; q < W; ++q) {
    TORCH_CHECK(args.send_counts[q] >= 0 && (args.recv_counts.empty() || args.recv_counts[q] >= 0),
                "cuda_p2p ", what, ": split sizes must be >= 0");
  }
  TORCH_CHECK(!ctx.ws.capturing(ctx.stream), "cuda_p2p ", what,
              ": cannot be captured in a graph (its split sizes are read back on the host)");
  detail::staged_only(ctx);  // zero-copy by sender, decided in the headers, not claimed
  if (W == 1) {
    TORCH_CHECK(args.recv_counts.empty() || args.recv_counts[0] == args.send_counts[0], "cuda_p2p ",
                what, ": rank 0 sends ", units(args.send_counts[0], args.unit_bytes, args.unit),
                " to itself, but expects ", units(args.recv_counts[0], args.unit_bytes, args.unit));
    std::vector<int64_t> recv{args.send_counts[0]};
    const std::vector<char*> out = outputs(recv);
    copy(ctx, out[0], args.send[0], recv[0] * args.unit_bytes);
    return {std::move(recv), {.algorithm = "direct"}};
  }
  // Compared at the first phase barrier (NOTE [Op signatures]); the split sizes, which the ranks
  // do not pass alike, travel in the header (NOTE [All-to-all headers]).
  detail::expect_signature(ctx, OpSignature::of(args.kind, args.text + detail::config_suffix(ctx)));
  const int64_t hdr = header_bytes(W);
  const int64_t hdr_used = header_words(W) * static_cast<int64_t>(sizeof(int64_t));
  int64_t piece = detail::phase_bytes(ctx) - hdr;
  if (ctx.config.chunk_bytes > 0) piece = std::min(piece, ctx.config.chunk_bytes);
  piece = detail::align_down(piece, detail::kAlign);
  TORCH_CHECK(piece > 0, "cuda_p2p ", what, ": the workspace buffer (", ctx.ws.buffer_size(),
              " bytes) is too small for the all-to-all header of ", W,
              " ranks; grow it with ensure_min_buffer_size");

  // This rank's header, alive until the synchronize below (the device copies from it), or past it
  // through ctx.state.in_flight when it raises; on a stream that runs inline, on the stack (NOTE
  // [All-to-all headers]).
  const bool inline_stream = inline_paths(ctx.ws.device(), ctx.stream) != nullptr;
  // n words of host memory: `stack` on such a stream, else `t` (host_words).
  const auto words_in = [&](c10::SmallVectorImpl<int64_t>& stack, at::Tensor& t, int64_t n) {
    if (inline_stream) {
      stack.resize(n);
      return stack.data();
    }
    t = host_words(ctx, n);
    // The synchronize below raises on a timeout with the copies into `t` still queued.
    ctx.state.in_flight.push_back(t);
    return t.data_ptr<int64_t>();
  };
  const int64_t hw = header_words(W);
  c10::SmallVector<int64_t, 64> own_words;
  at::Tensor own;
  int64_t* w = words_in(own_words, own, hw);
  w[0] = kMagic;
  w[1] = args.unit_bytes;
  int64_t my_stream = 0;
  // NOTE [All-to-all zero-copy]: zero-copy when every non-empty slice for a peer is in the heap.
  bool sends_zero_copy = true;
  for (int q = 0; q < W; ++q) {
    const int64_t len = args.send_counts[q] * args.unit_bytes;
    w[2 + q] = args.send_counts[q];
    w[2 + W + q] = args.recv_counts.empty() ? -1 : args.recv_counts[q];
    w[address_word(W, q)] = static_cast<int64_t>(reinterpret_cast<intptr_t>(args.send[q]));
    w[heap_word(W, q)] =
        q == me || len == 0 ? 0 : detail::readable_heap_offset(ctx, args.send[q], len);
    sends_zero_copy = sends_zero_copy && w[heap_word(W, q)] != kStaged;
    my_stream += q == me ? 0 : len;
  }
  sends_zero_copy = sends_zero_copy && my_stream > 0;
  if (!sends_zero_copy) {
    for (int q = 0; q < W; ++q) w[heap_word(W, q)] = kStaged;
  }

  detail::Phase ph = detail::begin_phase(ctx);
  copy(ctx, ph.region[me], w, hdr_used);
  if (!sends_zero_copy) stage_window(ctx, args, ph.region[me] + hdr, 0, std::min(piece, my_stream));
  detail::phase_barrier(ctx);  // raises SignatureMismatch on every rank on a disagreement

  // The W headers, copied out of the regions: later phases reuse them (NOTE [Collective phases]).
  c10::SmallVector<int64_t, 256> all_words;
  at::Tensor all;
  int64_t* words = words_in(all_words, all, W * hw);
  for (int r = 0; r < W; ++r) {
    if (inline_stream) {
      std::memcpy(words + r * hw, ph.region[r], hdr_used);
    } else {
      copy(ctx, words + r * hw, ph.region[r], hdr_used);
    }
  }
  if (!inline_stream) ctx.ws.device().synchronize(ctx.stream);
  const Headers h{W, words};
  const std::string error = split_disagreement(h, args.kind, args.unit,
                                               ctx.state.heap ? ctx.state.heap->buffer_size() : 0);
  if (!error.empty()) {
    detail::end_phase(ctx, ph);  // every rank ends the one phase it began (NOTE [Op signatures])
    throw SignatureMismatch(error);
  }
  std::vector<int64_t> recv(W);
  int64_t largest = 0, crossing = 0;
  int senders = 0, zero_copy_senders = 0;  // of bytes to peers
  for (int r = 0; r < W; ++r) {
    recv[r] = h.sends(r, me);
    largest = std::max(largest, h.staged_bytes(r));
    crossing += h.staged_bytes(r);
    senders += h.stream_bytes(r) > 0;
    zero_copy_senders += h.zero_copy(r);
  }
  // Counted zero-copy (alike on every rank) when no byte crossed through a staging region.
  const bool zero_copy = zero_copy_senders > 0 && zero_copy_senders == senders;
  const std::vector<char*> out = outputs(recv);
  TORCH_CHECK(static_cast<int>(out.size()) == W, "cuda_p2p ", what, ": expected ", W,
              " outputs, got ", out.size());
  // The own slice first: the peers may still be staging.
  copy(ctx, out[me], args.send[me], args.send_counts[me] * args.unit_bytes);
  const int64_t rounds = std::max<int64_t>(1, detail::ceil_div(largest, piece));
  // NOTE [All-to-all zero-copy]: the slices of zero-copy senders, read from their heaps in the
  // first phase.
  c10::SmallVector<int, 8> peers;
  for (int s = 1; s < W; ++s) {
    const int r = (me + s) % W;
    peers.push_back(r);
    if (h.zero_copy(r) && recv[r] > 0) {
      copy(ctx, out[r], detail::peer_heap(ctx, r, h.heap(r, me)), recv[r] * h.unit(r));
    }
  }
  // NOTE [All-to-all headers]: cross-memory reads past round 0, decided alike on every rank.
  if (rounds > 1 &&
      uses_cross_memory_reads(ctx.config, crossing, detail::cross_memory_reads(ctx))) {
    for (int s = 1; s < W; ++s) {
      const int r = (me + s) % W;
      if (h.zero_copy(r)) continue;
      const int64_t off = h.stream_offset(r, me), len = recv[r] * h.unit(r);
      if (off < piece) {
        const int64_t hi = std::min(off + len, piece);
        copy(ctx, out[r], ph.region[r] + hdr + off, hi - off);
      }
      const int64_t lo = std::max(off, piece);
      if (lo < off + len) {
        detail::read_input_cross_memory(ctx, out[r] + (lo - off), ph, r,
                                        static_cast<int>(address_word(W, me)), lo - off,
                                        off + len - lo);
      }
    }
    detail::end_phase(ctx, ph);
    detail::wait_readers(ctx, ph, peers);  // its readers, if zero-copy, too
    return {std::move(recv), {.algorithm = "direct", .zero_copy = zero_copy, .cross_memory = true}};
  }
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t a = k * piece, b = a + piece;
    if (k > 0) {
      ph = detail::begin_phase(ctx);
      if (!sends_zero_copy && a < my_stream) {
        stage_window(ctx, args, ph.region[me] + hdr, a, std::min(b, my_stream));
      }
      detail::phase_barrier(ctx);
    }
    // Start with the next rank, so that the ranks do not all read rank 0 first.
    for (int s = 1; s < W; ++s) {
      const int r = (me + s) % W;
      if (h.zero_copy(r)) continue;
      const int64_t off = h.stream_offset(r, me), len = recv[r] * h.unit(r);
      const int64_t lo = std::max(off, a), hi = std::min(off + len, b);
      if (lo < hi) copy(ctx, out[r] + (lo - off), ph.region[r] + hdr + (lo - a), hi - lo);
    }
    detail::end_phase(ctx, ph);
  }
  // NOTE [All-to-all zero-copy]: its readers are done with this rank's input once they ended the
  // last phase.
  if (sends_zero_copy) detail::wait_readers(ctx, ph, peers);
  return {std::move(recv), {.algorithm = "direct", .zero_copy = zero_copy}};
}

}  // namespace cuda_p2p::ops
