// Captured collectives replayed: the host device's capture (NOTE [Host capture] in
// p2p_workspace/host/host_device.cpp) runs what a replayed CUDA graph runs, with the replay-safe
// signals of NOTE [Replay-safe signals] (p2p_workspace/symmetric_workspace.cpp). Every result is
// checked against the same math done by plain ATen in this process, after every replay, with new
// values written into the captured inputs between replays, mixed with eager ops of the same group
// and with a second graph, in an order every rank draws alike.
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/channels.hpp"
#include "ops/collectives.hpp"
#include "ops/common.hpp"
#include "ops/fused_ops.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

at::Tensor input(at::IntArrayRef sizes, int64_t seed) { return small_ints(sizes, seed, -3, 3); }

c10::intrusive_ptr<ProcessGroupCudaP2P> make_group(Millis timeout, const char* streams,
                                                   bool trap_on_peer_failure = false) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->host_streams = streams;
  if (trap_on_peer_failure) options->trap_on_peer_failure = true;
  options->buffer_size = 1 << 16;  // small: the two-shot and the larger payloads run in rounds
  options->timeout = timeout;
  const auto& w = world();
  auto pg = c10::make_intrusive<ProcessGroupCudaP2P>(
      test_store(), w.rank, w.size, options, c10::make_intrusive<Unreachable>(w.rank, w.size),
      nullptr);
  if (pg->workspace() != nullptr) apply_test_semantics(pg->workspace()->device());
  return pg;
}

// The captured tensors and what a replay must leave in them, for the values of `round`.
struct Captured {
  std::vector<at::Tensor> in;   // written before each replay
  std::vector<at::Tensor> out;  // read after it
  // Writes round `round`'s inputs into `in` and returns the outputs they must give.
  std::function<std::vector<at::Tensor>(int round)> fill;
};

int64_t seed_of(int graph, int round, int rank) { return 100000 * graph + 100 * round + rank; }

// Graph 1: a one-shot all-reduce of an odd size and a two-shot all-reduce in rounds (64 KiB
// buffer), on the group's collective channel.
Captured graph_one(ProcessGroupCudaP2P& pg) {
  const int W = world().size, me = world().rank;
  Captured c;
  c.in = {at::zeros({1001}), at::zeros({40000})};
  c.out = {c.in[0], c.in[1]};  // in place, as dist.all_reduce
  std::vector<at::Tensor> a{c.in[0]}, b{c.in[1]};
  c10d::AllreduceOptions one, two;
  pg.allreduce(a, one);
  pg.allreduce(b, two);
  c.fill = [W, me, c](int round) mutable {
    std::vector<at::Tensor> want;
    for (size_t k = 0; k < c.in.size(); ++k) {
      c.in[k].copy_(input(c.in[k].sizes(), seed_of(1 + static_cast<int>(k), round, me)));
      auto sum = at::zeros_like(c.in[k]);
      for (int q = 0; q < W; ++q) sum += input(c.in[k].sizes(), seed_of(1 + k, round, q));
      want.push_back(sum);
    }
    return want;
  };
  return c;
}

// Graph 2: an all-gather and a reduce-scatter of odd sizes.
Captured graph_two(ProcessGroupCudaP2P& pg) {
  const int W = world().size, me = world().rank;
  Captured c;
  const int64_t n = 777;
  c.in = {at::zeros({n}), at::zeros({W * n})};
  c.out = {at::zeros({W * n}), at::zeros({n})};
  pg._allgather_base(c.out[0], c.in[0], c10d::AllgatherOptions());
  pg._reduce_scatter_base(c.out[1], c.in[1], c10d::ReduceScatterOptions());
  c.fill = [W, me, n, c](int round) mutable {
    c.in[0].copy_(input({n}, seed_of(3, round, me)));
    c.in[1].copy_(input({W * n}, seed_of(4, round, me)));
    std::vector<at::Tensor> parts;
    auto sum = at::zeros({W * n});
    for (int q = 0; q < W; ++q) {
      parts.push_back(input({n}, seed_of(3, round, q)));
      sum += input({W * n}, seed_of(4, round, q));
    }
    return std::vector<at::Tensor>{at::cat(parts), sum.slice(0, me * n, (me + 1) * n)};
  };
  return c;
}

// Graph 3: a broadcast, which keeps the copy engine (NOTE [Captured collectives in one kernel]),
// and a bfloat16 all-reduce (a kernel: float32 accumulation).
Captured graph_three(ProcessGroupCudaP2P& pg) {
  const int W = world().size, me = world().rank;
  Captured c;
  const int64_t n = 5000, m = 3001;
  c.in = {at::zeros({n}), at::zeros({m}, at::kBFloat16)};
  c.out = {c.in[0], c.in[1]};
  std::vector<at::Tensor> b{c.in[0]}, r{c.in[1]};
  c10d::BroadcastOptions root;
  root.rootRank = W - 1;
  pg.broadcast(b, root);
  pg.allreduce(r, c10d::AllreduceOptions());
  c.fill = [W, me, n, m, c](int round) mutable {
    c.in[0].copy_(input({n}, seed_of(5, round, me)));
    c.in[1].copy_(input({m}, seed_of(6, round, me)).to(at::kBFloat16));
    auto sum = at::zeros({m});
    for (int q = 0; q < W; ++q) sum += input({m}, seed_of(6, round, q));
    return std::vector<at::Tensor>{input({n}, seed_of(5, round, W - 1)), sum.to(at::kBFloat16)};
  };
  return c;
}

