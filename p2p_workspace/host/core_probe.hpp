// Core-to-core round trip: how long one cache line takes to go from one CPU to another and back
// (NOTE [Core placement] in core_probe.cpp). A yardstick of the machine, not of cuda_p2p: on a
// virtual machine it tells whether two vCPUs currently share a last-level cache, which decides
// how fast every cross-rank transfer of the host path runs.
#pragma once

#include <chrono>
#include <cstdint>

namespace cuda_p2p::host {

struct CoreRoundTrip {
  double min_ns = 0;     // the fastest batch's round trip (per round trip); 0 if none completed
  double median_ns = 0;  // the median batch's; 0 if none completed
  int64_t batches = 0;   // batches of kRoundTripBatch round trips timed
  // Fewer than kMinRoundTripBatches batches completed within the duration plus one second: one of
  // the CPUs was busy with something else (the figures then describe the machine's load, not the
  // placement). A result, not an error: a busy machine is a state to report.
  bool busy = false;
};

constexpr int kRoundTripBatch = 16;
constexpr int64_t kMinRoundTripBatches = 32;

// Bounces one cache line between a thread pinned to `cpu_a` and one pinned to `cpu_b` for about
// `duration` (at most 1 s; at least 32 batches), timed in batches. Throws std::invalid_argument
// when the CPUs are equal, negative or not usable by this process; returns `busy` when fewer than
// 32 batches completed within `duration` plus one second (a CPU taken by something else). Each
// waiting thread spins briefly, then yields: a probe run beside busy ranks does not starve them.
CoreRoundTrip core_round_trip(int cpu_a, int cpu_b, std::chrono::microseconds duration);

}  // namespace cuda_p2p::host
