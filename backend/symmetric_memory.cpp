// ProcessGroupCudaP2P's symmetric heap: user tensors that live in memory every peer maps, so that
// the collectives read them where they lie (NOTE [Symmetric heap] in
// p2p_workspace/symmetric_heap.cpp, NOTE [Zero-copy collectives] in ops/zero_copy.cpp).
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/symmetric_allocator.hpp"

namespace cuda_p2p {

at::Device ProcessGroupCudaP2P::symmetric_device() const {
  TORCH_CHECK(is_p2p_available(),
              "cuda_p2p symmetric memory: expected a group with an available P2P workspace, but "
              "it is unavailable: ",
              p2p_unavailable_reason());
  return workspace_->device().tensor_device();
}

// NOTE [Heap creation attempts]
// A heap that cannot be created (a rank out of memory: NOTE [Allocation failures at rendezvous])
// fails on every rank at once, so every rank counts the same attempts, and each attempt
// rendezvous under a prefix of its own: a later one (after memory was freed) never reads a record
// the failed one left in the store.
void ProcessGroupCudaP2P::ensure_symmetric_heap() {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (heap_) return;
  const at::Device device = symmetric_device();
  WorkspaceOptions o = config_.workspace_options;
  o.buffer_size = config_.symmetric_heap_size;
  o.num_channels = 1;  // its pad is never signalled: the collectives synchronise on the workspace
  o.private_reads = false;
  const std::string prefix = heap_attempts_ == 0
                                 ? std::string("cuda_p2p/heap/")
                                 : "cuda_p2p/heap/attempt" + std::to_string(heap_attempts_) + "/";
  ++heap_attempts_;
  // Collective: every rank creates it at the same point of its op sequence (the first
  // cuda_p2p.empty, use_symmetric_memory or MemPool allocator), so collective_state_.heap
  // changes in step. On CUDA the heap is committed device memory (a cudaMalloc'd block), on the
  // host a sparse memfd mapping.
  std::unique_ptr<SymmetricWorkspace> heap;
  const auto context = [&] {
    return "cuda_p2p symmetric memory: could not create the group's symmetric heap of " +
           std::to_string(config_.symmetric_heap_size) + " bytes per rank on " + device.str() +
           (device.is_cuda() ? " (committed device memory)" : "") + ": ";
  };
  try {
    heap =
        std::make_unique<SymmetricWorkspace>(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                                             getRank(), getSize(), workspace_->device_ptr(), o);
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
  heap_allocator_ = std::make_shared<HeapAllocator>(heap->buffer_size());
  heap_segments_ = std::make_shared<detail::HeapSegments>(
      heap_allocator_, heap->get_buffer(getRank(), {heap->buffer_size()}, at::kByte));
  {
    std::lock_guard<std::mutex> collective_lock(collective_mutex_);
    collective_state_.heap = heap.get();
  }
  heap_ = std::move(heap);
}

at::Tensor ProcessGroupCudaP2P::symmetric_empty(at::IntArrayRef sizes, at::ScalarType dtype,
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
  const at::Device expected = symmetric_device();
  TORCH_CHECK_VALUE(!device || (device->type() == expected.type() &&
                                (!device->has_index() || device->index() == expected.index())),
                    "cuda_p2p empty: expected device ", expected,
                    " (this group's symmetric heap lives on its workspace's device), got ",
                    *device);
  ensure_symmetric_heap();
  const auto& alloc = heap_allocator_;
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
  at::Tensor heap = heap_->get_buffer(getRank(), {heap_->buffer_size()}, at::kByte);
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

int64_t ProcessGroupCudaP2P::symmetric_offset(const at::Tensor& t) const {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (!heap_ || !t.defined() || !t.has_storage() || t.device() != heap_->device().tensor_device()) {
    return -1;
  }
  // From the data pointer to the end of the storage: all the tensor may reach.
  const auto n = static_cast<int64_t>(t.storage().nbytes()) -
                 t.storage_offset() * static_cast<int64_t>(t.element_size());
  return heap_->own_offset(t.data_ptr(), n);
}

at::Tensor ProcessGroupCudaP2P::symmetric_peer_tensor(const at::Tensor& t, int64_t rank) const {
  TORCH_CHECK_VALUE(rank >= 0 && rank < getSize(),
                    "cuda_p2p symmetric_peer_tensor: rank must be in [0, ", getSize(), "), got ",
                    rank);
  const int64_t offset = symmetric_offset(t);
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
// FSDP2 with model.set_allocate_memory_from_process_group_for_comm(True) asks the group's backend
// supports_tensor_alloc(device), then allocate_tensor(numel, dtype=, device=) for its comm
// buffers (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, ProcessGroupAllocMixin):
// the all-gather output, whose own chunk is the all-gather's input (an in-place all-gather), and
// the reduce-scatter's input and output. Heap tensors make those collectives zero-copy (NOTE
// [Zero-copy collectives] in ops/zero_copy.cpp). So the answer is yes only where the heap's
// tensors would be read in place: the collectives run on the workspace, the zero-copy agreement
// is not "off" (a CUDA group's default: NOTE [CUDA zero-copy is opt-in]) and the device is the
// heap's; elsewhere FSDP2 takes torch.empty, and a heap tensor that would only stage holds heap
// memory for nothing. c10d passes the device's index only: a CPU device has none (-1), so a
// host heap answers -1 and a CUDA heap its own GPU's index.
// Each call is a collective like cuda_p2p.empty (the first creates the heap); FSDP2 makes the
// same calls in the same order on every rank. A request the heap cannot hold gets an ordinary
// tensor (counted allocate_tensor.fallback) instead of failing the training step: its
// collective then stages on every rank - the exchange sees an input outside its heap; under the
// signature agreement every rank's allocator, fed the same calls, failed alike, and none claims.
bool ProcessGroupCudaP2P::supportsTensorAlloc(c10::DeviceIndex device_index) {
  if (!uses_workspace_collectives() || hierarchy_) return false;
  const bool host = workspace_on_host();
  if (ops::resolve_agreement(config_.collective.zero_copy_agreement, host) ==
      ops::ZeroCopyAgreement::kOff) {
    return false;
  }
  return device_index == (host ? c10::DeviceIndex(-1) : symmetric_device().index());
}

at::Tensor ProcessGroupCudaP2P::allocateTensor(long size, at::TensorOptions options) {
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  const std::optional<at::Device> device = options.device_opt();
  TORCH_CHECK_VALUE(size >= 0, "cuda_p2p allocate_tensor: expected a size >= 0, got ", size);
  TORCH_CHECK(supportsTensorAlloc(device ? device->index() : c10::DeviceIndex(-1)),
              "cuda_p2p allocate_tensor: this group does not allocate tensors on ",
              device ? device->str() : std::string("the default device"),
              " (supports_tensor_alloc is false: it allocates only where its collectives read the "
              "heap's tensors in place, NOTE [Process-group allocation for FSDP2])");
  try {
    auto t = symmetric_empty({size}, dtype, device);
    bump_counter("allocate_tensor.heap");
    return t;
  } catch (const c10::OutOfMemoryError&) {
    // The heap is full or too small for it, or could not be created (on every rank alike: NOTE
    // [Allocation failures at rendezvous]); an ordinary tensor, as the NOTE above says.
  }
  bump_counter("allocate_tensor.fallback");
  return at::empty({size}, options.device(symmetric_device()));
}

std::map<std::string, int64_t> ProcessGroupCudaP2P::symmetric_heap_info() const {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (!heap_) {
    return {{"created", 0},         {"capacity", 0},     {"used_bytes", 0}, {"live_blocks", 0},
            {"deferred_blocks", 0}, {"largest_free", 0}, {"segments", 0},   {"segment_bytes", 0}};
  }
  return {{"created", 1},
          {"capacity", heap_allocator_->capacity()},
          {"used_bytes", heap_allocator_->used_bytes()},
          // A block freed in stream order (NOTE [Heap frees in stream order]) has no tensor any
          // more: it counts as deferred, not live, until an allocation reclaims it.
          {"live_blocks", heap_allocator_->live_blocks() - heap_allocator_->deferred_blocks()},
          {"deferred_blocks", heap_allocator_->deferred_blocks()},
          {"largest_free", heap_allocator_->largest_free()},
          {"segments", heap_segments_->segments()},
          {"segment_bytes", heap_segments_->bytes()}};
}

}  // namespace cuda_p2p
