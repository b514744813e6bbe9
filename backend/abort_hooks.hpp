// AbortHooks: the callbacks a user registers on a group (c10d's registerAbortHook) to capture
// debug information before the group aborts, and what kind of failure the group had (c10d's
// getError()). NOTE [Abort hooks] and NOTE [Error kinds] in abort_hooks.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace cuda_p2p {

// What went wrong with a group, as c10d::ErrorType names it (numbered alike).
enum class ErrorKind : uint8_t { kSuccess = 0, kTimeout = 1, kCommError = 2, kRemoteError = 3 };

// The kind of the failure a group recorded (NOTE [Failed groups] in ops/failure_record.hpp):
// `failure` is its one line ("" when none), `rank` the group rank that recorded it.
ErrorKind classify_failure(const std::string& failure, int rank);

class AbortHooks {
 public:
  // Registers `hook` under `id`, replacing a hook of that id. A hook registered after the hooks
  // ran is not run (the group aborts once).
  void add(int64_t id, std::function<void()> hook);
  // Removes the hook of `id`; an id never registered is ignored, as torch's ProcessGroup does for
  // its own hooks.
  void remove(int64_t id);
  // Runs every registered hook, in id order, the first time it is called; later calls do
  // nothing. A hook that throws is reported with a warning naming `why` and its id; the others
  // still run. Never throws.
  void run(const std::string& why) noexcept;
  // Whether run() has run the hooks.
  bool ran() const;
  // From now on run() runs nothing: a group shutting down does not abort, and a Work that
  // outlives it must not run its hooks when it finds the device retired.
  void disarm();

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, std::function<void()>> hooks_;
  bool ran_ = false;
};

}  // namespace cuda_p2p
