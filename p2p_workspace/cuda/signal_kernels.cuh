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
  int peer[kMaxKernelWaits];
  int count;
};

// Writes `value` to `addr` after a system-wide fence (prior writes of the stream become visible
// to peers first).
cudaError_t launch_write_signal(uint32_t* addr, uint32_t value, cudaStream_t stream);

// Spins (with __nanosleep back-off) until every wait is reached or `timeout_ns` passes; on
// timeout it records the first missing peer + 1 in *timed_out_peer (host-mapped) and returns.
cudaError_t launch_wait_signals(const KernelWaits& waits, uint64_t timeout_ns, int* timed_out_peer,
                                cudaStream_t stream);

}  // namespace cuda_p2p::cuda
