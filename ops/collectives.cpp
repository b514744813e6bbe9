// Configuration, automatic choice, phases and the barrier of the workspace collectives.
#include "ops/collectives.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>

#include "ops/collective_detail.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p::ops {

// NOTE [Collective phases]
// A collective runs as one or more phases ("rounds" when a payload is larger than a region).
// Phase p uses half p % 2 of every rank's buffer. In a phase every rank
//  1. writes what it shares into its own region (ranks only write their own buffer and pull from
//     their peers');
//  2. publishes it: a barrier on the collective channel when every rank reads every region
//     (direct algorithms), the root's done words (broadcast, below), a signal to the neighbour
//     that pulls next (rings);
//  3. reads the regions it needs and writes its output;
//  4. ends the phase by storing the phase's number + 1 in its "done" word.
// Invariants:
//  - reuse: before a rank writes half h in phase p, every peer has finished phase p-2, the
//    previous use of h: begin_phase waits for every peer's done word to reach p-1. That wait is
//    almost always satisfied on arrival (a few loads, no sleep); nothing waits for its readers at
//    the end of an op, and the next collective (on the other half) starts at once;
//  - publication orders reads after writes within a phase only: broadcast needs the root alone,
//    a ring step its neighbour alone (a full barrier would make every rank wait for the slowest:
//    with 4 ranks on 2 cores, for ranks that are not even running);
//  - every wait polls the waiter's own pad, never a peer's memory (a GPU stream wait on a peer's
//    memory would poll across the interconnect): a rank ending a phase stores the new count into
//    its done slot in every peer's pad (NOTE [Signal pad layout] in p2p_workspace/pad_layout.hpp);
//  - the phase counter advances identically on every rank: the number of phases depends on sizes
//    every rank knows (all_gather_v: the largest contribution), which every collective first
//    checks that the ranks agree on (NOTE [Op signatures] in ops/op_signature.cpp; on a
//    disagreement each rank ends exactly one phase and raises); it restarts at 0 with a new
//    buffer (growth), whose words start at 0 and which nobody reads yet;
//  - broadcast publishes with the root's done words themselves: the root reads nothing, so it
//    ends the phase once it has staged, and its stores (one per peer, each with its futex wake)
//    tell the others the round is there; they wait for the root's done word to reach phase + 1,
//    which also satisfies the root's part of everybody's reuse guard;
//  - other users of the buffer (get_p2p_buffer, the fused pipelines) pass a barrier, on any
//    channel but after the collective in stream order, before they write where a collective may
//    still be read; a collective's first write follows the end of whatever ran before it in
//    stream order, and the fused pipelines end with a barrier.

// NOTE [Cross-memory reads]
// Where the workspace offers reads of peers' private memory (the host's process_vm_readv, probed
// at rendezvous: NOTE [Cross-memory probe]), the direct all-gather, the direct reduce-scatter and
// broadcast read a peer's *input tensor* straight into their output (reduce-scatter: into a small
// local piece that is reduced at once) instead of having the peer stage it in its buffer first:
// one copy per byte instead of two (all-gather on 2 ranks: 2 instead of 3 with the own shard).
// The payload then takes a single phase, whatever its size:
//
//   1. begin_phase (the reuse guard), then the rank writes the addresses of its inputs into the
//      first words of its region of the phase (the "header"), in stream order;
//   2. publication as in NOTE [Collective phases]: the phase barrier (all-gather,
//      reduce-scatter), the root's done word (broadcast). The release store of that word orders
//      both the header and the input's contents (written before the call, in program order)
//      before the reader's acquire; the reader loads the address when its read runs, after the
//      wait;
//   3. the readers read the peers' inputs and end the phase (done word = phase + 1) once every
//      read has returned;
//   4. unlike the staged algorithms, an owner must not return before its readers are done: the
//      caller may overwrite or free its input right after. So each rank whose input is read
//      waits, last, until every reader's done word has reached phase + 1 (wait_readers). Since
//      that is the very value the next phase's reuse guard needs, that guard is then free.
//
// A rank's header is covered by the reuse guard like any staged bytes (its readers of phase p-2
// loaded the addresses before ending phase p-2). Every rank decides to read directly from the
// payload size, the config and the workspace's agreed verdict, so all take the same path and the
// phase counts match. The reduce-scatter reduces in rank order with the same kernel as the
// staged path, so the bits do not depend on the path. A failing read (the peer died, the kernel
// refuses) throws; the backend then refuses further collectives, as for any failure midway.

