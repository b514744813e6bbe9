// The signal channels of a group's workspace: one per stream that signals, so that barriers issued
// from different streams never consume each other's signals (NOTE [Signal sequence numbers] in
// p2p_workspace/symmetric_workspace.cpp). WorkspaceOptions::kDefaultChannels provides them.
#pragma once

#include <array>

namespace cuda_p2p::ops {

inline constexpr int kApiChannel = 0;         // the Python API's intra_node_barrier
inline constexpr int kCollectiveChannel = 1;  // the workspace collectives
inline constexpr std::array<int, 2> kPipelineChannels = {2, 3};  // the fused pipelines' streams

}  // namespace cuda_p2p::ops
