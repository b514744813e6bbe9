// Intra-node collectives on the symmetric workspace (docs/collectives.md).
//
// Every algorithm is written once against the device interface (p2p_workspace/device.hpp):
// Device::copy moves data (memcpy on the host, the copy engine on CUDA), Device::launch runs the
// reductions (ATen or the vectorised host kernel of ops/reduction.cpp), and the workspace's
// put_signal / wait_signal / barrier on one channel order the ranks. One file per family:
//
//   all_gather.cpp      direct, ring
//   all_gather_v.cpp    a different number of bytes per rank (direct)
//   all_to_all.cpp      all-to-all with any split sizes, also unknown to the receiver (direct)
//   reduce_scatter.cpp  direct, ring in S steps
//   all_reduce.cpp      one-shot, two-shot
//   broadcast.cpp       direct
//   gather.cpp          direct (the others publish with their done words, the root pulls)
//   scatter.cpp         direct (the root publishes a slot per rank with its done word)
//   reduce.cpp          direct (gather's protocol; the root reduces the rounds in rank order)
//   collectives.cpp     configuration, automatic choice, phases, barrier
//
// Every entry point is collective over the workspace's ranks: each rank calls it with the same
// algorithm and sizes, in the same order relative to the other collectives of the group.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/common.hpp"
#include "ops/op_signature.hpp"
#include "ops/outcome.hpp"
#include "ops/round_policy.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p::ops {

// --- algorithms ---------------------------------------------------------------------------------
// kAuto picks by size (thresholds in CollectiveConfig; the runs:
// docs/measurements/collectives-thresholds.md).
enum class AllGatherAlgo : uint8_t { kAuto, kDirect, kRing };
enum class ReduceScatterAlgo : uint8_t { kAuto, kDirect, kRing };
enum class AllReduceAlgo : uint8_t { kAuto, kOneShot, kTwoShot };
// The rounds of a large two-shot all-reduce on a host workspace (NOTE [Rounds chosen by rank 0]
// in ops/all_reduce.cpp): kAuto lets rank 0 choose between chunk_bytes rounds and the largest the
// buffer holds, kLarge makes it always choose the latter, kChunked keeps chunk_bytes rounds.
enum class AllReduceRounds : uint8_t { kAuto, kChunked, kLarge };

// Names as used by options, environment variables and counters: "auto", "direct", "ring",
// "one_shot", "two_shot".
const char* to_string(AllGatherAlgo a);
const char* to_string(ReduceScatterAlgo a);
const char* to_string(AllReduceAlgo a);
const char* to_string(AllReduceRounds r);  // "auto", "chunked", "large"
// `what` names the option or variable in the error for an unknown name.
AllGatherAlgo parse_all_gather_algo(const std::string& name, const std::string& what);
ReduceScatterAlgo parse_reduce_scatter_algo(const std::string& name, const std::string& what);
AllReduceAlgo parse_all_reduce_algo(const std::string& name, const std::string& what);
AllReduceRounds parse_all_reduce_rounds(const std::string& name, const std::string& what);

struct CollectiveConfig {
  AllGatherAlgo all_gather = AllGatherAlgo::kAuto;
  ReduceScatterAlgo reduce_scatter = ReduceScatterAlgo::kAuto;
  AllReduceAlgo all_reduce = AllReduceAlgo::kAuto;
  // Steps of the reduce-scatter ring: a positive multiple of the world size; 0 means the world
  // size (one step per chunk).
  int ring_steps = 0;
  // The most bytes a rank stages per phase (a "round"): payloads larger than this, or than the
  // phase's half of the buffer, are pipelined through the buffer in rounds, so that one rank
  // stages round i+1 while its peers still read round i. 0: the whole half-buffer.
  int64_t chunk_bytes = kDefaultChunkBytes;
  // Who sizes the rounds of a large two-shot all-reduce on a host workspace (NOTE [Rounds chosen
  // by rank 0] in ops/all_reduce.cpp). Part of the op signature: ranks must agree on whether rank 0
  // chooses (auto and large do; chunked does not).
  AllReduceRounds all_reduce_rounds = AllReduceRounds::kAuto;

