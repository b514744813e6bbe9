// Reads of a peer process's private memory on the host: Linux cross-memory attach.
//
// process_vm_readv copies from another process's address space into this one's in a single
// kernel copy (the peer's pages are pinned, then copied to ours), which is what lets the
// workspace collectives read a peer's input tensor straight into their output instead of staging
// it through the shared buffer first (NOTE [Cross-memory reads] in ops/collectives.cpp). The kernel
// allows it only where ptrace would be allowed (same uid, and Yama's ptrace_scope; a container's
// seccomp profile may forbid the call): SymmetricWorkspace probes it at rendezvous.
#include "p2p_workspace/host/cross_memory.hpp"

#include <c10/util/Exception.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cuda_p2p {

namespace {

class ProcessVmReader : public CrossMemoryReader {
 public:
  explicit ProcessVmReader(bool deny) : deny_(deny) {}

  void read(void* dst, int64_t pid, const void* src, size_t n) override {
    auto* out = static_cast<char*>(dst);
    auto* in = static_cast<const char*>(src);
    // A read may return fewer bytes than asked (the kernel stops at the first page it cannot
    // pin); carry on from there, and fail only when no progress is made.
    while (n > 0) {
      iovec local{out, n};
      iovec remote{const_cast<char*>(in), n};
      ssize_t got;
      if (deny_) {
        got = -1;
        errno = EPERM;
      } else {
        got = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
      }
      if (got < 0 && errno == EINTR) continue;
      TORCH_CHECK(got > 0, "cuda_p2p: reading ", n, " bytes at ", src, " of process ", pid,
                  " with process_vm_readv failed: ", got < 0 ? std::strerror(errno) : "no progress",
                  deny_ ? std::string(" (denied by the test hook CUDA_P2P_TEST_DENY_CROSS_MEMORY)")
                        : std::string());
      out += got;
      in += got;
      n -= static_cast<size_t>(got);
    }
  }

 private:
  bool deny_ = false;
};

}  // namespace

std::shared_ptr<CrossMemoryReader> make_cross_memory_reader(bool deny) {
  return std::make_shared<ProcessVmReader>(deny);
}

}  // namespace cuda_p2p
