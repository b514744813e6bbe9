// How a failure reaches the streams of a device with CUDA's semantics (NOTE [Host device with
// CUDA's semantics] in p2p_workspace/host/host_device.hpp): the release of blocked waits (NOTE
// [Releasing blocked waits] in p2p_workspace/watchdog.hpp), the counted waits of a replayed graph
// (NOTE [Replay-safe signals]) and the group's op order across a capture (NOTE [One order per
// group]). Each test is a schedule of issue 48's review under which a GPU hangs or runs the wrong
// order; the host device runs it with the same protocol code. Cooperative streams run only while
// someone waits for them, which makes each schedule exact: the host gets as far ahead of its
// streams as the test says. Most tests are single-process (every word is this process's own)
// and run on every rank alike.
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/collectives.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "p2p_workspace/watchdog.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<Device> cuda_like_device() {
  return make_host_device(1, HostStreams::kCooperative, HostSemantics::kCuda);
}

// A word another process would write, written here as a peer's store lands: a plain store.
void peer_writes(uint32_t& word, uint32_t value) {
  std::atomic_ref<uint32_t>(word).store(value, std::memory_order_release);
}

uint32_t read(const uint32_t& word) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(word)).load(std::memory_order_acquire) &
         0x7fffffffu;  // without the sleeper bit (NOTE [Sleeper bit])
}

// Issue 48, finding 1b: one group's ops alternate between two caller streams B and A, whose waits
// poll one signal word for the values 1 (B), 2 (A) and 3 (B). Released stream by stream, the word
// ends at 2, and B's wait for 3 never passes: its stream never drains.
TEST(DeviceFailure, ReleasesLeaveEveryWordAtTheHighestValueAwaited) {
  auto dev = cuda_like_device();
  auto a = dev->new_stream(false), b = dev->new_stream(false);
  alignas(4) uint32_t word = 0;
  dev->wait_signals(*b, {{&word, 1, 1}}, 60s, "op 1 on B");
  dev->wait_signals(*a, {{&word, 2, 1}}, 60s, "op 2 on A");
  dev->wait_signals(*b, {{&word, 3, 1}}, 60s, "op 3 on B");
  dev->abort("aborted by the test");
  EXPECT_TRUE(dev->drain(3s)) << "a stream is still blocked: the word holds " << read(word);
  EXPECT_EQ(read(word), 3u);
}

// NOTE [Waits for a stream outlast the waits on it] in p2p_workspace/watchdog.cpp: a synchronize
// that began before its stream reached a wait no peer answers (a long task first, as a large op's
// earlier rounds) raises the wait's own missed deadline, naming the rank, not its own. Before, its
// deadline counted from the call came first ("the stream did not finish within the group's
// timeout"), as a fault test saw on a loaded machine.
TEST(DeviceFailure, ASynchronizeOutlastsAWaitItsStreamReachedLate) {
  auto dev = cuda_like_device();
  dev->set_timeout(300ms);
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0;
  dev->host_task(*s, [] { std::this_thread::sleep_for(900ms); });  // the earlier rounds
  dev->wait_signals(*s, {{&word, 1, 1}}, 300ms, "all_reduce round 3");
  expect_error([&] { dev->synchronize(*s); }, "rank 1 never arrived");
  EXPECT_TRUE(dev->drain(3s));
}

// Issue 48, finding 1c: after the release, a peer that was slow, not dead, writes the word back to
// an older value before the stream has passed its later waits. Nothing may leave a released
// stream blocked: the release is repeated until the waits have passed.
TEST(DeviceFailure, AReleasedWordALivePeerWritesBackLowerIsReleasedAgain) {
  auto dev = cuda_like_device();
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0;
  for (uint32_t v = 1; v <= 3; ++v) {
    dev->wait_signals(*s, {{&word, v, 1}}, 60s, "op " + std::to_string(v));
  }
  dev->abort("aborted by the test");
  ASSERT_EQ(read(word), 3u);  // released at once, before the stream ran anything
  peer_writes(word, 1);       // the peer's first signal, late
  EXPECT_TRUE(dev->drain(3s)) << "the stream is still blocked: the word holds " << read(word);
}

