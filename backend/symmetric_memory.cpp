#include "backend/symmetric_memory.hpp"

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "backend/symmetric_allocator.hpp"
#include "backend/workspace_collectives.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

SymmetricMemory::SymmetricMemory(const EngineContext& group, WorkspaceCollectives& collectives)
    : group_(group), collectives_(collectives) {}

at::Device SymmetricMemory::device() const {
  TORCH_CHECK(group_.workspace && group_.workspace->available(),
              "cuda_p2p symmetric memory: expected a group with an available P2P workspace, but "
              "it is unavailable: ",
              workspace_unavailable_reason(group_));
  return group_.workspace->device().tensor_device();
}

// NOTE [Heap creation attempts]
// A heap that cannot be created (a rank out of memory: NOTE [Allocation failures at rendezvous])
// fails on every rank at once, so every rank counts the same attempts, and each attempt
// rendezvous under a prefix of its own: a later one (after memory was freed) never reads a record
// the failed one left in the store.
void SymmetricMemory::ensure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (heap_) return;
  const at::Device device = this->device();
  WorkspaceOptions o = group_.config.workspace_options;
  o.timeout = group_.workspace->timeout();  // the group's, as setTimeout last set it
  o.buffer_size = group_.config.symmetric_heap_size;
  o.num_channels = 1;  // its pad is never signalled: the collectives synchronise on the workspace
  o.cross_memory_reads = false;
  o.graph_region_bytes = 0;  // no collective runs on the heap (NOTE [Graph flags])
  const std::string prefix = attempts_ == 0
                                 ? std::string("cuda_p2p/heap/")
                                 : "cuda_p2p/heap/attempt" + std::to_string(attempts_) + "/";
  ++attempts_;
  // Collective: every rank creates it at the same point of its op sequence (the first
  // cuda_p2p.empty, use_symmetric_memory or MemPool allocator), so the collectives' heap changes
  // in step. On CUDA the heap is committed device memory (a cudaMalloc'd block), on the
  // host a sparse memfd mapping.
  std::unique_ptr<SymmetricWorkspace> heap;
  const auto context = [&] {
    return "cuda_p2p symmetric memory: could not create the group's symmetric heap of " +
           std::to_string(group_.config.symmetric_heap_size) + " bytes per rank on " +
           device.str() + (device.is_cuda() ? " (committed device memory)" : "") + ": ";
  };
  try {
    heap = std::make_unique<SymmetricWorkspace>(
        c10::make_intrusive<c10d::PrefixStore>(prefix, group_.store), group_.rank, group_.size,
        group_.workspace->device_ptr(), o);
  } catch (const c10::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, context(), e.what_without_backtrace(),
                     "; lower Options.symmetric_heap_size or CUDA_P2P_SYMMETRIC_HEAP_SIZE, or "
                     "free memory first");
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, context(), e.what_without_backtrace(),
                " (the size is Options.symmetric_heap_size or CUDA_P2P_SYMMETRIC_HEAP_SIZE)");
  }
  TORCH_CHECK(heap->available(), "cuda_p2p symmetric memory: the heap could not be mapped: ",
              heap->unavailable_reason());
  allocator_ = std::make_shared<HeapAllocator>(heap->buffer_size());
  segments_ = std::make_shared<detail::HeapSegments>(
      allocator_, heap->get_buffer(group_.rank, {heap->buffer_size()}, at::kByte));
  collectives_.set_heap(heap.get());
  heap_ = std::move(heap);
}

