// NOTE [Quiet teardown] in p2p_workspace/store_probe.cpp: a workspace destroyed after its store's
// server has exited learns so from the kernel (its connection reads end-of-file) and calls the
// store no more, instead of making every call fail with a logged C++ stack trace.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "p2p_workspace/store_probe.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

// A TCPStore server of this process only, and clients of it (one per thread that uses it: a
// client serves one request at a time).
struct PrivateStore {
  c10::intrusive_ptr<c10d::TCPStore> server, client;
  c10d::TCPStoreOptions opts;
  PrivateStore() {
    opts.port = 0;
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::seconds(20);
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
    opts.port = server->getPort();
    opts.isServer = false;
    client = new_client();
  }
  c10::intrusive_ptr<c10d::TCPStore> new_client() {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  }
};

TEST(QuietTeardown, AServerThatExitedIsSeenWithoutAskingIt) {
  PrivateStore s;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "a/", c10::make_intrusive<c10d::PrefixStore>("b/", s.client));
  EXPECT_FALSE(store_server_gone(*prefixed));
  prefixed->set("k", std::vector<uint8_t>{1});
  s.server.reset();  // its process "exits": the daemon closes its connections
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!store_server_gone(*prefixed) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(store_server_gone(*prefixed));
  // A store without a server never is.
  EXPECT_FALSE(store_server_gone(*c10::make_intrusive<c10d::HashStore>()));
}

// Two ranks of one workspace in this process: their closing handshake would ask the dead server
// whether the other closed its mapping.
TEST(QuietTeardown, AWorkspaceOutlivingItsStoreServerIsDestroyedQuietlyAndAtOnce) {
  PrivateStore s;
  WorkspaceOptions o;
  o.buffer_size = 4096;
  o.timeout = std::chrono::seconds(5);
  std::unique_ptr<SymmetricWorkspace> ws[2];
  std::thread peer([&] {
    ws[1] = std::make_unique<SymmetricWorkspace>(
        c10::make_intrusive<c10d::PrefixStore>("ws/", s.new_client()), 1, 2, test_host_device(2),
        o);
  });
  ws[0] = std::make_unique<SymmetricWorkspace>(
      c10::make_intrusive<c10d::PrefixStore>("ws/", s.client), 0, 2, test_host_device(2), o);
  peer.join();
  ASSERT_TRUE(ws[0]->available()) << ws[0]->unavailable_reason();
  s.server.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Every store call now fails, and torch's client logs each failure with a stack trace: none
  // may be made. What the teardown writes to stderr is captured.
  std::FILE* capture = std::tmpfile();
  ASSERT_NE(capture, nullptr);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(::fileno(capture), STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  ws[0].reset();
  ws[1].reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string written;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) written.push_back(static_cast<char>(c));
  std::fclose(capture);
  EXPECT_EQ(written.find("failed"), std::string::npos) << written;
  EXPECT_LT(took, std::chrono::seconds(1)) << "waited for peers it cannot learn about";
}

// NOTE [Block lifetime]: on a device whose blocks outlive their owner's reference (the host's
// memfds), a workspace destroyed while a peer still maps its block frees it at once, without one
// store query: before, it asked the store whether the peer had closed every few milliseconds for
// up to SymmetricWorkspace::kCloseWait, each query a chance to meet the server's exit.
struct CountingStore : c10d::PrefixStore {
  using c10d::PrefixStore::PrefixStore;
  bool check(const std::vector<std::string>& keys) override {
    ++checks;
    return c10d::PrefixStore::check(keys);
  }
  std::atomic<int> checks{0};
};

TEST(QuietTeardown, AHostWorkspaceFreesItsBlockAtTeardownWithoutAskingTheStore) {
  auto shared = c10::make_intrusive<c10d::HashStore>();
  auto store0 = c10::make_intrusive<CountingStore>("ws/", shared);
  auto store1 = c10::make_intrusive<CountingStore>("ws/", shared);
  WorkspaceOptions o;
  o.buffer_size = 4096;
  o.timeout = std::chrono::seconds(5);
  std::unique_ptr<SymmetricWorkspace> ws[2];
  std::thread peer(
      [&] { ws[1] = std::make_unique<SymmetricWorkspace>(store1, 1, 2, test_host_device(2), o); });
  ws[0] = std::make_unique<SymmetricWorkspace>(store0, 0, 2, test_host_device(2), o);
  peer.join();
  ASSERT_TRUE(ws[0]->available()) << ws[0]->unavailable_reason();
  ASSERT_TRUE(ws[0]->device().blocks_outlive_owner());
  const int before = store0->checks.load();
  ws[0].reset();  // rank 1 still maps rank 0's block: it never closes it before this returns
  EXPECT_EQ(store0->checks.load(), before) << "asked the store whether the peer had closed";
  ws[1].reset();
}

}  // namespace
}  // namespace cuda_p2p::test