namespace {

constexpr NamedValue<AllGatherAlgo> kAllGatherNames[] = {{AllGatherAlgo::kAuto, "auto"},
                                                         {AllGatherAlgo::kDirect, "direct"},
                                                         {AllGatherAlgo::kRing, "ring"}};
constexpr NamedValue<ReduceScatterAlgo> kReduceScatterNames[] = {
    {ReduceScatterAlgo::kAuto, "auto"},
    {ReduceScatterAlgo::kDirect, "direct"},
    {ReduceScatterAlgo::kRing, "ring"}};
constexpr NamedValue<AllReduceAlgo> kAllReduceNames[] = {{AllReduceAlgo::kAuto, "auto"},
                                                         {AllReduceAlgo::kOneShot, "one_shot"},
                                                         {AllReduceAlgo::kTwoShot, "two_shot"}};
constexpr NamedValue<AllReduceRounds> kAllReduceRoundsNames[] = {
    {AllReduceRounds::kAuto, "auto"},
    {AllReduceRounds::kChunked, "chunked"},
    {AllReduceRounds::kLarge, "large"}};

}  // namespace

const char* to_string(AllGatherAlgo a) { return name_of(kAllGatherNames, a); }
const char* to_string(ReduceScatterAlgo a) { return name_of(kReduceScatterNames, a); }
const char* to_string(AllReduceAlgo a) { return name_of(kAllReduceNames, a); }
const char* to_string(AllReduceRounds r) { return name_of(kAllReduceRoundsNames, r); }

AllGatherAlgo parse_all_gather_algo(const std::string& name, const std::string& what) {
  return parse_named(kAllGatherNames, name, what);
}
ReduceScatterAlgo parse_reduce_scatter_algo(const std::string& name, const std::string& what) {
  return parse_named(kReduceScatterNames, name, what);
}
AllReduceAlgo parse_all_reduce_algo(const std::string& name, const std::string& what) {
  return parse_named(kAllReduceNames, name, what);
}
AllReduceRounds parse_all_reduce_rounds(const std::string& name, const std::string& what) {
  return parse_named(kAllReduceRoundsNames, name, what);
}

void validate(const CollectiveConfig& config, int world_size) {
  TORCH_CHECK(config.ring_steps >= 0 && config.ring_steps % world_size == 0,
              "cuda_p2p: ring_steps (Options.ring_steps or CUDA_P2P_RING_STEPS) must be 0 (the "
              "world size) or a positive multiple of the world size ",
              world_size, ", got ", config.ring_steps);
  TORCH_CHECK(config.chunk_bytes >= 0,
              "cuda_p2p: chunk_bytes (Options.chunk_bytes or CUDA_P2P_CHUNK_BYTES) must be >= 0 "
              "(0: half the buffer), got ",
              config.chunk_bytes);
  TORCH_CHECK(config.all_reduce_one_shot_max_bytes >= 0 && config.all_gather_ring_max_bytes >= 0 &&
                  config.reduce_scatter_ring_max_bytes >= 0 && config.cross_memory_min_bytes >= 0,
              "cuda_p2p: algorithm thresholds must be >= 0 bytes");
}

bool uses_cross_memory_reads(const CollectiveConfig& config, int64_t payload_bytes,
                             bool cross_memory_reads) {
  return cross_memory_reads && payload_bytes >= config.cross_memory_min_bytes;
}

