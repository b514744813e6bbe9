// Handing a block's file descriptor to the peers of this host.
//
// NOTE [Authenticated block exchange]
// The channel: a block's descriptor (a memfd, or a CUDA allocation exported as a POSIX
// descriptor) travels over a Unix socket in the abstract namespace (SCM_RIGHTS), named by 128
// random bits, serving only processes of the same uid (SO_PEERCRED), closed as soon as the
// rendezvous is over.
// The threat: the socket's name reaches the importer through the c10d store, which anyone on the
// machine can read and rewrite; a stranger may put there the name of its own socket and serve its
// own descriptor.
// The check: the importer authenticates the exporter before it receives anything. SO_PEERCRED on
// the connected socket (filled in by the kernel, not by the peer) must show this process's uid
// and the pid the exporter put in its handle (which travels in the rank's record).
//  - another uid can fake the name and the pid but not the kernel's credentials: refused;
//  - a process of our own uid could read our memory through /proc anyway: no secret keeps it out;
//  - a pid mismatch also catches a record left by another job; ranks in different pid
//    namespaces see each other's pids differently: the import fails and the workspace is off,
//    with that reason.
#include "p2p_workspace/fd_exchange.hpp"

#include <c10/util/Exception.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

namespace cuda_p2p {

namespace {

std::string errno_str() { return std::strerror(errno); }

// RAII for a file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

std::string random_name() {
  std::random_device rd;  // /dev/urandom
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name = "cuda_p2p-";
  for (int i = 0; i < 32; ++i) name += kHex[rd() & 0xf];
  return name;
}

// An abstract-namespace address: sun_path[0] == '\0', then the name (no trailing NUL).
socklen_t abstract_address(const std::string& name, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  TORCH_CHECK(name.size() + 1 <= sizeof(addr.sun_path), "cuda_p2p: socket name too long");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// One byte of payload plus room for one descriptor (SCM_RIGHTS), for sendmsg and recvmsg.
struct FdMessage {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;  // msg points into this object
  FdMessage& operator=(const FdMessage&) = delete;
};

void send_fd(int sock, int fd) {
  FdMessage m;
  msghdr& msg = m.msg;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  while (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    if (errno != EINTR) break;  // the peer sees the failure as a closed socket
  }
}

int recv_fd(int sock) {
  FdMessage m;
  msghdr& msg = m.msg;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  TORCH_CHECK(n > 0, "cuda_p2p: receiving a peer's block descriptor failed: ",
              n == 0 ? std::string("the peer closed the connection") : errno_str());
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  TORCH_CHECK(cmsg && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS,
              "cuda_p2p: a peer sent no block descriptor");
  int fd;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

}  // namespace

struct FdExporter::Server {
  Server(int fd, int max_peers, std::shared_ptr<void> keep, bool own_fd)
      : fd_(fd), own_fd_(own_fd), keep_(std::move(keep)), name_(random_name()) {
    Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    TORCH_CHECK(sock.fd >= 0, "cuda_p2p: socket() failed: ", errno_str());
    sockaddr_un addr;
    socklen_t len = abstract_address(name_, addr);
    TORCH_CHECK(::bind(sock.fd, reinterpret_cast<sockaddr*>(&addr), len) == 0,
                "cuda_p2p: bind() of the block-exchange socket failed: ", errno_str());
    TORCH_CHECK(::listen(sock.fd, std::max(max_peers, 1)) == 0,
                "cuda_p2p: listen() failed: ", errno_str());
    listen_fd_ = sock.release();
    thread_ = std::thread([this, max_peers] { serve(max_peers); });
  }
  ~Server() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
    if (own_fd_) ::close(fd_);
  }

  void serve(int max_peers) {
    const uid_t me = ::getuid();
    int served = 0;
    while (!stop_ && served < max_peers) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;  // re-checks stop_ every 20 ms
      Fd conn(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.fd < 0) continue;
      ucred cred{};
      socklen_t cred_len = sizeof(cred);
      if (::getsockopt(conn.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || cred.uid != me) {
        continue;  // another user: closed without a descriptor
      }
      send_fd(conn.fd, fd_);
      ++served;
    }
  }

  int fd_;
  bool own_fd_;
  std::shared_ptr<void> keep_;
  std::string name_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

FdExporter::FdExporter(int fd, int max_peers, std::shared_ptr<void> keep, bool own_fd) {
  try {
    server_ = std::make_unique<Server>(fd, max_peers, std::move(keep), own_fd);
  } catch (...) {
    if (own_fd) ::close(fd);
    throw;
  }
}

FdExporter::~FdExporter() = default;

std::vector<uint8_t> FdExporter::handle() const {
  const std::string h = server_->name_ + "@" + std::to_string(::getpid());
  return {h.begin(), h.end()};
}

int receive_fd(const std::string& text, Millis timeout) {
  // NOTE [Authenticated block exchange]
  const size_t at = text.rfind('@');
  const std::string name = text.substr(0, at == std::string::npos ? 0 : at);
  const std::string pid_text = at == std::string::npos ? "" : text.substr(at + 1);
  const bool name_ok = name.size() == 41 && name.rfind("cuda_p2p-", 0) == 0 &&
                       name.find_first_not_of("0123456789abcdef", 9) == std::string::npos;
  const bool pid_ok = !pid_text.empty() && pid_text.size() <= 10 &&
                      pid_text.find_first_not_of("0123456789") == std::string::npos;
  TORCH_CHECK(name_ok && pid_ok,
              "cuda_p2p: malformed block-exchange handle (expected 'cuda_p2p-<32 hex "
              "digits>@<pid>', got ",
              text.size(), " bytes)");
  const long long expected_pid = std::stoll(pid_text);
  sockaddr_un addr;
  socklen_t len = abstract_address(name, addr);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  Fd sock;
  while (true) {
    sock.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(sock.fd >= 0, "cuda_p2p: socket() failed: ", errno_str());
    // Bounds connect() too: a listener that never accepts would otherwise block it forever.
    ::setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                "cuda_p2p: could not reach a peer's block-exchange socket within ", timeout.count(),
                " ms (", errno_str(), "); are the ranks in different network namespaces?");
    ::close(sock.release());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  TORCH_CHECK(::getsockopt(sock.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0,
              "cuda_p2p: SO_PEERCRED on the block-exchange socket failed: ", errno_str());
  TORCH_CHECK(cred.uid == ::getuid() && static_cast<long long>(cred.pid) == expected_pid,
              "cuda_p2p: refusing a shared block: its exchange socket is served by uid ", cred.uid,
              " pid ", cred.pid, ", expected uid ", ::getuid(), " pid ", expected_pid,
              " (the rank's record in the store was rewritten by another process, or left by "
              "another job)");
  ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return recv_fd(sock.fd);
}

}  // namespace cuda_p2p
