// Zero-copy collectives: all-gather (and all_gather_v), reduce-scatter, all-reduce and broadcast
// reading their peers' inputs where they lie, in the peers' symmetric heaps (cuda_p2p.empty),
// instead of staging them.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p::ops::detail {

// NOTE [Zero-copy collectives]
// A group's symmetric heap (NOTE [Symmetric heap] in p2p_workspace/symmetric_heap.cpp) is mapped
// into every peer, so a tensor allocated in it can be read by a peer as it is: the copy into the
// staging buffer disappears. Peers read each other's inputs, so the ranks must first agree that
// every input is in its rank's heap, and where. Two ways (Options.zero_copy_agreement /
// CUDA_P2P_ZERO_COPY_AGREEMENT; "auto": exchange on the host, off on CUDA until signature is
// validated there, NOTE [CUDA zero-copy is opt-in] in ops/common.hpp; "off" never reads in
// place, so heap inputs stage like any other):
//
// Exchange (host only). The protocol of NOTE [Cross-memory reads] in ops/collectives.cpp, with heap
// offsets instead of addresses and a memcpy instead of a system call:
//
//   1. Whether to try is decided from what every rank knows alike: the group has a heap (it is
//      created collectively, by the first cuda_p2p.empty, at the same point of every rank's op
//      sequence), the workspace is on the host, and the sizes (all-reduce: two-shot, on 3+ ranks:
//      all_reduce_round). Groups without a heap never get here: they pay nothing.
//   2. begin_phase (the reuse guard), then the rank writes, in the header of its region, the heap
//      offset of each of its inputs, or -1 for an input outside its heap (any ordinary tensor).
//   3. The op's first phase barrier: it compares the op signatures (NOTE [Op signatures]) and
//      publishes the headers - and the inputs' contents, final since the caller passed them
//      (release store of the barrier, acquire of the wait). So a peer reads my input only after
//      I entered the op.
//   4. Every rank reads all W headers; all of them see the same words and take the same
//      decision. If any offset is -1 the ranks end this (empty) phase and run the staged
//      algorithm, whose phases follow as usual (its signature has been compared already): one
//      barrier more than staging alone, never a wrong result, never a hang. Offsets need not be
//      equal across ranks (each rank publishes its own): an in-place all_gather_into_tensor,
//      whose input is the rank's own chunk of a heap output, also runs zero-copy.
//
// Signature (CUDA's only way; the host's on request). Step 4 is a decision the host takes by
// reading W headers right after enqueueing the barrier. On the host the barrier has run by then
// (the caller's stream runs inline); on a GPU it is only enqueued, the headers are device memory,
// and the host would read them before the peers wrote them unless it synchronised the stream on
// every op - the cost the workspace exists to avoid. So each rank instead assumes that its peers
// allocated like it did (the heap's allocator gives equal offsets to equal call sequences) and
// states the assumption in the op signature, which every rank compares anyway:
//
//   1'. At the op's entry, before its signature is set (claim_* below): if every input of this
//       rank is in its heap, the rank predicts every rank's input offsets from its own - equal
//       offsets, or for an in-place all-gather "rank q's input is chunk q of an output at heap
//       offset O" - keeps the prediction (CollectiveState::zero_copy_claim) and appends it to its
//       signature text ("zero-copy: input at heap offset 4096"). Else it claims nothing, and its
//       text is unchanged.
//   2'. The zero-copy path runs only on a claim: begin_phase, then the op's first phase barrier
//       (broadcast: its handshake), which compares the signatures and publishes the inputs as in
//       step 3. Equal signatures mean equal predictions, and each rank's prediction of its own
//       inputs is exact, so every prediction is every rank's truth. Without a claim the staged
//       algorithm runs at once: a group with a heap pays nothing for ordinary inputs.
//   3'. A rank that claims while a peer does not (one rank's input outside its heap, or offsets
//       that differ because the ranks allocated or freed differently) is a signature mismatch: on
//       the host every rank raises SignatureMismatch naming both texts and the group stays usable;
//       on CUDA the comparison kernel records it and the next op raises it (NOTE [Op
//       signatures]), after this op ran on the disagreement - its results are garbage, and it may
//       time out (the two paths signal differently). The cure is the program's: allocate the
//       inputs of a collective alike on every rank, or turn zero-copy off (the error says both).
//       all_gather_v does not claim (a rank with no rows has no offset to predict from), so it
//       stages in this mode.
//
// Ranks of a group with a heap whose agreements differ would run different phases: each op's
// signature names a rank's agreement when it is not its device's default (agreement_text).
//
// Then, either way:
//
//   5. The readers read peers' inputs from their heap mappings (host: memcpy and the host
//      kernels; CUDA: the copy engine and the reduction kernels, through the CUDA IPC mappings),
//      and no rank may return (its caller may overwrite its input) before every peer finished
//      reading it:
//       - all-gather and reduce-scatter end the phase and wait for their readers' done words
//         (wait_readers, which also satisfies the next phase's reuse guard);
//       - all-reduce, in rounds like the staged two-shot, reduces its part of a round into its
//         region, passes a barrier (every rank has read that round of every input, the reduced
//         parts are published) and only then writes that round of its output, which may be its
//         input; later rounds read other bytes of the inputs, final since the first barrier,
//         each in a phase of its own;
//       - on CUDA "return" is the end of the enqueueing: the caller's later work on its input is
//         in stream order after the waits (backend/workspace_collectives.cpp runs every
//         collective on the caller's stream).
//
// Broadcast: a single input, the root's.
//  - exchange: the root alone decides (broadcast_zero_copy): it publishes its offset (or -1) with
//    the end of a phase, as the staged broadcast publishes a round; the others read it, then the
//    tensor from the root's heap, or fall back with the root;
//  - signature: every rank's tensor at one offset, as above; the handshake that compared the
//    claims followed every rank's entry, so the readers copy from the root's heap at once and
//    the root waits for them;
//  - only a tensor that fits one round of the staged broadcast goes zero-copy: beyond that the
//    staged rounds overlap the root's copy-in with the readers' copy-out, while zero-copy leaves
//    the root idle (docs/zero_copy.md, "Broadcast"; docs/measurements/zero-copy-broadcast-
//    2026-11-24.md).
//
// The reductions use the staged path's kernel in rank order, so each element gets the bits the
// staged direct reduce-scatter and two-shot all-reduce compute, and every rank the same bits.
//
// The host runs the CUDA side's code (signature agreement over CUDA IPC heaps) too, with
// zero_copy_agreement="signature", which the CPU suite tests (docs/zero_copy.md says where the
// CUDA side has run).