AllGatherAlgo select_all_gather(const CollectiveConfig& config, int64_t output_bytes,
                                int world_size, bool cross_memory_reads) {
  if (config.all_gather != AllGatherAlgo::kAuto) return config.all_gather;
  // One copy per byte instead of two or three: nothing beats it from there on.
  if (uses_cross_memory_reads(config, output_bytes, cross_memory_reads))
    return AllGatherAlgo::kDirect;
  if (world_size > 2 && output_bytes <= config.all_gather_ring_max_bytes) {
    return AllGatherAlgo::kRing;
  }
  return AllGatherAlgo::kDirect;
}

ReduceScatterAlgo select_reduce_scatter(const CollectiveConfig& config, int64_t input_bytes,
                                        int world_size, bool cross_memory_reads) {
  if (config.reduce_scatter != ReduceScatterAlgo::kAuto) return config.reduce_scatter;
  if (uses_cross_memory_reads(config, input_bytes, cross_memory_reads))
    return ReduceScatterAlgo::kDirect;
  if (world_size > 1 && input_bytes <= config.reduce_scatter_ring_max_bytes) {
    return ReduceScatterAlgo::kRing;
  }
  return ReduceScatterAlgo::kDirect;
}

AllReduceAlgo select_all_reduce(const CollectiveConfig& config, int64_t bytes, int world_size) {
  if (config.all_reduce != AllReduceAlgo::kAuto) return config.all_reduce;
  if (world_size == 1 || bytes <= config.all_reduce_one_shot_max_bytes) {
    return AllReduceAlgo::kOneShot;
  }
  return AllReduceAlgo::kTwoShot;
}

Outcome barrier(const CollectiveContext& ctx, std::optional<Millis> timeout) {
  const Outcome outcome{.algorithm = "workspace"};
  if (ctx.ws.world_size() == 1) return outcome;
  if (ctx.ws.capturing(ctx.stream)) {  // NOTE [Replay-safe signals]: no signature
    ctx.ws.barrier(ctx.stream, ctx.channel, timeout);
    return outcome;
  }
  const OpSignature sig = OpSignature::of(OpId::kBarrier, "");
  publish_signature(ctx.ws, ctx.stream, ctx.channel, ctx.state.signature, sig);
  ctx.ws.barrier(ctx.stream, ctx.channel, timeout);
  const std::string error =
      compare_signatures(ctx.ws, ctx.stream, ctx.channel, ctx.state.signature, sig);
  if (!error.empty()) {
    // As detail::handshake does: one empty phase, as the peers that ran a collective end one.
    detail::end_phase(ctx, detail::begin_phase(ctx));
    throw SignatureMismatch(error);
  }
  return outcome;
}

void reject(const CollectiveContext& ctx, OpId kind, const std::string& reason) {
  if (ctx.ws.world_size() == 1) return;
  const detail::CaptureBracket bracket(ctx);  // under capture: opened, and closed, as any op
  detail::expect_signature(ctx, OpSignature::rejected(kind, reason));
  detail::handshake(ctx);
}

void announce(const CollectiveContext& ctx, OpId kind, const std::string& text) {
  if (ctx.ws.world_size() == 1) return;
  const detail::CaptureBracket bracket(ctx);
  detail::expect_signature(ctx, OpSignature::of(kind, text));
  detail::handshake(ctx);
}

