// The CUDA device (cuda/cuda_device_impl.hpp and its .cpp files): the device interface on cuMem blocks (or legacy CUDA
// IPC) and CUDA streams.
// Declared only in builds with CUDA (CUDA_P2P_WITH_CUDA).
#pragma once

#include <memory>
#include <string>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

#ifdef CUDA_P2P_WITH_CUDA
// `hardware_queues`: CUDA_DEVICE_MAX_CONNECTIONS as the process set it (0: unset, the driver's
// default), which the backend reads with the rest of its configuration. Below
// kMinHardwareQueues the device waits with its wait kernel instead of stream memory operations
// (NOTE [Hardware queues] in cuda/cuda_device.cpp), and says so once.
// `blocks`: how its blocks are made (NOTE [Blocks that outlive their exporter] in
// cuda/vmm_blocks.cpp): "vmm" (cuMem allocations shared as POSIX descriptors; an error where the
// driver or the GPU lacks them), "ipc" (legacy cudaMalloc and CUDA IPC), "auto" (vmm where
// offered, else ipc, saying why in Device::block_memory()).
constexpr int kMinHardwareQueues = 4;
std::shared_ptr<Device> make_cuda_device(int device_index, int hardware_queues = 0,
                                         const std::string& blocks = "auto");
#endif

}  // namespace cuda_p2p
