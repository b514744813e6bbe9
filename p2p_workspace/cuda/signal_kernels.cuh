// Kernel fallbacks for the CUDA signal operations, used where stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32) are unavailable. Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cuda_p2p::cuda {

constexpr int kMaxKernelWaits = 16;

struct KernelWaits {
  const uint32_t* addr[kMaxKernelWaits];
  uint32_t value[kMaxKernelWaits];
  int count;
};

// What a wait kernel reports when it gives up (host-mapped pinned memory, zeroed before the
// launch): gave_up != 0, and missing[i] != 0 for every wait i not reached at the deadline.
struct KernelGiveUp {
  uint32_t missing[kMaxKernelWaits];
  uint32_t gave_up;
};

// Writes `value` to `addr` after a system-wide fence (prior writes of the stream become visible
// to peers first).
cudaError_t launch_write_signal(uint32_t* addr, uint32_t value, cudaStream_t stream);

// Spins (with __nanosleep back-off) until every wait is reached or `timeout_ns` passes; on
// timeout it fills *give_up (a device pointer to host-mapped memory) and returns, and the
// device's watchdog turns that into an error the host raises (NOTE [Device failure]).
cudaError_t launch_wait_signals(const KernelWaits& waits, uint64_t timeout_ns,
                                KernelGiveUp* give_up, cudaStream_t stream);

}  // namespace cuda_p2p::cuda
