#include "backend/counters.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cstring>
#include <utility>

#include "backend/config.hpp"
#include "backend/hierarchical.hpp"

namespace cuda_p2p {

namespace {

// The facts of an Outcome that have a counter, "<op>.<suffix>".
enum Fact : uint8_t {
  kCrossMemory = 1 << 0,  // "cross_memory"
  kZeroCopy = 1 << 1,     // "zero_copy"
  kInline = 1 << 2,       // "inline"
  kLargeRounds = 1 << 3,  // "large_rounds"
  kRounds = 1 << 4,       // "rounds": more than one round through the buffer
  kGrew = 1 << 5,         // "grow"
  kGraph = 1 << 6,        // "graph": enqueued under capture (NOTE [Replay-safe signals])
};

struct OpNames {
  Counters::Op op;
  const char* prefix;
  uint8_t facts;  // which facts of its Outcome the op names
};

// Every public name is made from this table (docs/collectives.md, "Counters"). A workspace
// collective names the graph it was captured in, and the reads it made; a fused op its rounds
// and growth.
constexpr uint8_t kCollective = kCrossMemory | kZeroCopy | kGraph;
constexpr OpNames kOps[] = {
    {Counters::Op::kAllReduce, "all_reduce", kZeroCopy | kInline | kLargeRounds | kGraph},
    {Counters::Op::kAllReduceSparse, "all_reduce_sparse", 0},
    {Counters::Op::kAllGather, "all_gather", kCollective},
    {Counters::Op::kReduceScatter, "reduce_scatter", kCollective},
    {Counters::Op::kBroadcast, "broadcast", kCollective},
    {Counters::Op::kBarrier, "barrier", kGraph},
    {Counters::Op::kMonitoredBarrier, "monitored_barrier", 0},
    {Counters::Op::kAllGatherV, "all_gather_v", kZeroCopy | kGraph},
    {Counters::Op::kAllToAllSingle, "all_to_all_single", kCollective},
    {Counters::Op::kAllToAll, "all_to_all", kCollective},
    {Counters::Op::kAllToAllV, "all_to_all_v", kCollective},
    {Counters::Op::kGather, "gather", kGraph},
    {Counters::Op::kScatter, "scatter", kGraph},
    {Counters::Op::kReduce, "reduce", kGraph},
    {Counters::Op::kSend, "send", 0},
    {Counters::Op::kRecv, "recv", 0},
    {Counters::Op::kRecvAnysource, "recv_anysource", 0},
    {Counters::Op::kFusedAllGatherMatmul, "fused_all_gather_matmul",
     kRounds | kZeroCopy | kGrew | kGraph},
    {Counters::Op::kFusedMatmulReduceScatter, "fused_matmul_reduce_scatter",
     kRounds | kGrew | kGraph},
    // The fp8 ops have never named their captures.
    {Counters::Op::kFusedAllGatherScaledMatmul, "fused_all_gather_scaled_matmul",
     kRounds | kZeroCopy | kGrew},
    {Counters::Op::kFusedScaledMatmulReduceScatter, "fused_scaled_matmul_reduce_scatter",
     kRounds | kGrew},
    {Counters::Op::kAllocateTensor, "allocate_tensor", 0},
    {Counters::Op::kWindow, "window", 0},
};
static_assert(std::size(kOps) == static_cast<size_t>(Counters::Op::kCount));

constexpr bool table_in_order() {
  for (size_t i = 0; i < std::size(kOps); ++i) {
    if (static_cast<size_t>(kOps[i].op) != i) return false;
  }
  return true;
}
static_assert(table_in_order(), "kOps must list the ops in the order of Counters::Op");

const OpNames& names_of(Counters::Op op) { return kOps[static_cast<size_t>(op)]; }

constexpr const char* kHotNames[] = {"all_reduce.one_shot", "all_reduce.two_shot",
                                     "all_reduce.inline", "all_reduce.zero_copy",
                                     "all_reduce.large_rounds"};

}  // namespace

Counters::Counters(bool debug, int rank, int size, std::string group_name, Explain explain)
    : debug_(debug),
      rank_(rank),
      size_(size),
      group_name_(std::move(group_name)),
      explain_(std::move(explain)) {}

void Counters::bump(std::string_view prefix, std::string_view suffix) {
  // Found without making a string: a counter costs a lookup, not an allocation.
  char buf[128];
  const size_t n = prefix.size() + 1 + suffix.size();
  TORCH_INTERNAL_ASSERT(n <= sizeof(buf), "cuda_p2p: counter name too long: ", prefix, ".", suffix);
  std::memcpy(buf, prefix.data(), prefix.size());
  buf[prefix.size()] = '.';
  std::memcpy(buf + prefix.size() + 1, suffix.data(), suffix.size());
  const std::string_view name(buf, n);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = counts_.find(name);
  if (it == counts_.end()) it = counts_.emplace(std::string(name), 0).first;
  ++it->second;
}

void Counters::record(Op op, const ops::Outcome& o) {
  if (op == Op::kAllReduce) {
    // The small all-reduce's path: atomics only.
    const bool one_shot = std::string_view(o.algorithm) == "one_shot";
    hot_[one_shot ? kOneShot : kTwoShot].fetch_add(1, std::memory_order_relaxed);
    if (o.ran_inline) hot_[kInline].fetch_add(1, std::memory_order_relaxed);
    if (o.zero_copy) hot_[kZeroCopy].fetch_add(1, std::memory_order_relaxed);
    if (o.large_rounds) hot_[kLargeRounds].fetch_add(1, std::memory_order_relaxed);
    if (o.graph) bump("all_reduce", "graph");
    return;
  }
  const OpNames& n = names_of(op);
  TORCH_INTERNAL_ASSERT(o.algorithm, "cuda_p2p: ", n.prefix, " reported no algorithm");
  bump(n.prefix, o.algorithm);
  if ((n.facts & kRounds) && o.rounds > 1) bump(n.prefix, "rounds");
  if ((n.facts & kCrossMemory) && o.cross_memory) bump(n.prefix, "cross_memory");
  if ((n.facts & kZeroCopy) && o.zero_copy) bump(n.prefix, "zero_copy");
  if ((n.facts & kInline) && o.ran_inline) bump(n.prefix, "inline");
  if ((n.facts & kLargeRounds) && o.large_rounds) bump(n.prefix, "large_rounds");
  if ((n.facts & kGrew) && o.grew) bump(n.prefix, "grow");
  if ((n.facts & kGraph) && o.graph) bump(n.prefix, "graph");
}

void Counters::record(Op op, const char* path) { bump(names_of(op).prefix, path); }

void Counters::fallback(Op op, const char* why) {
  const char* prefix = names_of(op).prefix;
  if (debug_) debug_fallback(std::string(prefix) + ".wrapped", why);
  bump(prefix, "wrapped");
}

void Counters::unfused(Op op) {
  const char* prefix = names_of(op).prefix;
  if (debug_) debug_fallback(std::string(prefix) + ".unfused", nullptr);
  bump(prefix, "unfused");
}

void Counters::hierarchical(Op op, const HierarchyOutcome& h) {
  const char* prefix = names_of(op).prefix;
  if (h.ran) {
    for (int i = 0; i < h.runs; ++i) bump(prefix, h.path);
    if (h.in_agreement) bump(prefix, "in_agreement");
    return;
  }
  if (h.flat == nullptr) return;  // declined before the agreement: nothing to say
  const std::string suffix = std::string("flat.") + h.flat;
  if (debug_) debug_fallback(std::string(prefix) + "." + suffix, nullptr);
  bump(prefix, suffix);
}

// NOTE [Debug lines] in backend/config.cpp: one line per fallback counter, its first time.
void Counters::debug_fallback(std::string_view name, const char* why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!debug_reported_.emplace(name).second) return;
  }
  std::string text;
  const std::string_view w = why ? why : "";
  if (why == nullptr) {
    text = name.ends_with(".unfused")   ? "the GEMM is below fused_min_flops"
           : name.ends_with(".wrapped") ? "see the group's line"
                                        : "the counter's name says why";
  } else if (w == reason::kWorkspaceOff) {
    text = explain_.collectives_off();
  } else if (w == reason::kDevice) {
    text = c10::str("a tensor is not a strided tensor on the workspace's device (",
                    explain_.workspace_device(), ")");
  } else if (w == reason::kDtype) {
    text = "a dtype the workspace does not reduce (bool, complex, ...)";
  } else if (w == reason::kReduceOp) {
    text = "a reduce op the workspace does not run (PREMUL_SUM)";
  } else {
    text = why;
  }
  config::debug_line(c10::str("cuda_p2p INFO rank ", rank_, "/", size_, " group ", group_name_,
                              ": ", name, ": ", text,
                              " (logged once per counter; get_counters() counts every call)"));
}

std::map<std::string, int64_t> Counters::snapshot() const {
  std::map<std::string, int64_t> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.insert(counts_.begin(), counts_.end());
  }
  static_assert(std::size(kHotNames) == kHotCount);
  for (size_t i = 0; i < hot_.size(); ++i) {
    const int64_t n = hot_[i].load(std::memory_order_relaxed);
    if (n != 0) all[kHotNames[i]] += n;
  }
  // NOTE [Intra-op threads] in ops/collectives.cpp
  if (const int64_t n = splits_->load(std::memory_order_relaxed)) all["intra_op.split"] += n;
  return all;
}

void Counters::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_.clear();
  for (auto& n : hot_) n.store(0, std::memory_order_relaxed);
  splits_->store(0, std::memory_order_relaxed);
}

}  // namespace cuda_p2p
