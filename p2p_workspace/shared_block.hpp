// memfd-backed shared blocks (shared_block.cpp, NOTE [Host segment hygiene] there): the host
// device's memory, and every device's failure areas (NOTE [Failure words] in watchdog.hpp), which
// are host memory on a GPU too. Algorithms use Device.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::host {

// A block of shared memory: an anonymous memfd (never a name in /dev/shm), mode 0600.
class HostBlock : public Block {
 public:
  HostBlock(int fd, size_t bytes, bool own_fd);
  ~HostBlock() override;
  // The memfd, kept open on the owning rank (for export); -1 on importers.
  int fd() const { return fd_; }
  // Closes the memfd once no exporter needs it any more; the mapping stays.
  void close_fd();

 private:
  int fd_;
};

// memfd-backed blocks (shared_block.cpp): allocate, export to peers over a Unix socket
// (SCM_RIGHTS, same user only), import.
std::shared_ptr<Block> allocate_shared_block(size_t bytes);
std::unique_ptr<BlockExporter> export_shared_block(const std::shared_ptr<Block>& block,
                                                   int max_peers);
std::shared_ptr<Block> import_shared_block(const std::vector<uint8_t>& handle, size_t bytes,
                                           Millis timeout);

}  // namespace cuda_p2p::host
