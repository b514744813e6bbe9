// Captured collectives replayed: the host device's capture (NOTE [Host capture] in
// p2p_workspace/host/host_device.cpp) runs what a replayed CUDA graph runs, with the replay-safe
// signals of NOTE [Replay-safe signals] (p2p_workspace/symmetric_workspace.cpp). Every result is
// checked against the same math done by plain ATen in this process, after every replay, with new
// values written into the captured inputs between replays, mixed with eager ops of the same group
// and with a second graph, in an order every rank draws alike.
#include <ATen/ATen.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/fused_ops.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

at::Tensor input(at::IntArrayRef sizes, int64_t seed) { return small_ints(sizes, seed, -3, 3); }

c10::intrusive_ptr<ProcessGroupCudaP2P> make_group(Millis timeout, const char* streams) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->host_streams = streams;
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
  // Counted once each, when captured; nothing ran.
  const auto counted = pg->counters();
  if (world().size > 1) {
    EXPECT_EQ(counted.at("all_reduce.graph"), 2);
    EXPECT_EQ(counted.at("all_gather.graph"), 1);
    EXPECT_EQ(counted.at("reduce_scatter.graph"), 1);
  }
  EXPECT_GT(one.graph->tasks(), 0u);
  // Every rank draws the same order: graph one, graph two or an eager all-reduce.
  std::mt19937 order(1234);
  for (int round = 1; round <= 12; ++round) {
    switch (order() % 3) {
      case 0:
        replay_and_check(dev, *s, one, round, "graph one");
        break;
      case 1:
        replay_and_check(dev, *s, two, round, "graph two");
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

TEST(Graphs, ARankThatNeverReplaysIsNamed) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = make_group(Millis(1500), "cooperative");
  Device& dev = pg->workspace()->device();
  auto s = dev.new_stream(false);
  set_current_stream(dev, s);
  Graph one = capture(*pg, s, graph_one);
  replay_and_check(dev, *s, one, 1, "graph one");  // every rank replays once
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

}  // namespace
}  // namespace cuda_p2p::test
