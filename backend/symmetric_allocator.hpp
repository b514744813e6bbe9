// HeapSegments: the segments a torch.cuda.MemPool takes from a group's symmetric heap (NOTE [Heap
// under a MemPool] in backend/symmetric_allocator.cpp), what the two functions of the group's
// pluggable allocator share. Device-independent, so the host tests exercise it too.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "p2p_workspace/symmetric_heap.hpp"

namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;  // c10/cuda/CUDACachingAllocator.h (CUDA builds)
}  // namespace c10::cuda::CUDACachingAllocator

namespace cuda_p2p::detail {

class HeapSegments {
 public:
  // `heap` is a byte view of this rank's whole heap: it keeps the heap's mapping alive for as
  // long as this object lives, whatever happens to the group.
  HeapSegments(std::shared_ptr<HeapAllocator> allocator, at::Tensor heap);

  // A segment of `bytes` in the heap, first fit like every heap block. Throws
  // c10::OutOfMemoryError (torch.OutOfMemoryError) naming the heap's options when no free range
  // holds it.
  void* allocate(size_t bytes);
  // Returns a segment that allocate() handed out; throws for any other pointer.
  void free(void* ptr);

  at::Device device() const { return heap_.device(); }
  // Live segments and their bytes (symmetric_heap_info's "segments" and "segment_bytes").
  int64_t segments() const;
  int64_t bytes() const;

 private:
  const std::shared_ptr<HeapAllocator> allocator_;
  const at::Tensor heap_;
  char* const base_;
  mutable std::mutex mutex_;
  std::map<int64_t, int64_t> live_;  // offset -> bytes asked for
};

// A torch::cuda::CUDAPluggableAllocator whose functions own `segments` and serve requests for
// GPU `device_index` (NOTE [Heap under a MemPool]); CUDA builds only (else it raises).
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> make_pool_allocator(
    std::shared_ptr<HeapSegments> segments, int device_index);

}  // namespace cuda_p2p::detail
