#include "backend/dispatcher_group.hpp"

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace cuda_p2p {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name,
                                                     const char* op) {
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cuda_p2p ", op, ": no process group named '", group_name,
                "' (pass group.group_name of a group created with backend='cuda_p2p'): ", e.what());
  }
}

}  // namespace

int64_t resolve_group_size(const std::string& group_name, const char* op) {
  return resolve_group(group_name, op)->getSize();
}

ProcessGroupCudaP2P& resolve_backend(const std::string& group_name, c10::DeviceType device_type,
                                     const char* op) {
  auto group = resolve_group(group_name, op);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(device_type);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cuda_p2p ", op, ": group '", group_name, "' has no backend for ",
                c10::DeviceTypeName(device_type), " tensors: ", e.what());
  }
  auto* ours = dynamic_cast<ProcessGroupCudaP2P*>(backend.get());
  TORCH_CHECK(ours != nullptr, "cuda_p2p ", op,
              ": expected a group created with backend='cuda_p2p', but group '", group_name,
              "' runs ", backend ? backend->getBackendName() : std::string("no backend"), " for ",
              c10::DeviceTypeName(device_type), " tensors");
  return *ours;
}

}  // namespace cuda_p2p