namespace {

constexpr int64_t kNotInHeap = -1;
// Elements per reduction call: the sources and the destination of a piece stay in the cache.
constexpr int64_t kReducePieceBytes = 256 << 10;

bool host_workspace(const CollectiveContext& ctx) {
  return ctx.ws.device().host_paths() != nullptr;
}

// The exchange is read by the host right after its barrier: NOTE [Synchronous host devices].
bool synchronous_host(const CollectiveContext& ctx) { return ctx.ws.device().host_synchronous(); }

ZeroCopyAgreement agreement(const CollectiveContext& ctx) {
  return resolve_agreement(ctx.config.zero_copy_agreement, synchronous_host(ctx));
}

bool signature_agreement(const CollectiveContext& ctx) {
  return agreement(ctx) == ZeroCopyAgreement::kSignature;
}

// "off" stages everything; the exchange needs the host (NOTE [Zero-copy collectives]): a CUDA
// group configured for it (the backend refuses that at creation) stages.
bool heap_usable(const CollectiveContext& ctx) {
  const ZeroCopyAgreement a = agreement(ctx);
  // Not under capture: its agreements carry host-issued values (NOTE [Replay-safe signals]).
  return ctx.state.heap != nullptr && ctx.ws.world_size() > 1 && !ctx.ws.capturing(ctx.stream) &&
         (a == ZeroCopyAgreement::kSignature ||
          (a == ZeroCopyAgreement::kExchange && synchronous_host(ctx)));
}

// [p, p + n) inside this rank's heap: its offset, else kNotInHeap.
int64_t heap_offset(const CollectiveContext& ctx, const void* p, int64_t n) {
  return ctx.state.heap->own_offset(p, n);
}

// Signature agreement: takes this op's claim out of the state (it never outlives its op).
std::optional<std::vector<int64_t>> take_claim(const CollectiveContext& ctx) {
  std::optional<std::vector<int64_t>> claimed = std::move(ctx.state.zero_copy_claim);
  ctx.state.zero_copy_claim.reset();
  return claimed;
}

// Whether this op may claim (signature agreement, a usable heap), after dropping any earlier
// claim: every claim_* starts here, so a claim never outlives its op.
bool may_claim(const CollectiveContext& ctx) {
  ctx.state.zero_copy_claim.reset();
  return signature_agreement(ctx) && heap_usable(ctx);
}

std::string claim(const CollectiveContext& ctx, std::vector<int64_t> offsets, std::string text) {
  ctx.state.zero_copy_claim = std::move(offsets);
  return ", zero-copy: " + text;
}

// The largest all-reduce round (elements) whose reduced part of a rank fits behind the header of
// its region, as the staged two-shot's rounds (config.chunk_bytes); 0 when none fits, or when
// zero-copy does not pay: on a host workspace with 2 ranks, where it saves only the staged
// two-shot's in-cache copy-in (docs/zero_copy.md, "The bound"), that all-reduce stages; on 3+
// ranks it reads zero-copy (the runs: docs/measurements/zero-copy-collectives-2026-11-23.md).
int64_t all_reduce_round(const CollectiveContext& ctx, int64_t esize) {
  const int W = ctx.ws.world_size();
  if (W == 2 && host_workspace(ctx)) return 0;
  const int64_t region = phase_bytes(ctx) - kAlign;
  int64_t m = region / esize * W;
  if (ctx.config.chunk_bytes > 0)
    m = std::min(m, std::max<int64_t>(ctx.config.chunk_bytes / esize, W));
  while (m > W && ceil_div(m, W) * esize > region) --m;
  return m <= 0 || ceil_div(m, W) * esize > region ? 0 : m;
}

// Steps 2-4 (exchange) or 2' (signature) of the NOTE: the open phase and every rank's offsets (by
// rank, then input), or nullopt - after the fallback's empty phase (exchange), or having run
// nothing (signature, no claim).
struct Agreed {
  Phase ph;
  std::vector<int64_t> offsets;  // rank q's input i at [q * n + i]
};

// `own_offsets()` gives this rank's inputs' offsets for the exchange; the signature agreement has
// them in its claim already (claim_*), so it does not call it.
template <typename OwnOffsets>
std::optional<Agreed> agree(const CollectiveContext& ctx, OwnOffsets&& own_offsets) {
  if (signature_agreement(ctx)) {
    auto claimed = take_claim(ctx);
    if (!claimed) return std::nullopt;
    Agreed a{begin_phase(ctx), std::move(*claimed)};
    phase_barrier(ctx);  // compares the signatures, which carry the claims (step 2')
    return a;
  }
  const std::vector<int64_t> mine = own_offsets();
  const int W = ctx.ws.world_size();
  const auto n = static_cast<int64_t>(mine.size());
  Agreed a{begin_phase(ctx), {}};
  TORCH_CHECK(n * static_cast<int64_t>(sizeof(int64_t)) <= a.ph.bytes,
              "cuda_p2p: the workspace buffer is too small for ", n, " heap offsets");
  auto* header = a.ph.region[ctx.ws.rank()];
  ctx.ws.device().host_task(ctx.stream, [header, mine] {
    std::memcpy(header, mine.data(), mine.size() * sizeof(int64_t));
  });
  phase_barrier(ctx);
  a.offsets.resize(static_cast<size_t>(W * n));
  bool all = true;
  for (int q = 0; q < W; ++q) {
    std::memcpy(&a.offsets[q * n], a.ph.region[q], n * sizeof(int64_t));
    for (int64_t i = 0; i < n; ++i) all = all && a.offsets[q * n + i] != kNotInHeap;
  }
  if (!all) {
    end_phase(ctx, a.ph);
    return std::nullopt;
  }
  return a;
}

const char* in_heap(const CollectiveContext& ctx, int q, int64_t offset) {
  return static_cast<const char*>(ctx.state.heap->buffer(q)) + offset;
}

c10::SmallVector<int, 8> peers_of(const CollectiveContext& ctx) {
  c10::SmallVector<int, 8> peers;
  for (int q = 0; q < ctx.ws.world_size(); ++q) {
    if (q != ctx.ws.rank()) peers.push_back(q);
  }
  return peers;
}

}  // namespace