struct Graph {
  std::shared_ptr<HostGraph> graph;
  Captured tensors;
};

Graph capture(ProcessGroupCudaP2P& pg, const std::shared_ptr<Stream>& s,
              Captured (*build)(ProcessGroupCudaP2P&)) {
  Device& dev = pg.workspace()->device();
  begin_capture(dev, s);
  Captured c;
  try {
    c = build(pg);
  } catch (...) {
    (void)end_capture(dev);
    throw;
  }
  return {end_capture(dev), std::move(c)};
}

void expect_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_TRUE(got[k].equal(want[k]))
        << what << ", output " << k << " (rank " << world().rank << ")";
  }
}

void replay_and_check(Device& dev, Stream& s, Graph& g, int round, const std::string& what) {
  const auto want = g.tensors.fill(round);
  g.graph->replay();
  dev.synchronize(s);
  expect_equal(g.tensors.out, want, what + ", round " + std::to_string(round));
}

// An eager all-reduce on the same stream, between replays.
void eager_all_reduce(ProcessGroupCudaP2P& pg, Device& dev, Stream& s, int round) {
  const int W = world().size, me = world().rank;
  std::vector<at::Tensor> t{input({333}, seed_of(9, round, me))};
  pg.allreduce(t, c10d::AllreduceOptions());
  dev.synchronize(s);
  auto sum = at::zeros({333});
  for (int q = 0; q < W; ++q) sum += input({333}, seed_of(9, round, q));
  EXPECT_TRUE(t[0].equal(sum)) << "eager all-reduce between replays, round " << round;
}

void replays_mixed_with_eager_ops(const char* streams) {
  auto pg = make_group(Millis(60000), streams);
  ASSERT_TRUE(pg->is_p2p_available()) << pg->p2p_unavailable_reason();
  Device& dev = pg->workspace()->device();
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  eager_all_reduce(*pg, dev, *s, 0);  // an eager op before the captures
  pg->reset_counters();
  Graph one = capture(*pg, s, graph_one);
  Graph two = capture(*pg, s, graph_two);
  Graph three = capture(*pg, s, graph_three);
  // Counted once each, when captured; nothing ran.
  const auto counted = pg->counters();
  if (world().size > 1) {
    EXPECT_EQ(counted.at("all_reduce.graph"), 3);
    EXPECT_EQ(counted.at("all_gather.graph"), 1);
    EXPECT_EQ(counted.at("reduce_scatter.graph"), 1);
  }
  // NOTE [Captured collectives in one kernel]: one recorded task per captured op (a rank alone
  // reduces nothing: its in-place all-reduces enqueue nothing).
  EXPECT_EQ(one.graph->tasks(), world().size > 1 ? 2u : 0u);
  EXPECT_EQ(two.graph->tasks(), 2u);
  // A broadcast keeps the copy engine, between an open and a close (NOTE [Graph flags]).
  if (world().size > 1) {
    EXPECT_GT(three.graph->tasks(), 2u);
  }
  // Every rank draws the same order: graph one, two or three, or an eager all-reduce; 50 rounds
  // (issue 55: graphs alternating with each other and with eager ops for 50 replays).
  std::mt19937 order(1234);
  for (int round = 1; round <= 50; ++round) {
    switch (order() % 4) {
      case 0:
        replay_and_check(dev, *s, one, round, "graph one");
        break;
      case 1:
        replay_and_check(dev, *s, two, round, "graph two");
        break;
      case 2:
        replay_and_check(dev, *s, three, round, "graph three");
        break;
      default:
        eager_all_reduce(*pg, dev, *s, round);
    }
  }
  // Replayed back to back, without a synchronization between: the second replay's waits must
  // not be satisfied by the first's signals.
  const auto want_a = one.tensors.fill(100);
  one.graph->replay();
  dev.synchronize(*s);
  expect_equal(one.tensors.out, want_a, "graph one, back to back (1)");
  auto want_b = two.tensors.fill(101);
  two.graph->replay();
  two.graph->replay();  // the same inputs twice: the same outputs
  dev.synchronize(*s);
  expect_equal(two.tensors.out, want_b, "graph two, replayed twice");
  eager_all_reduce(*pg, dev, *s, 200);  // an eager op after the replays
  set_current_stream(dev, nullptr);
  pg->shutdown();
}

TEST(Graphs, ReplaysGiveTheRightAnswersMixedWithEagerOpsAndAnotherGraph) {
  replays_mixed_with_eager_ops("cooperative");
}

TEST(Graphs, ReplaysWithAThreadPerStream) { replays_mixed_with_eager_ops("threads"); }

