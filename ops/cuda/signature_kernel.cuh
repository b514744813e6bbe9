// The CUDA side of the op-signature handshake (NOTE [Op signatures] in ops/op_signature.cpp): one
// kernel writes this rank's descriptor into the peers' pads, one compares the descriptors in the
// own pad after the barrier and records a disagreement in host-mapped memory. Plain CUDA: no torch
// headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cuda_p2p::cuda {

inline constexpr int kSignatureWords = 32;
inline constexpr int kSignatureMaxTargets = 16;

struct SignatureWords {
  uint32_t w[kSignatureWords];
};

struct SignatureTargets {
  uint32_t* slot[kSignatureMaxTargets];  // a descriptor slot in some rank's pad
  int count;
};

// What the comparison kernel leaves for the host: `flag` becomes 1 on a disagreement, after the
// `world_size` descriptors (kSignatureWords words each) were copied behind it.
struct SignatureRecord {
  uint32_t flag;
  uint32_t world_size;
  uint32_t words[1];  // world_size * kSignatureWords, allocated behind the struct
};

// Loads both kernels now (NOTE [Kernels loaded up front] in p2p_workspace/cuda/signal_kernels.cuh).
cudaError_t load_signature_kernels();
// Writes `words` into every target slot, in the order of `stream`.
cudaError_t launch_publish_signature(const SignatureWords& words, const SignatureTargets& targets,
                                     cudaStream_t stream);
// Compares the `world_size` descriptors at `slots` (consecutive, kSignatureWords words each, in
// device memory) with `mine`; on a difference copies them into `record` (a device pointer to
// host-mapped memory) and sets its flag.
cudaError_t launch_compare_signatures(const uint32_t* slots, int world_size,
                                      const SignatureWords& mine, SignatureRecord* record,
                                      cudaStream_t stream);

}  // namespace cuda_p2p::cuda
