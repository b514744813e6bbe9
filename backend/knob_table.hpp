// The knob table (knob_table.cpp): one row per knob, as config.hpp's Knob describes it. config.cpp
// checks, renders and resolves the rows (NOTE [Configuration rules] there). Backend-private.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/config.hpp"

namespace cuda_p2p::config {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr const char* kLocalRankEnv = "LOCAL_RANK";  // set by torchrun and most launchers
// CUDA's own: the hardware queues the process's streams share (NOTE [Hardware queues] in
// p2p_workspace/cuda/cuda_device.cpp).
inline constexpr const char* kCudaMaxConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS";

// Every knob, in the order of the docs' table.
std::vector<Knob> knob_rows();

}  // namespace cuda_p2p::config