  // Thresholds of the automatic choice (bytes of the full payload: the all-reduce tensor, the
  // all-gather output, the reduce-scatter input), chosen with bench/bench_collectives.py --full
  // --algos (docs/collectives.md, "Choosing an algorithm"; the runs:
  // docs/measurements/collectives-thresholds.md).
  //   all-reduce:     one-shot up to all_reduce_one_shot_max_bytes, two-shot above.
  //   all-gather:     the ring up to all_gather_ring_max_bytes (3+ ranks: waiting for one
  //                   neighbour instead of every rank matters when ranks share cores), else direct.
  //   reduce-scatter: ring up to reduce_scatter_ring_max_bytes, direct above.
  int64_t all_reduce_one_shot_max_bytes = kDefaultAllReduceOneShotMaxBytes;
  int64_t all_gather_ring_max_bytes = kDefaultAllGatherRingMaxBytes;
  int64_t reduce_scatter_ring_max_bytes = kDefaultReduceScatterRingMaxBytes;
  // Cross-memory reads (NOTE [Cross-memory reads]), when the workspace offers them (host, probed at
  // rendezvous, not turned off): the direct all-gather, the direct reduce-scatter and broadcast
  // read peers' tensors straight from their processes from this payload size on (bytes, as
  // above; broadcast: the tensor), and 'auto' then prefers direct over the rings. Below it they
  // stage through the buffer: the reads cost a system call per peer and make every owner wait
  // for its readers at the end.
  int64_t cross_memory_min_bytes = kDefaultCrossMemoryMinBytes;
  // Whether a one-shot all-reduce that fits one round runs inline on a stream that allows it
  // (NOTE [Inline one-shot] in ops/all_reduce.cpp). Not part of the op signature: both paths
  // write and wait for the same words, so ranks may differ.
  bool inline_all_reduce = true;
  // How the ranks agree on zero-copy (NOTE [Zero-copy collectives] in ops/zero_copy.cpp). Part of
  // the op signature when the ranks differ in the resolved mode (their phases would differ).
  ZeroCopyAgreement zero_copy_agreement = ZeroCopyAgreement::kAuto;
  // Host copies and reductions of at least this many bytes are split across the rank's ATen
  // intra-op threads when it has two or more (NOTE [Intra-op threads] in ops/collectives.cpp);
  // 0: never. Not part of the op signature: it changes where bytes are computed, not which.
  int64_t parallel_min_bytes = kDefaultParallelMinBytes;

  static constexpr int64_t kDefaultChunkBytes = 1 << 20;
  static constexpr int64_t kDefaultAllReduceOneShotMaxBytes = 8 << 10;
  // On 2 ranks the one-shot reads only one peer: with the inline one-shot (NOTE [Inline
  // one-shot] in ops/all_reduce.cpp) it beat two-shot up to 64 KiB in every --algos run
  // (docs/collectives.md, "The thresholds").
  static constexpr int64_t kDefaultTwoRankAllReduceOneShotMaxBytes = 64 << 10;
  static constexpr int64_t kDefaultAllGatherRingMaxBytes = 256 << 10;
  static constexpr int64_t kDefaultReduceScatterRingMaxBytes = 256 << 10;
  static constexpr int64_t kDefaultCrossMemoryMinBytes = 64 << 10;
  static constexpr int64_t kDefaultParallelMinBytes = 1 << 20;
};

// TORCH_CHECKs the settings against a world size.
void validate(const CollectiveConfig& config, int world_size);

// The algorithms the automatic choice makes for these sizes (the forced one when set).
// `cross_memory_reads`: whether the workspace offers cross-memory reads
// (SymmetricWorkspace::cross_memory_reads).
AllGatherAlgo select_all_gather(const CollectiveConfig& config, int64_t output_bytes,
                                int world_size, bool cross_memory_reads = false);
ReduceScatterAlgo select_reduce_scatter(const CollectiveConfig& config, int64_t input_bytes,
                                        int world_size, bool cross_memory_reads = false);
// Whether a direct all-gather / reduce-scatter or a broadcast of `payload_bytes` reads peers'
// tensors directly (NOTE [Cross-memory reads]) instead of staging them.
bool uses_cross_memory_reads(const CollectiveConfig& config, int64_t payload_bytes,
                             bool cross_memory_reads);
AllReduceAlgo select_all_reduce(const CollectiveConfig& config, int64_t bytes, int world_size);

