// What SymmetricWorkspace accepts from the store (NOTE [Workspace records], NOTE [One job per
// store]): each process plays rank 0 of a 2-rank job over its own HashStore, in which the test
// wrote rank 1's record (or rank 0's slot) itself, as a stranger with access to the store could.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "p2p_workspace/fd_exchange.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/shared_block.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

WorkspaceOptions short_timeout() {
  WorkspaceOptions o;
  o.buffer_size = 4096;
  o.timeout = std::chrono::seconds(2);
  o.graph_region_bytes = 0;  // the blocks the records below describe: buffer and pad only
  return o;
}

// A well-formed record for rank 1 of a job on this host, with `line` (1-based, after the version)
// replaced when given.
std::string record(int replace_line = -1, const std::string& with = "") {
  std::vector<std::string> lines = {
      "cuda_p2p-peer-v5", host_identity(), "12345", "cpu", "-1",
      "12288",  // 4096-byte buffer + two pages of pad (2 ranks, with graph flags)
      // "cuda_p2p-0123456789abcdef0123456789abcdef@12345"
      "637564615f7032702d303132333435363738396162636465663031323334"
      "3536373839616263646566403132333435",
      "140000000000", "42", "host", "03", "-"};
  if (replace_line >= 0) lines[replace_line] = with;
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

void expect_refused(const std::string& rank1_record, const std::string& needle) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("cuda_p2p/workspace/1/info/1", bytes(rank1_record));
  expect_error([&] { SymmetricWorkspace(store, 0, 2, make_host_device(), short_timeout()); },
               needle);
}

TEST(WorkspaceRecords, MalformedRecordsAreRefusedNamingTheRank) {
  const std::string invalid = "rank 1's workspace record in the store is invalid";
  expect_refused("", invalid + " (expected version");
  expect_refused("hello", invalid + " (not newline-terminated");
  expect_refused(record(0, "cuda_p2p-peer-v1"), "expected version 'cuda_p2p-peer-v5'");
  expect_refused(record() + "extra\n", "expected 12 lines, got 13");
  expect_refused(record(1, ""), "host id must be 1-512 printable characters");
  expect_refused(record(1, std::string(600, 'h')), "host id must be 1-512");
  expect_refused(record(1, "host\x1b[2Jx"), "host id must be 1-512 printable");
  expect_refused(record(2, "0"), "pid 0 is outside [1, 4194304]");
  expect_refused(record(2, "12a"), "pid is not an integer");
  expect_refused(record(2, "-"), "pid is not an integer");
  expect_refused(record(2, "99999999999999999999"), "pid is not an integer");
  expect_refused(record(3, ""), "device name must be 1-64 printable");
  expect_refused(record(4, "70000"), "device index 70000 is outside [-1, 65536]");
  expect_refused(record(5, "-8192"), "block size -8192 is outside");
  expect_refused(record(6, ""), "handle must be 1-1024 bytes in lower-case hex");
  expect_refused(record(6, "abc"), "handle must be");
  expect_refused(record(6, "zz"), "handle must be");
  expect_refused(record(6, std::string(4096, 'a')), "longer than 4096 bytes");
  expect_refused(record(7, "-1"), "probe address is not an unsigned integer");
  expect_refused(record(8, "99999999999999999999"), "probe token is out of range");
  expect_refused(record(9, ""), "device uuid must be 1-128 printable characters");
  expect_refused(record(10, ""), "CPU mask must be 1-256 bytes in lower-case hex");
  expect_refused(record(10, "0g"), "CPU mask must be");
  expect_refused(record(10, "abc"), "CPU mask must be");
  expect_refused(record(10, std::string(1024, 'f')), "CPU mask must be");
  expect_refused(record(11, ""), "failure area's handle must be '-' or 1-1024 bytes");
  expect_refused(record(11, "abc"), "failure area's handle must be");
  expect_refused(record(11, "0G"), "failure area's handle must be");
  // Well-formed, but the block size differs: the existing cross-rank check names both ranks.
  expect_refused(record(5, "16384"), "rank 1 has a 16384-byte block");
}

