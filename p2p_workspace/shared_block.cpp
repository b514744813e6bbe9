// Shared-memory blocks: the host device's memory and every device's failure areas.
//
// NOTE [Host segment hygiene]
// A block is an anonymous memfd: it never has a name in /dev/shm, so nothing can be left behind
// there, whatever happens to the process (SIGKILL included); the kernel frees the memory when the
// last mapping or descriptor goes. The memfd is chmod'ed 0600. Peers receive the descriptor
// itself (NOTE [Authenticated block exchange] in p2p_workspace/fd_exchange.cpp).
#include "p2p_workspace/shared_block.hpp"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "p2p_workspace/fd_exchange.hpp"

namespace cuda_p2p::host {

namespace {

void* map_fd(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TORCH_CHECK(p != MAP_FAILED, "cuda_p2p: mmap of a ", bytes,
              "-byte shared block failed: ", std::strerror(errno));
  return p;
}

}  // namespace

HostBlock::HostBlock(int fd, size_t bytes, bool own_fd) : fd_(own_fd ? fd : -1) {
  data_ = map_fd(fd, bytes);
  size_ = bytes;
}

HostBlock::~HostBlock() {
  ::munmap(data_, size_);
  close_fd();
}

void HostBlock::close_fd() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

std::shared_ptr<Block> allocate_shared_block(size_t bytes) {
  TORCH_CHECK(bytes > 0, "cuda_p2p: a shared block needs at least one byte");
  const int fd = ::memfd_create("cuda_p2p", MFD_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cuda_p2p: memfd_create failed: ", std::strerror(errno));
  try {
    TORCH_CHECK(::fchmod(fd, 0600) == 0, "cuda_p2p: fchmod(0600) failed: ", std::strerror(errno));
    TORCH_CHECK(::ftruncate(fd, static_cast<off_t>(bytes)) == 0, "cuda_p2p: ftruncate to ", bytes,
                " bytes failed: ", std::strerror(errno));
    // A fresh memfd reads as zeros: the signal pad starts cleared.
    return std::make_shared<HostBlock>(fd, bytes, /*own_fd=*/true);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::unique_ptr<BlockExporter> export_shared_block(const std::shared_ptr<Block>& block,
                                                   int max_peers) {
  auto* hb = dynamic_cast<HostBlock*>(block.get());
  TORCH_CHECK(hb && hb->fd() >= 0, "cuda_p2p: only a locally allocated host block can be exported");
  return std::make_unique<FdExporter>(hb->fd(), max_peers, block, /*own_fd=*/false);
}

std::shared_ptr<Block> import_shared_block(const std::vector<uint8_t>& handle, size_t bytes,
                                           Millis timeout) {
  const int fd = receive_fd(std::string(handle.begin(), handle.end()), timeout);
  struct stat st{};
  const bool ok = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes;
  if (!ok) ::close(fd);
  TORCH_CHECK(ok, "cuda_p2p: a peer's shared block holds ", st.st_size, " bytes, expected ", bytes);
  // The mapping keeps the memory alive; the descriptor is not needed any more.
  std::shared_ptr<Block> block;
  try {
    block = std::make_shared<HostBlock>(fd, bytes, /*own_fd=*/false);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return block;
}

}  // namespace cuda_p2p::host
