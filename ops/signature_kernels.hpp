// The GPU half of the op-signature handshake (NOTE [Op signatures] in ops/op_signature.cpp), for a
// device without the host's capability (NOTE [Host fast paths] in p2p_workspace/device.hpp):
// kernels enqueued in the order of `s`. ops/cuda/signature_launch.cpp; a build without CUDA has
// ops/cuda/without_cuda.cpp, which raises.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/op_signature.hpp"

namespace cuda_p2p::ops {

// Where the comparison kernel leaves a disagreement, in words the host reads (Device::host_words):
// word 0 becomes 1 on a disagreement, after word 1 was set to the world size and the world size's
// descriptors were copied from word kRecordHeader on.
inline constexpr size_t kRecordHeader = 2;
inline size_t signature_record_words(int world_size) {
  return kRecordHeader + static_cast<size_t>(world_size) * SymmetricWorkspace::kDescriptorWords;
}

// Writes `words` into every slot of `slots` (descriptor slots in the ranks' pads).
void publish_signature_on_device(Device& device, Stream& s, const DescriptorWords& words,
                                 const std::vector<uint32_t*>& slots);
// Compares the `world_size` descriptors at `slots` (consecutive, in this rank's pad) with
// `mine`; on a difference fills `record` (its device address) as above.
void compare_signatures_on_device(Device& device, Stream& s, const uint32_t* slots, int world_size,
                                  const DescriptorWords& mine, uint32_t* record);

}  // namespace cuda_p2p::ops
