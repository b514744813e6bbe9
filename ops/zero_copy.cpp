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
// staging buffer disappears. The protocol is the one of NOTE [Copy-free reads] in
// ops/collectives.cpp, with heap offsets instead of addresses and a memcpy instead of a system
// call:
//
//   1. Whether to try is decided from what every rank knows alike: the group has a heap (it is
//      created collectively, by the first cuda_p2p.empty, at the same point of every rank's op
//      sequence), the workspace is on the host (CUDA: below), and the sizes (all-reduce:
//      two-shot). Groups without a heap never get here: they pay nothing.
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
//   5. Else the readers read peers' inputs from their heap mappings, and no rank may return - its
//      caller may overwrite its input - before every peer finished reading it: all-gather and
//      reduce-scatter end the phase and wait for their readers' done words (wait_readers, which
//      also satisfies the next phase's reuse guard); all-reduce, in rounds like the staged
//      two-shot, reduces its part of a round into its region, passes a barrier (every rank has
//      read that round of every input, the reduced parts are published) and only then writes
//      that round of its output, which may be its input; later rounds read other bytes of the
//      inputs, final since the first barrier, and each takes a phase of its own.
//
// Broadcast has a single input, the root's, so the root alone decides (broadcast_zero_copy): it
// publishes its offset (or -1) with the end of a phase, as the staged broadcast publishes a
// round; the others read it, then the tensor from the root's heap, or fall back with the root.
// Only a tensor that fits one round of the staged broadcast goes zero-copy: beyond that the
// staged rounds overlap the root's copy-in with the readers' copy-out, every core working, while
// zero-copy leaves the root idle - measured 1.1-1.3x slower than staged at 4-16 MiB on 2 ranks,
// 0.6-0.9x at 64 KiB-1 MiB (docs/collectives.md, "Zero-copy symmetric tensors").
//
// The reductions use the staged path's kernel in rank order, so each element gets the bits the
// staged direct reduce-scatter and two-shot all-reduce compute, and every rank the same bits.
//
// Host only. A CUDA group has a heap too (cuda_p2p.empty, use_symmetric_memory's MemPool), but
// heap_usable is false there and its collectives stage heap inputs like any other: step 4 is a
// decision the host takes by reading the W headers right after enqueueing the barrier (and each
// header is written by a host memcpy in a host task). On the host the barrier has run by then
// (the caller's stream runs inline); on a GPU it is only enqueued, the headers are device memory
// (which neither memcpy may touch), and the host would read them before the peers wrote them -
// unless it synchronised the stream on every op, the cost the workspace exists to avoid. A CUDA
// version needs an agreement the host does not wait for: either a device-side one (a kernel reads
// the offsets after the barrier and copies or reduces from each peer's heap or buffer - a
// data-dependent source, so not cudaMemcpyAsync on the copy engine, whose pointers are fixed when
// it is enqueued), or offsets every rank knows before it enqueues anything, e.g. carried in the op
// signature as "my input is at offset o of my heap" and required equal (NOTE [Op signatures]; on
// CUDA a disagreement surfaces only after the op ran, so a mismatch would be an error, not a
// fallback). Neither is written.