// Issue 48, finding 3: the counted waits of a replayed graph, where a rank never replays. Each
// gave up on its own clock, so a replay with k of them took k timeouts to drain, and abort() did
// not shorten it. The first give-up, or an abort, ends every later wait of the replay at once.
TEST(DeviceFailure, ACapturedReplayDrainsAtOnceAfterTheFirstGiveUp) {
  auto dev = cuda_like_device();
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0, counter = 0;
  constexpr int kWaits = 4;
  constexpr auto kTimeout = 1000ms;
  begin_capture(*dev, s);
  for (int i = 0; i < kWaits; ++i) {
    dev->wait_counted(*s, {{&word, &counter, 1, 1}}, kTimeout,
                      "captured wait " + std::to_string(i));
  }
  auto graph = end_capture(*dev);
  graph->replay();
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { dev->synchronize(*s); }, "rank 1 never arrived");
  EXPECT_TRUE(dev->drain(kTimeout + kTimeout / 2))
      << "the replay's later waits each waited for their own timeout";
  EXPECT_LT(std::chrono::steady_clock::now() - start, kTimeout * (kWaits - 1));
}

TEST(DeviceFailure, AbortEndsTheCountedWaitsOfAReplay) {
  auto dev = cuda_like_device();
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0, counter = 0;
  constexpr int kWaits = 4;
  constexpr auto kTimeout = 1000ms;
  begin_capture(*dev, s);
  for (int i = 0; i < kWaits; ++i) {
    dev->wait_counted(*s, {{&word, &counter, 1, 1}}, kTimeout,
                      "captured wait " + std::to_string(i));
  }
  auto graph = end_capture(*dev);
  graph->replay();
  dev->abort("aborted by the test");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(dev->drain(kTimeout / 2)) << "the replay's waits ignored the abort";
  EXPECT_LT(std::chrono::steady_clock::now() - start, kTimeout);
  expect_error([&] { dev->check_healthy("next op"); }, "aborted by the test");
}

// Issue 48, finding 7: an eager op still queued, then an op captured on another stream, then an
// eager op on a third stream. The capture must not take the eager op's place in the group's
// order: the second eager op runs after the first.
TEST(DeviceFailure, ACaptureLeavesTheEagerOpOrderAlone) {
  const auto& w = world();
  auto dev = cuda_like_device();
  WorkspaceOptions o;
  o.buffer_size = 1 << 12;
  SymmetricWorkspace ws(test_store(), w.rank, w.size, dev, o);
  auto s1 = dev->new_stream(false), s2 = dev->new_stream(false), s3 = dev->new_stream(false);
  std::mutex mu;
  std::vector<std::string> ran;
  auto note = [&](std::string what) {
    return [&, what] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(what);
    };
  };
  alignas(4) uint32_t gate = 0;  // holds eager op 1 back, as a peer that has not arrived would
  ws.begin_op(*s1);
  dev->wait_signals(*s1, {{&gate, 1, w.rank}}, 60s, "eager op 1");
  dev->host_task(*s1, note("eager op 1"));
  ws.end_op(*s1);
  begin_capture(*dev, s2);
  ws.begin_op(*s2);
  dev->host_task(*s2, note("captured op"));
  ws.end_op(*s2);
  auto graph = end_capture(*dev);
  ws.begin_op(*s3);
  dev->host_task(*s3, note("eager op 2"));
  ws.end_op(*s3);
  std::thread opener([&] {
    std::this_thread::sleep_for(300ms);
    peer_writes(gate, 1);
  });
  dev->synchronize(*s3);
  opener.join();
  dev->synchronize(*s1);
  EXPECT_EQ(ran, (std::vector<std::string>{"eager op 1", "eager op 2"}));
  store_barrier("done");
}

c10::intrusive_ptr<ProcessGroupCudaP2P> make_group(Millis timeout) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->timeout = timeout;
  const auto& w = world();
  auto pg = c10::make_intrusive<ProcessGroupCudaP2P>(
      test_store(), w.rank, w.size, options, c10::make_intrusive<Unreachable>(w.rank, w.size),
      nullptr);
  use_cuda_semantics(pg->workspace()->device());
  return pg;
}

// Issue 48, finding 4: on CUDA the ranks' op signatures are compared in stream order, after the op
// has run on the arguments each rank passed - different phases and signals on different ranks
// where they disagree. The disagreement is raised by the next call, and the group must stay
// failed after it (NOTE [Op signatures]), not run the calls after that as if in step.
TEST(DeviceFailure, ACudaSignatureMismatchFailsTheGroup) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<at::Tensor> t{at::ones({64})};  // outlives the group's queued work
  auto pg = make_group(Millis(10000));
  Device& dev = pg->workspace()->device();
  c10d::AllreduceOptions mismatched;
  mismatched.reduceOp = w.rank == 0 ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  pg->allreduce(t, mismatched);
  try {
    dev.synchronize(*dev.current_stream());
  } catch (const c10::Error& e) {
    // A peer that found the disagreement first failed the group: its failure word (NOTE
    // [Failure words]) says why.
    EXPECT_NE(std::string(e.what()).find("disagreed"), std::string::npos) << e.what();
  }
  expect_error([&] { pg->allreduce(t, c10d::AllreduceOptions()); }, "disagreed");
  expect_error(
      [&] {
        pg->allreduce(t, c10d::AllreduceOptions());
        dev.synchronize(*dev.current_stream());
      },
      "disagreed");
  store_barrier("done");
}

