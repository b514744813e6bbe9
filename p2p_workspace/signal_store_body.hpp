// The one-store signal operations, written once for the GPU and the host (NOTE [One kernel
// source] in ops/kernel_body.hpp): a signal (Device::write_signal), a counter's advance
// (Device::advance_counter) and a counted signal (Device::write_counted, NOTE [Replay-safe
// signals] in p2p_workspace/symmetric_workspace.cpp). The CUDA kernels of the same names
// (p2p_workspace/cuda/signal_kernels.cu) and the host device's tasks (p2p_workspace/host/
// host_device.cpp) run these bodies. Plain C++ without torch headers, so that nvcc compiles it too.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"  // CUDA_P2P_HOST_DEVICE, CUDA_P2P_POLICY_CALLS

namespace cuda_p2p {

// A policy F of the signal stores provides:
//   uint32_t load(const uint32_t*) const     a counter of this rank's own memory; only the
//                                            streams of one channel, one at a time, write it,
//                                            so the stream's order orders it
//   void store(uint32_t*, uint32_t) const    a counter's new value, as load
//   void publish(uint32_t*, uint32_t) const  a signal word (usually in a peer's pad), after
//                                            everything this stream wrote before: CUDA a
//                                            system fence and a release store; the host a
//                                            release exchange that wakes a sleeping waiter

// Device::write_signal: `value` into `addr`.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void signal_write(uint32_t* addr, uint32_t value, const F& f) {
  f.publish(addr, value);
}

// Device::advance_counter: *counter += delta.
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void counter_advance(uint32_t* counter, uint32_t delta, const F& f) {
  f.store(counter, f.load(counter) + delta);
}

// Device::write_counted: *counter + offset into `addr`, the counter read when the stream gets
// here (a replay reads the count its own earlier advances left).
CUDA_P2P_POLICY_CALLS
template <typename F>
CUDA_P2P_HOST_DEVICE inline void counted_write(uint32_t* addr, const uint32_t* counter,
                                               uint32_t offset, const F& f) {
  f.publish(addr, f.load(counter) + offset);
}

}  // namespace cuda_p2p
