// The CUDA device (cuda/cuda_device.cpp): the device interface on CUDA IPC and CUDA streams.
// Declared only in builds with CUDA (CUDA_P2P_WITH_CUDA).
#pragma once

#include <memory>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

#ifdef CUDA_P2P_WITH_CUDA
// `hardware_queues`: CUDA_DEVICE_MAX_CONNECTIONS as the process set it (0: unset, the driver's
// default), which the backend reads with the rest of its configuration. Below
// kMinHardwareQueues the device waits with its wait kernel instead of stream memory operations
// (NOTE [Hardware queues] in cuda/cuda_device.cpp), and says so once.
constexpr int kMinHardwareQueues = 4;
std::shared_ptr<Device> make_cuda_device(int device_index, int hardware_queues = 0);
#endif

}  // namespace cuda_p2p
