// The one-sided window protocol (ops/window.hpp, NOTE [Window signals]) on the host device, over
// a heap built directly on the job's TCPStore (no Python, no backend): ring and all-to-all puts,
// signals before and after their waits, many puts then one signal, a peer's region read through
// its mapping, threads putting and waiting at once (run under TSan too: scripts/sanitizers.sh),
// a timeout naming the peer, every argument error with nothing written, and malformed records.
// Every result is compared with what the sender wrote, computed here by plain torch.
#include <ATen/ATen.h>

#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/harness.hpp"

#ifdef CUDA_P2P_WITH_WINDOWS
#include "ops/window.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p::test {
namespace {

using ops::WindowProtocol;
using ops::WindowRegion;

constexpr int64_t kHeapBytes = 1 << 20;
constexpr int64_t kRegionOffset = 4096;  // the counters take the heap's first bytes

// What each rank exchanges: the int64 words of every rank's record, in rank order.
std::vector<int64_t> all_gather(c10d::Store& store, const std::string& tag,
                                const std::vector<int64_t>& mine) {
  const auto& w = world();
  const auto* bytes = reinterpret_cast<const uint8_t*>(mine.data());
  store.set(tag + "/" + std::to_string(w.rank),
            std::vector<uint8_t>(bytes, bytes + mine.size() * sizeof(int64_t)));
  std::vector<int64_t> all;
  for (int r = 0; r < w.size; ++r) {
    const auto got = store.get(tag + "/" + std::to_string(r));
    EXPECT_EQ(got.size(), mine.size() * sizeof(int64_t)) << "rank " << r;
    const auto* p = reinterpret_cast<const int64_t*>(got.data());
    all.insert(all.end(), p, p + got.size() / sizeof(int64_t));
  }
  return all;
}

// One group's heap and a window on it, made the way the backend makes them (its records
// exchanged), with a float region of `numel` elements registered on every rank.
struct Fixture {
  c10::intrusive_ptr<c10d::Store> store = test_store();
  std::unique_ptr<SymmetricWorkspace> heap;
  std::unique_ptr<WindowProtocol> window;
  std::shared_ptr<Stream> stream;

  explicit Fixture(int64_t numel, Millis timeout = std::chrono::seconds(60)) {
    const auto& w = world();
    WorkspaceOptions o;
    o.buffer_size = kHeapBytes;
    o.num_channels = 1;
    o.timeout = timeout;
    heap = std::make_unique<SymmetricWorkspace>(test_store(), w.rank, w.size,
                                                test_host_device(w.size), o);
    EXPECT_TRUE(heap->available()) << heap->unavailable_reason();
    const auto signals = ops::parse_signal_records(
        all_gather(*store, "signals", ops::signal_record(int64_t{0})), w.size, kHeapBytes);
    window = std::make_unique<WindowProtocol>(*heap, signals.offsets);
    stream = heap->device().current_stream();
    register_region(numel);
  }

  void register_region(int64_t numel, at::ScalarType dtype = at::kFloat) {
    const WindowRegion mine{
        kRegionOffset, numel * static_cast<int64_t>(c10::elementSize(dtype)), dtype, {numel}};
    const auto regions = ops::parse_region_records(
        all_gather(*store, "regions" + std::to_string(registrations++), ops::region_record(mine)),
        world().size, kHeapBytes);
    EXPECT_TRUE(regions.failed.empty());
    window->set_regions(regions.regions);
  }

  // This rank's registered region, as it holds it.
  at::Tensor own(int64_t numel, at::ScalarType dtype = at::kFloat) const {
    return heap->get_buffer(world().rank, {numel}, dtype,
                            kRegionOffset / static_cast<int64_t>(c10::elementSize(dtype)));
  }
  // A put whose source lives as long as the fixture: with CUDA's semantics the copy runs after
  // the call returned (on a GPU the caching allocator's record_stream keeps it).
  void put(Stream& s, at::Tensor src, int dst, int64_t offset) {
    window->put(s, src, dst, offset);
    std::lock_guard<std::mutex> lock(kept_mutex);
    kept.push_back(std::move(src));
  }

