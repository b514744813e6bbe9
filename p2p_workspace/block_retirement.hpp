// What becomes of a rank's own workspace block once its mapping is released: retired until every
// peer has closed its mapping of it, then freed, or leaked when that cannot be learned in time
// (NOTE [Block lifetime] in block_retirement.cpp). Shared by a workspace and its mappings, which
// may outlive it (a tensor aliasing the buffer).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

class BlockRetirement {
 public:
  // `close_wait`: how long the final reap of a released mapping waits for the peers;
  // `free_unclosed`: Device::blocks_outlive_owner (what is not closed in time is freed, not
  // leaked).
  BlockRetirement(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                  Millis close_wait, bool free_unclosed);

  // `rank` is gone for good (a shrink excluded it): its "closed" keys are not waited for.
  void forget(int rank) noexcept;
  // The workspace is being destroyed: from now on the store is probed before each call (NOTE
  // [Quiet teardown] in store_probe.cpp).
  void tear_down() noexcept;
  // A mapping of `generation` was released: publish it, and retire `own`.
  void closed(int generation, std::shared_ptr<Block> own) noexcept;
  // Frees every retired block all peers have closed, waiting up to `wait` for them; with
  // `final`, leaks (with a warning) what is still mapped by a peer after that.
  void reap(Millis wait, bool final) noexcept;
  // Blocks retired and not freed yet.
  size_t retired() const;

 private:
  std::string key(int generation, int rank) const;
  bool store_usable() noexcept;
  std::vector<int> still_open(int generation);

  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int world_size_;
  const Millis close_wait_;
  const bool free_unclosed_;  // Device::blocks_outlive_owner
  mutable std::mutex mu_;
  std::vector<std::pair<int, std::shared_ptr<Block>>> retired_;  // (generation, own block)
  bool final_ = false;                                           // the workspace is destroyed
  bool tearing_down_ = false;  // the workspace's destructor has begun
  bool store_gone_ = false;    // a store call failed: the store's host has exited
  const std::unique_ptr<std::atomic<bool>[]> gone_;  // by rank: see forget()
};

}  // namespace cuda_p2p