int64_t readable_heap_offset(const CollectiveContext& ctx, const void* p, int64_t n) {
  return heap_usable(ctx) ? heap_offset(ctx, p, n) : kNotInHeap;
}

const char* peer_heap(const CollectiveContext& ctx, int q, int64_t offset) {
  TORCH_CHECK(ctx.state.heap != nullptr,
              "cuda_p2p: a peer's input is in its symmetric heap, but this rank has no heap (a "
              "protocol error)");
  return in_heap(ctx, q, offset);
}

std::string claim_all_gather(const CollectiveContext& ctx, const char* input, int64_t bytes,
                             c10::ArrayRef<char*> out) {
  if (!may_claim(ctx) || bytes == 0) return "";
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const int64_t own = heap_offset(ctx, input, bytes);
  if (own == kNotInHeap) return "";
  // In place (all_gather_into_tensor with the input as chunk `me` of a heap output): rank q's
  // input is chunk q of its output.
  bool in_place = input == out[me] && heap_offset(ctx, out[0], W * bytes) != kNotInHeap;
  for (int q = 0; q < W && in_place; ++q) in_place = out[q] == out[0] + q * bytes;
  if (in_place) {
    const int64_t base = own - me * bytes;
    std::vector<int64_t> offsets;
    for (int q = 0; q < W; ++q) offsets.push_back(base + q * bytes);
    return claim(ctx, std::move(offsets),
                 "in place in an output at heap offset " + std::to_string(base));
  }
  return claim(ctx, std::vector<int64_t>(W, own), "input at heap offset " + std::to_string(own));
}