// NOTE [Failure words]: rank 0's area and rank 1's, as one process plays rank 0; word[r] is the
// start of rank r's.
struct TwoWords {
  std::vector<uint32_t> area[2] = {
      std::vector<uint32_t>(FailureState::area_bytes(2) / sizeof(uint32_t)),
      std::vector<uint32_t>(FailureState::area_bytes(2) / sizeof(uint32_t))};
  uint32_t* word[2] = {area[0].data(), area[1].data()};
  bool trap_on_peer_failure = false;
  void give(Device& dev) {
    FailureWords w;
    w.rank = 0;
    w.trap_on_peer_failure = trap_on_peer_failure;
    w.own = word[0];
    w.peers = {nullptr, word[1]};
    dev.set_failure_words(std::move(w));
  }
};

// Issue 48, finding 3 with finding 2's word: a peer's failure ends a replay's counted waits at
// once instead of after a timeout each, and quietly (NOTE [Who traps] in
// p2p_workspace/flag_barrier_body.hpp): no lost context, the stream's tasks after the waits run,
// and the device's failure - read from the word - names the peer. With trap_on_peer_failure the
// first wait traps instead, and the model records the lost context.
void a_peers_failure_word_ends_counted_waits(bool trap_on_peer_failure) {
  auto dev = cuda_like_device();
  TwoWords words;
  words.trap_on_peer_failure = trap_on_peer_failure;
  words.give(*dev);
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0, counter = 0;
  std::atomic<int> after{0};
  begin_capture(*dev, s);
  for (int i = 0; i < 4; ++i) {
    dev->wait_counted(*s, {{&word, &counter, 1, 1}}, 60s, "captured wait " + std::to_string(i));
  }
  dev->host_task(*s, [&] { after.fetch_add(1); });
  auto graph = end_capture(*dev);
  graph->replay();
  std::thread peer([&] {
    std::this_thread::sleep_for(200ms);
    peer_writes(*words.word[0], 1 + 1);  // rank 1 failed
  });
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { dev->synchronize(*s); }, "rank 1's device failed first");
  peer.join();
  EXPECT_TRUE(dev->drain(3s)) << "the replay's waits ignored the peer's failure";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(read(*words.word[1]), 2u) << "the failure was not published on";
  if (trap_on_peer_failure) {
    EXPECT_NE(dev->lost_context().find("captured wait 0: a peer's failure"), std::string::npos)
        << dev->lost_context();
    EXPECT_EQ(after.load(), 0) << "the stream ran on after a trap";
  } else {
    EXPECT_EQ(dev->lost_context(), "") << "a peer's failure made a healthy rank trap";
    EXPECT_EQ(after.load(), 1) << "the waits did not end quietly";
  }
}

TEST(DeviceFailure, APeersFailureWordEndsAReplaysCountedWaitsAtOnceAndQuietly) {
  a_peers_failure_word_ends_counted_waits(false);
}
TEST(DeviceFailure, APeersFailureWordTrapsAReplaysCountedWaitWhereTheGroupAsks) {
  a_peers_failure_word_ends_counted_waits(true);
}

// A stream memory wait watches one word: the watchdog reads the failure word for it, fails the
// device and releases the wait.
TEST(DeviceFailure, APeersFailureWordReleasesAnEagerWait) {
  auto dev = cuda_like_device();
  TwoWords words;
  words.give(*dev);
  auto s = dev->new_stream(false);
  alignas(4) uint32_t word = 0;
  dev->wait_signals(*s, {{&word, 1, 1}}, 3600s, "barrier");
  std::thread peer([&] {
    std::this_thread::sleep_for(200ms);
    peer_writes(*words.word[0], 1 + 1);
  });
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { dev->synchronize(*s); }, "rank 1's device failed first");
  peer.join();
  EXPECT_TRUE(dev->drain(3s)) << "the wait was not released";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  expect_error([&] { dev->check_healthy("next op"); }, "rank 1's device failed first");
}