TEST(Graphs, CaptureRefusesWhatItCannotReplay) {
  auto pg = make_group(Millis(60000), "cooperative");
  Device& dev = pg->workspace()->device();
  // The inline stream (a caller without a stream of its own) runs its work at once. (With CUDA's
  // semantics a caller's stream is never the inline one.)
  if (!cuda_semantics()) {
    EXPECT_THROW(begin_capture(dev, dev.current_stream()), c10::Error);
  }
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  begin_capture(dev, s);
  EXPECT_THROW(begin_capture(dev, s), c10::Error);  // one capture at a time
  // A captured stream cannot be synchronized: its work runs at replay.
  EXPECT_THROW(dev.synchronize(*s), c10::Error);
  // Nor can an all-to-all be captured: its split sizes are read back on the host.
  const int W = world().size;
  auto in = at::arange(2 * W, at::kFloat), out = at::empty({2 * W});
  std::vector<int64_t> no_splits;
  try {
    pg->alltoall_base(out, in, no_splits, no_splits, c10d::AllToAllOptions());
    ADD_FAILURE() << "an all-to-all was captured";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be captured"), std::string::npos) << e.what();
  }
  (void)end_capture(dev);
  EXPECT_THROW(end_capture(dev), c10::Error);
  // The group was not failed by the refusal: an eager all-to-all runs.
  pg->alltoall_base(out, in, no_splits, no_splits, c10d::AllToAllOptions());
  dev.synchronize(*s);
  for (int q = 0; q < W; ++q) {
    EXPECT_EQ(out[2 * q].item<float>(), static_cast<float>(2 * world().rank)) << q;
  }
  set_current_stream(dev, nullptr);
  pg->shutdown();
}

// Fused ops are captured on CUDA only; on the host the capture refuses them before anything is
// enqueued, with an error that says why (and, before the group's first fused op, what to run
// first), and the group goes on working.
TEST(Graphs, AFusedOpUnderHostCaptureRaisesClearly) {
  const auto& w = world();
  auto pg = make_group(Millis(60000), "cooperative");
  Device& dev = pg->workspace()->device();
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  auto B = input({6, 5}, 99);
  auto shard = input({3, 6}, w.rank);
  auto fused = [&] {
    auto group = pg->pipeline_group(c10::DeviceType::CPU);
    std::lock_guard<std::mutex> lock(group.state.mutex);
    return ops::fused_all_gather_matmul(group, shard, {B}, 0, false, "pipeline");
  };
  auto expect_refused = [&](const char* words) {
    begin_capture(dev, s);
    expect_error([&] { (void)fused(); }, words);
    (void)end_capture(dev);
  };
  if (w.size > 1) expect_refused("run a fused op of this group once eagerly");
  auto r = fused();  // eager: makes the streams
  dev.synchronize(*s);
  std::vector<at::Tensor> shards;
  for (int q = 0; q < w.size; ++q) shards.push_back(input({3, 6}, q));
  EXPECT_TRUE(r.outputs[0].equal(at::matmul(at::cat(shards), B)));
  if (w.size > 1) expect_refused("cannot be captured on a host workspace");
  eager_all_reduce(*pg, dev, *s, 7);  // the group still works
  set_current_stream(dev, nullptr);
  pg->shutdown();
}

// A group whose every rank captured graph one on a stream of its own, current for the group's
// ops, and replayed it once.
struct ReplayedOnce {
  c10::intrusive_ptr<ProcessGroupCudaP2P> pg;
  std::shared_ptr<Stream> s;
  Graph one;
  Device& dev() const { return pg->workspace()->device(); }
};
ReplayedOnce replayed_once(Millis timeout, const char* streams, bool trap_on_peer_failure = false) {
  ReplayedOnce r{make_group(timeout, streams, trap_on_peer_failure), nullptr, {}};
  r.s = r.dev().new_stream(false);
  set_current_stream(r.dev(), r.s);
  r.one = capture(*r.pg, r.s, graph_one);
  replay_and_check(r.dev(), *r.s, r.one, 1, "graph one");  // every rank replays once
  return r;
}

TEST(Graphs, ARankThatNeverReplaysIsNamed) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  ReplayedOnce r = replayed_once(Millis(1500), "cooperative");
  auto& [pg, s, one] = r;
  Device& dev = r.dev();
  const int absent = w.size - 1;
  if (w.rank != absent) {
    (void)one.tensors.fill(2);
    one.graph->replay();
    try {
      dev.synchronize(*s);
      ADD_FAILURE() << "a replay without rank " << absent << " did not time out";
    } catch (const c10::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("never arrived"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(absent)), std::string::npos) << msg;
      EXPECT_NE(msg.find("graph"), std::string::npos) << msg;
    }
  }
  // The absent rank stays until its peers have given up: they read its pad.
  store_barrier("replay-timed-out");
  set_current_stream(dev, nullptr);
  pg->abort();
  // What the replay left queued ends at once after the failure (NOTE [Counted waits end with the
  // failure]) and runs before the graph's tensors go.
  EXPECT_TRUE(dev.drain(Millis(5000)));
}

// NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp. The last rank aborts while its peers
// replay (a thread per stream: their kernels run, as on a GPU, whatever their hosts do): a peer's
// failure word ends the replay's flag barriers and counted waits quietly - no lost context (the
// host's model of a trap) - and the next call, and check() without a synchronize, raise naming
// the aborting rank, whose own check() is quiet. With trap_on_peer_failure the peers' kernels
// trap instead. (Before, every peer trapped.)
void a_peers_abort_while_others_replay(bool trap_on_peer_failure) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  ReplayedOnce r = replayed_once(Millis(20000), "threads", trap_on_peer_failure);
  auto& [pg, s, one] = r;
  Device& dev = r.dev();
  const int aborting = w.size - 1;
  const std::string named = "rank " + std::to_string(aborting);
  if (w.rank == aborting) {
    store_barrier("replaying");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the peers' kernels wait
    pg->abort();
    pg->check();  // its own abort is no error
  } else {
    (void)one.tensors.fill(2);
    one.graph->replay();
    store_barrier("replaying");
    expect_error([&] { dev.synchronize(*s); }, named);
    EXPECT_TRUE(dev.drain(Millis(10000))) << "the replay did not end at the peer's failure";
    expect_error([&] { pg->check(); }, named);
    if (cuda_semantics()) {
      if (trap_on_peer_failure) {
        EXPECT_NE(pg->lost_context().find("a peer's failure"), std::string::npos)
            << "the group asked its kernels to trap at a peer's failure";
      } else {
        EXPECT_EQ(pg->lost_context(), "") << "a healthy peer of an aborting rank trapped";
      }
    }
  }
  if (w.rank == aborting || !trap_on_peer_failure) {
    EXPECT_EQ(pg->lost_context(), "");
  }
  store_barrier("checked");
  set_current_stream(dev, nullptr);
  pg->abort();
  EXPECT_TRUE(dev.drain(Millis(5000)));
}

TEST(Graphs, APeersAbortEndsReplaysQuietlyAndCheckNamesIt) {
  a_peers_abort_while_others_replay(false);
}
TEST(Graphs, APeersAbortTrapsReplaysWhereTheGroupAsks) { a_peers_abort_while_others_replay(true); }

// NOTE [One captured op at a time] in p2p_workspace/graph_flags.hpp. Two graphs of one group, the
// same op captured on two streams (an all-reduce run as one kernel: both would pass on one flag
// and stage into one region; a broadcast, which keeps the copy engine between an open and a
// close), replayed at once on rank 0 while its peers are late: rank 0's second replay finds the
// first holding the busy word, runs nothing and fails the group, which raises the cause on rank 0
// and names rank 0 on its peers; nobody traps. Before, the two ran on each other's flags: no error
// (or, for ops of different tags, a trap at a foreign tag).
void two_graphs_replayed_at_once(const char* streams, bool broadcast) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = make_group(Millis(20000), streams);
  Device& dev = pg->workspace()->device();
  auto one = dev.new_stream(false), two = dev.new_stream(false);
  auto a = input({1001}, w.rank), b = input({1001}, w.rank);
  auto op = [&](at::Tensor& t) {
    std::vector<at::Tensor> v{t};
    if (broadcast) {
      c10d::BroadcastOptions root;
      root.rootRank = 0;
      pg->broadcast(v, root);
    } else {
      pg->allreduce(v, c10d::AllreduceOptions());
    }
  };
  set_current_stream(dev, one);
  op(a);  // eagerly first, as a user does
  dev.synchronize(*one);
  begin_capture(dev, one);
  op(a);
  auto graph_a = end_capture(dev);
  set_current_stream(dev, two);
  begin_capture(dev, two);
  op(b);
  auto graph_b = end_capture(dev);
  // One after the other, they pass.
  graph_a->replay();
  dev.synchronize(*one);
  graph_b->replay();
  dev.synchronize(*two);
  store_barrier("replayed-in-turn");
  if (w.rank == 0) {
    graph_a->replay();  // waits for its late peers, holding the busy word
    graph_b->replay();  // at once, on the other stream
    store_barrier("replayed-at-once");
    for (auto* s : {two.get(), one.get()}) {
      try {
        dev.synchronize(*s);
      } catch (const c10::Error&) {  // NOLINT(bugprone-empty-catch): check() says what, below
      }
    }
    expect_error([&] { pg->check(); }, "another captured op of this group was running");
  } else {
    store_barrier("replayed-at-once");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    graph_a->replay();
    expect_error([&] { dev.synchronize(*one); }, "rank 0");
    expect_error([&] { pg->check(); }, "rank 0");
  }
  EXPECT_TRUE(dev.drain(Millis(10000))) << "a replay did not end at the group's failure";
  EXPECT_EQ(pg->lost_context(), "") << "a kernel trapped";
  store_barrier("checked");
  set_current_stream(dev, nullptr);
  pg->abort();
  EXPECT_TRUE(dev.drain(Millis(5000)));
}

TEST(Graphs, TwoGraphsReplayedAtOnceAreRefused) { two_graphs_replayed_at_once("threads", false); }
TEST(Graphs, TwoGraphsReplayedAtOnceAreRefusedCooperatively) {
  two_graphs_replayed_at_once("cooperative", false);
}
TEST(Graphs, TwoCopyEngineGraphsReplayedAtOnceAreRefused) {
  two_graphs_replayed_at_once("threads", true);
}

