// How a dispatcher op finds its group: by the name torch.distributed registered it under
// (group.group_name), as the ops' schemas take it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/ProcessGroupCudaP2P.hpp"

namespace cuda_p2p {

// The cuda_p2p backend of the group named `group_name` for tensors of `device_type`; "" names
// torch's default group (NOTE [The default group's name] in dispatcher_group.cpp). A clear
// error, naming `op`, when the group does not exist or is not a cuda_p2p group. Cached per thread
// (NOTE [Group lookup cache] in dispatcher_group.cpp).
c10::intrusive_ptr<ProcessGroupCudaP2P> resolve_backend(std::string_view group_name,
                                                        c10::DeviceType device_type,
                                                        const char* op);
// Records `group_name` as the name of torch's default group, a cuda_p2p group being created
// (python/cuda_p2p/_backend.py calls it; NOTE [The default group's name]).
void set_default_group_name(const std::string& group_name);
// Whether `group_name` (not "") is the one recorded as the default group's.
bool is_default_group_name(const std::string& group_name);

// The size of the group named `group_name` (any backend; "" as for resolve_backend).
int64_t resolve_group_size(const std::string& group_name, const char* op);

}  // namespace cuda_p2p