// Issue 48, finding 2. Rank 1's host stalls past the timeout with three all-reduces to issue;
// rank 0 fails, its released stream runs its three all-reduces on (op 3 stages over op 1's input
// and signals as far as op 3), then rank 1 issues its three. Without the failure word rank 1's
// op 1 found its barrier satisfied and returned op 3's data with no error. Rank 1 must raise,
// naming rank 0, well within the group's timeout.
void released_rank_schedule(bool queued_ahead) {
  const auto& w = world();
  if (w.size != 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<at::Tensor> ins, outs;
  for (int i = 0; i < 3; ++i) {
    ins.push_back(at::full({256}, static_cast<float>(10 * (i + 1) + w.rank)));
    outs.push_back(at::zeros({256}));
  }
  auto dev = cuda_like_device();
  WorkspaceOptions o;
  o.buffer_size = 1 << 14;
  o.timeout = 1000ms;
  SymmetricWorkspace ws(test_store(), w.rank, w.size, dev, o);
  auto s = dev->current_stream();
  ops::CollectiveState state;
  ops::CollectiveConfig config;
  const ops::CollectiveContext ctx{ws, *s, 1, state, config};
  auto enqueue = [&] {
    for (int i = 0; i < 3; ++i) {
      ops::all_reduce(ctx, ins[i], outs[i], ops::ReduceOp::kSum, ops::AllReduceAlgo::kOneShot);
    }
  };
  if (w.rank == 0) {
    if (queued_ahead) store_barrier("rank 1 queued");
    expect_error(
        [&] {
          enqueue();
          dev->synchronize(*s);
        },
        "rank 1 never arrived");
    EXPECT_TRUE(dev->drain(5000ms));  // its released stream ran ops 1-3
    store_barrier("rank 0 ran on");
  } else {
    // The stall. With `queued_ahead` rank 1's host enqueued its ops first, but its stream has
    // not run them (a cooperative stream runs when someone waits): the GPU behind its host.
    if (queued_ahead) {
      enqueue();
      store_barrier("rank 1 queued");
    }
    store_barrier("rank 0 ran on");
    const auto start = std::chrono::steady_clock::now();
    try {
      if (!queued_ahead) enqueue();
      dev->synchronize(*s);
      for (int i = 0; i < 3; ++i) {
        ADD_FAILURE() << "op " << i + 1 << " returned " << outs[i][0].item<float>()
                      << " (right: " << 20 * (i + 1) + 1 << ") without an error";
      }
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, o.timeout);
    EXPECT_TRUE(dev->drain(5000ms));
  }
  store_barrier("done");
}

TEST(DeviceFailure, AReleasedRankNeverHandsAHealthyPeerWrongData) {
  released_rank_schedule(/*queued_ahead=*/false);
}

// The same, with rank 1's ops already queued when rank 0 failed: its synchronize, after its
// stream ran, finds the word rank 0 wrote before it released anything.
TEST(DeviceFailure, AHealthyPeerWhoseOpsWereQueuedAheadRaisesToo) {
  released_rank_schedule(/*queued_ahead=*/true);
}

// On the synchronous host device too, a peer's failure ends a blocked wait at once, naming the
// rank that failed, instead of at the wait's own timeout naming it as missing.
TEST(DeviceFailure, APeersAbortEndsABlockedHostWaitAtOnce) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto dev = make_host_device(w.size);
  WorkspaceOptions o;
  o.buffer_size = 1 << 12;
  o.timeout = 60s;
  SymmetricWorkspace ws(test_store(), w.rank, w.size, dev, o);
  store_barrier("mapped");
  if (w.rank == 0) {
    std::this_thread::sleep_for(300ms);  // the others are in the barrier
    ws.abort("aborted by the test");
  } else {
    const auto start = std::chrono::steady_clock::now();
    expect_error([&] { ws.barrier(*dev->current_stream(), 0); }, "rank 0's device failed first");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  }
  store_barrier("done");
}

// Issue 48, finding 8: c10d's setTimeout reaches the workspace's waits (the backend's line that
// calls SymmetricWorkspace::set_timeout is its own).
TEST(DeviceFailure, SetTimeoutReachesTheWorkspacesWaits) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto dev = make_host_device(w.size);
  WorkspaceOptions o;
  o.buffer_size = 1 << 12;
  o.timeout = 60s;
  SymmetricWorkspace ws(test_store(), w.rank, w.size, dev, o);
  ws.set_timeout(300ms);
  EXPECT_EQ(ws.timeout(), 300ms);
  expect_error([&] { ws.set_timeout(0ms); }, "workspace timeout must be positive, got 0 ms");
  if (w.rank != w.size - 1) {
    const auto start = std::chrono::steady_clock::now();
    expect_error([&] { ws.barrier(*dev->current_stream(), 0); }, "timed out after 300 ms");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  }
  store_barrier("done");
}

}  // namespace
}  // namespace cuda_p2p::test
