// One identity per op: OpId, and what is fixed about each op in one table (kOpSpecs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace cuda_p2p::ops {

// NOTE [One identity per op]
// - OpId names every op a group counts or agrees on; its row of kOpSpecs says the rest: the public
//   name (the counters' prefix, "all_reduce.one_shot"; the name in handshake errors), which facts
//   of its Outcome have a counter, whether a group spanning hosts runs it hierarchically, and the
//   c10d OpType and name of its plain c10d call.
// - A handshake's descriptor carries the OpId as a byte (NOTE [Op signatures] in
//   ops/op_signature.cpp): ranks run one build, so the numbers need not be stable across builds.
//   0 is no op: a slot never written never names one.
// - An op reached by more than one c10d call (all_gather_into_tensor, the coalesced calls, ...)
//   counts under its one OpId; the call's own name and OpType are an OpCall (kCalls, below).
// - The fp8 fused ops agree as their plain ops do (their handshakes name
//   fused_all_gather_matmul / fused_matmul_reduce_scatter), and count under their own names.
enum class OpId : uint8_t {
  kBarrier = 1,
  kAllReduce,
  kAllReduceSparse,
  kAllGather,      // all_gather and all_gather_into_tensor, single or coalesced
  kAllGatherV,     // cuda_p2p's own
  kReduceScatter,  // reduce_scatter and reduce_scatter_tensor, single or coalesced
  kBroadcast,
  kMonitoredBarrier,
  kAllToAllSingle,
  kAllToAll,
  kAllToAllV,  // cuda_p2p's own
  kGather,
  kScatter,
  kReduce,
  kSend,
  kRecv,
  kRecvAnysource,
  kFusedAllGatherMatmul,
  kFusedMatmulReduceScatter,
  kFusedAllGatherScaledMatmul,
  kFusedScaledMatmulReduceScatter,
  kAllocateTensor,
  kWindow,  // the one-sided windows' calls (backend/windows.cpp)
  kEnd
};

// The facts of an Outcome (ops/outcome.hpp) that can have a counter, "<op>.<suffix>".
namespace fact {
inline constexpr uint8_t kCrossMemory = 1 << 0;  // "cross_memory"
inline constexpr uint8_t kZeroCopy = 1 << 1;     // "zero_copy"
inline constexpr uint8_t kInline = 1 << 2;       // "inline"
inline constexpr uint8_t kLargeRounds = 1 << 3;  // "large_rounds"
inline constexpr uint8_t kRounds = 1 << 4;       // "rounds": more than one round through the buffer
inline constexpr uint8_t kGrew = 1 << 5;         // "grow"
inline constexpr uint8_t kGraph = 1 << 6;  // "graph": enqueued under capture (NOTE [Replay-safe
                                           // signals])
// A workspace collective names the graph it was captured in and the reads it made.
inline constexpr uint8_t kCollective = kCrossMemory | kZeroCopy | kGraph;
inline constexpr uint8_t kFused = kRounds | kGrew;
}  // namespace fact

struct OpSpec {
  OpId id;
  const char* name;  // public: the counters' prefix, the handshakes' errors
  uint8_t facts;     // fact:: bits: the facts of its Outcome that have a counter
  bool hierarchy;    // a group spanning hosts runs it hierarchically (backend/hierarchical.hpp)
  c10d::OpType type = c10d::OpType::UNKNOWN;  // its plain c10d call's Work
  const char* c10d_name = "";                 // and that call's name, in the wrapped route's errors
};

