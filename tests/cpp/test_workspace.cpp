// SymmetricWorkspace on the host device, built directly over the job's TCPStore (no Python).
#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/shared_block.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/forwarding_device.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

std::unique_ptr<SymmetricWorkspace> make_workspace(int64_t buffer_size = 1 << 16,
                                                   Millis timeout = std::chrono::seconds(60)) {
  WorkspaceOptions o;
  o.buffer_size = buffer_size;
  o.timeout = timeout;
  return std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              test_host_device(), o);
}

// A barrier the caller has passed when this returns: with CUDA's semantics (cuda_semantics()) a
// barrier is only enqueued on the caller's stream, so the host then waits for it.
void barrier_now(SymmetricWorkspace& ws, Stream& s, int channel,
                 std::optional<Millis> timeout = {}) {
  ws.barrier(s, channel, timeout);
  ws.device().synchronize(s);
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (auto* e = readdir(d)) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

int count_memfd_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("memfd:cuda_p2p") != std::string::npos;
  return n;
}

TEST(Workspace, EveryRankReadsEveryPeersBuffer) {
  const auto& w = world();
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available()) << ws->unavailable_reason();
  EXPECT_EQ(ws->buffer_size(), 1 << 16);
  auto mine = ws->get_buffer(w.rank, {1000}, at::kInt);
  mine.copy_(at::arange(1000, at::kInt) + 1000 * w.rank);
  auto s = ws->device().current_stream();
  barrier_now(*ws, *s, 0);
  for (int r = 0; r < w.size; ++r) {
    auto peer = ws->get_buffer(r, {1000}, at::kInt);
    EXPECT_TRUE(peer.equal(at::arange(1000, at::kInt) + 1000 * r)) << "rank " << r;
    // A view at an offset aliases the same memory.
    auto tail = ws->get_buffer(r, {10}, at::kInt, 990);
    EXPECT_EQ(tail.storage_offset(), 990);
    EXPECT_EQ(tail[9].item<int>(), 999 + 1000 * r);
  }
  barrier_now(*ws, *s, 0);  // nobody overwrites while others still read
}

TEST(Workspace, PutWaitHandshakesOnSeveralChannels) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available());
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  auto s = ws->device().current_stream();
  auto mine = ws->get_buffer(w.rank, {ws->num_channels()}, at::kLong);
  for (int round = 1; round <= 50; ++round) {
    for (int ch = 0; ch < ws->num_channels(); ++ch) {
      mine[ch].fill_(round * 100 + ch);
      ws->put_signal(*s, right, ch);  // "my slot ch holds round's value"
      ws->wait_signal(*s, left, ch);
      ws->device().synchronize(*s);
      EXPECT_EQ(ws->get_buffer(left, {ws->num_channels()}, at::kLong)[ch].item<int64_t>(),
                round * 100 + ch);
      ws->put_signal(*s, left, ch);    // "I have read it"
      ws->wait_signal(*s, right, ch);  // before I overwrite mine
    }
  }
}

