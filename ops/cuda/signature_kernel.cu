#include "ops/cuda/signature_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

__global__ void publish_signature_kernel(SignatureWords words, SignatureTargets targets) {
  const int i = threadIdx.x;  // one word per thread
  for (int t = 0; t < targets.count; ++t) {
    // Volatile: the peer's pad is read by another process's kernel; the barrier's stream write
    // that follows in stream order carries the fence that publishes it.
    volatile uint32_t* slot = targets.slot[t];
    slot[i] = words.w[i];
  }
  // NOTE [Descriptor visibility]: over PCIe P2P a peer may observe the barrier's signal before
  // these posted writes unless they are fenced system-wide first; the waiter adds
  // CU_STREAM_WAIT_VALUE_FLUSH where the device supports it (p2p_workspace/cuda/cuda_device.cpp).
  __threadfence_system();
}

__global__ void compare_signatures_kernel(const uint32_t* slots, int world_size,
                                          SignatureWords mine, SignatureRecord* record) {
  const int i = threadIdx.x;
  const volatile uint32_t* s = slots;
  bool differs = false;
  // Word 0 is the stamp: it must match too (a stale descriptor is a disagreement).
  for (int r = 0; r < world_size; ++r) differs |= s[r * kSignatureWords + i] != mine.w[i];
  if (!__syncthreads_or(differs)) return;
  for (int r = 0; r < world_size; ++r) {
    record->words[r * kSignatureWords + i] = s[r * kSignatureWords + i];
  }
  __threadfence_system();
  __syncthreads();
  if (i == 0) {
    record->world_size = static_cast<uint32_t>(world_size);
    __threadfence_system();
    *reinterpret_cast<volatile uint32_t*>(&record->flag) = 1;
  }
}

}  // namespace

cudaError_t launch_publish_signature(const SignatureWords& words, const SignatureTargets& targets,
                                     cudaStream_t stream) {
  publish_signature_kernel<<<1, kSignatureWords, 0, stream>>>(words, targets);
  return cudaGetLastError();
}

cudaError_t launch_compare_signatures(const uint32_t* slots, int world_size,
                                      const SignatureWords& mine, SignatureRecord* record,
                                      cudaStream_t stream) {
  compare_signatures_kernel<<<1, kSignatureWords, 0, stream>>>(slots, world_size, mine, record);
  return cudaGetLastError();
}

cudaError_t load_signature_kernels() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, publish_signature_kernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, compare_signatures_kernel);
  return err;
}

}  // namespace cuda_p2p::cuda
