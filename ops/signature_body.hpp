// The op-signature handshake's per-word logic (NOTE [Op signatures] in ops/op_signature.cpp),
// written once for the GPU and the host (NOTE [One kernel source] in ops/kernel_body.hpp): a
// descriptor's publication into the peers' slots, the comparison of every rank's descriptor
// with this rank's, and the copy of the descriptors into the disagreement's record. Thread i of
// the CUDA kernels (ops/cuda/signature_kernel.cu, one word per thread) runs word i; the host
// (ops/op_signature.cpp) runs every word in a loop. Plain C++ without torch headers, so that nvcc
// compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p::ops {

// Words of a descriptor (SymmetricWorkspace::kDescriptorWords, cuda::kSignatureWords).
inline constexpr int kSignatureBodyWords = 32;

// A policy F provides uint32_t load(const uint32_t*) const and void store(uint32_t*, uint32_t)
// const: the descriptor slots are read and written by other processes (CUDA: volatile accesses,
// published by the barrier's fenced signal that follows in stream order, NOTE [Descriptor
// visibility]; the host: the barrier's release and acquire order them).

// Word i of this rank's descriptor `words` into each of the `count` slots (a descriptor slot in
// some rank's pad each).
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void signature_publish_word(const uint32_t* words,
                                                        uint32_t* const* slots, int count, int i,
                                                        const F& f) {
  for (int t = 0; t < count; ++t) f.store(slots[t] + i, words[i]);
}

// Whether word i of any of the `world_size` descriptors at `slots` (consecutive, in this rank's
// pad) differs from word i of `mine`. Word 0 is the stamp, the handshake's number: a stale
// descriptor is a disagreement too.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline bool signature_word_differs(const uint32_t* slots, int world_size,
                                                        const uint32_t* mine, int i, const F& f) {
  bool differs = false;
  for (int r = 0; r < world_size; ++r) {
    differs |= f.load(slots + r * kSignatureBodyWords + i) != mine[i];
  }
  return differs;
}

// Word i of every rank's descriptor at `slots` into `record` (rank r's at r * the descriptor's
// words): what the disagreement's record keeps for the host to decode.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void signature_record_word(const uint32_t* slots, int world_size, int i,
                                                       uint32_t* record, const F& f) {
  for (int r = 0; r < world_size; ++r) {
    record[r * kSignatureBodyWords + i] = f.load(slots + r * kSignatureBodyWords + i);
  }
}

}  // namespace cuda_p2p::ops