TEST(Workspace, BarriersOnTwoChannelsFromTwoThreadsDoNotInterfere) {
  const auto& w = world();
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available());
  auto buf = ws->get_buffer(w.rank, {2}, at::kLong);
  std::exception_ptr errors[2];
  auto worker = [&](int which) {
    try {
      auto stream = ws->device().new_stream(false);
      for (int i = 1; i <= 200; ++i) {
        ws->device().launch(*stream, [&, i] { buf[which].fill_(i); });
        ws->barrier(*stream, 1 + which);
        ws->device().host_task(*stream, [&, i, which] {
          for (int r = 0; r < w.size; ++r) {
            auto v = ws->get_buffer(r, {2}, at::kLong)[which].item<int64_t>();
            TORCH_CHECK(v == i, "channel ", 1 + which, " iteration ", i, ": rank ", r, " holds ",
                        v);
          }
        });
        ws->barrier(*stream, 1 + which);
      }
      ws->device().synchronize(*stream);
    } catch (...) {
      errors[which] = std::current_exception();
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(Workspace, StreamsCopyFromPeersAndJoinThroughEvents) {
  const auto& w = world();
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available());
  auto& dev = ws->device();
  auto main = dev.current_stream();
  ws->get_buffer(w.rank, {64}, at::kFloat).fill_(static_cast<float>(w.rank));
  barrier_now(*ws, *main, 0);
  auto s1 = dev.new_stream(false), s2 = dev.new_stream(true);
  auto gathered = at::zeros({w.size, 64});
  for (int r = 0; r < w.size; ++r) {
    auto& s = r % 2 ? *s2 : *s1;
    dev.copy(s, gathered[r].data_ptr(), ws->buffer(r), 64 * sizeof(float));
  }
  auto e1 = dev.record(*s1);
  dev.wait_event(*s2, *e1);  // s2 sees s1's copies
  at::Tensor sum;
  dev.launch(*s2, [&] { sum = gathered.sum(1); });
  dev.synchronize(*s2);
  EXPECT_TRUE(sum.equal(at::arange(w.size, at::kFloat) * 64)) << sum;
  dev.wait_event(*main, *dev.record(*s1));  // joins the caller's stream too
  barrier_now(*ws, *main, 0);
}

TEST(Workspace, ARankThatNeverArrivesIsNamed) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available());
  auto s = ws->device().current_stream();
  const int absent = w.size - 1;
  store_barrier("before-timeout");  // only the absent rank may be late by the barrier's timeout
  if (w.rank != absent) {
    const auto start = std::chrono::steady_clock::now();
    expect_error_naming_rank([&] { barrier_now(*ws, *s, 0, Millis(1000)); }, "never arrived",
                             absent);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(11));
  }
  store_barrier("after-timeout");
  if (cuda_semantics()) {
    // On CUDA a missed deadline fails the device for good (NOTE [Device failure]): the ranks
    // that waited raise it at their next op, and the late rank's barrier, which their released
    // streams' signals would satisfy, raises their failure instead (NOTE [Failure words]).
    if (w.rank == absent) {
      expect_error([&] { barrier_now(*ws, *s, 0); },
                   "rank " + std::to_string(absent) + " never arrived");
      expect_error([&] { barrier_now(*ws, *s, 0); }, "device failed first");
    } else {
      expect_error([&] { barrier_now(*ws, *s, 0); }, "never arrived");
    }
    // Waiting for several ranks names all of them, on a new group.
    auto fresh = make_workspace();
    if (w.size >= 3 && w.rank == 0) {
      expect_error([&] { barrier_now(*fresh, *fresh->device().current_stream(), 3, Millis(200)); },
                   "ranks 1, 2");
    }
    store_barrier("named");
    return;
  }
  // The late rank's barrier completes the one the others gave up on; the group is in step again.
  if (w.rank == absent) barrier_now(*ws, *s, 0);
  barrier_now(*ws, *s, 0, Millis(30000));
  // Waiting for several ranks names all of them.
  if (w.size >= 3 && w.rank == 0) {
    expect_error([&] { barrier_now(*ws, *s, 3, Millis(200)); }, "ranks 1, 2");
  }
}

TEST(Workspace, SimulatedTwoHostsTurnTheWorkspaceOff) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  WorkspaceOptions o;
  o.buffer_size = 1 << 16;
  o.host_id = w.rank < w.size / 2 ? "host-a" : "host-b";
  auto ws =
      std::make_unique<SymmetricWorkspace>(test_store(), w.rank, w.size, test_host_device(), o);
  EXPECT_FALSE(ws->available());
  EXPECT_NE(ws->unavailable_reason().find("span hosts"), std::string::npos)
      << ws->unavailable_reason();
  EXPECT_EQ(ws->buffer_size(), 0);
  expect_error([&] { ws->get_buffer(0, {1}, at::kFloat); }, "unavailable");
  auto s = ws->device().current_stream();
  expect_error([&] { barrier_now(*ws, *s, 0); }, "span hosts");
}