namespace detail {

int64_t phase_bytes(const CollectiveContext& ctx) {
  return align_down(ctx.ws.buffer_size() / 2, kAlign);
}

int64_t round_bytes(const CollectiveContext& ctx, int64_t unit, int64_t slots) {
  int64_t bytes = phase_bytes(ctx) / slots;
  if (ctx.config.chunk_bytes > 0) bytes = std::min(bytes, ctx.config.chunk_bytes);
  // A multiple of the cache line when a unit fits several times, else of the unit.
  const int64_t aligned = align_down(bytes, std::lcm(unit, kAlign));
  bytes = aligned > 0 ? aligned : align_down(bytes, unit);
  TORCH_CHECK(bytes >= unit, "cuda_p2p: the workspace buffer (", ctx.ws.buffer_size(),
              " bytes) is too small for ", slots, " slots of ", unit,
              "-byte elements per phase; grow it with ensure_min_buffer_size");
  return bytes;
}

CaptureBracket::CaptureBracket(const CollectiveContext& ctx)
    : ctx_(ctx),
      active_(ctx.ws.world_size() > 1 && ctx.ws.capturing(ctx.stream)),
      exceptions_(std::uncaught_exceptions()) {}

CaptureBracket::~CaptureBracket() {
  if (!active_) return;
  if (std::uncaught_exceptions() > exceptions_) {
    // Nothing more is enqueued for an op that raised; what it opened is forgotten, so that the
    // capture's next barrier-only op opens for itself (NOTE [Graph flags]).
    try {
      ctx_.ws.graph_abandon(ctx_.stream);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the exception in flight is the one to report
    }
    return;
  }
  try {
    // Nothing after an op run as one kernel, which opened nothing.
    ctx_.ws.graph_close(ctx_.stream, ctx_.channel, "collective");
  } catch (...) {
    // Enqueueing failed (a failed device): the group's next call raises that failure.
  }
}

bool cross_memory_reads(const CollectiveContext& ctx) {
  return ctx.ws.cross_memory_reads() && !ctx.ws.capturing(ctx.stream);
}

Phase begin_phase(const CollectiveContext& ctx) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  if (ctx.ws.capturing(ctx.stream)) {
    // NOTE [Replay-safe signals]: the eager phase count is left alone; one half of the buffer,
    // guarded by the graph done words.
    Phase p;
    p.graph = true;
    p.bytes = phase_bytes(ctx);
    for (int r = 0; r < W; ++r) p.region.push_back(static_cast<char*>(ctx.ws.buffer(r)));
    ctx.ws.graph_phase_begin(ctx.stream, ctx.channel, "collective phase");
    return p;
  }
  Phase p;
  void* const mine = ctx.ws.buffer(me);
  if (ctx.state.buffer != mine) {  // a new workspace (growth): nobody reads it yet
    ctx.state.buffer = mine;
    ctx.state.phase = 0;
  }
  p.index = ctx.state.phase++;
  p.bytes = phase_bytes(ctx);
  const int64_t offset = static_cast<int64_t>(p.index % 2) * p.bytes;
  for (int r = 0; r < W; ++r) p.region.push_back(static_cast<char*>(ctx.ws.buffer(r)) + offset);
  if (p.index >= 2) {
    std::vector<SignalWait> waits;
    waits.reserve(W - 1);
    const uint32_t want = static_cast<uint32_t>(p.index - 1);  // peers finished phase index-2
    for (int r = 0; r < W; ++r) {
      if (r != me) waits.push_back({ctx.ws.done_slot(me, ctx.channel, r), want, r});
    }
    // NOTE [Inline signals] in p2p_workspace/device.hpp: on a stream that runs inline the guard,
    // usually long satisfied, is polled first; only a wait that goes on builds its context.
    Device& dev = ctx.ws.device();
    HostPaths* host = inline_paths(dev, ctx.stream);
    if (host == nullptr || !host->poll_signals_now(waits)) {
      dev.wait_signals(ctx.stream, std::move(waits), ctx.ws.timeout(),
                       "collective buffer reuse guard (rank " + std::to_string(me) + ", phase " +
                           std::to_string(p.index) + ")");
    }
  }
  return p;
}

namespace {

void end_phase_index(const CollectiveContext& ctx, uint64_t index) {
  const int W = ctx.ws.world_size(), me = ctx.ws.rank();
  const auto value = static_cast<uint32_t>(index + 1);
  // Starting with the next rank, so that the ranks do not all store into rank 0's pad first.
  for (int s = 1; s < W; ++s) {
    const int r = (me + s) % W;
    ctx.ws.device().write_signal(ctx.stream, ctx.ws.done_slot(r, ctx.channel, me), value);
  }
}

// After a disagreement at the op's first phase barrier (phase open) or at its own handshake
// (none open): every rank ends exactly one phase, so that the phase counts, the done words and
// the halves stay in step (NOTE [Op signatures]).
[[noreturn]] void settle_and_raise(const CollectiveContext& ctx, bool phase_open,
                                   const std::string& error) {
  if (phase_open) {
    end_phase_index(ctx, ctx.state.phase - 1);
  } else {
    end_phase(ctx, begin_phase(ctx));
  }
  throw SignatureMismatch(error);
}

}  // namespace

