// Handing a file descriptor to the peers of this host (fd_exchange.cpp, NOTE [Authenticated block
// exchange] there): how a block's memory reaches the ranks that map it, for a memfd (the host's
// blocks and every device's failure areas, shared_block.cpp) and for a CUDA allocation exported
// as a POSIX descriptor (cuda/vmm_blocks.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

// Serves `fd` to up to `max_peers` processes of this uid over a Unix socket in the abstract
// namespace (SCM_RIGHTS) until destroyed. `keep` stays referenced as long (the block whose memory
// the descriptor is); with `own_fd` the descriptor is closed then too.
class FdExporter : public BlockExporter {
 public:
  FdExporter(int fd, int max_peers, std::shared_ptr<void> keep, bool own_fd);
  ~FdExporter() override;
  FdExporter(const FdExporter&) = delete;
  FdExporter& operator=(const FdExporter&) = delete;
  // "cuda_p2p-<32 hex digits>@<pid>": the socket's name and the serving process.
  std::vector<uint8_t> handle() const override;

 private:
  struct Server;
  std::unique_ptr<Server> server_;
};

// Receives the descriptor an FdExporter serves under `handle`, within `timeout`, after checking
// that the socket is served by this uid and by the pid the handle names. The caller owns it.
int receive_fd(const std::string& handle, Millis timeout);

}  // namespace cuda_p2p