TEST(Workspace, SegmentsArePrivateAndLeaveNothingBehind) {
  const auto& w = world();
  const auto before_shm = dev_shm_entries();
  const int before_maps = count_memfd_mappings();
  {
    auto ws = make_workspace();
    ASSERT_TRUE(ws->available());
    // Every block (own and peers') is mapped here, and with peers every rank's failure area
    // (NOTE [Failure words])...
    EXPECT_EQ(count_memfd_mappings(), before_maps + w.size + (w.size > 1 ? w.size : 0));
    // ...and nothing of it is a name in /dev/shm.
    EXPECT_EQ(dev_shm_entries(), before_shm);
    // The own block is a memfd readable by its owner only.
    auto block = host::allocate_shared_block(4096);
    struct stat st {};
    ASSERT_EQ(fstat(dynamic_cast<host::HostBlock&>(*block).fd(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    barrier_now(*ws, *ws->device().current_stream(), 0);
  }
  EXPECT_EQ(count_memfd_mappings(), before_maps);
  store_barrier("released");
}

TEST(Workspace, GrowsCollectivelyAndOldTensorsStayValid) {
  const auto& w = world();
  auto ws = make_workspace(4096);
  auto old = ws->get_buffer(w.rank, {4}, at::kFloat);
  old.fill_(7);
  // Ranks ask for different sizes; all grow to the largest.
  ws->ensure_min_buffer_size(8192 + 4096 * w.rank);
  const int64_t want = 8192 + 4096 * (w.size - 1);
  EXPECT_EQ(ws->buffer_size(), want);
  EXPECT_TRUE(old.equal(at::full({4}, 7.0f)));  // the old mapping is still alive
  auto big = ws->get_buffer(w.rank, {want / 4}, at::kFloat);
  big.fill_(static_cast<float>(w.rank));
  auto s = ws->device().current_stream();
  barrier_now(*ws, *s, 0);
  for (int r = 0; r < w.size; ++r) {
    EXPECT_EQ(ws->get_buffer(r, {want / 4}, at::kFloat)[want / 4 - 1].item<float>(), r);
  }
  barrier_now(*ws, *s, 0);
  // Asking for less changes nothing.
  ws->ensure_min_buffer_size(16);
  EXPECT_EQ(ws->buffer_size(), want);
}

TEST(Workspace, TwoWorkspacesInOneProcessAreSeparate) {
  const auto& w = world();
  auto a = make_workspace(4096), b = make_workspace(8192);
  ASSERT_TRUE(a->available() && b->available());
  EXPECT_NE(a->buffer(w.rank), b->buffer(w.rank));
  a->get_buffer(w.rank, {1}, at::kInt).fill_(1);
  b->get_buffer(w.rank, {1}, at::kInt).fill_(2);
  barrier_now(*a, *a->device().current_stream(), 0);
  barrier_now(*b, *b->device().current_stream(), 0);
  for (int r = 0; r < w.size; ++r) {
    EXPECT_EQ(a->get_buffer(r, {1}, at::kInt).item<int>(), 1);
    EXPECT_EQ(b->get_buffer(r, {1}, at::kInt).item<int>(), 2);
  }
  barrier_now(*a, *a->device().current_stream(), 0);
  barrier_now(*b, *b->device().current_stream(), 0);
}

TEST(Workspace, BadArgumentsSayWhatFits) {
  const auto& w = world();
  auto ws = make_workspace(4096);
  auto s = ws->device().current_stream();
  expect_error(
      [&] { ws->get_buffer(w.size, {1}, at::kFloat); },
      "rank must be in [0, " + std::to_string(w.size) + "), got " + std::to_string(w.size));
  expect_error([&] { ws->get_buffer(-1, {1}, at::kFloat); }, "got -1");
  expect_error([&] { ws->get_buffer(w.rank, {1025}, at::kFloat); },
               "need 4100 bytes, but the buffer holds 4096 bytes");
  expect_error([&] { ws->get_buffer(w.rank, {2}, at::kFloat, 1023); }, "at most 1 elements");
  expect_error([&] { ws->get_buffer(w.rank, {1}, at::kFloat, -1); }, "storage_offset must be >= 0");
  expect_error([&] { ws->get_buffer(w.rank, {-2}, at::kFloat); }, "sizes must be >= 0");
  expect_error([&] { ws->get_buffer(w.rank, {1}, at::kQInt8); }, "quantized");
  expect_error([&] { ws->put_signal(*s, 0, ws->num_channels()); }, "channel must be in [0, 4)");
  expect_error([&] { ws->barrier(*s, 0, {}, {w.rank, w.rank}); }, "listed twice");
  if (w.size > 1) {
    expect_error([&] { ws->barrier(*s, 0, {}, {(w.rank + 1) % w.size}); },
                 "must include the calling rank");
  }
  WorkspaceOptions bad;
  bad.buffer_size = 0;
  expect_error([&] { SymmetricWorkspace(test_store(), w.rank, w.size, test_host_device(), bad); },
               "buffer_size must be positive");
  barrier_now(*ws, *s, 0);
}

// NOTE [Cross-memory probe]: every rank reads every peer's private memory, through both forms of
// cross_memory_read, when the system allows it (it does on our machines; elsewhere the probe
// must say why not).
TEST(Workspace, ReadsPeersPrivateMemory) {
  const auto& w = world();
  auto ws = make_workspace();
  ASSERT_TRUE(ws->available()) << ws->unavailable_reason();
  if (!ws->cross_memory_reads())
    GTEST_SKIP() << "cross-memory reads denied here: " << ws->cross_memory_reads_reason();
  EXPECT_EQ(ws->cross_memory_reads_reason(), "");
  std::vector<int32_t> mine(12345);  // private: a plain heap vector
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int32_t>(i * 7 + 1000 * w.rank);
  auto header = ws->get_buffer(w.rank, {1}, at::kLong);
  header.fill_(static_cast<int64_t>(reinterpret_cast<uintptr_t>(mine.data())));
  auto s = ws->device().current_stream();
  barrier_now(*ws, *s, 0);
  for (int r = 0; r < w.size; ++r) {
    const auto* word = static_cast<const uint64_t*>(ws->buffer(r));
    std::vector<int32_t> got(100);
    ws->cross_memory_read(*s, got.data(), r, word, 4 * 1000, got.size() * 4);
    ws->device().synchronize(*s);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], static_cast<int32_t>((1000 + i) * 7 + 1000 * r)) << "rank " << r;
    }
    std::vector<int32_t> all(mine.size());
    ws->cross_memory_read(*s, all.data(), r, reinterpret_cast<const void*>(*word), all.size() * 4);
    ws->device().synchronize(*s);
    EXPECT_EQ(all.back(), static_cast<int32_t>((mine.size() - 1) * 7 + 1000 * r));
  }
  barrier_now(*ws, *s, 0);  // mine outlives every peer's reads
}

