#include "p2p_workspace/store_probe.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace cuda_p2p {

// NOTE [Quiet teardown]
// Why: a group's workspace is destroyed after its group, often at the end of the process, and its
// closing handshake (NOTE [Block lifetime] in block_retirement.cpp) goes through the group's
// store, whose server lives in one process of the job (rank 0's TCPStore) that may have exited
// by then (ranks end at different times; a group spanning hosts tears down its intra-host
// workspaces after the host's peers). Every call to a TCPStore whose server is gone fails, and
// torch's client logs it with a C++ stack trace before it raises: on every rank, for every key.
// How: at teardown the workspace asks the kernel, not the server: when the server's process
// exits its sockets close, and this process's connections to it read end-of-file.
//  - the probe peeks at them (MSG_PEEK | MSG_DONTWAIT: nothing consumed, nothing sent), so the
//    server never hears of it (a probe that connected would cost a busy server an accept);
//  - a server found gone is gone for good: no more store calls, the blocks handled as the
//    handshake says when the peers cannot be learned;
//  - a server that exits between the probe and the call is the one window left; other stores
//    (FileStore, HashStore) have no server to lose.
namespace {

int peer_port(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// Whether a connected socket of this process to `port` reads end-of-file or an error.
bool connection_closed(int port) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool closed = false;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st{};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer_port(peer) != port) {
      continue;
    }
    char byte = 0;
    const ssize_t n = ::recv(static_cast<int>(fd), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      closed = true;
      break;
    }
  }
  ::closedir(dir);
  return closed;
}

}  // namespace

bool store_server_gone(c10d::Store& store) noexcept {
  try {
    c10d::Store* s = &store;
    c10::intrusive_ptr<c10d::Store> inner;
    if (auto* prefix = dynamic_cast<c10d::PrefixStore*>(s)) {
      inner = prefix->getUnderlyingNonPrefixStore();
      s = inner.get();
    }
    const auto* tcp = dynamic_cast<const c10d::TCPStore*>(s);
    return tcp != nullptr && connection_closed(tcp->getPort());
  } catch (...) {
    return false;
  }
}

}  // namespace cuda_p2p