std::string claim_reduce_scatter(const CollectiveContext& ctx, c10::ArrayRef<char*> in,
                                 int64_t bytes) {
  if (!may_claim(ctx) || bytes == 0) return "";
  const int W = ctx.ws.world_size();
  std::vector<int64_t> own;
  bool contiguous = true;
  for (const char* p : in) {
    own.push_back(heap_offset(ctx, p, bytes));
    if (own.back() == kNotInHeap) return "";
    contiguous =
        contiguous && own.back() == own[0] + (static_cast<int64_t>(own.size()) - 1) * bytes;
  }
  std::string text =
      contiguous ? "input at heap offset " + std::to_string(own[0]) : "inputs at heap offsets";
  for (size_t i = 0; !contiguous && i < own.size(); ++i) {
    text += (i ? ", " : " ") + std::to_string(own[i]);
  }
  std::vector<int64_t> offsets;
  for (int q = 0; q < W; ++q) offsets.insert(offsets.end(), own.begin(), own.end());
  return claim(ctx, std::move(offsets), text);
}

std::string claim_all_reduce(const CollectiveContext& ctx, const char* in, int64_t numel,
                             int64_t esize) {
  if (!may_claim(ctx) || numel == 0 || all_reduce_round(ctx, esize) == 0) return "";
  const int64_t own = heap_offset(ctx, in, numel * esize);
  if (own == kNotInHeap) return "";
  return claim(ctx, std::vector<int64_t>(ctx.ws.world_size(), own),
               "input at heap offset " + std::to_string(own));
}

std::string claim_broadcast(const CollectiveContext& ctx, const char* data, int64_t bytes) {
  if (!may_claim(ctx) || bytes == 0 || bytes > round_bytes(ctx, 1)) return "";
  const int64_t own = heap_offset(ctx, data, bytes);
  if (own == kNotInHeap) return "";
  return claim(ctx, std::vector<int64_t>(ctx.ws.world_size(), own),
               "tensor at heap offset " + std::to_string(own));
}

bool all_gather_zero_copy(const CollectiveContext& ctx, const char* input,
                          c10::ArrayRef<int64_t> bytes, c10::ArrayRef<char*> out) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  if (!heap_usable(ctx) || *std::max_element(bytes.begin(), bytes.end()) == 0) return false;
  // A rank with nothing to contribute (all_gather_v) has no input to place: offset 0, never read.
  auto a = agree(ctx, [&] {
    return std::vector<int64_t>{bytes[me] == 0 ? 0 : heap_offset(ctx, input, bytes[me])};
  });
  if (!a) return false;
  // Peers first, then the own shard: the peers' wait for their readers overlaps with that copy.
  for (int s = 1; s < W; ++s) {
    const int q = (me + s) % W;
    if (bytes[q] > 0) copy(ctx, out[q], in_heap(ctx, q, a->offsets[q]), bytes[q]);
  }
  end_phase(ctx, a->ph);
  if (bytes[me] > 0) copy(ctx, out[me], input, bytes[me]);
  wait_readers(ctx, a->ph, peers_of(ctx));
  return true;
}