void end_phase(const CollectiveContext& ctx, const Phase& ph) {
  if (ph.graph) {
    ctx.ws.graph_phase_end(ctx.stream, ctx.channel);
    return;
  }
  end_phase_index(ctx, ph.index);
}

void phase_barrier(const CollectiveContext& ctx) {
  if (ctx.ws.capturing(ctx.stream)) {  // NOTE [Replay-safe signals]: no signature
    ctx.state.pending.reset();
    ctx.ws.barrier(ctx.stream, ctx.channel);
    return;
  }
  if (!ctx.state.pending) {
    ctx.ws.barrier(ctx.stream, ctx.channel);
    return;
  }
  const OpSignature sig = std::move(*ctx.state.pending);
  ctx.state.pending.reset();
  publish_signature(ctx.ws, ctx.stream, ctx.channel, ctx.state.signature, sig);
  ctx.ws.barrier(ctx.stream, ctx.channel);
  const std::string error =
      compare_signatures(ctx.ws, ctx.stream, ctx.channel, ctx.state.signature, sig);
  if (!error.empty()) settle_and_raise(ctx, /*phase_open=*/true, error);
}

void expect_signature(const CollectiveContext& ctx, OpSignature sig) {
  if (ctx.ws.world_size() == 1) return;
  if (ctx.ws.capturing(ctx.stream)) {
    // NOTE [Replay-safe signals]: nothing to compare; the op's open (NOTE [Graph flags]) checks
    // its tag, the signature's hash, at every flag barrier instead.
    ctx.state.pending.reset();
    ctx.ws.graph_open(ctx.stream, ctx.channel, graph_tag(sig),
                      std::string(name(sig.kind)) + " on channel " + std::to_string(ctx.channel));
    return;
  }
  ctx.state.pending = std::move(sig);
}

void staged_only(const CollectiveContext& ctx) { ctx.state.zero_copy_claim.reset(); }

int64_t check_rooted(const CollectiveContext& ctx, const char* op, int root, const at::Tensor& mine,
                     const char* mine_name, const std::vector<at::Tensor>& at_root,
                     const char* root_name) {
  const int W = ctx.ws.world_size();
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p ", op, ": root must be in [0, ", W, "), got ", root);
  TORCH_CHECK(mine.is_contiguous(), "cuda_p2p ", op, ": expected a contiguous ", mine_name);
  const int64_t bytes = static_cast<int64_t>(mine.nbytes());
  if (ctx.ws.rank() != root) return bytes;
  TORCH_CHECK(static_cast<int>(at_root.size()) == W, "cuda_p2p ", op, ": expected ", W, " ",
              root_name, "s on the root (one per rank), got ", at_root.size());
  for (const auto& t : at_root) {
    TORCH_CHECK(static_cast<int64_t>(t.nbytes()) == bytes && t.is_contiguous(), "cuda_p2p ", op,
                ": every ", root_name, " must be contiguous with the ", mine_name, "'s ", bytes,
                " bytes, got ", t.nbytes());
  }
  return bytes;
}

void handshake(const CollectiveContext& ctx) {
  if (!ctx.state.pending) return;
  if (ctx.ws.capturing(ctx.stream)) {  // NOTE [Replay-safe signals]: nothing to compare
    const bool invalid = ctx.state.pending->invalid;
    ctx.state.pending.reset();
    if (invalid) end_phase(ctx, begin_phase(ctx));  // as its peers do; the caller raises
    return;
  }
  const OpSignature sig = std::move(*ctx.state.pending);
  ctx.state.pending.reset();
  const std::string error =
      ops::handshake(ctx.ws, ctx.stream, ctx.channel, ctx.state.signature, sig);
  if (!error.empty()) settle_and_raise(ctx, /*phase_open=*/false, error);
  if (sig.invalid) end_phase(ctx, begin_phase(ctx));  // as its peers do; the caller raises
}

