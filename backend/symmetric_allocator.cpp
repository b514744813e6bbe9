// The group's allocator for a torch.cuda.MemPool over its symmetric heap: the segments it takes
// from the heap (HeapSegments, any device) and, on CUDA, the pluggable allocator around them
// (SymmetricMemory::allocator). docs/collectives.md, "Zero-copy symmetric tensors".
#include "backend/symmetric_allocator.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>

#ifdef CUDA_P2P_WITH_CUDA
#include <cuda_runtime.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif

namespace cuda_p2p {

// NOTE [Heap under a MemPool]
// On a GPU, `with cuda_p2p.use_symmetric_memory(group):` puts torch's own CUDA allocations in the
// group's heap: it enters torch.cuda.use_mem_pool with the group's MemPool (python/cuda_p2p/
// _symmetric.py: one per group, created on the group's device at first use), whose allocator is
// symmetric_allocator(): a torch::cuda::CUDAPluggableAllocator whose two std::functions capture
// this group's HeapSegments - nothing process-wide, so two groups have two allocators over two
// heaps. What torch does with it (read in torch 2.14: c10/cuda/CUDACachingAllocator.cpp,
// aten/src/ATen/cuda/MemPool.cpp, torch/csrc/cuda/CUDAPluggableAllocator.cpp,
// torch/cuda/memory.py):
//
//  * A MemPool is a private pool of the caching allocator of the device current at its creation,
//    and the pool holds a shared_ptr to its allocator (since at::cuda::MemPool takes a shared_ptr,
//    early 2026; before, a raw pointer, and a pool tensor outliving both the group and its pool
//    would reach a freed allocator there). use_mem_pool(pool, device) sends the calling thread's
//    allocations on that device to the pool until the block ends; other threads and devices are
//    not affected.
//  * An allocation in the pool is served from the pool's cached free blocks when one fits
//    (blocks are split; sizes rounded to 512 B). Else the caching allocator asks for a new
//    segment: raw_alloc(size) calls the allocation function with (size, current device, current
//    stream). The size is the caching allocator's segment size, not the tensor's: 2 MiB for
//    requests up to 1 MiB, 20 MiB up to 10 MiB, larger ones rounded up to 2 MiB.
//  * On nullptr torch would retry after releasing the cached blocks of the default pools and of
//    destroyed pools (none of which is in this heap while the group's pool lives), then raise its
//    OutOfMemoryError, which names the GPU's free memory - misleading for a full heap with the GPU
//    half empty. So the allocation function throws c10::OutOfMemoryError itself, naming the heap
//    and its options; torch's allocator expects exceptions there (it takes its lock back in a
//    scope guard around the allocation call).
//  * A dead tensor's block returns to the pool's cache, not to the heap, and
//    torch.cuda.empty_cache() does not release a live pool's segments. Segments return to the
//    heap (raw_delete calls the free function with the segment's pointer, size, device and
//    stream) only once the pool is released: when the MemPool is destroyed its free segments at
//    once, the others after their last tensor died, at the next emptying of the cache
//    (torch.cuda.empty_cache(), an out-of-memory retry). While the group's pool lives, the heap's
//    used bytes (symmetric_heap_info) include every segment it ever took, used or cached.
//  * The free function may thus run long after the group is gone, from torch's allocator with its
//    lock held, at interpreter exit too. It never throws (raw_delete runs in destructors).
//  * It first waits for the segment's stream (an event, with a deadline: torch returns a block
//    used on other streams to the pool only once their events completed, so that stream is the
//    one that may still use it), since the range can be handed out again at once, to another
//    stream; not for the device, whose other streams may be blocked at a wait (NOTE [Group
//    streams] in p2p_workspace/cuda/cuda_device.cpp). A segment whose stream did not finish in
//    time is not returned to the heap, as a failed drain's mappings are kept.
//  * The HeapSegments both functions capture hold the heap's allocator and a view of its mapping
//    for as long as the allocator object lives (the pool's shared_ptr, the group's, a user's): no
//    segment is ever freed under a live tensor, none is returned to an unmapped heap, and the
//    heap's block is freed only after the group, its cuda_p2p.empty tensors and the last pool
//    over it with its segments are gone (then NOTE [Block lifetime] waits for the peers to unmap
//    it; where the allocator is the heap's last holder, that wait - up to 10 s for a peer that
//    keeps its mapping - runs inside torch's allocator, under its lock).
//
// Offsets are deterministic like the rest of the heap (NOTE [Symmetric heap]) as long as the
// caching allocator decides alike on every rank: the same allocations and frees in the same order
// on one stream. A block used on another stream (record_stream) is reusable only once an event
// has completed, which depends on timing: offsets may then differ between ranks
// (symmetric_offset says where each tensor is).

namespace detail {

#ifdef CUDA_P2P_WITH_CUDA
namespace {
// NOTE [Heap under a MemPool]: how long a released segment's stream may take to finish.
constexpr std::chrono::seconds kSegmentWait{60};
}  // namespace
#endif

HeapSegments::HeapSegments(std::shared_ptr<HeapAllocator> allocator, at::Tensor heap)
    : allocator_(std::move(allocator)),
      heap_(std::move(heap)),
      base_(static_cast<char*>(heap_.data_ptr())) {}

void* HeapSegments::allocate(size_t bytes) {
  const auto n = static_cast<int64_t>(
      std::min<size_t>(bytes, static_cast<size_t>(std::numeric_limits<int64_t>::max())));
  const auto offset = allocator_->allocate(n);
  TORCH_CHECK_WITH(OutOfMemoryError, offset.has_value(),
                   "cuda_p2p: the symmetric heap is full: a segment of ", bytes,
                   " bytes for the allocations under use_symmetric_memory (a torch.cuda.MemPool "
                   "over the heap) does not fit; the largest free range holds ",
                   allocator_->largest_free(), " of its ", allocator_->capacity(), " bytes (",
                   segments(), " pool segments hold ", this->bytes(),
                   " bytes, cached ones included: the pool keeps the segments of dead tensors); "
                   "the heap does not grow: raise Options.symmetric_heap_size or "
                   "CUDA_P2P_SYMMETRIC_HEAP_SIZE, or allocate less under it");
  std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(*offset, n);
  return base_ + *offset;
}

void HeapSegments::free(void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr), base = reinterpret_cast<uintptr_t>(base_);
  const auto offset = p >= base ? static_cast<int64_t>(p - base) : int64_t{-1};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(offset);
    TORCH_CHECK(it != live_.end(), "cuda_p2p: ", ptr,
                " is not a live segment of this symmetric heap");
    live_.erase(it);
  }
  allocator_->free(offset);
}