// Per-group state of the collectives, owned by the backend (never shared by two groups).
struct InlineOneShot;  // ops/all_reduce.cpp

class CollectiveState {
 public:
  // Phases run so far on `buffer` (this rank's, to notice a new workspace after growth); phase p
  // uses half p % 2 of every buffer. NOTE [Collective phases].
  uint64_t phase = 0;
  const void* buffer = nullptr;
  // Float32 accumulators of float16 / bfloat16 reductions, grown on demand, reused by every op
  // (the hot path allocates nothing once warm). On CUDA each use is recorded on its stream
  // (Device::record_stream in detail::reduce_on_stream: NOTE [Pipeline temporaries]).
  at::Tensor scratch;
  // Where a cross-memory reduce-scatter lands the peers' pieces before reducing them (bytes, grown
  // on demand). Host memory used in host stream order only: cross-memory reads exist on the host
  // device alone, so there is no GPU stream to record it on.
  at::Tensor read_scratch;
  // The group's symmetric heap once cuda_p2p.empty created it (NOTE [Zero-copy collectives] in
  // ops/zero_copy.cpp), else null; owned by the backend. Set at the same point of the op
  // sequence on every rank (its creation is collective), so every rank sees the same value.
  SymmetricWorkspace* heap = nullptr;
  // Signature agreement (NOTE [Zero-copy collectives] in ops/zero_copy.cpp): the heap offsets this
  // rank claims for every rank's inputs in the running collective (rank q's input i at
  // [q * n + i]), set with its signature and taken by its zero-copy path; unset otherwise.
  std::optional<std::vector<int64_t>> zero_copy_claim;
  // The handshakes of the collective channel (NOTE [Op signatures] in ops/op_signature.cpp), and
  // the signature of the running collective until it has been compared.
  SignatureState signature;
  std::optional<OpSignature> pending;
  // The inline one-shot all-reduce's cached addresses and signature (NOTE [Inline one-shot] in
  // ops/all_reduce.cpp), made on its first use.
  std::shared_ptr<InlineOneShot> inline_one_shot;
  // Tensors the running op's queued work reads or writes (its host temporaries, the caller's
  // tensors): the backend keeps them until the op's stream has passed the op, whichever way the
  // op left, a timeout included (NOTE [Tensors in stream order] in
  // backend/workspace_collectives.cpp). Empty between ops.
  std::vector<at::Tensor> in_flight;
  // Rank 0's choice of rounds for large two-shot all-reduces (NOTE [Rounds chosen by rank 0]).
  RoundPolicy round_policy;
  // Host copies and reductions split across the intra-op threads (NOTE [Intra-op threads] in
  // ops/collectives.cpp), counted by the closures that ran them; the backend shares it with its
  // counters ("intra_op.split"), since the closures may run after the op returned.
  std::shared_ptr<std::atomic<int64_t>> parallel_splits = std::make_shared<std::atomic<int64_t>>(0);
};

// What every collective runs on.
struct CollectiveContext {
  SymmetricWorkspace& ws;
  Stream& stream;
  int channel;
  CollectiveState& state;
  const CollectiveConfig& config;
};

// --- entry points -------------------------------------------------------------------------------
// Tensors are contiguous and on the workspace's device; outputs never overlap inputs except
// where stated. Each returns what it did (NOTE [Outcomes] in ops/outcome.hpp): the algorithm that
// ran (never "auto"), and whether it read its peers' inputs zero-copy or by cross-memory reads.

// outputs[q] (W tensors) receives rank q's `input`; every output has input's bytes. An output
// may be the input itself (in-place all_gather_into_tensor): it is then left alone.
Outcome all_gather(const CollectiveContext& ctx, const at::Tensor& input,
                   const std::vector<at::Tensor>& outputs, AllGatherAlgo algo);

// Rank q contributes bytes[q] bytes (the same vector on every rank; input holds bytes[rank]) to
// outputs[q]. Direct algorithm, in rounds of the largest contribution.
Outcome all_gather_v(const CollectiveContext& ctx, const at::Tensor& input,
                     const std::vector<int64_t>& bytes, const std::vector<at::Tensor>& outputs);

