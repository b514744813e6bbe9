// test_collectives (tests/cpp/test_collectives.cpp): the collectives that reduce (reduce-scatter,
// all-reduce, reduce), broadcast, the cross-memory reads and rounds of small chunks.

#include "tests/cpp/test_collectives/fixture.hpp"

namespace cuda_p2p::test {
namespace {

using namespace collectives;  // NOLINT: the fixture's names, in this file's tests only

TEST(Collectives, ReduceScatterEveryAlgorithmDtypeOpAndSize) {
  const auto& w = world();
  Fixture f;
  struct Variant {
    ReduceScatterAlgo algo;
    int steps_per_rank;  // ring steps = this * W
  };
  for (auto v : {Variant{ReduceScatterAlgo::kDirect, 1}, Variant{ReduceScatterAlgo::kRing, 1},
                 Variant{ReduceScatterAlgo::kRing, 3}}) {
    f.config.ring_steps = v.steps_per_rank * w.size;
    for (auto dtype : matrix_dtypes()) {
      const int64_t unit = static_cast<int64_t>(c10::elementSize(
          v.algo == ReduceScatterAlgo::kRing ? ops::accumulate_type(dtype) : dtype));
      auto ctx = f.ctx();
      const int64_t round = ops::detail::round_bytes(ctx, unit, w.size) / unit;
      for (auto op : matrix_ops(dtype)) {
        for (int64_t n : sizes_for(round)) {
          const std::string algo_name =
              std::string(ops::to_string(v.algo)) + "/S=" + std::to_string(f.config.ring_steps);
          SCOPED_TRACE(describe("reduce_scatter", algo_name.c_str(), dtype, n, op));
          const auto input =
              reduce_input(n + 31 * static_cast<int>(op), w.rank, n * w.size, dtype, op);
          std::vector<at::Tensor> chunks;
          for (int q = 0; q < w.size; ++q) chunks.push_back(input.narrow(0, q * n, n));
          Guarded out(n, dtype);
          EXPECT_STREQ(ops::reduce_scatter(f.ctx(), chunks, out.inner, op, v.algo).algorithm,
                       ops::to_string(v.algo));
          std::vector<at::Tensor> mine;
          for (int q = 0; q < w.size; ++q) {
            mine.push_back(reduce_input(n + 31 * static_cast<int>(op), q, n * w.size, dtype, op)
                               .narrow(0, w.rank * n, n));
          }
          if (n > 0) {
            EXPECT_TRUE(out.inner.equal(reference_reduce(mine, op)));
          }
          EXPECT_TRUE(out.margins_intact());
        }
      }
    }
  }
}

TEST(Collectives, AllReduceEveryAlgorithmDtypeOpAndSize) {
  const auto& w = world();
  Fixture f;
  for (auto algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
    for (auto dtype : matrix_dtypes()) {
      const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
      auto ctx = f.ctx();
      // One-shot stages a whole round; two-shot about W/(W+1) of the region.
      const int64_t round =
          algo == AllReduceAlgo::kOneShot
              ? ops::detail::round_bytes(ctx, esize) / esize
              : (ops::detail::phase_bytes(ctx) - 128) / esize * w.size / (w.size + 1);
      for (auto op : matrix_ops(dtype)) {
        for (int64_t n : sizes_for(round)) {
          SCOPED_TRACE(describe("all_reduce", ops::to_string(algo), dtype, n, op));
          const int64_t seed = n + 17 * static_cast<int>(op);
          Guarded out(n, dtype);
          const auto in = reduce_input(seed, w.rank, n, dtype, op);
          EXPECT_STREQ(ops::all_reduce(f.ctx(), in, out.inner, op, algo).algorithm,
                       ops::to_string(algo));
          std::vector<at::Tensor> all;
          for (int q = 0; q < w.size; ++q) all.push_back(reduce_input(seed, q, n, dtype, op));
          if (n > 0) {
            EXPECT_TRUE(out.inner.equal(reference_reduce(all, op)));
          }
          EXPECT_TRUE(out.margins_intact());
          // In place.
          auto t = reduce_input(seed, w.rank, n, dtype, op);
          ops::all_reduce(f.ctx(), t, t, op, algo);
          EXPECT_TRUE(t.equal(out.inner));
        }
      }
    }
  }
}

// The rank that holds a hash of `t` in the store under `key`, compared on every rank.
TEST(Collectives, AllReduceGivesIdenticalBitsOnEveryRankAndForBothAlgorithms) {
  const auto& w = world();
  Fixture f;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct}) {
      // Random values: rounding depends on the order of the additions.
      at::manual_seed(100 + w.rank);
      const auto x = (at::randn({2000}) * 3).to(dtype);
      auto one = at::empty_like(x), two = at::empty_like(x);
      ops::all_reduce(f.ctx(), x, one, op, AllReduceAlgo::kOneShot);
      ops::all_reduce(f.ctx(), x, two, op, AllReduceAlgo::kTwoShot);
      EXPECT_TRUE(one.equal(two)) << dtype << " " << ops::to_string(op);
      const std::string key = std::string("bits/") + c10::toString(dtype) + ops::to_string(op);
      EXPECT_TRUE(identical_on_every_rank(one, key)) << dtype << " " << ops::to_string(op);
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const auto& w = world();
  Fixture f;
  auto ctx = f.ctx();
  const int64_t round = ops::detail::round_bytes(ctx, 1) / 2;
  for (int root = 0; root < w.size; ++root) {
    for (auto dtype : {at::kBFloat16, at::kLong}) {
      for (int64_t n : sizes_for(round)) {
        SCOPED_TRACE(describe("broadcast", "direct", dtype, n));
        Guarded t(n, dtype);
        t.inner.copy_(reduce_input(root * 100 + n, w.rank, n, dtype, ReduceOp::kSum));
        ops::broadcast(f.ctx(), t.inner, root);
        EXPECT_TRUE(t.inner.equal(reduce_input(root * 100 + n, root, n, dtype, ReduceOp::kSum)));
        EXPECT_TRUE(t.margins_intact());
      }
    }
  }
}

// ops::reduce (NOTE [Reduce at the root]): every dtype and op, from a rotating root, at the
// round boundaries; the root's tensor holds the reduction (in place), the others' are untouched.
TEST(Collectives, ReduceEveryDtypeOpAndSizeFromEveryRoot) {
  const auto& w = world();
  Fixture f;
  for (auto dtype : matrix_dtypes()) {
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    auto ctx = f.ctx();
    const int64_t round = ops::detail::round_bytes(ctx, esize) / esize;
    int c = 0;
    for (auto op : matrix_ops(dtype)) {
      for (int64_t n : sizes_for(round)) {
        const int root = c++ % w.size;
        SCOPED_TRACE(describe("reduce", "direct", dtype, n, op) + " root=" + std::to_string(root));
        const int64_t seed = n + 13 * static_cast<int>(op);
        Guarded t(n, dtype);
        t.inner.copy_(reduce_input(seed, w.rank, n, dtype, op));
        ops::reduce(f.ctx(), t.inner, root, op);
        if (w.rank == root) {
          std::vector<at::Tensor> all;
          for (int q = 0; q < w.size; ++q) all.push_back(reduce_input(seed, q, n, dtype, op));
          if (n > 0) {
            EXPECT_TRUE(t.inner.equal(reference_reduce(all, op)));
          }
        } else {
          EXPECT_TRUE(t.inner.equal(reduce_input(seed, w.rank, n, dtype, op)));
        }
        EXPECT_TRUE(t.margins_intact());
      }
    }
  }
}

// The root's bits are the one-shot all-reduce's (the same sources, order and kernel), in rounds
// of 1 KiB chunks too.
TEST(Collectives, ReduceGivesTheOneShotAllReduceBits) {
  const auto& w = world();
  for (int64_t chunk : {int64_t{0}, int64_t{1024}}) {
    Fixture f;
    f.config.chunk_bytes = chunk;
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct}) {
        at::manual_seed(200 + w.rank);  // random values: rounding depends on the order
        const auto x = (at::randn({3000}) * 3).to(dtype);
        auto one = at::empty_like(x);
        ops::all_reduce(f.ctx(), x, one, op, AllReduceAlgo::kOneShot);
        for (int root = 0; root < w.size; ++root) {
          auto r = x.clone();
          ops::reduce(f.ctx(), r, root, op);
          EXPECT_TRUE(r.equal(w.rank == root ? one : x))
              << dtype << " " << ops::to_string(op) << " root " << root << " chunk " << chunk;
        }
      }
    }
  }
}