// NOTE [Graph flags]: what is open is kept per capture. Rank 0's captured all-reduce is rejected
// (its arguments fail their checks: it takes part with a rejected signature and raises) while its
// peers capture theirs; then every rank captures a barrier alone, which must be an op of its own
// on every rank, and passes at every replay. (Before, the rejection's open stayed open: rank 0's
// barrier took it for its own, on another slot and tag than its peers' - a foreign tag or a
// timeout at the first replay.)
TEST(Graphs, ARejectedCapturedOpLeavesNothingOpenForTheNextCapture) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = make_group(Millis(10000), "cooperative");
  Device& dev = pg->workspace()->device();
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  auto t = input({1001}, w.rank);
  begin_capture(dev, s);
  if (w.rank == 0) {
    expect_error(
        [&] { pg->check_all_reduce_in_place(t, [] { TORCH_CHECK(false, "a bad argument"); }); },
        "a bad argument");
  } else {
    std::vector<at::Tensor> v{t};
    pg->allreduce(v, c10d::AllreduceOptions());
  }
  (void)end_capture(dev);  // never replayed: its ranks disagree
  begin_capture(dev, s);
  pg->workspace()->barrier(*s, ops::kCollectiveChannel);  // a barrier op alone, on the op's channel
  auto barrier = end_capture(dev);
  for (int i = 0; i < 3; ++i) {
    barrier->replay();
    dev.synchronize(*s);
  }
  eager_all_reduce(*pg, dev, *s, 1);  // the group still works
  set_current_stream(dev, nullptr);
  pg->shutdown();
}

// A captured barrier alone waits its caller's limit (intra_node_barrier(timeout=...)), not the
// group's timeout (issue 56, finding 9: before, the op of its own took the group's 60 s).
TEST(Graphs, ACapturedBarrierWaitsItsCallersLimit) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = make_group(Millis(60000), "cooperative");
  Device& dev = pg->workspace()->device();
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  begin_capture(dev, s);
  pg->intra_node_barrier({}, Millis(700));
  auto barrier = end_capture(dev);
  const int absent = w.size - 1;
  if (w.rank != absent) {
    barrier->replay();
    // Given up at the limit: within half the group's timeout, on a busy machine too (the
    // synchronous host's error also says "timed out after 700 ms"; CUDA's record names the rank).
    const auto t0 = std::chrono::steady_clock::now();
    expect_error_naming_rank([&] { dev.synchronize(*s); }, "never arrived", absent);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  }
  store_barrier("limit-timed-out");  // the absent rank stays until its peers gave up
  set_current_stream(dev, nullptr);
  pg->abort();
  EXPECT_TRUE(dev.drain(Millis(5000)));
}

// ---------------------------------------------------------------------------------------------
// The ops on a workspace of their own (NOTE [Captured collectives in one kernel], NOTE [Graph
// flags]): every kind, dtype and reduce op as one kernel, against plain ATen; the copy-engine
// path beside it (a graph region too small for the op); the flags at rest after every replay; a
// rank that replays once more than its peers; ranks at different ops.

using ops::ReduceOp;

// A workspace, a stream of its own (capturable), and the state its collectives share.
struct Ws {
  std::unique_ptr<SymmetricWorkspace> ws;
  std::shared_ptr<Stream> s;
  ops::CollectiveState state;
  ops::CollectiveConfig config;
  Ws(int64_t region, Millis timeout) {
    WorkspaceOptions o;
    o.buffer_size = 1 << 16;
    o.timeout = timeout;
    o.cross_memory_reads = false;
    o.graph_region_bytes = region;
    ws = std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              test_host_device(world().size), o);
    s = ws->device().new_stream(false);
    config.chunk_bytes = 0;
  }
  Device& dev() { return ws->device(); }
  // One op, ordered as the backend orders it (NOTE [One order per group]).
  template <typename F>
  void op(F&& f) {
    ws->begin_op(*s);
    f(ops::CollectiveContext{*ws, *s, ops::kCollectiveChannel, state, config});
    ws->end_op(*s);
  }
  template <typename F>
  std::shared_ptr<HostGraph> capture(F&& ops) {
    begin_capture(dev(), s);
    try {
      ops();
    } catch (...) {
      (void)end_capture(dev());
      throw;
    }
    return end_capture(dev());
  }
  // Every graph flag of this rank's pad, on every channel, is back at zero once every rank has
  // ended its replay, and before any starts the next (whose open stores into this pad).
  bool flags_at_rest() {
    const std::string n = std::to_string(++rest_checks);
    store_barrier("rest " + n);
    const bool rest = flags_zero();
    store_barrier("rested " + n);
    return rest;
  }
  int rest_checks = 0;
  bool flags_zero() const {
    for (int c = 0; c < ws->num_channels(); ++c) {
      for (int b = 0; b < kMaxGraphBlocks; ++b) {
        for (int k = 0; k < kGraphSlots; ++k) {
          for (int q = 0; q < world().size; ++q) {
            const uint32_t* f = ws->graph_flag(world().rank, c, b, k, q);
            if (std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(f)).load() != 0) return false;
          }
        }
      }
    }
    return true;
  }
};

// Small integers, so that every reduction order gives the same bits (products of up to 4 ranks
// stay exact in bfloat16; the bitwise ops take bytes).
at::Tensor value(int64_t seed, int rank, int64_t n, at::ScalarType dtype, ReduceOp op) {
  auto i = at::arange(n, at::kLong);
  at::Tensor v;
  if (op == ReduceOp::kProduct) {
    v = (i * 7 + rank * 3 + seed) % 5 - 2;
  } else if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    v = (i * 2654435761LL + rank * 40503 + seed * 977) % 251;
  } else {
    v = (i * 7 + rank * 13 + seed) % 17 - 8;
  }
  if (dtype == at::kByte) v = v.abs();
  return v.to(dtype);
}