TEST(Workspace, CrossMemoryReadsTurnedOffOrDeniedOnOneRankAreOffEverywhere) {
  const auto& w = world();
  {
    WorkspaceOptions o;
    o.buffer_size = 1 << 16;
    o.cross_memory_reads = w.rank != w.size - 1;  // off on the last rank only
    SymmetricWorkspace ws(test_store(), w.rank, w.size, test_host_device(), o);
    ASSERT_TRUE(ws.available());
    EXPECT_FALSE(ws.cross_memory_reads());
    EXPECT_NE(
        ws.cross_memory_reads_reason().find("turned off on rank " + std::to_string(w.size - 1)),
        std::string::npos)
        << ws.cross_memory_reads_reason();
    int32_t x = 0;
    auto s = ws.device().current_stream();
    expect_error([&] { ws.cross_memory_read(*s, &x, 0, &x, sizeof(x)); }, "unavailable");
  }
  if (w.size < 2) return;
  // The test hook: the last rank's reads fail as under Yama (EPERM).
  WorkspaceOptions o;
  o.buffer_size = 1 << 16;
  o.deny_cross_memory_reads = w.rank == w.size - 1;
  auto ws =
      std::make_unique<SymmetricWorkspace>(test_store(), w.rank, w.size, test_host_device(), o);
  ASSERT_TRUE(ws->available());
  EXPECT_FALSE(ws->cross_memory_reads());
  EXPECT_NE(ws->cross_memory_reads_reason().find("rank " + std::to_string(w.size - 1) +
                                                 " cannot read rank"),
            std::string::npos)
      << ws->cross_memory_reads_reason();
  EXPECT_NE(ws->cross_memory_reads_reason().find("Operation not permitted"), std::string::npos);
}

// NOTE [Device failure]: abort() from another thread unblocks a rank whose barrier waits for a
// peer that never arrives, with a clear error, on the caller's stream and on a device stream
// (cooperative or executor thread, per CUDA_P2P_HOST_STREAMS); later ops fail at once.
TEST(Workspace, AbortFromAnotherThreadUnblocksAPendingWait) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int absent = w.size - 1;
  for (bool side_stream : {false, true}) {
    auto ws = make_workspace(1 << 16, std::chrono::seconds(60));
    ASSERT_TRUE(ws->available());
    if (w.rank != absent) {
      auto& dev = ws->device();
      auto s = side_stream ? dev.new_stream(false) : dev.current_stream();
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ws->abort("aborted by the test");
      });
      const auto start = std::chrono::steady_clock::now();
      expect_error(
          [&] {
            barrier_now(*ws, *s, 0);
            dev.synchronize(*s);
          },
          "aborted by the test");
      const auto took = std::chrono::steady_clock::now() - start;
      aborter.join();
      EXPECT_LT(took, std::chrono::milliseconds(1200)) << (side_stream ? "side stream" : "caller");
      // Sticky: the next op fails before it waits.
      expect_error([&] { ws->barrier(*dev.current_stream(), 1); }, "aborted by the test");
      expect_error([&] { dev.check_healthy("all_reduce"); }, "cuda_p2p all_reduce");
    }
    store_barrier(std::string("abort-done-") + (side_stream ? "1" : "0"));
  }
}

