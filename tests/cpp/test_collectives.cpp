// The workspace collectives (ops/collectives.hpp) on the host device, under mpirun (1, 2, 3 and 4
// ranks), without Python: every algorithm x dtype x reduce op x size (0, 1, odd, exactly one
// round, one round +- an element, several rounds), against reference values each rank computes
// itself from every rank's (deterministic) input. Outputs are slices of larger tensors whose
// margins must stay untouched.
//
// This file: the reduction kernel, the configuration, and the collectives that move data without
// reducing it; test_collectives/reductions.cpp the reducing ones, test_collectives/rounds.cpp the
// round policy, sequences of collectives and what ranks that disagree or never call get.

#include "tests/cpp/test_collectives/fixture.hpp"

namespace cuda_p2p::test {
namespace {

using namespace collectives;  // NOLINT: the fixture's names, in this file's tests only

// ---------------------------------------------------------------------------------------------
// The reduction kernel (no group: the one-rank entry on the synchronous host runs them)

TEST(Reduction, HostKernelMatchesAtenForEveryDtypeOpAndSourceCount) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  for (auto dtype : kAllDtypes) {
    for (auto op : ops_for(dtype)) {
      for (int n_src : {1, 2, 3, 4, 7, 8}) {
        for (int64_t n : {0, 1, 15, 1023, 1025, 5000}) {
          std::vector<at::Tensor> srcs;
          for (int s = 0; s < n_src; ++s) srcs.push_back(reduce_input(11, s, n, dtype, op));
          const int64_t divisor = op == ReduceOp::kAvg ? n_src : 0;
          auto got = at::empty({n}, at::TensorOptions().dtype(dtype));
          auto want = at::empty({n}, at::TensorOptions().dtype(dtype));
          at::Tensor scratch;
          ops::reduce(got, srcs, op, divisor, scratch);
          ops::detail::reduce_with_aten(want, srcs, op, divisor, scratch);
          EXPECT_TRUE(got.equal(want))
              << dtype << " " << ops::to_string(op) << " " << n_src << " sources, n=" << n;
          if (n > 0) {
            EXPECT_TRUE(got.equal(reference_reduce(srcs, op)))
                << dtype << " " << ops::to_string(op) << " " << n_src << " sources, n=" << n;
          }
        }
      }
    }
  }
}

TEST(Reduction, AccumulatesHalfTypesInFloatAndRoundsOnce) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  // 1 + 2^-9 * 8 in bfloat16 steps: each bfloat16 addition alone would round 1 + 2^-9 to 1.
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const double tiny = dtype == at::kBFloat16 ? 1.0 / 512 : 1.0 / 4096;
    std::vector<at::Tensor> srcs{at::ones({64}, at::TensorOptions().dtype(dtype))};
    for (int i = 0; i < 8; ++i)
      srcs.push_back(at::full({64}, tiny, at::TensorOptions().dtype(dtype)));
    auto out = at::empty({64}, at::TensorOptions().dtype(dtype));
    at::Tensor scratch;
    ops::reduce(out, srcs, ReduceOp::kSum, 0, scratch);
    EXPECT_EQ(out[0].item<double>(), at::tensor({1.0 + 8 * tiny}).to(dtype).item<double>())
        << dtype;
    // A float partial plus a narrow source, into a float partial and into the narrow type.
    auto partial = at::full({64}, 1.0f);
    auto acc = at::empty({64});
    ops::reduce(acc, {partial, srcs[1]}, ReduceOp::kSum, 0, scratch);
    EXPECT_EQ(acc[0].item<float>(), static_cast<float>(1.0 + tiny));
    ops::reduce(out, {acc, srcs[1]}, ReduceOp::kAvg, 2, scratch);
    EXPECT_EQ(out[0].item<double>(),
              at::tensor({static_cast<float>((1.0 + 2 * tiny) / 2)}).to(dtype).item<double>());
  }
}