// One rank's part of an all-to-all (ops/all_to_all.cpp, NOTE [All-to-all headers]). Sizes count
// units (rows, or elements for the list all_to_all) of `unit_bytes` bytes each.
struct AllToAllArgs {
  OpId kind = OpId::kAllToAllSingle;
  // The part of the signature every rank must pass alike (dtype, row shape: "rows of 6 x
  // float32"); the settings that change the rounds are appended.
  std::string text;
  // send[q]: send_counts[q] units for rank q (W of each; contiguous, on the workspace's device).
  std::vector<const char*> send;
  std::vector<int64_t> send_counts;
  // The units this rank expects from each rank, or empty when it does not know them (they are
  // learnt from the senders: all_to_all_v).
  std::vector<int64_t> recv_counts;
  int64_t unit_bytes = 1;
  const char* unit = "rows";  // in errors
};
// Where the units from each rank land (W pointers), given how many each rank sends this one:
// called once every rank's split sizes are known and agreed, before anything is read.
using AllToAllOutputs = c10::function_ref<std::vector<char*>(const std::vector<int64_t>& recv)>;
// Rank r's send[q] lands at rank q's outputs(...)[r]. Split sizes that do not match across ranks
// (rank r sends n units to q, q expects m != n from r) raise SignatureMismatch on every rank,
// naming both, before anything is read. Returns the units received from each rank. Not
// capturable in a graph: the split sizes are read back on the host.
struct AllToAllResult {
  std::vector<int64_t> recv;  // units received from each rank
  Outcome outcome;
};
AllToAllResult all_to_all(const CollectiveContext& ctx, const AllToAllArgs& args,
                          AllToAllOutputs outputs);

// output = op over ranks of inputs[rank] (W chunks, each with output's size and dtype).
Outcome reduce_scatter(const CollectiveContext& ctx, const std::vector<at::Tensor>& inputs,
                       const at::Tensor& output, ReduceOp op, ReduceScatterAlgo algo);

// output = op over ranks of input; output may be input (in place). Every rank gets identical bits.
// Also says whether it ran inline (NOTE [Inline one-shot]) or in rank 0's large rounds.
Outcome all_reduce(const CollectiveContext& ctx, const at::Tensor& input, const at::Tensor& output,
                   ReduceOp op, AllReduceAlgo algo);

// tensor = root's tensor.
Outcome broadcast(const CollectiveContext& ctx, const at::Tensor& tensor, int root);

// outputs[q] (W tensors, on `root` only; ignored elsewhere) receives rank q's `input` (the same
// bytes on every rank). Rank root's own input is copied, not staged.
Outcome gather(const CollectiveContext& ctx, const at::Tensor& input,
               const std::vector<at::Tensor>& outputs, int root);

// `output` receives root's inputs[rank] (W tensors, on `root` only; every one with output's bytes).
Outcome scatter(const CollectiveContext& ctx, const std::vector<at::Tensor>& inputs,
                const at::Tensor& output, int root);

// tensor = op over ranks of tensor, on `root` only (in place; the same bits as the one-shot
// all-reduce: NOTE [Reduce at the root] in ops/reduce.cpp); the others' tensors are left as they
// were. `op` applies to the dtype (check_reduce_op).
Outcome reduce(const CollectiveContext& ctx, const at::Tensor& tensor, int root, ReduceOp op);

// Returns (host) or lets the stream continue (CUDA) once every rank has arrived. Its handshake
// tells a barrier from another collective called on another rank (NOTE [Op signatures]).
Outcome barrier(const CollectiveContext& ctx, std::optional<Millis> timeout = {});

// For a rank whose own argument check failed in a collective its peers are running: takes part
// in the op's handshake with an invalid signature carrying `reason`, so that every peer raises at
// once naming this rank, and leaves the phases in step; the caller then raises its own error.
void reject(const CollectiveContext& ctx, OpId kind, const std::string& reason);
// For a rank whose call goes to the wrapped backend where its peers' may run on the workspace:
// takes part in the op's handshake with the signature `text` (its route included), so that ranks
// that route a call differently raise the same error instead of waiting in different backends
// (NOTE [Routes agree] in backend/workspace_collectives.cpp); returns when every rank agreed.
void announce(const CollectiveContext& ctx, OpId kind, const std::string& text);

}  // namespace cuda_p2p::ops
