// HeapAllocator: the deterministic allocator of a group's symmetric heap (docs/collectives.md,
// "Zero-copy symmetric tensors"). It hands out offsets into a fixed-size region; ranks that
// allocate and free the same sizes in the same order get the same offsets (NOTE [Symmetric heap]
// in the .cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace cuda_p2p {

class HeapAllocator {
 public:
  // Every offset handed out is a multiple of `alignment` (a power of two).
  static constexpr int64_t kDefaultAlignment = 256;
  explicit HeapAllocator(int64_t capacity, int64_t alignment = kDefaultAlignment);

  // The lowest free offset that fits `nbytes` (first fit; 0 bytes take one alignment unit, so
  // that every live block has its own offset), or nullopt when no free range does.
  std::optional<int64_t> allocate(int64_t nbytes);
  // Returns the block at `offset` (as allocate returned it); it merges with free neighbours.
  void free(int64_t offset);
  // Returns the block at `offset` only once `wait` has returned true (NOTE [Heap frees in stream
  // order] in the .cpp): until then it stays allocated. Deferred frees are completed, all of
  // them and in the order they were made, by the first allocate that finds no free range
  // otherwise, and by complete_deferred(). `wait` may block; when it returns false or throws (the
  // work it waits for may still be queued: a failed drain) the block is never returned.
  void free_after(int64_t offset, std::function<bool()> wait);
  void complete_deferred();
  // Blocks freed with free_after and not returned yet.
  int64_t deferred_blocks() const;

  int64_t capacity() const { return capacity_; }
  int64_t alignment() const { return alignment_; }
  int64_t used_bytes() const;
  int64_t live_blocks() const;
  // The largest free range (what one allocation may take at most).
  int64_t largest_free() const;
  // Free ranges, {offset: bytes}, for tests.
  std::map<int64_t, int64_t> free_ranges() const;

 private:
  const int64_t capacity_;
  const int64_t alignment_;
  mutable std::mutex mutex_;
  std::map<int64_t, int64_t> free_;  // offset -> bytes, never adjacent (merged)
  std::map<int64_t, int64_t> used_;  // offset -> bytes
  std::vector<std::pair<int64_t, std::function<bool()>>> deferred_;  // (offset, wait), in order
};

}  // namespace cuda_p2p