TEST(Reduction, DestinationMayBeASource) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    std::vector<at::Tensor> srcs;
    for (int s = 0; s < 4; ++s) srcs.push_back(reduce_input(3, s, 3000, dtype, ReduceOp::kSum));
    const auto want = reference_reduce(srcs, ReduceOp::kSum);
    for (int alias = 0; alias < 4; ++alias) {
      for (bool aten : {false, true}) {
        std::vector<at::Tensor> copy;
        for (auto& s : srcs) copy.push_back(s.clone());
        at::Tensor scratch;
        if (aten) {
          ops::detail::reduce_with_aten(copy[alias], copy, ReduceOp::kSum, 0, scratch);
        } else {
          ops::reduce(copy[alias], copy, ReduceOp::kSum, 0, scratch);
        }
        EXPECT_TRUE(copy[alias].equal(want))
            << dtype << " into source " << alias << (aten ? " (ATen)" : "");
      }
    }
  }
}

TEST(Reduction, WritesASecondDestinationInTheSamePass) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
    std::vector<at::Tensor> srcs;
    for (int s = 0; s < 3; ++s) srcs.push_back(reduce_input(7, s, 3001, dtype, ReduceOp::kSum));
    auto a = at::empty({3001}, at::TensorOptions().dtype(dtype));
    auto b = at::full({3001}, 5, at::TensorOptions().dtype(dtype));
    at::Tensor scratch;
    ops::reduce(a, srcs, ReduceOp::kSum, 0, scratch, b);
    EXPECT_TRUE(a.equal(reference_reduce(srcs, ReduceOp::kSum))) << dtype;
    EXPECT_TRUE(b.equal(a)) << dtype;
    EXPECT_THROW(ops::reduce(a, srcs, ReduceOp::kSum, 0, scratch, at::empty({3}, a.options())),
                 c10::Error);
  }
}

TEST(Reduction, RejectsWhatGlooRejects) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  EXPECT_THROW(ops::check_reduce_op(ReduceOp::kAvg, at::kLong, "all_reduce"), c10::Error);
  EXPECT_THROW(ops::check_reduce_op(ReduceOp::kBand, at::kFloat, "all_reduce"), c10::Error);
  EXPECT_NO_THROW(ops::check_reduce_op(ReduceOp::kAvg, at::kBFloat16, "all_reduce"));
  EXPECT_NO_THROW(ops::check_reduce_op(ReduceOp::kBxor, at::kByte, "all_reduce"));
  EXPECT_FALSE(ops::is_reducible_dtype(at::kBool));
  EXPECT_FALSE(ops::is_reducible_dtype(at::kComplexFloat));
  try {
    ops::check_reduce_op(ReduceOp::kAvg, at::kInt, "all_reduce");
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a floating-point dtype"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Configuration (no group: the one-rank entry on the synchronous host runs them)

TEST(Config, NamesParseAndTheEnvironmentForces) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  EXPECT_EQ(ops::parse_all_gather_algo("ring", "x"), AllGatherAlgo::kRing);
  EXPECT_THROW(ops::parse_all_gather_algo("bidir_full", "x"), c10::Error);  // removed
  EXPECT_STREQ(ops::to_string(AllReduceAlgo::kTwoShot), "two_shot");
  try {
    ops::parse_reduce_scatter_algo("rings", "CUDA_P2P_REDUCE_SCATTER_ALGO");
    ADD_FAILURE() << "accepted 'rings'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be one of auto|direct|ring, got 'rings'"),
              std::string::npos)
        << e.what();
  }
  ops::CollectiveConfig c;
  c.all_gather = AllGatherAlgo::kRing;
  c.ring_steps = 8;
  EXPECT_EQ(ops::select_all_gather(c, 1 << 30, 4), AllGatherAlgo::kRing);
  EXPECT_NO_THROW(ops::validate(c, 4));
  EXPECT_THROW(ops::validate(c, 3), c10::Error);  // 8 steps on 3 ranks
  // (How Options and the environment set these: tests/cpp/test_config.cpp.)
}

