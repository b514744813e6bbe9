// The CUDA device (cuda/cuda_device.cpp): the device interface on CUDA IPC and CUDA streams.
// Declared only in builds with CUDA (CUDA_P2P_WITH_CUDA).
#pragma once

#include <memory>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

#ifdef CUDA_P2P_WITH_CUDA
std::shared_ptr<Device> make_cuda_device(int device_index);
#endif

}  // namespace cuda_p2p
