// Kernel fallbacks for the CUDA signal operations, used where stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32) are unavailable. Plain CUDA: no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"
#include "p2p_workspace/signal_wait_body.hpp"

namespace cuda_p2p::cuda {

constexpr int kMaxKernelWaits = 16;

struct KernelWaits {
  const uint32_t* addr[kMaxKernelWaits];
  uint32_t value[kMaxKernelWaits];
  int count;
};

// What a wait kernel reports when it gives up (host-mapped pinned memory, zeroed before the
// launch): gave_up != 0 (kWaitGaveUp at its deadline, kWaitEnded at a failure:
// p2p_workspace/signal_wait_body.hpp), and missing[i] != 0 for every wait i not reached then.
struct KernelGiveUp {
  uint32_t missing[kMaxKernelWaits];
  uint32_t gave_up;
};

// What else a wait kernel polls, so that it ends at once on a failure, with no release needed
// from a stream that could queue behind it (NOTE [Failure words], NOTE [Counted waits end with
// the failure] in p2p_workspace/watchdog.hpp). Device addresses of host-mapped memory, or null.
struct WaitEnds {
  const uint32_t* peer_failed;  // this rank's failure word: 1 + the rank that failed first
  const uint32_t* failed;       // the device's own failure (GraphGiveUp::failed)
  int rank;                     // this rank: its own failure coming back is not a peer's
  bool trap_on_peer_failure;    // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp
  uint32_t* eager_gave_up;      // GraphGiveUp::eager_gave_up, or null
};

// Writes `value` to `addr` after a system-wide fence (prior writes of the stream become visible
// to peers first).
cudaError_t launch_write_signal(uint32_t* addr, uint32_t value, cudaStream_t stream);

// NOTE [Kernels loaded up front]
// Under CUDA's lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a kernel is
// loaded at its first launch, and loading may synchronize the context: it waits for every stream
// of the process. A stream blocked at a signal wait then blocks the launch, and the launch may be
// the very one that would let it pass (a wait kernel's first use behind a blocked wait, the
// release of NOTE [Releasing blocked waits]). So the device loads every kernel of this file when
// it is created, before any wait is enqueued, and the backend the ops' kernels (ops/cuda/) when it
// creates a CUDA workspace. Returns the first error.
cudaError_t load_kernels();

// Spins (with __nanosleep back-off) until every wait is reached or `timeout_ns` passes; on
// timeout it fills *give_up (a device pointer to host-mapped memory) and returns, and the
// device's watchdog turns that into an error the host raises (NOTE [Device failure]). Ends the
// same way (kWaitEnded) as soon as `ends` says the device or a peer failed.
cudaError_t launch_wait_signals(const KernelWaits& waits, uint64_t timeout_ns,
                                KernelGiveUp* give_up, WaitEnds ends, cudaStream_t stream);

// NOTE [Replay-safe signals] (p2p_workspace/symmetric_workspace.cpp): the counted operations,
// whose values are read from counters in device memory when the kernel runs, so that a CUDA
// graph replays them correctly.
struct CountedKernelWaits {
  const uint32_t* addr[kMaxKernelWaits];
  const uint32_t* counter[kMaxKernelWaits];
  uint32_t offset[kMaxKernelWaits];
  int peer[kMaxKernelWaits];
  int count;
};

// What a counted wait reports when it gives up under a graph (host-mapped pinned memory of the
// device, allocated before any capture): the peers still missing, one bit per rank, and a count
// of give-ups. The host turns it into the device's failure at its next check (NOTE [Device
// failure]). Never reset: the device stays failed. `failed` is the device's failure, written by
// the host (FailureState::mirror_to); a counted wait ends at once when it or gave_up is set (NOTE
// [Counted waits end with the failure] in p2p_workspace/watchdog.hpp).
struct GraphGiveUp {
  uint32_t peer_bits[4];  // ranks 0..127
  uint32_t gave_up;
  uint32_t failed;
  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: the peers whose flag held another op's
  // tag, the first such tag and this rank's (gave_up counts these give-ups too).
  uint32_t foreign_bits[4];
  uint32_t foreign_tag;
  uint32_t own_tag;
  // NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp: kernels that found another
  // captured op holding the busy word (gave_up counts them too), and the first one's tag.
  uint32_t busy;
  uint32_t busy_tag;
  // NOTE [Eager give-ups reach the next call]: set by an eager wait kernel that gave up, after
  // its own record (KernelGiveUp).
  uint32_t eager_gave_up;
};

// *counter += delta.
cudaError_t launch_advance_counter(uint32_t* counter, uint32_t delta, cudaStream_t stream);
// *addr = *counter + offset, after a system-wide fence.
cudaError_t launch_write_counted(uint32_t* addr, const uint32_t* counter, uint32_t offset,
                                 cudaStream_t stream);
// Spins until every *addr[i] >= *counter[i] + offset[i] (sequence-number order) or `timeout_ns`
// passes; then flags the missing peers in *give_up (a device pointer to host-mapped memory) and
// traps (NOTE [Counted waits end with the failure]): torch's next synchronize raises. Returns at
// once, flagging nothing, once a peer's failure reaches this rank's word (`ends.peer_failed`,
// which the host reads; trapping instead where ends.trap_on_peer_failure: NOTE [Who traps] in
// p2p_workspace/flag_barrier_body.hpp), or give_up->gave_up or give_up->failed is set (a give-up
// of this device, or its own failure, which its host knows).
cudaError_t launch_wait_counted(const CountedKernelWaits& waits, uint64_t timeout_ns,
                                GraphGiveUp* give_up, WaitEnds ends, cudaStream_t stream);

// NOTE [Graph flags]: a kernel of `launch.barriers` flag barriers and nothing else, on
// `launch.blocks` blocks (p2p_workspace/cuda/graph_barrier.cuh).
cudaError_t launch_graph_barriers(const GraphLaunch& launch, cudaStream_t stream);

}  // namespace cuda_p2p::cuda