bool reduce_scatter_zero_copy(const CollectiveContext& ctx, c10::ArrayRef<char*> in, char* out,
                              int64_t numel, at::ScalarType dtype, ReduceOp op) {
  if (!heap_usable(ctx) || numel == 0) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  auto a = agree(ctx, [&] {
    std::vector<int64_t> mine;
    for (const char* p : in) mine.push_back(heap_offset(ctx, p, numel * esize));
    return mine;
  });
  if (!a) return false;
  const int64_t m = std::max<int64_t>(kReducePieceBytes / esize, 1);
  for (int64_t off = 0; off < numel; off += m) {
    const int64_t len = std::min(m, numel - off);
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      const char* p = in_heap(ctx, q, a->offsets[q * W + me]) + off * esize;
      srcs.push_back(view(ctx, const_cast<char*>(p), len, dtype));
    }
    reduce_on_stream(ctx, view(ctx, out + off * esize, len, dtype), std::move(srcs), op, W);
  }
  end_phase(ctx, a->ph);
  wait_readers(ctx, a->ph, peers_of(ctx));
  return true;
}

bool all_reduce_zero_copy(const CollectiveContext& ctx, char* in, char* out, int64_t numel,
                          at::ScalarType dtype, ReduceOp op) {
  if (!heap_usable(ctx) || numel == 0) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  // Rounds of m elements, as the staged two-shot's (config.chunk_bytes), so that a round's
  // reduced chunks are still in the cache when the ranks gather them; each rank's reduced part
  // of a round lands behind the header of its region.
  const int64_t m = all_reduce_round(ctx, esize);
  if (m == 0) return false;
  auto a = agree(ctx, [&] { return std::vector<int64_t>{heap_offset(ctx, in, numel * esize)}; });
  if (!a) return false;
  for (int64_t base = 0; base < numel; base += m) {
    const int64_t len = std::min(m, numel - base);
    // Round 0 runs in the phase of the agreement; later rounds take their own (reuse guard).
    const Phase ph = base == 0 ? a->ph : begin_phase(ctx);
    const auto [b, e] = split_range(len, W, me);
    std::vector<at::Tensor> srcs;
    srcs.reserve(W);
    for (int q = 0; q < W; ++q) {
      const char* p = in_heap(ctx, q, a->offsets[q]) + (base + b) * esize;
      srcs.push_back(view(ctx, const_cast<char*>(p), e - b, dtype));
    }
    reduce_on_stream(ctx, view(ctx, ph.region[me] + kAlign, e - b, dtype), std::move(srcs), op, W);
    // Every rank has read this round of every input and published its reduced part (step 5):
    // only now may the round of the output, which may be the input, be written.
    phase_barrier(ctx);
    for (int s = 0; s < W; ++s) {
      const int q = (me + s) % W;
      const auto [bq, eq] = split_range(len, W, q);
      copy(ctx, out + (base + bq) * esize, ph.region[q] + kAlign, (eq - bq) * esize);
    }
    end_phase(ctx, ph);
  }
  return true;
}

bool broadcast_zero_copy(const CollectiveContext& ctx, char* data, int64_t bytes, int root) {
  if (!heap_usable(ctx) || bytes == 0 || bytes > round_bytes(ctx, 1)) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  c10::SmallVector<int, 8> readers;
  for (int q = 0; q < W; ++q) {
    if (q != root) readers.push_back(q);
  }
  if (signature_agreement(ctx)) {
    const auto claimed = take_claim(ctx);
    if (!claimed) return false;
    // The handshake before this (ops/broadcast.cpp) compared the claims and followed every
    // rank's entry: the root's tensor is final. The phase is for the done words only.
    const Phase ph = begin_phase(ctx);
    if (me != root) copy(ctx, data, in_heap(ctx, root, (*claimed)[root]), bytes);
    end_phase(ctx, ph);
    if (me == root) wait_readers(ctx, ph, readers);
    return true;
  }
  const Phase ph = begin_phase(ctx);
  if (me == root) {
    const int64_t offset = heap_offset(ctx, data, bytes);
    auto* header = ph.region[me];
    ctx.ws.device().host_task(ctx.stream,
                              [header, offset] { std::memcpy(header, &offset, sizeof offset); });
    end_phase(ctx, ph);  // publishes the offset to every rank at once
    if (offset == kNotInHeap) return false;
    // The caller may overwrite its tensor once this returns: not before every reader is done.
    wait_readers(ctx, ph, readers);
  } else {
    wait_phase_ended(ctx, ph, {root}, "broadcast: waiting for the root");
    int64_t offset = kNotInHeap;
    std::memcpy(&offset, ph.region[root], sizeof offset);
    if (offset != kNotInHeap) copy(ctx, data, in_heap(ctx, root, offset), bytes);
    end_phase(ctx, ph);
    if (offset == kNotInHeap) return false;
  }
  return true;
}

}  // namespace cuda_p2p::ops::detail