// Every public op name comes from this table (docs/collectives.md, "Counters"), in OpId order.
inline constexpr OpSpec kOpSpecs[] = {
    {OpId::kBarrier, "barrier", fact::kGraph, true, c10d::OpType::BARRIER, "barrier"},
    {OpId::kAllReduce, "all_reduce",
     fact::kZeroCopy | fact::kInline | fact::kLargeRounds | fact::kGraph, true,
     c10d::OpType::ALLREDUCE, "allreduce"},
    {OpId::kAllReduceSparse, "all_reduce_sparse", 0, false, c10d::OpType::_ALLREDUCE_SPARSE,
     "allreduce_sparse"},
    {OpId::kAllGather, "all_gather", fact::kCollective, true, c10d::OpType::ALLGATHER, "allgather"},
    {OpId::kAllGatherV, "all_gather_v", fact::kZeroCopy | fact::kGraph, false},
    {OpId::kReduceScatter, "reduce_scatter", fact::kCollective, true, c10d::OpType::REDUCE_SCATTER,
     "reduce_scatter"},
    {OpId::kBroadcast, "broadcast", fact::kCollective, true, c10d::OpType::BROADCAST, "broadcast"},
    {OpId::kMonitoredBarrier, "monitored_barrier", 0, false, c10d::OpType::BARRIER,
     "monitored_barrier"},
    {OpId::kAllToAllSingle, "all_to_all_single", fact::kCollective, false,
     c10d::OpType::ALLTOALL_BASE, "all_to_all_single"},
    {OpId::kAllToAll, "all_to_all", fact::kCollective, false, c10d::OpType::ALLTOALL, "all_to_all"},
    {OpId::kAllToAllV, "all_to_all_v", fact::kCollective, false},
    {OpId::kGather, "gather", fact::kGraph, false, c10d::OpType::GATHER, "gather"},
    {OpId::kScatter, "scatter", fact::kGraph, false, c10d::OpType::SCATTER, "scatter"},
    {OpId::kReduce, "reduce", fact::kGraph, false, c10d::OpType::REDUCE, "reduce"},
    {OpId::kSend, "send", 0, false, c10d::OpType::SEND, "send"},
    {OpId::kRecv, "recv", 0, false, c10d::OpType::RECV, "recv"},
    {OpId::kRecvAnysource, "recv_anysource", 0, false, c10d::OpType::RECVANYSOURCE,
     "recv_anysource"},
    {OpId::kFusedAllGatherMatmul, "fused_all_gather_matmul",
     fact::kFused | fact::kZeroCopy | fact::kGraph, false},
    {OpId::kFusedMatmulReduceScatter, "fused_matmul_reduce_scatter", fact::kFused | fact::kGraph,
     false},
    // The fp8 ops have never named their captures.
    {OpId::kFusedAllGatherScaledMatmul, "fused_all_gather_scaled_matmul",
     fact::kFused | fact::kZeroCopy, false},
    {OpId::kFusedScaledMatmulReduceScatter, "fused_scaled_matmul_reduce_scatter", fact::kFused,
     false},
    {OpId::kAllocateTensor, "allocate_tensor", 0, false},
    {OpId::kWindow, "window", 0, false},
};

inline constexpr size_t kOpCount = std::size(kOpSpecs);
static_assert(kOpCount + 1 == static_cast<size_t>(OpId::kEnd), "one row per OpId");

constexpr bool op_specs_in_order() {
  for (size_t i = 0; i < kOpCount; ++i) {
    if (static_cast<size_t>(kOpSpecs[i].id) != i + 1) return false;
  }
  return true;
}
static_assert(op_specs_in_order(), "kOpSpecs lists the ops in OpId order");

constexpr bool op_names_unique() {
  for (size_t i = 0; i < kOpCount; ++i) {
    for (size_t j = i + 1; j < kOpCount; ++j) {
      if (std::string_view(kOpSpecs[i].name) == kOpSpecs[j].name) return false;
    }
  }
  return true;
}
static_assert(op_names_unique(), "every op has a name of its own (its counters' prefix)");

// Whether `byte` names an op (a descriptor read from a peer is checked with it).
constexpr bool is_op_id(uint32_t byte) {
  return byte >= static_cast<uint32_t>(OpId::kBarrier) && byte < static_cast<uint32_t>(OpId::kEnd);
}
constexpr const OpSpec& spec(OpId id) { return kOpSpecs[static_cast<size_t>(id) - 1]; }
constexpr const char* name(OpId id) { return spec(id).name; }

// One c10d call of an op: the op it counts as, the name its handshakes and errors use, and the
// c10d OpType and name of the call (its Work's type; the wrapped route's errors).
struct OpCall {
  OpId id;
  const char* name;
  c10d::OpType type;
  const char* c10d_name;
};
// The op's plain c10d call.
constexpr OpCall call(OpId id) {
  const OpSpec& s = spec(id);
  return {id, s.name, s.type, s.c10d_name};
}

// The c10d calls that are not their op's plain call (NOTE [Canonical entries] in
// backend/entry_sequence.hpp: each stands for its old and its torch 2.14 name).
namespace calls {
inline constexpr OpCall kAllGatherIntoTensor{OpId::kAllGather, "all_gather_into_tensor",
                                             c10d::OpType::_ALLGATHER_BASE,
                                             "all_gather_into_tensor"};
inline constexpr OpCall kAllGatherIntoTensorCoalesced{OpId::kAllGather, "all_gather_into_tensor",
                                                      c10d::OpType::COALESCED,
                                                      "allgather_into_tensor_coalesced"};
inline constexpr OpCall kReduceScatterTensor{OpId::kReduceScatter, "reduce_scatter_tensor",
                                             c10d::OpType::_REDUCE_SCATTER_BASE,
                                             "reduce_scatter_tensor"};
inline constexpr OpCall kReduceScatterTensorCoalesced{OpId::kReduceScatter, "reduce_scatter_tensor",
                                                      c10d::OpType::COALESCED,
                                                      "reduce_scatter_tensor_coalesced"};
inline constexpr OpCall kGatherSingle{OpId::kGather, "gather", c10d::OpType::GATHER,
                                      "gather_single"};
// The coalesced calls the workspace does not run (the wrapped backend's, counted as their op).
inline constexpr OpCall kAllReduceCoalesced{
    OpId::kAllReduce, "all_reduce", c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced"};
inline constexpr OpCall kAllGatherCoalesced{
    OpId::kAllGather, "all_gather", c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced"};
}  // namespace calls

}  // namespace cuda_p2p::ops
