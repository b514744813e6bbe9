// The host's reader of other processes' private memory (host/cross_memory.cpp): Linux
// cross-memory attach.
#pragma once

#include <memory>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

// process_vm_readv: one copy from the peer's memory straight into this process's, instead of two
// through the shared buffer. `deny` (a test hook) makes every read fail as the kernel does under
// Yama ptrace_scope >= 1 (EPERM), so tests can exercise the fallback on machines that allow the
// call.
std::shared_ptr<CrossMemoryReader> make_cross_memory_reader(bool deny = false);

}  // namespace cuda_p2p