TEST(Config, AutomaticChoiceFollowsTheThresholds) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  ops::CollectiveConfig c;
  c.all_reduce_one_shot_max_bytes = 1000;
  EXPECT_EQ(ops::select_all_reduce(c, 1000, 4), AllReduceAlgo::kOneShot);
  EXPECT_EQ(ops::select_all_reduce(c, 1001, 4), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(ops::select_all_reduce(c, 1 << 30, 1), AllReduceAlgo::kOneShot);
  c.all_reduce = AllReduceAlgo::kTwoShot;
  EXPECT_EQ(ops::select_all_reduce(c, 8, 4), AllReduceAlgo::kTwoShot);
  c.all_gather_ring_max_bytes = 1 << 20;
  EXPECT_EQ(ops::select_all_gather(c, 4097, 4), AllGatherAlgo::kRing);
  EXPECT_EQ(ops::select_all_gather(c, 1 << 20, 3), AllGatherAlgo::kRing);
  EXPECT_EQ(ops::select_all_gather(c, (1 << 20) + 1, 4), AllGatherAlgo::kDirect);
  EXPECT_EQ(ops::select_all_gather(c, 16, 2), AllGatherAlgo::kDirect);
  c.reduce_scatter_ring_max_bytes = 1 << 20;
  EXPECT_EQ(ops::select_reduce_scatter(c, 1 << 20, 4), ReduceScatterAlgo::kRing);
  EXPECT_EQ(ops::select_reduce_scatter(c, (1 << 20) + 1, 4), ReduceScatterAlgo::kDirect);
  EXPECT_EQ(ops::select_reduce_scatter(c, 16, 1), ReduceScatterAlgo::kDirect);
}

// ---------------------------------------------------------------------------------------------
// Collectives (every rank)

TEST(Collectives, AllGatherEveryAlgorithmDtypeAndSize) {
  const auto& w = world();
  Fixture f;
  for (auto algo : {AllGatherAlgo::kDirect, AllGatherAlgo::kRing}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kChar, at::kDouble}) {
      const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
      const bool slots = algo != AllGatherAlgo::kDirect;
      auto ctx = f.ctx();
      const int64_t round = ops::detail::round_bytes(ctx, 1, slots ? w.size : 1) / esize;
      for (int64_t n : sizes_for(round)) {
        SCOPED_TRACE(describe("all_gather", ops::to_string(algo), dtype, n));
        const auto input = reduce_input(5, w.rank, n, dtype, ReduceOp::kSum);
        Guarded out(n * w.size, dtype);
        std::vector<at::Tensor> outs;
        for (int q = 0; q < w.size; ++q) outs.push_back(out.inner.narrow(0, q * n, n));
        EXPECT_STREQ(ops::all_gather(f.ctx(), input, outs, algo).algorithm, ops::to_string(algo));
        std::vector<at::Tensor> want;
        for (int q = 0; q < w.size; ++q)
          want.push_back(reduce_input(5, q, n, dtype, ReduceOp::kSum));
        EXPECT_TRUE(out.inner.equal(at::cat(want)));
        EXPECT_TRUE(out.margins_intact());
      }
    }
  }
}

TEST(Collectives, AllGatherInPlaceAndIntoSeparateTensors) {
  const auto& w = world();
  Fixture f;
  const int64_t n = 777;
  for (auto algo : {AllGatherAlgo::kDirect, AllGatherAlgo::kRing}) {
    // In place: this rank's input is its slice of the output.
    auto out = at::zeros({w.size * n});
    auto mine = out.narrow(0, w.rank * n, n);
    mine.copy_(reduce_input(9, w.rank, n, at::kFloat, ReduceOp::kSum));
    std::vector<at::Tensor> outs;
    for (int q = 0; q < w.size; ++q) outs.push_back(out.narrow(0, q * n, n));
    ops::all_gather(f.ctx(), mine, outs, algo);
    for (int q = 0; q < w.size; ++q) {
      EXPECT_TRUE(outs[q].equal(reduce_input(9, q, n, at::kFloat, ReduceOp::kSum)))
          << ops::to_string(algo) << " rank " << q;
    }
    // Separate output tensors, in no particular memory order.
    std::vector<at::Tensor> separate;
    for (int q = 0; q < w.size; ++q) separate.push_back(at::full({n}, -1.0f));
    const auto in = reduce_input(10, w.rank, n, at::kFloat, ReduceOp::kSum);
    ops::all_gather(f.ctx(), in, separate, algo);
    for (int q = 0; q < w.size; ++q) {
      EXPECT_TRUE(separate[q].equal(reduce_input(10, q, n, at::kFloat, ReduceOp::kSum)));
    }
  }
}

