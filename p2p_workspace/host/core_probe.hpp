// Core-to-core round trip: how long one cache line takes to go from one CPU to another and back
// (NOTE [Core placement] in core_probe.cpp). A yardstick of the machine, not of cuda_p2p: on a
// virtual machine it tells whether two vCPUs currently share a last-level cache, which decides
// how fast every cross-rank transfer of the host path runs.
#pragma once

#include <chrono>
#include <cstdint>

namespace cuda_p2p::host {

struct CoreRoundTrip {
  double min_ns = 0;     // the fastest batch's round trip (per round trip)
  double median_ns = 0;  // the median batch's
  int64_t batches = 0;   // batches of kRoundTripBatch round trips timed
};

constexpr int kRoundTripBatch = 16;

// Bounces one cache line between a thread pinned to `cpu_a` and one pinned to `cpu_b` for about
// `duration` (at most 1 s; at least 32 batches), timed in batches. Throws std::invalid_argument
// when the CPUs are equal, negative or not usable by this process, and std::runtime_error when
// fewer than 32 batches completed within `duration` plus one second (a CPU taken by something that
// never yields). Each waiting thread spins briefly, then yields: a probe run beside busy ranks does
// not starve them.
CoreRoundTrip core_round_trip(int cpu_a, int cpu_b, std::chrono::microseconds duration);

}  // namespace cuda_p2p::host
