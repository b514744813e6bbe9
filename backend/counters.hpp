// Counters: which path every call of a group took ("all_reduce.one_shot", "all_gather.wrapped",
// ...), readable with get_counters(). The names are public API (docs/collectives.md, "Counters");
// this module is the one place that makes them: ops report what they did as an ops::Outcome
// (NOTE [Outcomes] in ops/outcome.hpp), the hierarchy as a HierarchyOutcome, the router the
// fallbacks, and record() / fallback() / hierarchical() turn those into names. It also holds the
// CUDA_P2P_DEBUG=INFO line of each fallback's first call (NOTE [Debug lines] in
// backend/config.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "ops/op_spec.hpp"
#include "ops/outcome.hpp"

namespace cuda_p2p {

struct HierarchyOutcome;  // backend/hierarchical.hpp

// The short reasons a call goes to the wrapped backend, or a group spanning hosts runs it flat.
// They are part of the protocol, not only of the debug line: a rank that routes a call to the
// wrapped backend names its reason in the op's handshake (NOTE [Routes agree] in
// backend/workspace_collectives.cpp), so ranks routing alike must name the same one. One
// spelling, safe in a counter's name ("all_reduce.flat.several_tensors", backend/hierarchical.cpp);
// texts show it with spaces (reason::text: "(wrapped: several tensors)").
namespace reason {
inline constexpr const char* kWorkspaceOff = "workspace unavailable or its collectives off";
inline constexpr const char* kDevice = "device";  // not a strided tensor on the workspace's device
inline constexpr const char* kDtype = "dtype";    // a dtype the workspace does not reduce
inline constexpr const char* kReduceOp = "reduce_op";  // PREMUL_SUM
inline constexpr const char* kSeveralTensors = "several_tensors";
inline constexpr const char* kNoTensors = "no_tensors";
inline constexpr const char* kShapes = "shapes";  // the wrapped backend reports the mismatch
inline constexpr const char* kNoWorkspaceOp = "no workspace version of this op";
// `why` as a text says it: underscores as spaces.
inline std::string text(std::string_view why) {
  std::string t(why);
  std::replace(t.begin(), t.end(), '_', ' ');
  return t;
}
}  // namespace reason

class Counters {
 public:
  // What a fallback's debug line says for the reasons only the group can explain
  // (reason::kWorkspaceOff: why the collectives are off; reason::kDevice: the workspace's
  // device). Called on a fallback's first call, with CUDA_P2P_DEBUG=INFO only.
  struct Explain {
    std::function<std::string()> collectives_off;
    std::function<std::string()> workspace_device;
  };
  // `debug`: CUDA_P2P_DEBUG=INFO; rank, size and group name head its lines.
  Counters(bool debug, int rank, int size, std::string group_name, Explain explain);

  // An op ran as `outcome` says: "<op>.<algorithm>", then one counter per fact the op names
  // ("<op>.cross_memory", "<op>.zero_copy", "all_reduce.inline", "<op>.graph", ...). The
  // all-reduce's counters are atomics: no lock and no allocation on the small all-reduce's path
  // (NOTE [Inline one-shot] in ops/all_reduce.cpp).
  void record(ops::OpId op, const ops::Outcome& outcome);
  // "<op>.<path>" for a path that is no algorithm ("allocate_tensor.heap", ".fallback").
  void record(ops::OpId op, const char* path);
  // The call went to the wrapped backend: "<op>.wrapped", and under CUDA_P2P_DEBUG=INFO the
  // first such call writes one line saying why (`why`: a reason:: or the caller's own).
  void fallback(ops::OpId op, const char* why);
  // A fused op's "auto" ran the unfused pair (NOTE [Unfused below a size]): "<op>.unfused".
  void unfused(ops::OpId op);
  // What a hierarchical entry did: "<op>.hierarchical" / "<op>.hierarchical_leaders" (once per
  // pair it ran), "all_reduce.in_agreement", or "<op>.flat.<why>" when it declined.
  void hierarchical(ops::OpId op, const HierarchyOutcome& outcome);

  // The count of host copies and reductions split across intra-op threads ("intra_op.split"),
  // which the collectives' closures bump (NOTE [Intra-op threads] in ops/collectives.cpp).
  const std::shared_ptr<std::atomic<int64_t>>& intra_op_splits() const { return splits_; }

  // Every counter that is not zero, by name.
  std::map<std::string, int64_t> snapshot() const;
  void reset();

 private:
  void bump(std::string_view prefix, std::string_view suffix);
  // NOTE [Debug lines]: one line per fallback counter, its first time; `why` may be null (the
  // counter's name says it).
  void debug_fallback(std::string_view name, const char* why);

  const bool debug_;
  const int rank_, size_;
  const std::string group_name_;
  const Explain explain_;

  mutable std::mutex mutex_;
  std::map<std::string, int64_t, std::less<>> counts_;  // looked up without a string
  std::set<std::string, std::less<>> debug_reported_;   // under mutex_
  // The all-reduce's counters (NOTE [Inline one-shot]): one relaxed atomic add each instead of
  // a lookup under mutex_; snapshot() adds them to the map's entries of the same names.
  enum Hot : uint8_t { kOneShot, kTwoShot, kInline, kZeroCopy, kLargeRounds, kHotCount };
  std::array<std::atomic<int64_t>, kHotCount> hot_{};
  std::shared_ptr<std::atomic<int64_t>> splits_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace cuda_p2p