int64_t HeapSegments::segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(live_.size());
}

int64_t HeapSegments::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [offset, size] : live_) n += size;
  return n;
}

std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> make_pool_allocator(
    std::shared_ptr<HeapSegments> segments, int device_index) {
#ifdef CUDA_P2P_WITH_CUDA
  // NOTE [Heap under a MemPool]: both functions own the segments, hence the heap's mapping.
  auto allocate = [segments, device_index](size_t bytes, int dev, cudaStream_t) -> void* {
    TORCH_CHECK(dev == device_index,
                "cuda_p2p: the symmetric allocator of a group whose heap is on cuda:", device_index,
                " was asked for memory on cuda:", dev,
                "; create its torch.cuda.MemPool with cuda:", device_index,
                " current (cuda_p2p.get_mem_pool does)");
    return segments->allocate(bytes);
  };
  auto free = [segments](void* ptr, size_t, int dev, cudaStream_t stream) noexcept {
    try {
      int previous = -1;
      if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
      if (previous != dev) (void)cudaSetDevice(dev);
      bool over = false;
      cudaEvent_t event = nullptr;
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventRecord(event, stream) == cudaSuccess) {
        const auto deadline = std::chrono::steady_clock::now() + kSegmentWait;
        auto nap = std::chrono::microseconds(1);
        while (true) {
          const cudaError_t q = cudaEventQuery(event);
          over = q == cudaSuccess;
          if (q != cudaErrorNotReady || std::chrono::steady_clock::now() >= deadline) break;
          std::this_thread::sleep_for(nap);
          nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
        }
      }
      if (event != nullptr) (void)cudaEventDestroy(event);
      if (previous >= 0 && previous != dev) (void)cudaSetDevice(previous);
      (void)cudaGetLastError();
      if (over) segments->free(ptr);
    } catch (...) {
      // Not a segment of this heap (never, from torch): nothing of the heap to give back.
    }
  };
  return torch::cuda::CUDAPluggableAllocator::createCustomAllocator(allocate, free);
#else
  (void)segments;
  (void)device_index;
  TORCH_CHECK_NOT_IMPLEMENTED(false, "cuda_p2p: a MemPool allocator needs a build with CUDA");
  return nullptr;
#endif
}

}  // namespace detail
}  // namespace cuda_p2p
