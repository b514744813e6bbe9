// How a dispatcher op finds its group: by the name torch.distributed registered it under
// (group.group_name), as the ops' schemas take it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/ProcessGroupCudaP2P.hpp"

namespace cuda_p2p {

// The cuda_p2p backend of the group named `group_name` for tensors of `device_type`; a clear
// error, naming `op`, when the group does not exist or is not a cuda_p2p group. Cached per thread
// (NOTE [Group lookup cache] in dispatcher_group.cpp).
c10::intrusive_ptr<ProcessGroupCudaP2P> resolve_backend(std::string_view group_name,
                                                        c10::DeviceType device_type,
                                                        const char* op);
// The size of the group named `group_name` (any backend).
int64_t resolve_group_size(const std::string& group_name, const char* op);

}  // namespace cuda_p2p