// op over the ranks' values in rank order, as ops::reduce defines it, with plain ATen.
at::Tensor reference(const std::vector<at::Tensor>& xs, ReduceOp op) {
  const at::ScalarType dtype = xs[0].scalar_type();
  const bool floating = at::isFloatingType(dtype);
  at::Tensor r = xs[0].to(floating ? at::kDouble : at::kLong);
  for (size_t i = 1; i < xs.size(); ++i) {
    const at::Tensor x = xs[i].to(r.scalar_type());
    switch (op) {
      case ReduceOp::kProduct:
        r = r * x;
        break;
      case ReduceOp::kMin:
        r = at::minimum(r, x);
        break;
      case ReduceOp::kMax:
        r = at::maximum(r, x);
        break;
      case ReduceOp::kBand:
        r = at::bitwise_and(r, x);
        break;
      case ReduceOp::kBor:
        r = at::bitwise_or(r, x);
        break;
      case ReduceOp::kBxor:
        r = at::bitwise_xor(r, x);
        break;
      default:
        r = r + x;
    }
  }
  if (op == ReduceOp::kAvg) {
    return (r.to(ops::accumulate_type(dtype)) / static_cast<double>(xs.size())).to(dtype);
  }
  return r.to(dtype);
}

enum class Kind { kOneShot, kTwoShot, kAllGather, kReduceScatter };

const char* name(Kind k) {
  switch (k) {
    case Kind::kOneShot:
      return "one-shot all-reduce";
    case Kind::kTwoShot:
      return "two-shot all-reduce";
    case Kind::kAllGather:
      return "all-gather";
    default:
      return "reduce-scatter";
  }
}

// One captured op of `kind` on n elements (per rank, or per chunk), its tensors, and its check.
struct CapturedOp {
  Kind kind;
  at::ScalarType dtype;
  ReduceOp op;
  int64_t n;
  at::Tensor in, out;
  std::vector<at::Tensor> ins, outs;  // chunks / slices of `in` / `out`
  std::string what;

  CapturedOp(Kind k, at::ScalarType t, ReduceOp o, int64_t elems)
      : kind(k), dtype(t), op(o), n(elems) {
    const int W = world().size;
    const auto opts = at::TensorOptions().dtype(t);
    const bool all_reduce = k == Kind::kOneShot || k == Kind::kTwoShot;
    in = at::zeros({k == Kind::kReduceScatter ? W * n : n}, opts);
    out = all_reduce ? in : at::zeros({k == Kind::kAllGather ? W * n : n}, opts);
    for (int q = 0; q < W; ++q) {
      if (k == Kind::kReduceScatter) ins.push_back(in.narrow(0, q * n, n));
      if (k == Kind::kAllGather) outs.push_back(out.narrow(0, q * n, n));
    }
    std::ostringstream os;
    os << name(k) << " of " << n << " x " << t << " " << ops::to_string(o) << " (rank "
       << world().rank << " of " << W << ")";
    what = os.str();
  }
  void enqueue(Ws& f) {
    f.op([&](const ops::CollectiveContext& ctx) {
      switch (kind) {
        case Kind::kOneShot:
          (void)ops::all_reduce(ctx, in, out, op, ops::AllReduceAlgo::kOneShot);
          break;
        case Kind::kTwoShot:
          (void)ops::all_reduce(ctx, in, out, op, ops::AllReduceAlgo::kTwoShot);
          break;
        case Kind::kAllGather:
          (void)ops::all_gather(ctx, in, outs, ops::AllGatherAlgo::kAuto);
          break;
        case Kind::kReduceScatter:
          (void)ops::reduce_scatter(ctx, ins, out, op, ops::ReduceScatterAlgo::kAuto);
          break;
      }
    });
  }
  // Writes round `round`'s inputs; returns the output they must give.
  at::Tensor fill(int round) {
    const int W = world().size, me = world().rank;
    const int64_t total = kind == Kind::kReduceScatter ? W * n : n;
    auto mine = [&](int rank) { return value(1000 * round, rank, total, dtype, op); };
    in.copy_(mine(me));
    std::vector<at::Tensor> all;
    for (int q = 0; q < W; ++q) all.push_back(mine(q));
    if (kind == Kind::kAllGather) return at::cat(all);
    const at::Tensor sum = reference(all, op);
    return kind == Kind::kReduceScatter ? sum.narrow(0, me * n, n) : sum;
  }
};

void replay_and_expect(Ws& f, HostGraph& g, CapturedOp& op, int round) {
  const at::Tensor want = op.fill(round);
  g.replay();
  f.dev().synchronize(*f.s);
  EXPECT_TRUE(op.out.equal(want)) << op.what << ", round " << round;
}