namespace {

constexpr int64_t kNotInHeap = -1;
// Elements per reduction call: the sources and the destination of a piece stay in the cache.
constexpr int64_t kReducePieceBytes = 256 << 10;

bool heap_usable(const CollectiveContext& ctx) {
  return ctx.state.heap != nullptr && ctx.ws.world_size() > 1 &&
         ctx.ws.device().tensor_device().is_cpu();
}

// [p, p + n) inside this rank's heap: its offset, else kNotInHeap.
int64_t heap_offset(const CollectiveContext& ctx, const void* p, int64_t n) {
  const auto* base = static_cast<const char*>(ctx.state.heap->buffer(ctx.ws.rank()));
  const auto* c = static_cast<const char*>(p);
  if (c < base || c + n > base + ctx.state.heap->buffer_size()) return kNotInHeap;
  return c - base;
}

// Steps 2-4 of the NOTE: the open phase and every rank's offsets (by rank, then input), or
// nullopt after the fallback's empty phase.
struct Agreed {
  Phase ph;
  std::vector<int64_t> offsets;  // rank q's input i at [q * n + i]
};

std::optional<Agreed> agree(const CollectiveContext& ctx, const std::vector<int64_t>& mine) {
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

bool all_gather_zero_copy(const CollectiveContext& ctx, const char* input,
                          c10::ArrayRef<int64_t> bytes, c10::ArrayRef<char*> out) {
  ctx.state.last_zero_copy = false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  if (!heap_usable(ctx) || *std::max_element(bytes.begin(), bytes.end()) == 0) return false;
  // A rank with nothing to contribute (all_gather_v) has no input to place: offset 0, never read.
  auto a = agree(ctx, {bytes[me] == 0 ? 0 : heap_offset(ctx, input, bytes[me])});
  if (!a) return false;
  // Peers first, then the own shard: the peers' wait for their readers overlaps with that copy.
  for (int s = 1; s < W; ++s) {
    const int q = (me + s) % W;
    if (bytes[q] > 0) copy(ctx, out[q], in_heap(ctx, q, a->offsets[q]), bytes[q]);
  }
  end_phase(ctx, a->ph);
  if (bytes[me] > 0) copy(ctx, out[me], input, bytes[me]);
  wait_readers(ctx, a->ph, peers_of(ctx));
  ctx.state.last_zero_copy = true;
  return true;
}

bool reduce_scatter_zero_copy(const CollectiveContext& ctx, c10::ArrayRef<char*> in, char* out,
                              int64_t numel, at::ScalarType dtype, ReduceOp op) {
  ctx.state.last_zero_copy = false;
  if (!heap_usable(ctx) || numel == 0) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int64_t> mine;
  for (const char* p : in) mine.push_back(heap_offset(ctx, p, numel * esize));
  auto a = agree(ctx, mine);
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
  ctx.state.last_zero_copy = true;
  return true;
}

bool all_reduce_zero_copy(const CollectiveContext& ctx, char* in, char* out, int64_t numel,
                          at::ScalarType dtype, ReduceOp op) {
  ctx.state.last_zero_copy = false;
  if (!heap_usable(ctx) || numel == 0) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  // Rounds of m elements, as the staged two-shot's (config.chunk_bytes), so that a round's
  // reduced chunks are still in the cache when the ranks gather them; each rank's reduced part
  // of a round lands behind the header of its region.
  const int64_t region = phase_bytes(ctx) - kAlign;
  int64_t m = region / esize * W;
  if (ctx.config.chunk_bytes > 0)
    m = std::min(m, std::max<int64_t>(ctx.config.chunk_bytes / esize, W));
  while (m > W && ceil_div(m, W) * esize > region) --m;
  if (m <= 0 || ceil_div(m, W) * esize > region) return false;
  auto a = agree(ctx, {heap_offset(ctx, in, numel * esize)});
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
  ctx.state.last_zero_copy = true;
  return true;
}

bool broadcast_zero_copy(const CollectiveContext& ctx, char* data, int64_t bytes, int root) {
  ctx.state.last_zero_copy = false;
  if (!heap_usable(ctx) || bytes == 0 || bytes > round_bytes(ctx, 1)) return false;
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const Phase ph = begin_phase(ctx);
  if (me == root) {
    const int64_t offset = heap_offset(ctx, data, bytes);
    auto* header = ph.region[me];
    ctx.ws.device().host_task(ctx.stream,
                              [header, offset] { std::memcpy(header, &offset, sizeof offset); });
    end_phase(ctx, ph);  // publishes the offset to every rank at once
    if (offset == kNotInHeap) return false;
    c10::SmallVector<int, 8> readers;
    for (int q = 0; q < W; ++q) {
      if (q != root) readers.push_back(q);
    }
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
  ctx.state.last_zero_copy = true;
  return true;
}

}  // namespace cuda_p2p::ops::detail