// NOTE [Allocation failures at rendezvous]: a rank that could not allocate its block publishes a
// failure record; every rank raises naming it (an OutOfMemoryError for "oom"), and a malformed
// one is refused like a malformed info record.
TEST(WorkspaceRecords, AFailedRankIsNamedAndAMalformedFailureRefused) {
  const std::string head = "cuda_p2p-peer-failed-v1\n";
  const std::string failed = "1 of 2 ranks could not allocate their block of 12288 bytes (rank 1: ";
  expect_refused(head + "error\nno memfd for you\n", failed + "no memfd for you)");
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("cuda_p2p/workspace/1/info/1", bytes(head + "oom\ncudaMalloc: out of memory\n"));
  EXPECT_THROW(SymmetricWorkspace(store, 0, 2, make_host_device(), short_timeout()),
               c10::OutOfMemoryError);
  const std::string invalid = "rank 1's workspace failure record in the store is invalid";
  expect_refused(head + "fatal\nwhy\n", invalid);      // unknown kind
  expect_refused(head + "oom\n\n", invalid);           // no reason
  expect_refused(head + "oom\nwhy\nmore\n", invalid);  // an extra line
  expect_refused(head + "oom\nwhy", invalid);          // not newline-terminated
  expect_refused(head + "oom\n\x1b[2J\n", invalid);    // not printable
  expect_refused(head + "oom\n" + std::string(1001, 'x') + "\n", invalid);  // too long
}

TEST(WorkspaceRecords, AWellFormedRecordOfAStrangerIsNeverMapped) {
  // The handle names a socket nobody serves (pid 12345 is not whoever might listen there): the
  // mapping fails, and the workspace is off with a reason naming the rank - never half-mapped.
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("cuda_p2p/workspace/1/info/1", bytes(record()));
  // Rank 1's "mapped" status, as a peer that mapped rank 0 would publish it.
  store->set("cuda_p2p/workspace/1/mapped/1", bytes("0:"));
  SymmetricWorkspace ws(store, 0, 2, make_host_device(), short_timeout());
  EXPECT_FALSE(ws.available());
  EXPECT_NE(ws.unavailable_reason().find("rank 0 mapping rank 1's block"), std::string::npos)
      << ws.unavailable_reason();
}

TEST(WorkspaceRecords, ASlotHeldByAnotherJobIsRefused) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("cuda_p2p/workspace/owner/0", bytes("pid 4242 on otherhost token 00"));
  expect_error([&] { SymmetricWorkspace(store, 0, 2, make_host_device(), short_timeout()); },
               "another job already uses this store: rank 0's workspace slot is held by another "
               "process (pid 4242 on otherhost)");
  // Nothing of ours was published.
  EXPECT_FALSE(store->check({"cuda_p2p/workspace/1/info/0"}));
}

// NOTE [Authenticated block exchange]: the importer checks who serves the socket.
TEST(BlockExchange, AnExporterWhosePidDiffersFromTheHandleIsRefused) {
  auto block = host::allocate_shared_block(4096);
  static_cast<int*>(block->data())[0] = 77;
  auto exporter = host::export_shared_block(block, 2);
  auto handle = exporter->handle();
  const std::string text(handle.begin(), handle.end());
  const std::string mine = "@" + std::to_string(::getpid());
  ASSERT_EQ(text.substr(text.size() - mine.size()), mine) << text;
  // The handle as published maps (positive control)...
  auto mapped = host::import_shared_block(handle, 4096, std::chrono::seconds(5));
  EXPECT_EQ(static_cast<int*>(mapped->data())[0], 77);
  // ...one claiming another pid for the same socket (a rewritten record) does not.
  const std::string forged =
      text.substr(0, text.size() - mine.size()) + "@" + std::to_string(::getpid() + 1);
  expect_error([&] { host::import_shared_block(bytes(forged), 4096, std::chrono::seconds(5)); },
               "refusing a shared block: its exchange socket is served by uid " +
                   std::to_string(::getuid()) + " pid " + std::to_string(::getpid()) +
                   ", expected uid " + std::to_string(::getuid()) + " pid " +
                   std::to_string(::getpid() + 1));
  expect_error([&] { host::import_shared_block(bytes("cuda_p2p-xyz@1"), 4096, {}); },
               "malformed block-exchange handle");
  expect_error([&] { host::import_shared_block(bytes(text.substr(0, 41)), 4096, {}); },
               "malformed block-exchange handle");
}