TEST(Collectives, AllGatherVWithADifferentSizePerRank) {
  const auto& w = world();
  Fixture f;
  auto ctx = f.ctx();
  const int64_t round = ops::detail::round_bytes(ctx, 1) / 4;
  // Per rank: nothing, a few, exactly one round, several rounds.
  const std::vector<std::function<int64_t(int)>> layouts = {
      [](int) { return int64_t{0}; },
      [](int r) { return int64_t{3 * r + 1}; },
      [&](int r) { return r % 2 ? round : int64_t{0}; },
      [&](int r) { return r == 0 ? 3 * round + 7 : int64_t{r}; },
      [&](int r) { return (r + 1) * round / 2 + r; },
  };
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::vector<int64_t> counts, bytes;
    for (int q = 0; q < w.size; ++q) {
      counts.push_back(layouts[l](q));
      bytes.push_back(counts.back() * 4);
    }
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    Guarded out(total, at::kFloat);
    std::vector<at::Tensor> outs;
    int64_t at_row = 0;
    std::vector<at::Tensor> want;
    for (int q = 0; q < w.size; ++q) {
      outs.push_back(out.inner.narrow(0, at_row, counts[q]));
      want.push_back(reduce_input(20 + l, q, counts[q], at::kFloat, ReduceOp::kSum));
      at_row += counts[q];
    }
    const auto in = reduce_input(20 + l, w.rank, counts[w.rank], at::kFloat, ReduceOp::kSum);
    ops::all_gather_v(f.ctx(), in, bytes, outs);
    EXPECT_TRUE(out.inner.equal(at::cat(want))) << "layout " << l;
    EXPECT_TRUE(out.margins_intact()) << "layout " << l;
  }
}

// ops::all_to_all (NOTE [All-to-all headers]): rows of 3 int32 from every rank to every rank, with
// the receiver's counts known and unknown, split layouts with empty slices, in one round and in
// many (a 16 KiB buffer, then 1 KiB chunks); 1-4 ranks.
TEST(Collectives, AllToAllAnySplitsKnownOrNot) {
  const auto& w = world();
  const int64_t row = 3;
  auto block = [&](int src, int dst, int64_t rows, int seed) {
    return (at::arange(rows * row, at::kInt) * 5 + src * 7 + dst * 3 + seed).view({rows, row});
  };
  const std::vector<std::function<int64_t(int, int)>> layouts = {
      [](int, int) { return int64_t{0}; },
      [](int s, int d) { return int64_t{(s + 2 * d) % 4 + 1}; },
      [](int s, int d) { return (s + d) % 2 ? int64_t{0} : int64_t{s + d + 1}; },
      [](int s, int d) { return int64_t{400 + 300 * ((s + d) % 3)}; },  // many rounds
  };
  for (int64_t chunk : {int64_t{0}, int64_t{1024}}) {
    Fixture f(/*buffer=*/1 << 14);
    f.config.chunk_bytes = chunk;
    for (size_t l = 0; l < layouts.size(); ++l) {
      for (bool known : {true, false}) {
        const int seed = static_cast<int>(l) + (known ? 0 : 10);
        ops::AllToAllArgs args;
        args.text = "rows of 3 x int32";
        args.unit_bytes = row * 4;
        std::vector<at::Tensor> sends, want;
        int64_t total = 0;
        for (int q = 0; q < w.size; ++q) {
          sends.push_back(block(w.rank, q, layouts[l](w.rank, q), seed).contiguous());
          args.send.push_back(static_cast<const char*>(sends.back().const_data_ptr()));
          args.send_counts.push_back(layouts[l](w.rank, q));
          if (known) args.recv_counts.push_back(layouts[l](q, w.rank));
          want.push_back(block(q, w.rank, layouts[l](q, w.rank), seed));
          total += layouts[l](q, w.rank);
        }
        Guarded out(total * row, at::kInt);
        const auto got = ops::all_to_all(f.ctx(), args, [&](const std::vector<int64_t>& rows) {
          std::vector<char*> ptrs;
          int64_t at_row = 0;
          for (int64_t r : rows) {
            ptrs.push_back(static_cast<char*>(out.inner.data_ptr()) + at_row * row * 4);
            at_row += r;
          }
          EXPECT_EQ(at_row, total);
          return ptrs;
        });
        const std::string what = "layout " + std::to_string(l) + " known " + std::to_string(known) +
                                 " chunk " + std::to_string(chunk);
        EXPECT_TRUE(out.inner.view({total, row}).equal(at::cat(want))) << what;
        EXPECT_TRUE(out.margins_intact()) << what;
        for (int q = 0; q < w.size; ++q) EXPECT_EQ(got.recv[q], layouts[l](q, w.rank)) << what;
      }
    }
  }
}