// NOTE [Cross-memory reads]: direct all-gather, direct reduce-scatter and broadcast reading peers'
// tensors give the staged paths' bits, for every dtype and op, sizes of 0, 1, odd and several
// 64 KiB reduce-scatter pieces, inputs that stay untouched and reused at once.
TEST(Collectives, CopyFreeReadsMatchTheStagedPaths) {
  const auto& w = world();
  Fixture read(kBuffer, std::chrono::seconds(60), /*cross_memory_reads=*/true);
  Fixture staged;
  if (!read.ws->cross_memory_reads()) {
    GTEST_SKIP() << "cross-memory reads denied here: " << read.ws->cross_memory_reads_reason();
  }
  read.config.cross_memory_min_bytes = 0;
  const std::vector<int64_t> sizes = {0, 1, 7, 1000, 3 * 16384 + 5};
  for (auto dtype : matrix_dtypes()) {
    for (int64_t n : sizes) {
      SCOPED_TRACE(describe("cross-memory", "direct", dtype, n));
      // All-gather, its input reused (overwritten) right after the call.
      auto input = reduce_input(n, w.rank, n, dtype, ReduceOp::kSum);
      std::vector<at::Tensor> got, want;
      for (int q = 0; q < w.size; ++q) {
        got.push_back(at::full({n}, kGuard, at::TensorOptions().dtype(dtype)));
        want.push_back(at::full({n}, kGuard, at::TensorOptions().dtype(dtype)));
      }
      EXPECT_EQ(ops::all_gather(read.ctx(), input, got, AllGatherAlgo::kDirect).cross_memory,
                n > 0 && w.size > 1);
      input.fill_(-1);
      input.copy_(reduce_input(n, w.rank, n, dtype, ReduceOp::kSum));
      EXPECT_FALSE(ops::all_gather(staged.ctx(), input, want, AllGatherAlgo::kDirect).cross_memory);
      for (int q = 0; q < w.size; ++q) EXPECT_TRUE(got[q].equal(want[q])) << "shard " << q;
      // Reduce-scatter, every op.
      for (auto op : matrix_ops(dtype)) {
        const auto in = reduce_input(n + 3, w.rank, n * w.size, dtype, op);
        const auto copy = in.clone();
        std::vector<at::Tensor> chunks;
        for (int q = 0; q < w.size; ++q) chunks.push_back(in.narrow(0, q * n, n));
        Guarded a(n, dtype), b(n, dtype);
        ops::reduce_scatter(read.ctx(), chunks, a.inner, op, ReduceScatterAlgo::kDirect);
        ops::reduce_scatter(staged.ctx(), chunks, b.inner, op, ReduceScatterAlgo::kDirect);
        EXPECT_TRUE(a.inner.equal(b.inner)) << ops::to_string(op);
        EXPECT_TRUE(a.margins_intact() && in.equal(copy)) << ops::to_string(op);
      }
      // Broadcast from the last rank.
      const int root = w.size - 1;
      Guarded t(n, dtype);
      t.inner.copy_(reduce_input(n + 5, w.rank, n, dtype, ReduceOp::kSum));
      ops::broadcast(read.ctx(), t.inner, root);
      EXPECT_TRUE(t.inner.equal(reduce_input(n + 5, root, n, dtype, ReduceOp::kSum)));
      EXPECT_TRUE(t.margins_intact());
    }
  }
}