std::string config_suffix(const CollectiveContext& ctx) {
  std::string s;
  if (ctx.config.chunk_bytes != CollectiveConfig::kDefaultChunkBytes) {
    s = ", chunk_bytes " + std::to_string(ctx.config.chunk_bytes);
  }
  // Ranks that agree on zero-copy differently run different phases (NOTE [Zero-copy
  // collectives]): named when a rank of a group with a heap chose other than its device's default.
  if (ctx.state.heap != nullptr) {
    const std::string zc =
        agreement_text(ctx.config.zero_copy_agreement, ctx.ws.device().host_synchronous());
    if (!zc.empty()) s += ", " + zc;
  }
  return s;
}
void signal(const CollectiveContext& ctx, int peer) {
  ctx.ws.put_signal(ctx.stream, peer, ctx.channel);
}
void wait(const CollectiveContext& ctx, int peer) {
  ctx.ws.wait_signal(ctx.stream, peer, ctx.channel);
}

void publish_addresses(const CollectiveContext& ctx, const Phase& ph,
                       c10::ArrayRef<const void*> ptrs) {
  // In stream order, like the staging copies it replaces (NOTE [Cross-memory reads], step 1).
  auto* header = reinterpret_cast<uint64_t*>(ph.region[ctx.ws.rank()]);
  TORCH_CHECK(static_cast<int64_t>(ptrs.size() * sizeof(uint64_t)) <= ph.bytes,
              "cuda_p2p: the workspace buffer is too small for ", ptrs.size(), " addresses");
  std::vector<uint64_t> values;
  values.reserve(ptrs.size());
  for (const void* p : ptrs) values.push_back(reinterpret_cast<uint64_t>(p));
  ctx.ws.device().host_task(ctx.stream, [header, values = std::move(values)] {
    std::memcpy(header, values.data(), values.size() * sizeof(uint64_t));
  });
}

void read_input_cross_memory(const CollectiveContext& ctx, void* dst, const Phase& ph, int peer,
                             int index, int64_t offset, int64_t n) {
  if (n <= 0) return;
  const auto* word = reinterpret_cast<const uint64_t*>(ph.region[peer]) + index;
  ctx.ws.cross_memory_read(ctx.stream, dst, peer, word, offset, static_cast<size_t>(n));
}

void wait_phase_ended(const CollectiveContext& ctx, const Phase& ph, c10::ArrayRef<int> ranks,
                      const char* why) {
  if (ph.graph) {
    ctx.ws.graph_wait_phase_ended(ctx.stream, ctx.channel, ranks, why);
    return;
  }
  std::vector<SignalWait> waits;
  waits.reserve(ranks.size());
  const uint32_t want = static_cast<uint32_t>(ph.index + 1);
  for (int r : ranks) waits.push_back({ctx.ws.done_slot(ctx.ws.rank(), ctx.channel, r), want, r});
  if (waits.empty()) return;
  ctx.ws.device().wait_signals(ctx.stream, std::move(waits), ctx.ws.timeout(),
                               std::string(why) + " (rank " + std::to_string(ctx.ws.rank()) +
                                   ", phase " + std::to_string(ph.index) + ")");
}

void wait_readers(const CollectiveContext& ctx, const Phase& ph, c10::ArrayRef<int> readers) {
  wait_phase_ended(ctx, ph, readers, "cross-memory read guard: readers of this rank's input");
}