at::Tensor SymmetricMemory::empty(at::IntArrayRef sizes, at::ScalarType dtype,
                                  std::optional<at::Device> device) {
  TORCH_CHECK(!c10::isQIntType(dtype) && dtype != at::kComplexHalf,
              "cuda_p2p empty: expected a plain (non-quantized) dtype, got ", dtype);
  uint64_t numel = 1;
  for (auto s : sizes) {
    TORCH_CHECK(s >= 0, "cuda_p2p empty: expected sizes >= 0, got ", sizes);
    TORCH_CHECK(!c10::mul_overflows(numel, static_cast<uint64_t>(s), &numel),
                "cuda_p2p empty: the number of elements of ", sizes, " overflows");
  }
  uint64_t nbytes = 0;
  TORCH_CHECK(!c10::mul_overflows(numel, static_cast<uint64_t>(c10::elementSize(dtype)), &nbytes),
              "cuda_p2p empty: the byte size of ", sizes, " x ", dtype, " overflows");
  const at::Device expected = this->device();
  TORCH_CHECK_VALUE(!device || (device->type() == expected.type() &&
                                (!device->has_index() || device->index() == expected.index())),
                    "cuda_p2p empty: expected device ", expected,
                    " (this group's symmetric heap lives on its workspace's device), got ",
                    *device);
  ensure();
  const auto& alloc = allocator_;
  const auto bytes = static_cast<int64_t>(std::min<uint64_t>(nbytes, INT64_MAX));
  const auto offset = alloc->allocate(bytes);
  // An OutOfMemoryError (a RuntimeError in Python): allocateTensor takes it for a full heap.
  TORCH_CHECK_WITH(OutOfMemoryError, offset.has_value(),
                   "cuda_p2p empty: the symmetric heap is full: ", sizes, " x ", dtype, " needs ",
                   bytes, " bytes, the largest free range holds ", alloc->largest_free(),
                   " of its ", alloc->capacity(), " bytes (", alloc->live_blocks(),
                   " live blocks); the heap does not grow: raise Options.symmetric_heap_size or "
                   "CUDA_P2P_SYMMETRIC_HEAP_SIZE, or free symmetric tensors");
  // A byte view of the whole heap keeps its mapping alive as long as the tensor's storage.
  at::Tensor heap = heap_->get_buffer(group_.rank, {heap_->buffer_size()}, at::kByte);
  void* data = static_cast<char*>(heap.data_ptr()) + *offset;
  // NOTE [Heap frees in stream order] in p2p_workspace/symmetric_heap.cpp: on a GPU the range is
  // reclaimed only after the work queued before the free (the freeing thread's stream, then the
  // group's streams) has run.
  std::shared_ptr<Device> gpu;
  if (!heap_->device().tensor_device().is_cpu()) gpu = heap_->device_ptr();
  const Millis timeout = heap_->timeout();
  return at::for_blob(data, sizes)
      .deleter([alloc, heap, o = *offset, gpu, timeout](void*) mutable {
        std::shared_ptr<Event> queued;
        if (gpu) {
          try {
            queued = gpu->record(*gpu->current_stream());
          } catch (...) {  // NOLINT(bugprone-empty-catch): no context left (process exit)
          }
        }
        if (!queued) {
          alloc->free(o);
        } else {
          // Over once the freeing stream passed the free and the group's streams drained; a
          // failed device's synchronize raises, yet its released streams drain.
          alloc->free_after(o, [gpu, queued, timeout] {
            try {
              gpu->synchronize(*queued);
            } catch (...) {  // NOLINT(bugprone-empty-catch): the drain below says whether it ran
            }
            return gpu->query(*queued) && gpu->drain(timeout);
          });
        }
        heap.reset();
      })
      .options(at::TensorOptions().dtype(dtype).device(heap.device()))
      .target_device(heap.device())
      .make_tensor();
}

