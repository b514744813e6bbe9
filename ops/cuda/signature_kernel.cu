#include "ops/cuda/signature_kernel.cuh"
#include "ops/signature_body.hpp"
#include "p2p_workspace/cuda/launch_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

static_assert(kSignatureWords == ops::kSignatureBodyWords, "one descriptor size");

// The descriptors' policy (ops/signature_body.hpp): volatile accesses, since another process's
// kernel reads the peer's pad; the barrier's stream write that follows in stream order carries
// the fence that publishes them.
struct CudaSignature {
  __device__ uint32_t load(const uint32_t* p) const {
    return *static_cast<const volatile uint32_t*>(p);
  }
  __device__ void store(uint32_t* p, uint32_t v) const { *static_cast<volatile uint32_t*>(p) = v; }
};

__global__ void publish_signature_kernel(SignatureWords words, SignatureTargets targets) {
  const int i = threadIdx.x;  // one word per thread
  ops::signature_publish_word(words.w, targets.slot, targets.count, i, CudaSignature{});
  // NOTE [Descriptor visibility]: over PCIe P2P a peer may observe the barrier's signal before
  // these posted writes unless they are fenced system-wide first; the waiter adds
  // CU_STREAM_WAIT_VALUE_FLUSH where the device supports it (p2p_workspace/cuda/cuda_device.cpp).
  __threadfence_system();
}

__global__ void compare_signatures_kernel(const uint32_t* slots, int world_size,
                                          SignatureWords mine, SignatureRecord* record) {
  const int i = threadIdx.x;
  const CudaSignature f;
  const bool differs = ops::signature_word_differs(slots, world_size, mine.w, i, f);
  if (!__syncthreads_or(differs)) return;
  // The first disagreement not yet raised stays (as the host's comparison task keeps it,
  // ops/op_signature.cpp): one thread reads the flag, the host may clear it meanwhile.
  const bool taken = i == 0 && *reinterpret_cast<const volatile uint32_t*>(&record->flag) != 0;
  if (__syncthreads_or(taken)) return;
  ops::signature_record_word(slots, world_size, i, record->words, f);
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
  return launch_kernel(publish_signature_kernel, 1, kSignatureWords, stream, words, targets);
}

cudaError_t launch_compare_signatures(const uint32_t* slots, int world_size,
                                      const SignatureWords& mine, SignatureRecord* record,
                                      cudaStream_t stream) {
  return launch_kernel(compare_signatures_kernel, 1, kSignatureWords, stream, slots, world_size,
                       mine, record);
}

cudaError_t load_signature_kernels() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, publish_signature_kernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, compare_signatures_kernel);
  return err;
}

}  // namespace cuda_p2p::cuda