// Every kind, reducible dtype and reduce op as one kernel: one recorded task per op, the
// reference's bits after every replay, eager ops of the group between replays, and every flag
// back at zero after each.
TEST(GraphKernels, EveryKindDtypeAndOpAsOneKernelMatchesATen) {
  const int W = world().size;
  Ws f(WorkspaceOptions::kDefaultGraphRegionBytes, Millis(60000));
  const std::vector<at::ScalarType> dtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                              at::kBFloat16, at::kChar,   at::kByte,
                                              at::kShort,    at::kInt,    at::kLong};
  std::vector<CapturedOp> cases;
  for (auto t : dtypes) {
    const bool floating = at::isFloatingType(t);
    for (ReduceOp o : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                       ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBxor}) {
      const bool bitwise = o == ReduceOp::kBand || o == ReduceOp::kBxor;
      if ((o == ReduceOp::kAvg && !floating) || (bitwise && floating)) continue;
      cases.emplace_back(Kind::kOneShot, t, o, 37);
      cases.emplace_back(Kind::kTwoShot, t, o, 1001);
      cases.emplace_back(Kind::kReduceScatter, t, o, 13);
    }
    cases.emplace_back(Kind::kAllGather, t, ReduceOp::kSum, 29);
  }
  // Several blocks (more than graph::kBlockBytes staged per rank), odd tails.
  cases.emplace_back(Kind::kOneShot, at::kFloat, ReduceOp::kSum, 70001);
  cases.emplace_back(Kind::kTwoShot, at::kBFloat16, ReduceOp::kSum, 150003);
  cases.emplace_back(Kind::kAllGather, at::kFloat, ReduceOp::kSum, 40001);
  cases.emplace_back(Kind::kReduceScatter, at::kHalf, ReduceOp::kAvg, 20001);
  std::vector<at::Tensor> eager{at::ones({257})};
  for (auto& c : cases) {
    auto g = f.capture([&] { c.enqueue(f); });
    if (W > 1) {
      EXPECT_EQ(g->tasks(), 1u) << c.what << ": not one kernel";
    }
    for (int round = 1; round <= 2; ++round) {
      replay_and_expect(f, *g, c, round);
      if (W > 1) {
        EXPECT_TRUE(f.flags_at_rest()) << c.what << ", round " << round;
      }
    }
    // An eager op of the same group between replays, with its own staging and signals.
    f.op([&](const ops::CollectiveContext& ctx) {
      (void)ops::all_reduce(ctx, eager[0], eager[0], ReduceOp::kMax, ops::AllReduceAlgo::kAuto);
    });
    f.dev().synchronize(*f.s);
    replay_and_expect(f, *g, c, 3);
  }
  EXPECT_TRUE(eager[0].equal(at::ones({257})));
  store_barrier("done");
}

// A graph region too small for the ops: they keep the copy engine, between an open and a close
// (NOTE [Graph flags]), in rounds through the buffer, interleaved with kernel ops of another graph
// and eager ops, replayed in any order; the flags rest at zero after every replay, and what a
// graph addresses stays valid while a larger eager op runs between its replays (NOTE [Captured
// scratch]).
TEST(GraphKernels, CopyEngineOpsBesideKernelOpsInAnyOrder) {
  const int W = world().size;
  Ws f(4096, Millis(60000));
  CapturedOp big_sum(Kind::kTwoShot, at::kBFloat16, ReduceOp::kSum, 30001);
  CapturedOp big_gather(Kind::kAllGather, at::kFloat, ReduceOp::kSum, 3001);
  CapturedOp big_scatter(Kind::kReduceScatter, at::kHalf, ReduceOp::kAvg, 2001);
  CapturedOp small(Kind::kOneShot, at::kFloat, ReduceOp::kSum, 500);
  auto engine = f.capture([&] {
    big_sum.enqueue(f);
    big_gather.enqueue(f);
    big_scatter.enqueue(f);
  });
  auto kernel = f.capture([&] { small.enqueue(f); });
  if (W > 1) {
    EXPECT_GT(engine->tasks(), 3u) << "the large ops did not keep the copy engine";
    EXPECT_EQ(kernel->tasks(), 1u);
  }
  std::mt19937 order(99);
  for (int round = 1; round <= 9; ++round) {
    if (order() % 2 == 0) {
      const at::Tensor a = big_sum.fill(round), b = big_gather.fill(round),
                       c = big_scatter.fill(round);
      engine->replay();
      f.dev().synchronize(*f.s);
      EXPECT_TRUE(big_sum.out.equal(a)) << big_sum.what << ", round " << round;
      EXPECT_TRUE(big_gather.out.equal(b)) << big_gather.what << ", round " << round;
      EXPECT_TRUE(big_scatter.out.equal(c)) << big_scatter.what << ", round " << round;
    } else {
      replay_and_expect(f, *kernel, small, round);
    }
    if (W > 1) {
      EXPECT_TRUE(f.flags_at_rest()) << "round " << round;
    }
    if (round % 3 == 0) {  // a larger eager reduction between replays
      auto large = value(round, world().rank, 200003, at::kBFloat16, ReduceOp::kSum);
      std::vector<at::Tensor> all;
      for (int q = 0; q < W; ++q)
        all.push_back(value(round, q, 200003, at::kBFloat16, ReduceOp::kSum));
      f.op([&](const ops::CollectiveContext& ctx) {
        (void)ops::all_reduce(ctx, large, large, ReduceOp::kSum, ops::AllReduceAlgo::kTwoShot);
      });
      f.dev().synchronize(*f.s);
      EXPECT_TRUE(large.equal(reference(all, ReduceOp::kSum))) << "eager, round " << round;
    }
  }
  store_barrier("done");
}