// NOTE [Block lifetime]: a rank's block of an old generation is freed only once every peer has
// closed its mapping of it; a peer that keeps a tensor over it holds it for everybody.
TEST(Workspace, OldBlocksAreFreedOnlyOnceEveryPeerClosedThem) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int holder = w.size - 1;
  auto ws = make_workspace(4096);
  ASSERT_TRUE(ws->available());
  ws->get_buffer(w.rank, {4}, at::kInt).fill_(100 + w.rank);
  barrier_now(*ws, *ws->device().current_stream(), 0);
  at::Tensor held;
  if (w.rank == holder) held = ws->get_buffer(0, {4}, at::kInt);  // rank 0's generation-1 block
  ws->grow_to(8192);  // generation 2: every rank retires its generation-1 block
  EXPECT_EQ(ws->retired_blocks(), w.rank == holder ? 0u : 1u);
  store_barrier("grown-once");
  ws->grow_to(16384);  // generation 3: generation 1 is still mapped by the holder, on every rank
  EXPECT_EQ(ws->retired_blocks(), w.rank == holder ? 1u : 2u);
  if (w.rank == holder) {
    EXPECT_TRUE(held.equal(at::full({4}, 100, at::kInt)));  // rank 0's old block is still there
    held = at::Tensor();  // closes the holder's generation-1 mapping
  }
  store_barrier("released");
  ws->grow_to(32768);  // generation 4: generations 1 and 2 are closed everywhere and freed
  EXPECT_EQ(ws->retired_blocks(), 1u);  // generation 3, freed by the next rendezvous or at exit
  barrier_now(*ws, *ws->device().current_stream(), 0);
}

// A workspace destroyed while a peer still maps its block waits a bounded time, then leaks the
// block (never frees it under the peer): the rule of legacy CUDA IPC's blocks, which a
// ForwardingDevice states (Device::blocks_outlive_owner() false). A block that outlives its
// owner's reference (the host's) is freed at once instead (NOTE [Block lifetime];
// test_quiet_teardown.cpp).
TEST(Workspace, DestructionWaitsBoundedForPeersToClose) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int holder = w.size - 1;
  const auto timeout = std::chrono::milliseconds(400);
  WorkspaceOptions o;
  o.buffer_size = 4096;
  o.timeout = timeout;
  auto ws = std::make_unique<SymmetricWorkspace>(
      test_store(), w.rank, w.size, std::make_shared<ForwardingDevice>(test_host_device()), o);
  ASSERT_TRUE(ws->available());
  at::Tensor held;
  if (w.rank == holder) held = ws->get_buffer(0, {4}, at::kInt);
  store_barrier("holding");
  if (w.rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    ws.reset();
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, timeout - std::chrono::milliseconds(50));
    EXPECT_LT(took, std::chrono::seconds(10));
  }
  store_barrier("rank-0-gone");
  if (w.rank == holder) {
    held.fill_(5);  // still mapped, still backed
    EXPECT_TRUE(held.equal(at::full({4}, 5, at::kInt)));
    held = at::Tensor();
  }
  ws.reset();
  store_barrier("all-gone");
}

// A device that reports a peer it cannot reach (as CUDA does for GPUs without peer access):
// the workspace is unavailable on every rank, with a reason naming the ranks.
class UnreachablePeerDevice : public ForwardingDevice {
 public:
  UnreachablePeerDevice(std::shared_ptr<Device> inner, int unreachable_from)
      : ForwardingDevice(std::move(inner)), from_(unreachable_from) {}
  std::string device_uuid() const override { return "test-" + std::to_string(world().rank); }
  std::string peer_access_problem(const std::string& peer_uuid) override {
    return world().rank == from_ ? "no path to " + peer_uuid : "";
  }

 private:
  int from_;
};

