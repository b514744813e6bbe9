// SymmetricMemory: a group's symmetric heap - user tensors that live in memory every peer maps,
// so that the collectives read them where they lie (NOTE [Symmetric heap] in
// p2p_workspace/symmetric_heap.cpp, NOTE [Zero-copy collectives] in ops/zero_copy.cpp;
// docs/zero_copy.md) - its allocator, and on CUDA the MemPool allocator carved from it
// (backend/symmetric_allocator.hpp). It owns the heap and its lock.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>

#include "backend/engine_context.hpp"
#include "p2p_workspace/symmetric_heap.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

// The allocator type of torch.cuda.MemPool (c10/cuda/CUDACachingAllocator.h, CUDA builds only).
namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;
}  // namespace c10::cuda::CUDACachingAllocator

namespace cuda_p2p {

namespace detail {
class HeapSegments;  // backend/symmetric_allocator.hpp
}  // namespace detail

class WorkspaceCollectives;

class SymmetricMemory {
 public:
  // `collectives` outlives this; the heap is made on the workspace's device and announced to the
  // collectives when it is created.
  SymmetricMemory(const EngineContext& group, WorkspaceCollectives& collectives);

  // The device of the heap: its workspace's (the host, or the GPU the group was created on).
  // Raises when the workspace is unavailable.
  at::Device device() const;
  // Collective, once: creates the heap (Config::symmetric_heap_size bytes per rank on device(),
  // mapped into every peer). Later calls return at once. Raises when the workspace is unavailable,
  // and on every rank when a rank cannot allocate its heap (an OutOfMemoryError when it ran out
  // of memory); a later call tries again.
  void ensure();
  // Collective (ranks allocate in the same order to get the same offsets): a tensor of `sizes`
  // and `dtype` in this rank's heap, whose block is freed when its storage dies. `device`, when
  // given, must be device() (a CUDA device without index: any index is taken as it).
  at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype,
                   std::optional<at::Device> device = std::nullopt);
  // Moves `t`'s whole storage into this rank's heap (NOTE [Storage moved into the heap] in
  // symmetric_memory.cpp): afterwards `t`, and every tensor viewing its storage, alias a heap block
  // holding the same bytes, and the memory it had is freed. Not collective. Raises, changing
  // nothing, when the storage's memory is not its device's default allocator's (from_blob, numpy,
  // shared or pinned memory) or the heap cannot hold it.
  void move_into_heap(const at::Tensor& t);
  // The offset of `t`'s data (all its storage bytes from its data pointer on) in this rank's
  // heap, or -1 when it is not in it (another device, or no heap).
  int64_t offset(const at::Tensor& t) const;
  // `t` (a tensor in this rank's heap) as rank `rank` holds it (ProcessGroupCudaP2P::
  // symmetric_peer_tensor).
  at::Tensor peer_tensor(const at::Tensor& t, int64_t rank) const;
  // ProcessGroupCudaP2P::symmetric_heap_info.
  std::map<std::string, int64_t> info() const;
  // The MemPool allocator (NOTE [Heap under a MemPool] in backend/symmetric_allocator.cpp) and
  // the segments it takes from the heap; collective the first time (they create the heap).
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator();
  std::shared_ptr<detail::HeapSegments> segments();
  // The heap once created, else null.
  SymmetricWorkspace* heap() const;
  // c10d's setTimeout: the heap's waits and store exchanges from now on.
  void set_timeout(Millis timeout);

  // FSDP2's comm buffers (NOTE [Process-group allocation for FSDP2]): whether this group's
  // collectives would read heap tensors on the device of `device_index` zero-copy, and a buffer
  // of `size` elements in the heap (true), or an ordinary tensor (false) when the heap cannot
  // hold it.
  bool allocates_comm_buffers(c10::DeviceIndex device_index) const;
  std::pair<at::Tensor, bool> allocate_comm_buffer(int64_t size, at::TensorOptions options);

 private:
  const EngineContext group_;
  WorkspaceCollectives& collectives_;

  // The heap, created by ensure() under mutex_; its allocator is shared with the deleters of the
  // tensors in it, which also keep its mapping alive.
  mutable std::mutex mutex_;
  std::unique_ptr<SymmetricWorkspace> heap_;
  std::shared_ptr<HeapAllocator> allocator_;
  // What the MemPool allocator's functions own (NOTE [Heap under a MemPool]); the allocator
  // itself is created on the first allocator().
  std::shared_ptr<detail::HeapSegments> segments_;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> pool_allocator_;
  int attempts_ = 0;  // NOTE [Heap creation attempts]
};

}  // namespace cuda_p2p
