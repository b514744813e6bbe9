// Frees that wait for a safe point: NOTE [Deferred frees]. Device-independent (the CUDA device
// holds one; tests/cpp/test_watchdog/deferred_frees.cpp drives it on the host).
#pragma once

#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace cuda_p2p {

// NOTE [Deferred frees]
// - The last reference to a CUDA block can go at any point of Python's garbage collection: in a
//   thread that captures a CUDA graph (where cudaFree is refused, the capture invalidated and the
//   block leaked), or while a stream of another group is blocked at a wait (cudaFree and
//   cudaIpcCloseMemHandle synchronise the whole device).
// - So a block's destructor frees nothing itself: it queues its free here, and the device runs
//   the queue at its own calls that may synchronise (allocate, import, a drain that completed),
//   outside any capture of the calling thread, and at its end.
// - Once the owner has closed the queue (the device is gone), a free runs where it is queued.
// - `keep` at close: what is queued is leaked, not freed (NOTE [Blocks of an undrained device]).
class DeferredFrees {
 public:
  using Free = std::function<void()>;

  // Queues `free`, or runs it now when the queue is closed.
  void add(Free free) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        queued_.push_back(std::move(free));
        return;
      }
    }
    free();
  }

  // Runs the queued frees, oldest first, outside the lock (a free may take long, and a free's
  // block may queue another). Returns how many ran.
  size_t run() {
    std::vector<Free> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now.swap(queued_);
    }
    for (auto& f : now) f();
    return now.size();
  }

  // The owner's end: runs what is queued (or drops it with `keep`: a leak), and from now on
  // add() runs a free at once.
  void close(bool keep) {
    std::vector<Free> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      now.swap(queued_);
    }
    if (!keep) {
      for (auto& f : now) f();
    }
  }

  size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_.size();
  }

 private:
  mutable std::mutex mu_;
  std::vector<Free> queued_;
  bool closed_ = false;
};

}  // namespace cuda_p2p
