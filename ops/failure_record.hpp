// A group's failure record, shared by its workspace collectives and its fused ops, and the local
// argument check that tells the peers before it raises.
#pragma once

#include <c10/util/FunctionRef.h>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace cuda_p2p::ops {

// NOTE [Failed groups]
// A workspace op that fails midway (a timeout, a dead peer, a failing read) may leave the
// ranks' signal counts, phases and buffers out of step, on its channel and - since the ranks
// that did not fail go on - soon on the others. So one failure, of a collective or of a fused
// op, marks the whole group failed: every later workspace op of the group (collective or fused)
// refuses at once with one line naming the first failure and saying to recreate the group,
// instead of costing a timeout each or reading stale data. Its peers are told too: the backend
// fails the workspace's device with it (on_first_failure), which writes it into their failure
// words (NOTE [Failure words] in p2p_workspace/watchdog.hpp), so that a peer that arrives late
// at the op this rank gave up on raises naming this rank instead of taking the signals and data
// this rank left behind. A disagreement of the ranks' signatures is not a failure (NOTE [Op
// signatures] in ops/op_signature.cpp): the op did not run anywhere and the group stays usable.
class FailureRecord {
 public:
  // Records `e` (its message without the C++ backtrace, on one line) as the group's failure, if
  // it is the first; `what` names the op that failed.
  void mark(const char* what, const std::exception& e);
  // TORCH_CHECKs that the group has not failed; `what` names the refused op. (One load inline:
  // it is on every op's path.)
  void check(const char* what) const {
    if (failed_.load(std::memory_order_acquire)) raise(what);
  }
  // The first failure ("" when none).
  std::string first() const;
  // `fn` is called with the first failure's line by the mark() that records it, before that
  // returns (the group's abort hooks: NOTE [Abort hooks] in backend/abort_hooks.cpp). Set before
  // the group's first op; `fn` must not throw.
  void on_first_failure(std::function<void(const std::string&)> fn) { on_first_ = std::move(fn); }

 private:
  void raise(const char* what) const;
  // Set, under mutex_, once failure_ is: check() on the hot path of every op is one load.
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::string failure_;
  std::function<void(const std::string&)> on_first_;
};

// Runs an op's local argument checks (everything that needs no peer). If they raise while
// `tell_peers` holds (the op would have run on the workspace, with peers) and the group has not
// failed, `reject(reason)` first takes this rank through the op's handshake with an invalid
// signature carrying the reason (NOTE [Op signatures]), so that its peers raise at once naming
// it instead of waiting for the timeout; then the rank's own error propagates (an error of
// `reject` itself is dropped: the own one is the one to report).
// function_refs: a small op's checks run on every call, and a std::function would allocate.
void check_or_reject(const FailureRecord& failure, bool tell_peers,
                     c10::function_ref<void()> checks,
                     c10::function_ref<void(const std::string&)> reject);

}  // namespace cuda_p2p::ops
