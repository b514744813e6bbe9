#include "backend/counters.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cstring>
#include <utility>

#include "backend/config.hpp"
#include "backend/hierarchical.hpp"

namespace cuda_p2p {

namespace {

namespace fact = ops::fact;
using ops::OpId;
using ops::spec;

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

void Counters::record(OpId op, const ops::Outcome& o) {
  if (op == OpId::kAllReduce) {
    // The small all-reduce's path: atomics only.
    const bool one_shot = std::string_view(o.algorithm) == "one_shot";
    hot_[one_shot ? kOneShot : kTwoShot].fetch_add(1, std::memory_order_relaxed);
    if (o.ran_inline) hot_[kInline].fetch_add(1, std::memory_order_relaxed);
    if (o.zero_copy) hot_[kZeroCopy].fetch_add(1, std::memory_order_relaxed);
    if (o.large_rounds) hot_[kLargeRounds].fetch_add(1, std::memory_order_relaxed);
    if (o.graph) bump("all_reduce", "graph");
    return;
  }
  const ops::OpSpec& n = spec(op);
  const char* prefix = n.name;
  TORCH_INTERNAL_ASSERT(o.algorithm, "cuda_p2p: ", prefix, " reported no algorithm");
  bump(prefix, o.algorithm);
  if ((n.facts & fact::kRounds) && o.rounds > 1) bump(prefix, "rounds");
  if ((n.facts & fact::kCrossMemory) && o.cross_memory) bump(prefix, "cross_memory");
  if ((n.facts & fact::kZeroCopy) && o.zero_copy) bump(prefix, "zero_copy");
  if ((n.facts & fact::kInline) && o.ran_inline) bump(prefix, "inline");
  if ((n.facts & fact::kLargeRounds) && o.large_rounds) bump(prefix, "large_rounds");
  if ((n.facts & fact::kGrew) && o.grew) bump(prefix, "grow");
  if ((n.facts & fact::kGraph) && o.graph) bump(prefix, "graph");
}

void Counters::record(OpId op, const char* path) { bump(spec(op).name, path); }

void Counters::fallback(OpId op, const char* why) {
  const char* prefix = spec(op).name;
  if (debug_) debug_fallback(std::string(prefix) + ".wrapped", why);
  bump(prefix, "wrapped");
}

void Counters::unfused(OpId op) {
  const char* prefix = spec(op).name;
  if (debug_) debug_fallback(std::string(prefix) + ".unfused", nullptr);
  bump(prefix, "unfused");
}

void Counters::hierarchical(OpId op, const HierarchyOutcome& h) {
  const char* prefix = spec(op).name;
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
    text = reason::text(why);
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