// NOTE [Captured scratch]: what a graph addresses - the graph region of its kernel ops, the
// buffer and signal pad of its copy-engine ops - stays mapped when the workspace grows and eager
// ops move to the new buffer: replays after the growth still give the reference's bits.
TEST(GraphKernels, WhatAGraphAddressesOutlivesAGrowth) {
  const int W = world().size;
  Ws f(4096, Millis(60000));
  CapturedOp small(Kind::kOneShot, at::kFloat, ReduceOp::kSum, 500);    // a kernel
  CapturedOp big(Kind::kTwoShot, at::kBFloat16, ReduceOp::kSum, 9001);  // the copy engine
  auto g = f.capture([&] {
    small.enqueue(f);
    big.enqueue(f);
  });
  auto replay = [&](int round) {
    const at::Tensor a = small.fill(round), b = big.fill(round);
    g->replay();
    f.dev().synchronize(*f.s);
    EXPECT_TRUE(small.out.equal(a)) << small.what << ", round " << round;
    EXPECT_TRUE(big.out.equal(b)) << big.what << ", round " << round;
  };
  replay(1);
  const uint64_t version = f.ws->mapping_version();
  f.ws->ensure_min_buffer_size(int64_t{4} << 20);
  EXPECT_NE(f.ws->mapping_version(), version) << "the workspace did not grow";
  for (int round = 2; round <= 4; ++round) {
    // An eager op on the new buffer, larger than the old one, then the graph on the old one.
    auto large = value(round, world().rank, 600001, at::kFloat, ReduceOp::kSum);
    std::vector<at::Tensor> all;
    for (int q = 0; q < W; ++q) all.push_back(value(round, q, 600001, at::kFloat, ReduceOp::kSum));
    f.op([&](const ops::CollectiveContext& ctx) {
      (void)ops::all_reduce(ctx, large, large, ReduceOp::kSum, ops::AllReduceAlgo::kOneShot);
    });
    f.dev().synchronize(*f.s);
    EXPECT_TRUE(large.equal(reference(all, ReduceOp::kSum))) << "eager, round " << round;
    replay(round);
  }
  store_barrier("done");
}

// NOTE [Graph flags]: a rank that replays a graph once more than its peers raises, naming them,
// and fails its device; its peers learn it through their failure words when they go on, and no
// rank's output takes data of an unmatched replay.
TEST(GraphKernels, AnExtraReplayOnOneRankRaisesNamingItsPeers) {
  const int W = world().size, me = world().rank;
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  // A kernel op; an op that keeps the copy engine (no graph region), between an open and a close.
  for (int64_t region : {WorkspaceOptions::kDefaultGraphRegionBytes, int64_t{0}}) {
    const std::string r = std::to_string(region);
    Ws f(region, Millis(1500));
    CapturedOp op(Kind::kOneShot, at::kFloat, ReduceOp::kSum, 1000);
    auto g = f.capture([&] { op.enqueue(f); });
    replay_and_expect(f, *g, op, 1);  // every rank replays once
    store_barrier("replayed once " + r);
    if (me == 0) {
      (void)op.fill(2);
      g->replay();  // once more, alone
      const std::string peers = W == 2 ? "rank 1 never arrived" : "ranks 1,";
      expect_error([&] { f.dev().synchronize(*f.s); }, peers);
    }
    store_barrier("rank 0 gave up " + r);
    if (me != 0) {
      // The peers replay once more too, now that rank 0 has failed: they must raise, and their
      // output (the input, in place) must keep this round's input: the reduction comes after a
      // barrier rank 0 never reaches, and nothing of rank 0's stale round is reduced.
      (void)op.fill(3);
      const at::Tensor mine = op.in.clone();
      g->replay();
      expect_error([&] { f.dev().synchronize(*f.s); }, "rank 0");
      EXPECT_TRUE(op.out.equal(mine)) << "the output was written, region " << r;
    }
    store_barrier("done " + r);
    f.ws->abort("the test ends");
    EXPECT_TRUE(f.dev().drain(Millis(5000)));
  }
}

// NOTE [Graph flags]: ranks that captured different ops (here a size that differs on rank 0, and
// an op that keeps the copy engine against one that does not) raise at the first flag barrier,
// naming the rank at another op, instead of pairing the two.
TEST(GraphKernels, RanksAtDifferentOpsRaiseNamingTheRank) {
  const int W = world().size, me = world().rank;
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int region : {1 << 20, 0}) {  // kernel ops; ops that keep the copy engine
    Ws f(region, Millis(20000));
    CapturedOp op(Kind::kOneShot, at::kFloat, ReduceOp::kSum, me == 0 ? 1000 : 1001);
    // The first rank to poll a foreign flag fails at once, as the kernel traps at once
    // (p2p_workspace/flag_barrier_body.hpp): its failure may reach a slower peer before that
    // peer's own capture or replay, which then raise it.
    expect_error(
        [&] {
          auto g = f.capture([&] { op.enqueue(f); });
          (void)op.fill(1);
          g->replay();
          f.dev().synchronize(*f.s);
        },
        "another captured op");
    store_barrier("raised " + std::to_string(region));
    f.ws->abort("the test ends");
    EXPECT_TRUE(f.dev().drain(Millis(5000)));
  }
}

}  // namespace
}  // namespace cuda_p2p::test
