#include "p2p_workspace/symmetric_heap.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace cuda_p2p {

// NOTE [Symmetric heap]
// A group's symmetric heap is a second region per rank, mapped into every peer like the
// workspace's buffer but never used for staging: user tensors live in it (cuda_p2p.empty), at
// the same offset on every rank, so that a collective can read a peer's input where it lies
// (NOTE [Zero-copy collectives] in ops/zero_copy.cpp). The allocator is first fit over a map of
// free ranges sorted by offset, with every size rounded up to the alignment and a freed block
// merged with its free neighbours. It depends on nothing but the sequence of allocate / free
// calls, so ranks that make the same calls in the same order get the same offsets; ranks that do
// not (a tensor freed late by one rank's garbage collector) may get different ones, which the
// collectives detect and then stage as usual - the offsets are a performance contract, never a
// correctness one. The heap does not grow (growth would move or remap tensors that users hold):
// an allocation that finds no free range raises, naming the option that sizes the heap.

HeapAllocator::HeapAllocator(int64_t capacity, int64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  TORCH_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
              "cuda_p2p HeapAllocator: the alignment must be a power of two, got ", alignment);
  TORCH_CHECK(capacity >= 0, "cuda_p2p HeapAllocator: the capacity must be >= 0 bytes, got ",
              capacity);
  const int64_t usable = capacity / alignment * alignment;
  if (usable > 0) free_.emplace(0, usable);
}

std::optional<int64_t> HeapAllocator::allocate(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p HeapAllocator: expected a size >= 0 bytes, got ", nbytes);
  if (nbytes > capacity_) return std::nullopt;
  const int64_t size = std::max<int64_t>(1, (nbytes + alignment_ - 1) / alignment_) * alignment_;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const int64_t offset = it->first, rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    used_.emplace(offset, size);
    return offset;
  }
  return std::nullopt;
}

void HeapAllocator::free(int64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto u = used_.find(offset);
  TORCH_CHECK(u != used_.end(), "cuda_p2p HeapAllocator: no live block at offset ", offset);
  int64_t start = offset, size = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, size);
}

int64_t HeapAllocator::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [o, s] : used_) n += s;
  return n;
}

int64_t HeapAllocator::live_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(used_.size());
}

int64_t HeapAllocator::largest_free() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [o, s] : free_) n = std::max(n, s);
  return n;
}

std::map<int64_t, int64_t> HeapAllocator::free_ranges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_;
}

}  // namespace cuda_p2p
