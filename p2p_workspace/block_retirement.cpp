#include "p2p_workspace/block_retirement.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "p2p_workspace/store_probe.hpp"
#include "p2p_workspace/workspace_records.hpp"

namespace cuda_p2p {

// NOTE [Block lifetime]
// Why: a rank's own block may be freed only once no peer maps it any more: CUDA documents freeing
// an exported allocation before every importer has called cudaIpcCloseMemHandle as undefined (a
// host memfd stays valid while mapped, but the host runs the same protocol, so CI tests it).
// The protocol: every generation of the workspace ends with a closing handshake over the store.
//  - when a rank's mapping of a generation is released (replaced on growth, or destroyed, and no
//    tensor aliases it any more), it closes its imports of the peers' blocks and publishes
//    <generation>/closed/<rank>; its own block of that generation is retired, not freed;
//  - a retired block is freed once every peer has published its key: checked without waiting at
//    every rendezvous, waited for (at most SymmetricWorkspace::kCloseWait) when the workspace is
//    destroyed; every rank publishes before it waits, so ranks destroying their groups together
//    never wait for each other in a cycle;
//  - a block whose peers have not closed by then (a peer that died, hangs, or keeps a
//    get_p2p_buffer tensor alive) is leaked with a warning, never freed under a peer; after
//    abort() nothing is waited for: what is not closed yet is leaked;
//  - where blocks outlive their owner's reference (Device::blocks_outlive_owner: the host's
//    memfds, CUDA's cuMem blocks, NOTE [Blocks that outlive their exporter] in
//    cuda/vmm_blocks.cpp) such a block is freed instead: nothing is left behind after a peer
//    died, and the memory goes with the last mapping. At teardown it is freed at once, without
//    asking the store: the wait would buy nothing there, and each of its store calls could meet
//    the store's server exiting (NOTE [Quiet teardown] in store_probe.cpp: the one window the
//    probe leaves, which a rank waiting for a peer that ends later kept reopening every nap);
//  - peers gone for good (forget_peers: a shrink excluded them, NOTE [Shrinking past dead ranks]
//    in backend/child_groups.cpp) are not waited for at all.

BlockRetirement::BlockRetirement(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                 Millis close_wait, bool free_unclosed)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      close_wait_(close_wait),
      free_unclosed_(free_unclosed),
      gone_(std::make_unique<std::atomic<bool>[]>(world_size)) {}

void BlockRetirement::forget(int rank) noexcept {
  gone_[rank].store(true, std::memory_order_release);
}

void BlockRetirement::tear_down() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  tearing_down_ = true;
}

void BlockRetirement::closed(int generation, std::shared_ptr<Block> own) noexcept {
  bool published = false;
  bool usable = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    usable = store_usable();
  }
  if (usable) {
    try {
      store_->set(key(generation, rank_), records::to_bytes("1"));
      published = true;
    } catch (...) {
      // The store is gone (process teardown): peers cannot learn it; they leak their blocks.
    }
  }
  bool final = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (own) retired_.emplace_back(generation, std::move(own));
    final = final_;
    // At teardown, not asked again: every query of a dead TCPStore logs a stack trace.
    if (!published && final) store_gone_ = true;
  }
  // The workspace is gone (a tensor outlived it): nobody else will reap.
  if (final) reap(close_wait_, /*final=*/true);
}

void BlockRetirement::reap(Millis wait, bool final) noexcept {
  std::vector<std::pair<int, std::shared_ptr<Block>>> free, leak;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_ |= final;
    const auto deadline = std::chrono::steady_clock::now() + wait;
    auto nap = std::chrono::milliseconds(1);
    for (auto& entry : retired_) {
      if (final && free_unclosed_) {  // NOTE [Block lifetime]: freed at once at teardown
        free.push_back(std::move(entry));
        continue;
      }
      while (true) {
        const std::vector<int> open = still_open(entry.first);
        if (open.empty()) {
          free.push_back(std::move(entry));
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline || open.front() < 0) {
          if (final && free_unclosed_) {
            free.push_back(std::move(entry));  // safe on this device (NOTE [Block lifetime])
          } else if (final) {
            try {  // a warning handler may throw (Python's warnings-as-errors)
              if (open.front() < 0) {
                TORCH_WARN("cuda_p2p: rank ", rank_, " leaks its workspace block of generation ",
                           entry.first,
                           ": the store cannot be reached (its host process has "
                           "exited?), so whether the peers closed their mappings of it cannot "
                           "be learned (NOTE [Block lifetime])");
              } else {
                TORCH_WARN("cuda_p2p: rank ", rank_, " leaks its workspace block of generation ",
                           entry.first, ": rank(s) ", c10::Join(", ", open),
                           " did not close their mapping of it in time (NOTE [Block lifetime])");
              }
            } catch (...) {
            }
            leak.push_back(std::move(entry));
          }
          break;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::milliseconds(50));
      }
    }
    std::erase_if(retired_, [](const auto& e) { return !e.second; });
  }
  for (auto& l : leak) {
    // Intentionally never freed (NOTE [Block lifetime]).
    (void)new std::shared_ptr<Block>(std::move(l.second));
  }
  free.clear();  // frees the blocks, outside the lock
}

size_t BlockRetirement::retired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.size();
}

std::string BlockRetirement::key(int generation, int rank) const {
  return "cuda_p2p/workspace/" + std::to_string(generation) + "/closed/" + std::to_string(rank);
}

// Whether the store may be called: not known to be gone, and at teardown its server has not
// closed this process's connections (NOTE [Quiet teardown]). Called under mu_.
bool BlockRetirement::store_usable() noexcept {
  if (store_gone_) return false;
  if ((tearing_down_ || final_) && store_server_gone(*store_)) store_gone_ = true;
  return !store_gone_;
}

// The peers that have not closed `generation` yet; {-1} when the store cannot be read.
// Called under mu_.
std::vector<int> BlockRetirement::still_open(int generation) {
  if (!store_usable()) return {-1};
  std::vector<int> open;
  try {
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_ || gone_[r].load(std::memory_order_acquire)) continue;
      if (!store_->check({key(generation, r)})) open.push_back(r);
    }
  } catch (...) {
    store_gone_ = final_;  // at teardown, for good; a live workspace asks again next time
    return {-1};
  }
  return open;
}

}  // namespace cuda_p2p