TEST(Collectives, SmallChunksPipelineManyRounds) {
  const auto& w = world();
  Fixture f(1 << 16);
  f.config.chunk_bytes = 256;  // 64 floats per round and rank
  const int64_t n = 1000 + w.size;
  std::vector<at::Tensor> all;
  for (int q = 0; q < w.size; ++q) all.push_back(reduce_input(1, q, n, at::kFloat, ReduceOp::kSum));
  for (auto algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
    auto out = at::empty({n});
    ops::all_reduce(f.ctx(), all[w.rank], out, ReduceOp::kSum, algo);
    EXPECT_TRUE(out.equal(reference_reduce(all, ReduceOp::kSum))) << ops::to_string(algo);
  }
  auto gathered = at::empty({n * w.size});
  std::vector<at::Tensor> outs;
  for (int q = 0; q < w.size; ++q) outs.push_back(gathered.narrow(0, q * n, n));
  for (auto algo : {AllGatherAlgo::kDirect, AllGatherAlgo::kRing}) {
    gathered.fill_(-1);
    ops::all_gather(f.ctx(), all[w.rank], outs, algo);
    EXPECT_TRUE(gathered.equal(at::cat(all))) << ops::to_string(algo);
  }
  ops::barrier(f.ctx());
}

}  // namespace
}  // namespace cuda_p2p::test
