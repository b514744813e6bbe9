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

// NOTE [Heap frees in stream order]
// On a GPU a tensor's Python reference dies while kernels queued on a stream, or a peer's
// zero-copy pull, may still read it; handing its range to the next cuda_p2p.empty at once would
// let a new tensor's writes land under them (the MemPool path synchronizes instead:
// backend/symmetric_allocator.cpp). So a CUDA heap's tensors are freed with free_after, whose
// wait covers the work queued before the free (an event on the freeing thread's stream, then the
// group's streams: backend/symmetric_memory.cpp). Their ranges are reclaimed lazily - all of
// them, in the order they were freed, by the first allocation that cannot be served otherwise -
// never by polling which waits happen to be over: ranks that allocate and free alike must keep
// making the same calls in the same order (NOTE [Symmetric heap]), and a poll would differ
// between ranks. The host frees at once: its ops have completed when they return.
std::optional<int64_t> HeapAllocator::allocate(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p HeapAllocator: expected a size >= 0 bytes, got ", nbytes);
  if (nbytes > capacity_) return std::nullopt;
  const int64_t size = std::max<int64_t>(1, (nbytes + alignment_ - 1) / alignment_) * alignment_;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < size) continue;
        const int64_t offset = it->first, rest = it->second - size;
        free_.erase(it);
        if (rest > 0) free_.emplace(offset + size, rest);
        used_.emplace(offset, size);
        return offset;
      }
      if (deferred_.empty()) break;
    }
    complete_deferred();
  }
  return std::nullopt;
}

void HeapAllocator::free_after(int64_t offset, std::function<bool()> wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(used_.count(offset), "cuda_p2p HeapAllocator: no live block at offset ", offset);
  deferred_.emplace_back(offset, std::move(wait));
}

void HeapAllocator::complete_deferred() {
  std::vector<std::pair<int64_t, std::function<bool()>>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    due.swap(deferred_);
  }
  for (auto& [offset, wait] : due) {
    bool over = false;
    try {
      over = !wait || wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): whether the work is over is unknown
    }
    // A range whose work may still be queued stays allocated for good, as the mappings of a
    // failed drain stay mapped (NOTE [Teardown drains]): never handed out under a queued write.
    if (over) free(offset);
  }
}

int64_t HeapAllocator::deferred_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(deferred_.size());
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