// Split sizes that disagree raise the same error on every rank, naming both ranks, and the next
// all-to-all runs.
TEST(Collectives, AllToAllSplitsThatDisagreeRaiseEverywhere) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  Fixture f(/*buffer=*/1 << 14);
  auto run = [&](bool wrong) {
    const auto in = at::arange(w.size * 2, at::kLong) + 100 * w.rank;
    auto out = at::full({w.size * 2}, -1, at::kLong);
    ops::AllToAllArgs args;
    args.text = "rows of 1 x int64";
    args.unit_bytes = 8;
    for (int q = 0; q < w.size; ++q) {
      args.send.push_back(static_cast<const char*>(in.const_data_ptr()) + q * 16);
      args.send_counts.push_back(2);
      args.recv_counts.push_back(wrong && w.rank == 0 && q == 1 ? 3 : 2);
    }
    ops::all_to_all(f.ctx(), args, [&](const std::vector<int64_t>&) {
      std::vector<char*> ptrs;
      for (int q = 0; q < w.size; ++q) ptrs.push_back(static_cast<char*>(out.data_ptr()) + q * 16);
      return ptrs;
    });
    return out;
  };
  try {
    run(true);
    ADD_FAILURE() << "returned on rank " << w.rank;
  } catch (const ops::SignatureMismatch& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("ranks disagree on the split sizes: rank 1 sends 2 rows (16 bytes) to "
                       "rank 0, but rank 0 expects 3 rows (24 bytes) from rank 1"),
              std::string::npos)
        << msg;
  }
  const auto out = run(false);
  for (int q = 0; q < w.size; ++q) {
    EXPECT_EQ(out[2 * q].item<int64_t>(), 100 * q + 2 * w.rank);
    EXPECT_EQ(out[2 * q + 1].item<int64_t>(), 100 * q + 2 * w.rank + 1);
  }
}

// ops::gather and ops::scatter from every root, sizes from empty to many rounds (a 16 KiB buffer,
// then 1 KiB chunks); 1-4 ranks.
TEST(Collectives, GatherAndScatterFromEveryRoot) {
  const auto& w = world();
  for (int64_t chunk : {int64_t{0}, int64_t{1024}}) {
    Fixture f(/*buffer=*/1 << 14);
    f.config.chunk_bytes = chunk;
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{5000}}) {
      for (int root = 0; root < w.size; ++root) {
        const std::string what = "n " + std::to_string(n) + " root " + std::to_string(root) +
                                 " chunk " + std::to_string(chunk);
        std::vector<at::Tensor> parts, outs;
        for (int q = 0; q < w.size; ++q) {
          parts.push_back(reduce_input(40 + root, q, n, at::kInt, ReduceOp::kSum));
        }
        Guarded all(n * w.size, at::kInt);
        if (w.rank == root) {
          for (int q = 0; q < w.size; ++q) outs.push_back(all.inner.narrow(0, q * n, n));
        }
        ops::gather(f.ctx(), parts[w.rank], outs, root);
        if (w.rank == root) {
          EXPECT_TRUE(all.inner.equal(at::cat(parts))) << "gather " << what;
        }
        EXPECT_TRUE(all.margins_intact()) << "gather " << what;
        Guarded mine(n, at::kInt);
        std::vector<at::Tensor> ins;
        if (w.rank == root) {
          for (int q = 0; q < w.size; ++q) {
            ins.push_back(reduce_input(50 + root, q, n, at::kInt, ReduceOp::kSum));
          }
        }
        ops::scatter(f.ctx(), ins, mine.inner, root);
        EXPECT_TRUE(mine.inner.equal(reduce_input(50 + root, w.rank, n, at::kInt, ReduceOp::kSum)))
            << "scatter " << what;
        EXPECT_TRUE(mine.margins_intact()) << "scatter " << what;
      }
    }
  }
}

}  // namespace
}  // namespace cuda_p2p::test