// NOTE [Storage moved into the heap]
// Why: a window registers a tensor in place (NOTE [Window registration] in backend/windows.cpp):
// the peers' puts must land in the very memory the user reads.
// How (as torch's own storage resize_ and swap do):
//  - a heap block of the storage's bytes receives its contents on the caller's current stream,
//    which is then synchronized: the copy is ordered after the work queued there that writes the
//    tensor, and has run before a peer may put into the block;
//  - the StorageImpl's DataPtr becomes the block's: the tensor, its views and every tensor sharing
//    the storage alias the heap; the old memory is freed when its DataPtr goes (after the
//    synchronize: nothing queued reads it); the block is freed when the storage dies, like a
//    cuda_p2p.empty tensor's, whether or not a window still holds it.
// Limits:
//  - only a storage its device's default allocator made (torch.empty, zeros, ...) is moved:
//    memory another owner holds (from_blob, numpy, shared or pinned memory, a memory map) may
//    still be read through that owner, so it raises;
//  - data pointers taken before the move (data_ptr(), a numpy view, DLPack) point at freed memory;
//  - ranks moving storages of different sizes allocate differently from then on: later heap
//    tensors may lie at different offsets, which costs the zero-copy collectives their zero-copy
//    path (NOTE [Zero-copy collectives] in ops/zero_copy.cpp), never correctness.
void SymmetricMemory::move_into_heap(const at::Tensor& t) {
  const at::Device dev = device();
  TORCH_CHECK_VALUE(t.defined() && t.has_storage() && t.device() == dev,
                    "cuda_p2p symmetric memory: expected a tensor with storage on ", dev,
                    " to move into the heap");
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->mutable_data();  // a lazily copied (copy-on-write) storage gets memory of its own
  const c10::Allocator* own = c10::GetAllocator(dev.type());
  const c10::DeleterFnPtr deleter = storage->data_ptr().get_deleter();
  TORCH_CHECK_VALUE(
      own != nullptr && own->raw_deleter() != nullptr && deleter == own->raw_deleter(),
      "cuda_p2p symmetric memory: expected a tensor whose memory ", dev,
      "'s default allocator made (torch.empty, torch.zeros, ...), got one whose memory another "
      "owner holds (torch.from_numpy, from_blob, shared or pinned memory, a memory map), which "
      "cannot be moved into the symmetric heap; register a copy (t.clone()) or a tensor of "
      "cuda_p2p.empty");
  const auto nbytes = static_cast<int64_t>(storage->nbytes());
  at::Tensor block = empty({nbytes}, at::kByte);
  Device& device = heap_->device();
  const auto stream = device.current_stream();
  if (nbytes > 0) {
    device.copy(*stream, block.data_ptr(), storage->data(), static_cast<size_t>(nbytes));
  }
  if (!inline_paths(device, *stream)) device.synchronize(*stream);
  at::DataPtr moved =
      block.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, block.device()));
  storage->set_data_ptr(std::move(moved));  // the old DataPtr, returned, frees the old memory
}

int64_t SymmetricMemory::offset(const at::Tensor& t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!heap_ || !t.defined() || !t.has_storage() || t.device() != heap_->device().tensor_device()) {
    return -1;
  }
  // From the data pointer to the end of the storage: all the tensor may reach.
  const auto n = static_cast<int64_t>(t.storage().nbytes()) -
                 t.storage_offset() * static_cast<int64_t>(t.element_size());
  return heap_->own_offset(t.data_ptr(), n);
}

at::Tensor SymmetricMemory::peer_tensor(const at::Tensor& t, int64_t rank) const {
  TORCH_CHECK_VALUE(rank >= 0 && rank < group_.size,
                    "cuda_p2p symmetric_peer_tensor: rank must be in [0, ", group_.size, "), got ",
                    rank);
  const int64_t offset = this->offset(t);
  TORCH_CHECK_VALUE(offset >= 0,
                    "cuda_p2p symmetric_peer_tensor: expected a tensor in this group's symmetric "
                    "heap (cuda_p2p.empty, use_symmetric_memory), got one that is not in it");
  const int64_t item = static_cast<int64_t>(t.element_size());
  TORCH_CHECK_VALUE(offset % item == 0, "cuda_p2p symmetric_peer_tensor: the tensor's offset ",
                    offset, " is not a multiple of its element size ", item);
  int64_t span = 1;  // elements from the data pointer to the last one
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) span = 0;
    if (span > 0) span += (t.size(d) - 1) * t.stride(d);
  }
  // symmetric_offset holds the data in the heap; the heap is never replaced once created.
  return heap_->get_buffer(static_cast<int>(rank), {span}, t.scalar_type(), offset / item)
      .as_strided(t.sizes(), t.strides());
}

