// test_graphs (tests/cpp/test_graphs.cpp): the captured ops on a workspace of their own, as one
// kernel each, against plain ATen.

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
#include "tests/cpp/reduce_reference.hpp"

namespace cuda_p2p::test {
namespace {

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
    auto mine = [&](int rank) { return reduce_input(1000 * round, rank, total, dtype, op); };
    in.copy_(mine(me));
    std::vector<at::Tensor> all;
    for (int q = 0; q < W; ++q) all.push_back(mine(q));
    if (kind == Kind::kAllGather) return at::cat(all);
    const at::Tensor sum = reference_reduce(all, op);
    return kind == Kind::kReduceScatter ? sum.narrow(0, me * n, n) : sum;
  }
};

void replay_and_expect(Ws& f, HostGraph& g, CapturedOp& op, int round) {
  const at::Tensor want = op.fill(round);
  g.replay();
  f.dev().synchronize(*f.s);
  EXPECT_TRUE(op.out.equal(want)) << op.what << ", round " << round;
}

// Every kind as one kernel, for a dtype of each element size and each kind of arithmetic (float,
// narrow float accumulated in float, integer; a divisor, a bitwise op): one recorded task per op,
// the reference's bits after every replay, eager ops of the group between replays, and every
// flag back at zero after each. The kernels' arithmetic for every dtype, reduce op, size and
// alignment is test_kernel_matrix's (the same kernel bodies, one process): here what the
// capture, the replays and the flags across real ranks add.
TEST(GraphKernels, EveryKindAndEachKindOfArithmeticAsOneKernelMatchesATen) {
  const int W = world().size;
  Ws f(WorkspaceOptions::kDefaultGraphRegionBytes, Millis(60000));
  const std::vector<std::pair<at::ScalarType, std::vector<ReduceOp>>> arithmetic = {
      {at::kFloat, {ReduceOp::kSum, ReduceOp::kAvg}},
      {at::kBFloat16, {ReduceOp::kSum, ReduceOp::kMax}},
      {at::kDouble, {ReduceOp::kProduct}},
      {at::kChar, {ReduceOp::kMin, ReduceOp::kBxor}},
      {at::kLong, {ReduceOp::kSum, ReduceOp::kBand}}};
  std::vector<CapturedOp> cases;
  for (const auto& [t, reduce_ops] : arithmetic) {
    for (ReduceOp o : reduce_ops) {
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
      auto large = reduce_input(round, world().rank, 200003, at::kBFloat16, ReduceOp::kSum);
      std::vector<at::Tensor> all;
      for (int q = 0; q < W; ++q)
        all.push_back(reduce_input(round, q, 200003, at::kBFloat16, ReduceOp::kSum));
      f.op([&](const ops::CollectiveContext& ctx) {
        (void)ops::all_reduce(ctx, large, large, ReduceOp::kSum, ops::AllReduceAlgo::kTwoShot);
      });
      f.dev().synchronize(*f.s);
      EXPECT_TRUE(large.equal(reference_reduce(all, ReduceOp::kSum))) << "eager, round " << round;
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
    auto large = reduce_input(round, world().rank, 600001, at::kFloat, ReduceOp::kSum);
    std::vector<at::Tensor> all;
    for (int q = 0; q < W; ++q)
      all.push_back(reduce_input(round, q, 600001, at::kFloat, ReduceOp::kSum));
    f.op([&](const ops::CollectiveContext& ctx) {
      (void)ops::all_reduce(ctx, large, large, ReduceOp::kSum, ops::AllReduceAlgo::kOneShot);
    });
    f.dev().synchronize(*f.s);
    EXPECT_TRUE(large.equal(reference_reduce(all, ReduceOp::kSum))) << "eager, round " << round;
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