// The exchange as the CUDA device uses it for a cuMem allocation's descriptor (fd_exchange.hpp):
// an exporter that owns the descriptor serves it to each peer, then closes it when destroyed.
TEST(BlockExchange, AnOwnedDescriptorIsServedToEveryPeerAndClosedWithItsExporter) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "ab", 2), 2);
  ::close(fds[1]);
  auto exporter = std::make_unique<FdExporter>(fds[0], 2, nullptr, /*own_fd=*/true);
  const auto h = exporter->handle();
  const std::string handle(h.begin(), h.end());
  for (char want : {'a', 'b'}) {  // two peers, each with its own descriptor of the one pipe
    const int got = receive_fd(handle, std::chrono::seconds(5));
    ASSERT_GE(got, 0);
    EXPECT_NE(got, fds[0]);
    char c = 0;
    EXPECT_EQ(::read(got, &c, 1), 1);
    EXPECT_EQ(c, want);
    ::close(got);
  }
  exporter.reset();
  errno = 0;
  EXPECT_EQ(::fcntl(fds[0], F_GETFD), -1);
  EXPECT_EQ(errno, EBADF) << "the exporter left its descriptor open";
}

TEST(BlockExchange, AnExporterOfAnotherUserIsRefused) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  // A child running as uid 65534 serves its own memfd under a socket name, as a stranger who
  // rewrote a rank's record would; the handle carries the child's real pid, so only the uid
  // tells it apart. The child makes raw system calls only (it is forked from a threaded process).
  char pid_hex[9];
  std::snprintf(pid_hex, sizeof(pid_hex), "%08x", static_cast<unsigned>(::getpid()));
  const std::string name = "cuda_p2p-" + std::string(24, '0') + pid_hex;  // unique per rank
  ASSERT_EQ(name.size(), 41u);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int mfd = ::memfd_create("stranger", 0);
    if (mfd < 0 || ::ftruncate(mfd, 4096) != 0) ::_exit(3);
    const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::bind(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(sock, 4) != 0) {
      ::_exit(4);
    }
    if (::write(ready[1], "r", 1) != 1) ::_exit(5);
    const int conn = ::accept(sock, nullptr, nullptr);
    char byte = 'F';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &mfd, sizeof(int));
    (void)::sendmsg(conn, &msg, MSG_NOSIGNAL);
    char sink;
    // Until the importer hangs up. (A (void) cast does not silence warn_unused_result in GCC.)
    [[maybe_unused]] const ssize_t n = ::read(conn, &sink, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  char r = 0;
  ASSERT_EQ(::read(ready[0], &r, 1), 1) << "the stranger process could not start";
  ::close(ready[0]);
  const std::string handle = name + "@" + std::to_string(child);
  const int maps_before = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) n += line.find("memfd:stranger") != std::string::npos;
    return n;
  }();
  expect_error([&] { host::import_shared_block(bytes(handle), 4096, std::chrono::seconds(5)); },
               "served by uid 65534 pid " + std::to_string(child) + ", expected uid 0 pid " +
                   std::to_string(child));
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Nothing of the stranger's was received, let alone mapped.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("memfd:stranger") != std::string::npos;
  EXPECT_EQ(n, maps_before);
  EXPECT_EQ(maps_before, 0);
}

}  // namespace
}  // namespace cuda_p2p::test