TEST(Workspace, APeerDeviceThatCannotBeReachedTurnsTheWorkspaceOffEverywhere) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  WorkspaceOptions o;
  o.buffer_size = 4096;
  const int from = w.size - 1;
  SymmetricWorkspace ws(test_store(), w.rank, w.size,
                        std::make_shared<UnreachablePeerDevice>(make_host_device(), from), o);
  EXPECT_FALSE(ws.available());
  const std::string why = ws.unavailable_reason();
  EXPECT_NE(why.find("rank " + std::to_string(from) +
                     " cannot map rank 0's block: no path to "
                     "test-0"),
            std::string::npos)
      << why;
}

// A store that fails every call once severed, as the job's TCPStore does after its host process
// (rank 0) has exited while another rank still tears down.
class SeverableStore : public c10d::Store {
 public:
  explicit SeverableStore(c10::intrusive_ptr<c10d::Store> inner) : inner_(std::move(inner)) {}
  void sever() { severed_ = true; }
  int calls_after_sever() const { return calls_after_sever_; }

  c10::intrusive_ptr<Store> clone() override { return inner_->clone(); }
  void set(const std::string& k, const std::vector<uint8_t>& v) override {
    live();
    inner_->set(k, v);
  }
  std::vector<uint8_t> compareSet(const std::string& k, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    live();
    return inner_->compareSet(k, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& k) override {
    live();
    return inner_->get(k);
  }
  int64_t add(const std::string& k, int64_t v) override {
    live();
    return inner_->add(k, v);
  }
  bool deleteKey(const std::string& k) override {
    live();
    return inner_->deleteKey(k);
  }
  bool check(const std::vector<std::string>& keys) override {
    live();
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    live();
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    live();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    live();
    inner_->wait(keys, t);
  }

 private:
  void live() {
    if (!severed_) return;
    ++calls_after_sever_;
    C10_THROW_ERROR(DistNetworkError, "the test severed the store");
  }
  c10::intrusive_ptr<c10d::Store> inner_;
  std::atomic<bool> severed_{false};
  std::atomic<int> calls_after_sever_{0};
};

class CollectWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

// NOTE [Block lifetime] at process teardown: a tensor over a peer's buffer outlives the workspace
// and the store (the first GPU run's bench/gpu_timing.py). The rank cannot publish that it closed
// the mapping, nor learn whether the peers closed its block: it leaks the block, says that the
// store is unreachable (it said "rank(s) -1 did not close"), and asks the dead store nothing more
// (each call on a dead TCPStore logs a stack trace).
TEST(Workspace, AtTeardownAnUnreachableStoreIsNamedAndAskedOnce) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int holder = w.size - 1;
  auto store = c10::make_intrusive<SeverableStore>(test_store());
  WorkspaceOptions o;
  o.buffer_size = 4096;
  o.timeout = std::chrono::milliseconds(300);  // the peers' bounded wait for the holder
  // No rank unreachable: the host device with CUDA's rule that a block must not be freed under a
  // peer (Device::blocks_outlive_owner() is false), so that an unclosed block is leaked, with a
  // warning.
  auto ws = std::make_unique<SymmetricWorkspace>(
      store, w.rank, w.size, std::make_shared<UnreachablePeerDevice>(make_host_device(), -1), o);
  ASSERT_TRUE(ws->available()) << ws->unavailable_reason();
  at::Tensor held;
  if (w.rank == holder) held = ws->get_buffer(0, {4}, at::kInt);
  store_barrier("severable-holding");
  if (w.rank == holder) {
    CollectWarnings warnings;
    {
      c10::WarningUtils::WarningHandlerGuard guard(&warnings);
      store->sever();
      ws.reset();           // the mapping lives on in `held`
      held = at::Tensor();  // its release can neither publish nor ask
    }
    ASSERT_EQ(warnings.messages.size(), 1u) << c10::Join(" | ", warnings.messages);
    const std::string& msg = warnings.messages.front();
    EXPECT_NE(msg.find("leaks its workspace block of generation 1: the store cannot be reached"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("-1"), std::string::npos) << msg;
    EXPECT_EQ(store->calls_after_sever(), 1) << "the failed publish only";
  } else {
    ws.reset();  // waits 300 ms for the holder, then leaks its block (the holder never published)
  }
  store_barrier("severable-done");
}

}  // namespace
}  // namespace cuda_p2p::test
