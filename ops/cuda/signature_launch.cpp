// ops/signature_kernels.hpp on CUDA: the launches of ops/cuda/signature_kernel.cu.
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "ops/cuda/signature_kernel.cuh"
#include "ops/signature_kernels.hpp"

namespace cuda_p2p::ops {

namespace {

static_assert(SymmetricWorkspace::kDescriptorWords == cuda::kSignatureWords);
static_assert(offsetof(cuda::SignatureRecord, flag) == 0);
static_assert(offsetof(cuda::SignatureRecord, world_size) == sizeof(uint32_t));
static_assert(offsetof(cuda::SignatureRecord, words) == kRecordHeader * sizeof(uint32_t));

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "cuda_p2p: ", what, ": ", cudaGetErrorString(err));
}

cuda::SignatureWords signature_words(const DescriptorWords& w) {
  cuda::SignatureWords c;
  std::memcpy(c.w, w.data(), sizeof(c.w));
  return c;
}

}  // namespace

void publish_signature_on_device(Device& device, Stream& s, const DescriptorWords& words,
                                 const std::vector<uint32_t*>& slots) {
  const int n = static_cast<int>(slots.size());
  for (int r0 = 0; r0 < n; r0 += cuda::kSignatureMaxTargets) {
    cuda::SignatureTargets targets{};
    for (int r = r0; r < std::min(n, r0 + cuda::kSignatureMaxTargets); ++r) {
      targets.slot[targets.count++] = slots[r];
    }
    device.launch(s, [c = signature_words(words), targets] {
      check_launch(
          cuda::launch_publish_signature(c, targets, c10::cuda::getCurrentCUDAStream().stream()),
          "launch_publish_signature");
    });
  }
}

void compare_signatures_on_device(Device& device, Stream& s, const uint32_t* slots, int world_size,
                                  const DescriptorWords& mine, uint32_t* record) {
  device.launch(s, [slots, world_size, c = signature_words(mine),
                    rec = reinterpret_cast<cuda::SignatureRecord*>(record)] {
    check_launch(cuda::launch_compare_signatures(slots, world_size, c, rec,
                                                 c10::cuda::getCurrentCUDAStream().stream()),
                 "launch_compare_signatures");
  });
}

}  // namespace cuda_p2p::ops
