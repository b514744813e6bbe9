#include "backend/abort_hooks.hpp"

#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace cuda_p2p {

// NOTE [Error kinds]
// getError() says what kind of failure a group had, in c10d's four words, so that a fault-
// tolerant trainer can tell a peer that vanished from a local fault before it shrinks the group.
// The group's failure is its first workspace op that failed midway (NOTE [Failed groups] in
// ops/failure_record.hpp), one line of text: the errors of the layers below are the workspace's
// own messages, not types (c10 has no timeout error type), so the kind is read from the phrases
// those messages are written with, all of them ours:
//  - TIMEOUT: a wait missed its deadline. Every wait of the workspace, the rendezvous, the
//    mailboxes and the CUDA watchdog says "timed out after <n> ms" and names the ranks that never
//    arrived. A peer killed or stopped is seen so: nothing tells a rank that a peer died.
//  - REMOTE_ERROR: a peer failed and told this rank so. A peer's failure that reached this rank
//    through its failure word says "<rank>'s device failed first, and its failure reached rank
//    <r>" (NOTE [Failure words] in p2p_workspace/watchdog.hpp), whatever the peer's own reason
//    was, a timeout included. The rendezvous of a growth reads every rank's record and raises on
//    all of them when some "could not allocate" their block (NOTE [Allocation failures at
//    rendezvous] in p2p_workspace/symmetric_workspace.cpp), naming each "rank <r>: <reason>":
//    remote on the ranks it does not name.
//  - COMM_ERROR: any other failure of a workspace op (this rank's own allocation or mapping, a
//    failed read of a peer's memory, an error of the device).
// SUCCESS while the group has recorded none. A failure the phrases above misclassify is still a
// failure: only TIMEOUT and REMOTE_ERROR need their phrase.
ErrorKind classify_failure(const std::string& failure, int rank) {
  if (failure.empty()) return ErrorKind::kSuccess;
  if (failure.find("'s device failed first, and its failure reached rank ") != std::string::npos) {
    return ErrorKind::kRemoteError;
  }
  if (failure.find(" timed out after ") != std::string::npos) return ErrorKind::kTimeout;
  const size_t allocation = failure.find(" could not allocate ");
  if (allocation != std::string::npos) {
    const std::string me = "rank " + std::to_string(rank) + ": ";
    const bool named = failure.find("(" + me, allocation) != std::string::npos ||
                       failure.find("; " + me, allocation) != std::string::npos;
    return named ? ErrorKind::kCommError : ErrorKind::kRemoteError;
  }
  return ErrorKind::kCommError;
}

// NOTE [Abort hooks]
// torch 2.14's registerAbortHook: callbacks that capture debug information before a group
// aborts on a timeout or an error. A cuda_p2p group aborts its workspace in two ways, and the
// hooks run before either, in the thread that found it, once per group:
//  - a workspace op fails midway (a timeout, a peer's failure, a local error): the group then
//    refuses every later workspace op (NOTE [Failed groups]); the hooks run when that failure is
//    recorded, before the op's error propagates. A peer's failure that reached this rank's
//    failure word (NOTE [Failure words] in p2p_workspace/watchdog.hpp) makes the next op raise
//    before it starts: the hooks run then, before that error propagates;
//  - abort() (torch's abort_process_group, a shrink with SHRINK_ABORT): the hooks run first, then
//    the workspace, mailboxes and wrapped backends are aborted.
// The hooks are copied out of the lock before they run, so that a hook may take the GIL (a
// Python hook does) while another thread registers one. A hook that raises is reported and the
// abort goes on: a debug callback must not keep a group from aborting.
void AbortHooks::add(int64_t id, std::function<void()> hook) {
  TORCH_CHECK(hook, "cuda_p2p register_abort_hook: expected a callable for hook id ", id,
              ", got None");
  std::lock_guard<std::mutex> lock(mutex_);
  hooks_[id] = std::move(hook);
}

void AbortHooks::remove(int64_t id) {
  std::function<void()> gone;  // destroyed outside the lock: a Python hook takes the GIL then
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = hooks_.find(id);
  if (it == hooks_.end()) return;
  gone = std::move(it->second);
  hooks_.erase(it);
}

void AbortHooks::run(const std::string& why) noexcept {
  std::vector<std::pair<int64_t, std::function<void()>>> hooks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ran_) return;
    ran_ = true;
    hooks.assign(hooks_.begin(), hooks_.end());
  }
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      try {  // a warning handler may throw (Python's warnings-as-errors)
        TORCH_WARN("cuda_p2p: abort hook ", id, " raised before the group aborted (", why,
                   "): ", e.what());
      } catch (...) {
      }
    } catch (...) {
    }
  }
}

void AbortHooks::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  ran_ = true;
}

bool AbortHooks::ran() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ran_;
}

}  // namespace cuda_p2p
