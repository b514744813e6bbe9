// What ops/cuda/ provides to a build without CUDA (CMakeLists.txt compiles this file only
// there): errors saying so, for a device without the host's capability (NOTE [Host fast paths]).
#include <c10/util/Exception.h>

#include "ops/signature_kernels.hpp"

namespace cuda_p2p::ops {

void publish_signature_on_device(Device& device, Stream& /*s*/, const DescriptorWords& /*words*/,
                                 const std::vector<uint32_t*>& /*slots*/) {
  TORCH_CHECK(false, "cuda_p2p: op signatures on a ", device.name(),
              " device need a build with CUDA");
}

void compare_signatures_on_device(Device& device, Stream& /*s*/, const uint32_t* /*slots*/,
                                  int /*world_size*/, const DescriptorWords& /*mine*/,
                                  uint32_t* /*record*/) {
  TORCH_CHECK(false, "cuda_p2p: op signatures on a ", device.name(),
              " device need a build with CUDA");
}

}  // namespace cuda_p2p::ops