  // With CUDA's semantics a call returns with its work queued: the host then waits for it.
  void sync() const { sync(*stream); }
  // Not on the host's inline stream, which every thread shares and whose work has run: its
  // synchronize would wait for the other threads' calls too (a blocked wait among them).
  void sync(Stream& s) const {
    if (!inline_paths(heap->device(), s)) heap->device().synchronize(s);
  }

  int registrations = 0;
  std::mutex kept_mutex;
  std::vector<at::Tensor> kept;
};

// What `src` puts into `dst`'s window, element offset `seed`: exact in float32.
at::Tensor message(int src, int dst, int64_t n, int seed = 0) {
  return at::arange(n, at::kFloat) + src * 1000 + dst * 100 + seed * 10000;
}

TEST(Window, RingPutsLandInTheRightNeighbour) {
  const auto& w = world();
  constexpr int64_t kNumel = 64, kOffset = 8, kCount = 16;
  Fixture f(kNumel);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  f.put(*f.stream, message(w.rank, right, kCount), right, kOffset);
  f.window->signal(*f.stream, right);
  f.window->wait(*f.stream, left, std::chrono::seconds(60));
  f.sync();
  auto want = at::zeros({kNumel}, at::kFloat);
  want.narrow(0, kOffset, kCount).copy_(message(left, w.rank, kCount));
  EXPECT_TRUE(f.own(kNumel).equal(want)) << f.own(kNumel);
  store_barrier("done");
}

TEST(Window, AllToAllPutsEachRankItsSlot) {
  const auto& w = world();
  constexpr int64_t kSlot = 5;
  Fixture f(kSlot * w.size);
  for (int q = 0; q < w.size; ++q) {
    f.put(*f.stream, message(w.rank, q, kSlot), q, w.rank * kSlot);
    f.window->signal(*f.stream, q);
  }
  for (int q = 0; q < w.size; ++q) f.window->wait(*f.stream, q, std::chrono::seconds(60));
  f.sync();
  std::vector<at::Tensor> parts;
  for (int q = 0; q < w.size; ++q) parts.push_back(message(q, w.rank, kSlot));
  EXPECT_TRUE(f.own(kSlot * w.size).equal(at::cat(parts))) << f.own(kSlot * w.size);
  store_barrier("done");
}

// Signals sent before their waits stay counted: three signals, then three waits each consume
// one, and a fourth wait times out naming the sender - having consumed nothing, so that the next
// signal satisfies the next wait. Before the signals, five puts; the first wait sees all of them.
TEST(Window, SignalsAreCountedAndAWaitConsumesOne) {
  const auto& w = world();
  constexpr int64_t kNumel = 40, kPiece = 8;
  Fixture f(kNumel);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  for (int i = 0; i < 5; ++i) {
    f.put(*f.stream, message(w.rank, right, kPiece, i), right, i * kPiece);
  }
  for (int i = 0; i < 3; ++i) f.window->signal(*f.stream, right);
  f.sync();
  store_barrier("signalled");  // every signal is there before any wait is enqueued
  f.window->wait(*f.stream, left, std::chrono::seconds(60));
  f.sync();
  std::vector<at::Tensor> parts;
  for (int i = 0; i < 5; ++i) parts.push_back(message(left, w.rank, kPiece, i));
  EXPECT_TRUE(f.own(kNumel).equal(at::cat(parts)));
  f.window->wait(*f.stream, left, std::chrono::seconds(60));
  f.window->wait(*f.stream, left, std::chrono::seconds(60));
  f.sync();
  if (cuda_semantics()) {
    // A missed deadline fails the device there (NOTE [Window signals]); the host's rollback is
    // what this test checks next.
    store_barrier("done");
    return;
  }
  expect_error([&] { f.window->wait(*f.stream, left, std::chrono::milliseconds(200)); },
               "rank " + std::to_string(w.rank) + "'s window wait_signal for signal #4 from rank " +
                   std::to_string(left) + " timed out after 200 ms: rank " + std::to_string(left) +
                   " never arrived");
  store_barrier("timed out");
  f.window->signal(*f.stream, right);
  f.window->wait(*f.stream, left, std::chrono::seconds(60));  // the 4th, not a 5th
  store_barrier("done");
}

// A wait enqueued before its signal is sent: the peer signals only once this rank told it (over
// the store) that its wait is pending.
TEST(Window, WaitsBeforeSignals) {
  const auto& w = world();
  Fixture f(4);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  std::thread late([&] {
    store_barrier("waiting");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto s = f.heap->device().current_stream();
    f.put(*s, message(w.rank, right, 4), right, 0);
    f.window->signal(*s, right);
    f.sync(*s);
  });
  f.window->wait(*f.stream, left, std::chrono::seconds(60));
  f.sync();
  late.join();
  EXPECT_TRUE(f.own(4).equal(message(left, w.rank, 4)));
  store_barrier("done");
}

TEST(Window, RemoteTensorAliasesThePeersRegion) {
  const auto& w = world();
  constexpr int64_t kNumel = 12;
  Fixture f(kNumel);
  const int left = (w.rank + w.size - 1) % w.size;
  f.own(kNumel).copy_(message(w.rank, w.rank, kNumel));
  store_barrier("written");
  at::Tensor remote = f.window->remote(left);
  EXPECT_EQ(remote.sizes(), at::IntArrayRef({kNumel}));
  EXPECT_EQ(remote.scalar_type(), at::kFloat);
  EXPECT_TRUE(remote.equal(message(left, left, kNumel)));
  store_barrier("read");
  // Writing through the mapping writes the peer's memory.
  if (w.rank == 0) f.window->remote(1).fill_(-1.0f);
  store_barrier("overwritten");
  if (w.rank == 1) {
    EXPECT_TRUE(f.own(kNumel).eq(-1.0f).all().item<bool>());
  }
  store_barrier("done");
}

// Several threads of each rank: one puts into and signals the right neighbour, another waits for
// the left one's signals and checks each put it announced, while a third signals the left
// neighbour on its own: the counts of different peers, and of one peer's puts and signals, are
// driven from different threads at once.
TEST(Window, ThreadsPutSignalAndWaitAtOnce) {
  const auto& w = world();
  constexpr int kRounds = 200;
  constexpr int64_t kPiece = 4;
  Fixture f(kRounds * kPiece);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  auto& device = f.heap->device();
  std::thread producer([&] {
    auto s = device.current_stream();
    for (int i = 0; i < kRounds; ++i) {
      f.put(*s, message(w.rank, right, kPiece, i), right, i * kPiece);
      f.window->signal(*s, right);
    }
    f.sync(*s);
  });
  std::thread backwards([&] {
    if (w.size == 2) return;  // left is right: one producer per peer keeps the counts apart
    auto s = device.current_stream();
    for (int i = 0; i < kRounds; ++i) f.window->signal(*s, left);
    f.sync(*s);
  });
  int wrong = 0;
  for (int i = 0; i < kRounds; ++i) {
    f.window->wait(*f.stream, left, std::chrono::seconds(60));
    f.sync();
    wrong += !f.own(kRounds * kPiece)
                  .narrow(0, i * kPiece, kPiece)
                  .equal(message(left, w.rank, kPiece, i));
  }
  if (w.size > 2) {
    for (int i = 0; i < kRounds; ++i) f.window->wait(*f.stream, right, std::chrono::seconds(60));
    f.sync();
  }
  producer.join();
  backwards.join();
  EXPECT_EQ(wrong, 0);
  store_barrier("done");
}

// Two threads signal one peer at once, each from its own stream where the device gives each
// thread one (CUDA's semantics): the peer's word must never go back, or its last waits would
// never be satisfied (NOTE [Window signals]: signals execute in the order they were counted).
TEST(Window, SignalsFromTwoThreadsToOnePeerStayCounted) {
  const auto& w = world();
  constexpr int kEach = 300;
  Fixture f(1);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  auto signal = [&] {
    auto s = f.heap->device().current_stream();
    for (int i = 0; i < kEach; ++i) f.window->signal(*s, right);
    f.sync(*s);
  };
  std::thread a(signal), b(signal);
  for (int i = 0; i < 2 * kEach; ++i) f.window->wait(*f.stream, left, std::chrono::seconds(30));
  f.sync();
  a.join();
  b.join();
  store_barrier("done");
}

// The same, made deterministic: thread A's signal is counted first but its stream writes it only
// after a pause, while thread B's, counted second, could be written at once from B's stream.
// Written in that order, the peer's word would end at 1 and its second wait, made once both
// writes ran, would time out; the window orders B's write after A's.
TEST(Window, ASignalCountedFirstIsWrittenFirst) {
  const auto& w = world();
  Fixture f(1);
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  auto& device = f.heap->device();
  std::promise<void> counted;
  std::thread a([&] {
    auto s = device.current_stream();
    device.host_task(*s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    f.window->signal(*s, right);
    counted.set_value();
    f.sync(*s);
  });
  std::thread b([&] {
    counted.get_future().wait();
    auto s = device.current_stream();
    f.window->signal(*s, right);
    f.sync(*s);
  });
  a.join();
  b.join();
  store_barrier("written");
  f.window->wait(*f.stream, left, std::chrono::seconds(5));
  f.window->wait(*f.stream, left, std::chrono::seconds(5));
  f.sync();
  store_barrier("done");
}

// A peer whose device fails tells the others through their failure words (NOTE [Failure words]
// in p2p_workspace/watchdog.hpp): a window wait for it, blocked with a long timeout, ends soon
// with that failure, naming the peer and why, like every workspace wait.
TEST(Window, APeersFailureEndsAWaitNamingIt) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  Fixture f(1);
  store_barrier("made");
  if (w.rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are waiting
    f.heap->device().abort("test: rank 0 gave up");
  } else {
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      f.window->wait(*f.stream, 0, std::chrono::seconds(60));
      f.sync();
    } catch (const c10::Error& e) {
      error = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    EXPECT_NE(error.find("rank 0's device failed first"), std::string::npos) << error;
    EXPECT_NE(error.find("test: rank 0 gave up"), std::string::npos) << error;
    // The next wait, for any peer, raises it at once.
    expect_error(
        [&] { f.window->wait(*f.stream, (w.rank + 1) % w.size, std::chrono::seconds(60)); },
        "rank 0's device failed first");
  }
  store_barrier("done");
}

TEST(Window, ArgumentErrorsWriteNothing) {
  const auto& w = world();
  constexpr int64_t kNumel = 10;
  Fixture f(kNumel);
  const int right = (w.rank + 1) % w.size;
  const std::string on = " (on rank " + std::to_string(w.rank) + ")";
  auto& s = *f.stream;
  expect_error([&] { f.window->put(s, at::ones({2}), w.size, 0); },
               "cuda_p2p window put: expected dst_rank in [0, " + std::to_string(w.size) +
                   "), got " + std::to_string(w.size));
  expect_error([&] { f.window->put(s, at::ones({2}), -1, 0); }, "got -1 on rank");
  expect_error([&] { f.window->put(s, at::ones({2}, at::kDouble), right, 0); },
               "cuda_p2p window put: rank " + std::to_string(right) +
                   "'s window holds float32, but the tensor put is float64" + on);
  expect_error([&] { f.window->put(s, at::ones({2}), right, -3); },
               "expected an element offset >= 0, got -3" + on);
  expect_error([&] { f.window->put(s, at::ones({11}), right, 0); },
               "cuda_p2p window put: rank " + std::to_string(right) +
                   "'s window holds 10 elements of float32, but the put writes 11 elements at "
                   "element offset 0 (up to element 11; on rank " +
                   std::to_string(w.rank) + "): nothing was written");
  expect_error([&] { f.window->put(s, at::ones({4}), right, 7); }, "up to element 11");
  expect_error([&] { f.window->put(s, at::ones({1}), right, INT64_MAX); }, "element offset");
  expect_error([&] { f.window->put(s, at::ones({4, 2}).t(), right, 0); },
               "expected a contiguous tensor");
  expect_error([&] { f.window->put(s, at::Tensor(), right, 0); }, "an undefined tensor");
  expect_error([&] { f.window->signal(s, w.size + 3); }, "expected peer_rank in [0, ");
  expect_error([&] { f.window->wait(s, -2, std::chrono::seconds(1)); },
               "cuda_p2p window wait_signal: expected peer_rank in [0, ");
  expect_error([&] { f.window->remote(w.size); }, "cuda_p2p window map_remote_tensor");
  // The largest put that fits, at the end: accepted.
  f.put(s, at::ones({3}), right, 7);
  f.sync();
  store_barrier("put");
  auto want = at::zeros({kNumel}, at::kFloat);
  want.narrow(0, 7, 3).fill_(1.0f);
  EXPECT_TRUE(f.own(kNumel).equal(want)) << f.own(kNumel);
  // Unregistered: puts and remote tensors raise; signals need no registration.
  f.window->clear_regions();
  EXPECT_FALSE(f.window->registered());
  expect_error([&] { f.window->put(s, at::ones({1}), right, 0); },
               "the window has no registered tensor");
  expect_error([&] { f.window->remote(right); }, "the window has no registered tensor");
  store_barrier("done");
}

TEST(Window, MalformedRecordsNameTheirRank) {
  const int W = 3;
  auto good = ops::region_record(WindowRegion{256, 40, at::kFloat, {2, 5}});
  const auto records = [&](std::vector<int64_t> bad) {
    std::vector<int64_t> all = good;
    all.insert(all.end(), bad.begin(), bad.end());
    all.insert(all.end(), good.begin(), good.end());
    return all;
  };
  auto with = [&](int word, int64_t value) {
    auto r = good;
    r[word] = value;
    return records(r);
  };
  const auto parsed = ops::parse_region_records(records(good), W, kHeapBytes);
  ASSERT_EQ(parsed.regions.size(), 3u);
  EXPECT_EQ(parsed.regions[1].sizes, std::vector<int64_t>({2, 5}));
  EXPECT_EQ(parsed.regions[1].dtype, at::kFloat);
  const std::string rank1 = "malformed region record of rank 1";
  expect_error([&] { ops::parse_region_records(with(0, 7), W, kHeapBytes); }, rank1 + " ");
  expect_error([&] { ops::parse_region_records(with(1, kHeapBytes - 8), W, kHeapBytes); },
               "40 bytes at offset 1048568 outside a heap of 1048576 bytes");
  expect_error([&] { ops::parse_region_records(with(1, -4), W, kHeapBytes); }, rank1);
  expect_error([&] { ops::parse_region_records(with(1, 258), W, kHeapBytes); },
               "offset 258 is not a multiple of the 4-byte elements");
  expect_error([&] { ops::parse_region_records(with(3, 999), W, kHeapBytes); }, "dtype 999");
  expect_error([&] { ops::parse_region_records(with(4, 17), W, kHeapBytes); }, "17 dimensions");
  expect_error([&] { ops::parse_region_records(with(5, 3), W, kHeapBytes); },
               "15 elements of float32 in 40 bytes");
  expect_error([&] { ops::parse_region_records(with(5, -1), W, kHeapBytes); },
               "size -1 of dimension 0");
  expect_error([&] { ops::parse_region_records(records(good), W + 1, kHeapBytes); },
               "expected 84 words of region records, got 63");
  // A failed record is no error here: the ranks are named, and no region is kept.
  const auto failed =
      ops::parse_region_records(records(ops::region_record(std::nullopt)), W, kHeapBytes);
  EXPECT_EQ(failed.failed, std::vector<int>({1}));
  EXPECT_TRUE(failed.regions.empty());
  // The signal records likewise.
  const std::vector<int64_t> signals = {0, 0, 0, kHeapBytes - 8, 0, 64};
  expect_error([&] { ops::parse_signal_records(signals, W, kHeapBytes); },
               "malformed signal record of rank 1");
  const std::vector<int64_t> odd = {0, 0, 0, 6, 0, 64};
  expect_error([&] { ops::parse_signal_records(odd, W, kHeapBytes); }, "at offset 6");
  const std::vector<int64_t> ok = {0, 0, 1, 0, 0, 64};
  const auto parsed_signals = ops::parse_signal_records(ok, W, kHeapBytes);
  EXPECT_EQ(parsed_signals.failed, std::vector<int>({1}));
}

}  // namespace
}  // namespace cuda_p2p::test

#else  // NOTE [Windows where torch has them] in CMakeLists.txt: this torch's c10d has none.
TEST(Window, NotBuilt) {
  GTEST_SKIP() << "elsewhere: windows are not built against this torch (its c10d lacks what "
                  "they need; CI's torch builds them)";
}
#endif
