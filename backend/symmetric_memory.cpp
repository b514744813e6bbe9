// ProcessGroupCudaP2P's symmetric heap: user tensors that live in memory every peer maps, so that
// the collectives read them where they lie (NOTE [Symmetric heap] in
// p2p_workspace/symmetric_heap.cpp, NOTE [Zero-copy collectives] in ops/zero_copy.cpp).
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "backend/ProcessGroupCudaP2P.hpp"

namespace cuda_p2p {

void ProcessGroupCudaP2P::ensure_symmetric_heap() {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (heap_) return;
  TORCH_CHECK(is_p2p_available(),
              "cuda_p2p symmetric memory: expected a group with an available P2P workspace, but "
              "it is unavailable: ",
              p2p_unavailable_reason());
  TORCH_CHECK_NOT_IMPLEMENTED(
      workspace_on_host(),
      "cuda_p2p symmetric memory: the symmetric heap exists on the host (CPU tensors) only; "
      "CUDA symmetric tensors are not implemented (docs/collectives.md, \"Zero-copy symmetric "
      "tensors\")");
  WorkspaceOptions o = config_.workspace_options;
  o.buffer_size = config_.symmetric_heap_size;
  o.num_channels = 1;  // its pad is never signalled: the collectives synchronise on the workspace
  o.private_reads = false;
  // Collective: every rank creates it at the same point of its op sequence (the first
  // cuda_p2p.empty or use_symmetric_memory), so collective_state_.heap changes in step.
  auto heap = std::make_unique<SymmetricWorkspace>(
      c10::make_intrusive<c10d::PrefixStore>("cuda_p2p/heap/", store_), getRank(), getSize(),
      workspace_->device_ptr(), o);
  TORCH_CHECK(heap->available(), "cuda_p2p symmetric memory: the heap could not be mapped: ",
              heap->unavailable_reason());
  heap_allocator_ = std::make_shared<HeapAllocator>(heap->buffer_size());
  {
    std::lock_guard<std::mutex> collective_lock(collective_mutex_);
    collective_state_.heap = heap.get();
  }
  heap_ = std::move(heap);
}

at::Tensor ProcessGroupCudaP2P::symmetric_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
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
  ensure_symmetric_heap();
  const auto& alloc = heap_allocator_;
  const auto bytes = static_cast<int64_t>(std::min<uint64_t>(nbytes, INT64_MAX));
  const auto offset = alloc->allocate(bytes);
  TORCH_CHECK(offset.has_value(), "cuda_p2p empty: the symmetric heap is full: ", sizes, " x ",
              dtype, " needs ", bytes, " bytes, the largest free range holds ",
              alloc->largest_free(), " of its ", alloc->capacity(), " bytes (",
              alloc->live_blocks(),
              " live tensors); the heap does not grow: raise Options.symmetric_heap_size or "
              "CUDA_P2P_SYMMETRIC_HEAP_SIZE, or free symmetric tensors");
  // A byte view of the whole heap keeps its mapping alive as long as the tensor's storage.
  at::Tensor heap = heap_->get_buffer(getRank(), {heap_->buffer_size()}, at::kByte);
  void* data = static_cast<char*>(heap.data_ptr()) + *offset;
  return at::from_blob(
      data, sizes,
      [alloc, heap, o = *offset](void*) mutable {
        alloc->free(o);
        heap.reset();
      },
      at::TensorOptions().dtype(dtype).device(heap.device()));
}

int64_t ProcessGroupCudaP2P::symmetric_offset(const at::Tensor& t) const {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (!heap_ || !t.defined() || !t.device().is_cpu()) return -1;
  const auto* base = static_cast<const char*>(heap_->buffer(getRank()));
  const auto* p = static_cast<const char*>(t.data_ptr());
  const auto n = static_cast<int64_t>(t.storage().nbytes()) -
                 t.storage_offset() * static_cast<int64_t>(t.element_size());
  if (p < base || p + std::max<int64_t>(n, 0) > base + heap_->buffer_size()) return -1;
  return p - base;
}

std::map<std::string, int64_t> ProcessGroupCudaP2P::symmetric_heap_info() const {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  if (!heap_) {
    return {{"created", 0},
            {"capacity", 0},
            {"used_bytes", 0},
            {"live_blocks", 0},
            {"largest_free", 0}};
  }
  return {{"created", 1},
          {"capacity", heap_allocator_->capacity()},
          {"used_bytes", heap_allocator_->used_bytes()},
          {"live_blocks", heap_allocator_->live_blocks()},
          {"largest_free", heap_allocator_->largest_free()}};
}

}  // namespace cuda_p2p
