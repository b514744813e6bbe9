// What every engine of a group's backend knows of its group (backend/ProcessGroupCudaP2P.hpp):
// made once by the router, which outlives its engines.
#pragma once

#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/config.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

struct EngineContext {
  c10::intrusive_ptr<c10d::Store> store;
  int rank;
  int size;
  SymmetricWorkspace* workspace;  // null when the group has none
  const Config& config;           // resolved once from the Options and the environment
};

// Why the group's workspace is unavailable ("" when it is): turned off (the configuration's
// reason) or its rendezvous failed.
inline std::string workspace_unavailable_reason(const EngineContext& group) {
  return group.workspace ? group.workspace->unavailable_reason()
                         : group.config.workspace_off_reason;
}

}  // namespace cuda_p2p