// NOTE [Intra-op threads]
// A rank with several cores of its own (torch.set_num_threads(N), ATen's intra-op pool, one per
// process) would otherwise stage and reduce on one of them. On the host, a copy or reduction of a
// workspace collective of at least config.parallel_min_bytes is split into one piece per thread
// with at::parallel_for, run from the stream's closure (the caller's thread or the stream's
// worker: ATen's pool serves any thread; inside a parallel region it runs serially). Pieces are
// element ranges and each element is reduced alone, sources in the same order, so the bits are
// those of one thread. With one thread per rank (the default: ranks sharing cores) nothing
// changes: not a closure more, not a branch of the kernel. Below the threshold the pool's wake-up
// costs more than the second core gains (bench/bench_collectives.py --threads; docs/collectives.md,
// "Intra-op threads"). CUDA copies are the copy engine's.
void copy(const CollectiveContext& ctx, void* dst, const void* src, int64_t n) {
  if (n <= 0 || dst == src) return;
  const int64_t grain = ctx.ws.device().host_paths() != nullptr
                            ? parallel_grain(n, 1, ctx.config.parallel_min_bytes)
                            : 0;
  if (grain > 0) {
    ctx.ws.device().launch(ctx.stream, [dst, src, n, grain, splits = ctx.state.parallel_splits] {
      at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
        std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b,
                    static_cast<size_t>(e - b));
      });
      splits->fetch_add(1, std::memory_order_relaxed);
    });
    return;
  }
  ctx.ws.device().copy(ctx.stream, dst, src, static_cast<size_t>(n));
}

at::Tensor view(const CollectiveContext& ctx, void* ptr, int64_t numel, at::ScalarType dtype) {
  // The device is given, not derived from `ptr`: for a peer's IPC mapping the CUDA runtime names
  // the peer's GPU (cudaPointerGetAttributes), not the one this rank computes on.
  const at::Device device = ctx.ws.device().tensor_device();
  return at::for_blob(ptr, {numel})
      .options(at::TensorOptions().dtype(dtype).device(device))
      .target_device(device)
      .make_tensor();
}

void reduce_on_stream(const CollectiveContext& ctx, at::Tensor dst, std::vector<at::Tensor> srcs,
                      ReduceOp op, int64_t divisor, at::Tensor also) {
  if (dst.numel() == 0) return;
  // One source in place: nothing to do (a rank alone; AVG over one rank divides by one).
  if (srcs.size() == 1 && !also.defined() && srcs[0].data_ptr() == dst.data_ptr() &&
      srcs[0].scalar_type() == dst.scalar_type() && (op != ReduceOp::kAvg || divisor == 1)) {
    return;
  }
  // NOTE [Captured scratch]
  // A captured op must address only memory that lives as long as its graph: a replay runs the
  // kernels with the addresses they were captured with. The group's scratch is not such memory
  // (a later, larger eager op frees and reallocates it), so under capture a reduction that needs
  // an accumulator in memory (the ATen fallback; the CUDA kernel and the host kernel keep theirs
  // in registers) takes a fresh one, allocated during the capture: from the graph's own pool on
  // CUDA, owned by the graph; on the host at each replay.
  const bool captured = ctx.ws.capturing(ctx.stream);
  at::Tensor* scratch = captured ? nullptr : &ctx.state.scratch;
  ctx.ws.device().launch(
      ctx.stream,
      [dst = std::move(dst), srcs = std::move(srcs), op, divisor, scratch, also = std::move(also),
       min = ctx.config.parallel_min_bytes, splits = ctx.state.parallel_splits] {
        at::Tensor fresh;
        // NOTE [Intra-op threads]
        if (reduce(dst, srcs, op, divisor, scratch ? *scratch : fresh, also, min)) {
          splits->fetch_add(1, std::memory_order_relaxed);
        }
      });
  // The scratch outlives this op and the next one may run on another stream: the caching
  // allocator must not hand it out again before this stream's use (NOTE [Pipeline
  // temporaries] in ops/pipeline_common.hpp). On CUDA the closure ran already; a host closure
  // reaches the scratch through the group's state, which holds it.
  if (!captured && ctx.ws.device().host_paths() == nullptr) {
    ctx.ws.device().record_stream(ctx.state.scratch, ctx.stream);
  }
}

}  // namespace detail
}  // namespace cuda_p2p::ops