// NOTE [Process-group allocation for FSDP2]
// What FSDP2 asks: with model.set_allocate_memory_from_process_group_for_comm(True),
// supports_tensor_alloc(device), then allocate_tensor(numel, dtype=, device=) for its comm
// buffers (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, ProcessGroupAllocMixin): the
// all-gather output (whose own chunk is the all-gather's input: in place) and the
// reduce-scatter's input and output. Heap tensors make those collectives zero-copy (NOTE
// [Zero-copy collectives] in ops/zero_copy.cpp).
// What we answer:
//  - yes only where the heap's tensors would be read zero-copy: the collectives run on the
//    workspace, the zero-copy agreement is not "off" (a CUDA group's default: NOTE [CUDA
//    zero-copy is opt-in]) and the device is the heap's; elsewhere FSDP2 takes torch.empty (a
//    heap tensor that would only stage holds heap memory for nothing);
//  - c10d passes the device's index only: a host heap answers -1, a CUDA heap its GPU's index;
//  - each call is a collective like cuda_p2p.empty (the first creates the heap); FSDP2 makes the
//    same calls in the same order on every rank;
//  - a request the heap cannot hold gets an ordinary tensor (counted allocate_tensor.fallback),
//    not a failed step: its collective then stages on every rank (the exchange sees an input
//    outside its heap; under the signature agreement every rank's allocator failed alike).
bool SymmetricMemory::allocates_comm_buffers(c10::DeviceIndex device_index) const {
  if (!collectives_.on()) return false;
  const bool host = collectives_.on_host();
  if (ops::resolve_agreement(group_.config.collective.zero_copy_agreement, host) ==
      ops::ZeroCopyAgreement::kOff) {
    return false;
  }
  return device_index == (host ? c10::DeviceIndex(-1) : device().index());
}

std::pair<at::Tensor, bool> SymmetricMemory::allocate_comm_buffer(int64_t size,
                                                                  at::TensorOptions options) {
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  try {
    return {empty({size}, dtype, options.device_opt()), true};
  } catch (const c10::OutOfMemoryError&) {
    // The heap is full or too small for it, or could not be created (on every rank alike: NOTE
    // [Allocation failures at rendezvous]); an ordinary tensor, as the NOTE above says.
  }
  return {at::empty({size}, options.device(device())), false};
}

std::map<std::string, int64_t> SymmetricMemory::info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!heap_) {
    return {{"created", 0},         {"capacity", 0},     {"used_bytes", 0}, {"live_blocks", 0},
            {"deferred_blocks", 0}, {"largest_free", 0}, {"segments", 0},   {"segment_bytes", 0}};
  }
  return {{"created", 1},
          {"capacity", allocator_->capacity()},
          {"used_bytes", allocator_->used_bytes()},
          // A block freed in stream order (NOTE [Heap frees in stream order]) has no tensor any
          // more: it counts as deferred, not live, until an allocation reclaims it.
          {"live_blocks", allocator_->live_blocks() - allocator_->deferred_blocks()},
          {"deferred_blocks", allocator_->deferred_blocks()},
          {"largest_free", allocator_->largest_free()},
          {"segments", segments_->segments()},
          {"segment_bytes", segments_->bytes()}};
}

std::shared_ptr<detail::HeapSegments> SymmetricMemory::segments() {
  ensure();
  std::lock_guard<std::mutex> lock(mutex_);
  return segments_;
}

std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> SymmetricMemory::allocator() {
  const at::Device device = this->device();
  TORCH_CHECK_NOT_IMPLEMENTED(
      device.is_cuda(), "cuda_p2p symmetric_allocator: this group's symmetric heap is on ", device,
      ": torch has no allocator hook for CPU tensors; allocate CPU symmetric tensors with "
      "cuda_p2p.empty or under cuda_p2p.use_symmetric_memory (docs/collectives.md, "
      "\"Zero-copy symmetric tensors\")");
  auto segments = this->segments();  // collective the first time: creates the heap
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pool_allocator_) pool_allocator_ = detail::make_pool_allocator(segments, device.index());
  return pool_allocator_;
}

SymmetricWorkspace* SymmetricMemory::heap() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heap_.get();
}

void SymmetricMemory::set_timeout(Millis timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (heap_) heap_->set_timeout(timeout);
}

}  // namespace cuda_p2p
