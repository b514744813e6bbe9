// test_collectives (tests/cpp/test_collectives.cpp): the round policy (NOTE [Rounds chosen by
// rank 0]), sequences of collectives of every kind, and what ranks that disagree or never call get.

#include "tests/cpp/test_collectives/fixture.hpp"

namespace cuda_p2p::test {
namespace {

using namespace collectives;  // NOLINT: the fixture's names, in this file's tests only

// NOTE [Rounds chosen by rank 0]: the policy alone, on made-up times (16 MiB ops; no group: the
// one-rank entry on the synchronous host runs these two).
TEST(RoundPolicy, TriesLargeRoundsWhenChunkedOnesSlowDownAndComesBack) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  using ops::RoundSize;
  ops::RoundPolicy p;
  const int64_t n = 16 << 20;
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);  // nothing measured: chunked
  p.record(n, RoundSize::kChunked, 1.5e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  p.record(n, RoundSize::kChunked, 2.0e-3);
  // Large rounds once after two ops; they lose in an ordinary placement and are not tried again
  // for 128 ops while chunked ones keep their ordinary spread.
  EXPECT_EQ(p.choose(n), RoundSize::kLarge);
  p.record(n, RoundSize::kLarge, 3.4e-3);
  for (int i = 0; i < 127; ++i) {
    EXPECT_EQ(p.choose(n), RoundSize::kChunked) << i;
    p.record(n, RoundSize::kChunked, i % 2 ? 1.5e-3 : 2.0e-3);
  }
  EXPECT_EQ(p.choose(n), RoundSize::kLarge);
  p.record(n, RoundSize::kLarge, 3.4e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  // One slow op (over 2.5x the best) in an ordinary placement, 32 ops after the last try of
  // large rounds, is noise; two in a row: large rounds once, slower than chunked ones usually
  // are but faster than those ops, then chunked again after one op.
  for (int i = 0; i < 31; ++i) p.record(n, RoundSize::kChunked, 1.5e-3);
  p.record(n, RoundSize::kChunked, 4.0e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  p.record(n, RoundSize::kChunked, 1.5e-3);
  p.record(n, RoundSize::kChunked, 4.0e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  p.record(n, RoundSize::kChunked, 4.0e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kLarge);
  p.record(n, RoundSize::kLarge, 3.4e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  p.record(n, RoundSize::kChunked, 1.5e-3);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
  // A slow placement: large rounds are faster from the second slow chunked op on (one is noise);
  // chunked ones are tried again after 2, 4, ... and then every 32 ops, as long as each try
  // confirms it.
  p.record(n, RoundSize::kChunked, 9.9e-3);
  std::vector<int> gaps;
  int since = 0;
  for (int op = 0; op < 200; ++op) {
    const RoundSize r = p.choose(n);
    ++since;
    if (r == RoundSize::kChunked) {
      gaps.push_back(since);
      since = 0;
    }
    p.record(n, r, r == RoundSize::kChunked ? 9.9e-3 : 2.9e-3);
  }
  ASSERT_GE(gaps.size(), 7u);
  EXPECT_EQ(std::vector<int>(gaps.begin(), gaps.begin() + 7),
            (std::vector<int>{1, 2, 4, 8, 16, 32, 32}));
  // The placement ends: large rounds are back to 3.4 ms, the next chunked try is fast, and
  // chunked rounds stay.
  while (p.choose(n) == RoundSize::kLarge) p.record(n, RoundSize::kLarge, 3.4e-3);
  p.record(n, RoundSize::kChunked, 1.5e-3);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(p.choose(n), RoundSize::kChunked) << i;
    p.record(n, RoundSize::kChunked, 1.6e-3);
  }
  // Large rounds that lost are not tried again for 32 ops, however slow chunked ones are; size
  // classes are apart; an empty op or no time records nothing. (The first try, here after two
  // chunked ops, is the one that loses.)
  const int64_t m = 4 << 20;
  EXPECT_EQ(p.choose(m), RoundSize::kChunked);
  p.record(m, RoundSize::kChunked, 1e-3);
  p.record(m, RoundSize::kChunked, 0);
  p.record(0, RoundSize::kChunked, 1.0);
  p.record(m, RoundSize::kChunked, 3e-3);
  EXPECT_EQ(p.choose(m), RoundSize::kLarge);
  p.record(m, RoundSize::kLarge, 4e-3);
  for (int i = 0; i < 31; ++i) {
    EXPECT_EQ(p.choose(m), RoundSize::kChunked) << i;
    p.record(m, RoundSize::kChunked, 3e-3);
  }
  EXPECT_EQ(p.choose(m), RoundSize::kLarge);
  EXPECT_EQ(p.choose(n), RoundSize::kChunked);
}

// NOTE [Rounds chosen by rank 0]: as the all-reduce uses the policy, one op ahead - rank 0 chooses
// the next op's rounds while an op runs, before that op's time is recorded. A try is never run
// twice in a row, a slow placement still moves the ops to large rounds after one more chunked op,
// and the placement's end brings chunked rounds back.
TEST(RoundPolicy, ChoosesOneOpAheadWithoutRepeatingATry) {
  if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
  using ops::RoundSize;
  ops::RoundPolicy p;
  const int64_t n = 4 << 20;
  EXPECT_EQ(p.agreed(n), RoundSize::kChunked);  // every size class starts chunked
  RoundSize running = p.agreed(n);
  std::vector<RoundSize> ran;
  // time(op, rounds): the ordinary placement for 200 ops, the slow one for 200, then ordinary.
  auto time = [](int op, RoundSize r) {
    const bool slow = op >= 200 && op < 400;
    if (r == RoundSize::kChunked) return slow ? 2.3e-3 : 0.22e-3;
    return slow ? 1.6e-3 : 0.43e-3;
  };
  for (int op = 0; op < 600; ++op) {
    const RoundSize next = p.choose(n, running);  // written into rank 0's word
    p.record(n, running, time(op, running));      // the op ends
    ran.push_back(running);
    p.agree(n, next);  // what every rank read
    running = p.agreed(n);
  }
  for (size_t i = 1; i < ran.size(); ++i) {
    // Large rounds are never tried twice in a row while chunked ones are in use: in the first
    // ordinary placement, and after the next chunked try in the last one.
    const bool ordinary = i < 200 || i >= 433;
    if (ordinary) {
      EXPECT_FALSE(ran[i] == RoundSize::kLarge && ran[i - 1] == RoundSize::kLarge) << i;
    }
  }
  auto large_in = [&](int b, int e) {
    return std::count(ran.begin() + b, ran.begin() + e, RoundSize::kLarge);
  };
  // Ordinary: the first try after two ops, then one in 128 or so.
  EXPECT_EQ(ran[0], RoundSize::kChunked);
  EXPECT_EQ(ran[3], RoundSize::kLarge);
  EXPECT_LE(large_in(0, 200), 3);
  // Slow: large rounds from the fourth op of the placement on (two slow chunked ops, the second
  // recorded while the next one runs), chunked tries after 2, 4, ... 32 ops.
  EXPECT_EQ(ran[202], RoundSize::kChunked);
  EXPECT_EQ(ran[203], RoundSize::kLarge);
  EXPECT_GE(large_in(203, 400), 185);
  // Back to ordinary: the next chunked try finds it, and large rounds stop within 33 ops.
  EXPECT_LE(large_in(433, 600), 3);
  // A size class that is not chosen keeps its own agreed rounds.
  EXPECT_EQ(p.agreed(n * 4), RoundSize::kChunked);
  p.agree(n * 4, RoundSize::kLarge);
  EXPECT_EQ(p.agreed(n * 4), RoundSize::kLarge);
  EXPECT_EQ(p.agreed(n), running);
}

// NOTE [Rounds chosen by rank 0]: every setting, mixed across ranks where allowed, odd sizes and
// several dtypes: the same results as the reference, and every rank runs the rounds rank 0 chose.
TEST(Collectives, AllReduceRoundsChosenByRankZero) {
  const auto& w = world();
  Fixture f(1 << 16);
  f.config.chunk_bytes = 256;  // 64 floats per chunked round; large rounds hold thousands
  using ops::AllReduceRounds;
  struct Case {
    AllReduceRounds rank0, others;
    bool large;  // whether rank 0 chooses large rounds (when it does not choose by time)
  };
  for (const Case c : {Case{AllReduceRounds::kAuto, AllReduceRounds::kAuto, false},
                       Case{AllReduceRounds::kLarge, AllReduceRounds::kLarge, true},
                       Case{AllReduceRounds::kLarge, AllReduceRounds::kAuto, true},
                       Case{AllReduceRounds::kAuto, AllReduceRounds::kLarge, false},
                       Case{AllReduceRounds::kChunked, AllReduceRounds::kChunked, false}}) {
    f.config.all_reduce_rounds = w.rank == 0 ? c.rank0 : c.others;
    f.state.round_policy = ops::RoundPolicy{};
    std::set<int> seen;  // the size classes (floor(log2(bytes))) rank 0 has chosen for
    for (int rep = 0; rep < 2; ++rep) {
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt, at::kByte}) {
        const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
        // One chunked round (never chosen), just over one, and many with a ragged end.
        for (int64_t n : {256 / esize, 256 / esize + 1, int64_t{9001} + w.size}) {
          SCOPED_TRACE(describe("all_reduce rounds", ops::to_string(f.config.all_reduce_rounds),
                                dtype, n, ReduceOp::kSum));
          std::vector<at::Tensor> all;
          for (int q = 0; q < w.size; ++q) {
            all.push_back(reduce_input(n + 3 + rep, q, n, dtype, ReduceOp::kSum));
          }
          Guarded out(n, dtype);
          const ops::Outcome outcome = ops::all_reduce(f.ctx(), all[w.rank], out.inner,
                                                       ReduceOp::kSum, AllReduceAlgo::kTwoShot);
          EXPECT_TRUE(out.inner.equal(reference_reduce(all, ReduceOp::kSum)));
          EXPECT_TRUE(out.margins_intact());
          // Only on a stream that runs inline: never with CUDA's semantics.
          const bool chosen = !cuda_semantics() && w.size > 1 &&
                              c.rank0 != AllReduceRounds::kChunked && n * esize > 256 &&
                              256 / esize / w.size * esize >= 8;
          // Rank 0's choice applies from the second op of a size class on; its auto choice
          // depends on its timings: only known when it forces large rounds, but the same on
          // every rank either way.
          const int size_class = 63 - std::countl_zero(static_cast<uint64_t>(n * esize));
          const bool second = chosen && !seen.insert(size_class).second;
          if (c.rank0 != AllReduceRounds::kAuto) {
            EXPECT_EQ(outcome.large_rounds, second && c.large);
          }
          const auto large = at::full({1}, static_cast<int>(outcome.large_rounds), at::kInt);
          EXPECT_TRUE(identical_on_every_rank(
              large, "rounds/" + std::string(ops::to_string(c.rank0)) + "/" +
                         ops::to_string(c.others) + "/" + c10::toString(dtype) + "/" +
                         std::to_string(n) + "/" + std::to_string(rep)));
        }
      }
    }
  }
  // chunked on one rank, auto on the others: their signatures differ, and every rank raises.
  // (With CUDA's semantics rank 0 chooses nothing, so the settings do not differ in effect.)
  if (w.size > 1 && !cuda_semantics()) {
    f.config.all_reduce_rounds = w.rank == 0 ? AllReduceRounds::kChunked : AllReduceRounds::kAuto;
    auto x = reduce_input(1, w.rank, 4096, at::kFloat, ReduceOp::kSum);
    try {
      auto out = x.clone();
      ops::all_reduce(f.ctx(), x, out, ReduceOp::kSum, AllReduceAlgo::kTwoShot);
      ADD_FAILURE() << "returned on rank " << w.rank;
    } catch (const ops::SignatureMismatch& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("rounds by rank 0"), std::string::npos)
          << e.what_without_backtrace();
    }
    f.config.all_reduce_rounds = AllReduceRounds::kAuto;
    std::vector<at::Tensor> all;
    for (int q = 0; q < w.size; ++q)
      all.push_back(reduce_input(2, q, 4096, at::kFloat, ReduceOp::kSum));
    auto out = at::empty({4096});
    ops::all_reduce(f.ctx(), all[w.rank], out, ReduceOp::kSum, AllReduceAlgo::kTwoShot);
    EXPECT_TRUE(out.equal(reference_reduce(all, ReduceOp::kSum)));
  }
}

TEST(Collectives, ConsecutiveCollectivesOfEveryKindDoNotCorruptEachOther) {
  // Many different collectives back to back with no barrier in between: a rank racing ahead
  // writes the other half of the buffer while its peers still read the previous one.
  const auto& w = world();
  Fixture f;
  const int64_t n = 300;
  for (int it = 0; it < 60; ++it) {
    std::vector<at::Tensor> xs;
    for (int q = 0; q < w.size; ++q)
      xs.push_back(reduce_input(it, q, n * w.size, at::kInt, ReduceOp::kSum));
    auto ar = at::empty({n * w.size}, at::kInt);
    ops::all_reduce(f.ctx(), xs[w.rank], ar, ReduceOp::kSum,
                    it % 2 ? AllReduceAlgo::kOneShot : AllReduceAlgo::kTwoShot);
    auto ag = at::empty({n * w.size * w.size}, at::kInt);
    std::vector<at::Tensor> outs;
    for (int q = 0; q < w.size; ++q) outs.push_back(ag.narrow(0, q * n * w.size, n * w.size));
    ops::all_gather(f.ctx(), xs[w.rank], outs,
                    it % 2 ? AllGatherAlgo::kDirect : AllGatherAlgo::kRing);
    auto rs = at::empty({n}, at::kInt);
    std::vector<at::Tensor> chunks;
    for (int q = 0; q < w.size; ++q) chunks.push_back(xs[w.rank].narrow(0, q * n, n));
    ops::reduce_scatter(f.ctx(), chunks, rs, ReduceOp::kSum,
                        it % 3 ? ReduceScatterAlgo::kDirect : ReduceScatterAlgo::kRing);
    auto bc = xs[w.rank].clone();
    ops::broadcast(f.ctx(), bc, it % w.size);
    auto rd = xs[w.rank].clone();
    ops::reduce(f.ctx(), rd, (it + 1) % w.size, ReduceOp::kSum);
    const auto sum = reference_reduce(xs, ReduceOp::kSum);
    EXPECT_TRUE(rd.equal(w.rank == (it + 1) % w.size ? sum : xs[w.rank])) << "iteration " << it;
    EXPECT_TRUE(ar.equal(sum)) << "iteration " << it;
    EXPECT_TRUE(ag.equal(at::cat(xs))) << "iteration " << it;
    EXPECT_TRUE(rs.equal(sum.narrow(0, w.rank * n, n))) << "iteration " << it;
    EXPECT_TRUE(bc.equal(xs[it % w.size])) << "iteration " << it;
  }
}

TEST(Collectives, ARankThatNeverCallsIsNamedInTheTimeout) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Outlives the workspace: with CUDA's semantics the released stream runs the op to its end
  // on stale data, as late as the workspace's teardown drains it.
  auto x = at::ones({10});
  // Created with the long timeout (creating exchanges records under it), then shortened; only
  // the absent rank may be late by it.
  Fixture f(kBuffer);
  f.ws->set_timeout(Millis(1000));
  store_barrier("before-timeout");
  const int absent = w.size - 1;
  if (w.rank != absent) {
    expect_error_naming_rank(
        [&] { ops::all_reduce(f.ctx(), x, x, ReduceOp::kSum, AllReduceAlgo::kOneShot); },
        "never arrived", absent);
  }
  store_barrier("after-timeout");
}

TEST(Collectives, RingStepsMustBeAMultipleOfTheWorldSize) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  Fixture f;
  f.config.ring_steps = w.size + 1;
  auto x = at::ones({4 * w.size});
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < w.size; ++q) chunks.push_back(x.narrow(0, 4 * q, 4));
  auto out = at::empty({4});
  EXPECT_THROW(ops::reduce_scatter(f.ctx(), chunks, out, ReduceOp::kSum, ReduceScatterAlgo::kRing),
               c10::Error);
}

// NOTE [Op signatures]: rank 0 passes other sizes (and, where it matters, takes another
// algorithm: one that compares at its first phase barrier against one that runs a handshake of
// its own); every rank raises, and a correct collective of every kind right after is right.
TEST(Collectives, RanksThatDisagreeAllRaiseAndStayInStep) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  // The promise of a synchronous comparison: with CUDA's semantics a disagreement is found in
  // stream order and raised by a later call, and the op has run (NOTE [Op signatures]).
  if (cuda_semantics()) GTEST_SKIP() << "elsewhere: the synchronous host comparison's promise";
  Fixture f(/*buffer=*/1 << 14);  // several rounds for the larger sizes
  const bool odd = w.rank == 0;
  auto expect_mismatch = [&](const char* what, const std::function<void()>& call) {
    try {
      call();
      ADD_FAILURE() << what << ": returned on rank " << w.rank;
    } catch (const ops::SignatureMismatch& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("ranks disagree: rank 0 passed"), std::string::npos) << what << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << msg;
    }
    // Every kind still works (and the phases agree: a rank out of step would hang or corrupt).
    const int64_t n = 5000;
    std::vector<at::Tensor> xs;
    for (int q = 0; q < w.size; ++q) {
      xs.push_back(reduce_input(7, q, n * w.size, at::kInt, ReduceOp::kSum));
    }
    auto ar = at::empty({n * w.size}, at::kInt);
    ops::all_reduce(f.ctx(), xs[w.rank], ar, ReduceOp::kSum, AllReduceAlgo::kTwoShot);
    EXPECT_TRUE(ar.equal(reference_reduce(xs, ReduceOp::kSum))) << what;
    auto bc = xs[w.rank].clone();
    ops::broadcast(f.ctx(), bc, w.size - 1);
    EXPECT_TRUE(bc.equal(xs[w.size - 1])) << what;
    auto ag = at::empty({n * w.size * w.size}, at::kInt);
    std::vector<at::Tensor> outs;
    for (int q = 0; q < w.size; ++q) outs.push_back(ag.narrow(0, q * n * w.size, n * w.size));
    ops::all_gather(f.ctx(), xs[w.rank], outs, AllGatherAlgo::kRing);
    EXPECT_TRUE(ag.equal(at::cat(xs))) << what;
    auto rd = xs[w.rank].clone();
    ops::reduce(f.ctx(), rd, 0, ReduceOp::kSum);
    EXPECT_TRUE(rd.equal(w.rank == 0 ? reference_reduce(xs, ReduceOp::kSum) : xs[w.rank])) << what;
  };
  for (auto algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
    expect_mismatch("all_reduce sizes", [&] {
      auto x = at::ones({odd ? 3000 : 9000});
      ops::all_reduce(f.ctx(), x, x, ReduceOp::kSum, algo);
    });
  }
  expect_mismatch("all_reduce zero vs some", [&] {
    auto x = at::ones({odd ? 0 : 10});
    ops::all_reduce(f.ctx(), x, x, ReduceOp::kSum, AllReduceAlgo::kOneShot);
  });
  expect_mismatch("all_gather ring vs direct", [&] {
    const int64_t n = odd ? 100 : 200;
    auto in = at::ones({n});
    auto out = at::empty({n * w.size});
    std::vector<at::Tensor> outs;
    for (int q = 0; q < w.size; ++q) outs.push_back(out.narrow(0, q * n, n));
    ops::all_gather(f.ctx(), in, outs, odd ? AllGatherAlgo::kRing : AllGatherAlgo::kDirect);
  });
  expect_mismatch("reduce_scatter ring vs direct", [&] {
    const int64_t n = 4000;
    auto in = at::ones({n * w.size}, odd ? at::kFloat : at::kInt);
    std::vector<at::Tensor> chunks;
    for (int q = 0; q < w.size; ++q) chunks.push_back(in.narrow(0, q * n, n));
    auto out = at::empty({n}, in.options());
    ops::reduce_scatter(f.ctx(), chunks, out, ReduceOp::kSum,
                        odd ? ReduceScatterAlgo::kRing : ReduceScatterAlgo::kDirect);
  });
  expect_mismatch("broadcast roots", [&] {
    auto x = at::ones({7000});
    ops::broadcast(f.ctx(), x, odd ? 0 : 1);
  });
  expect_mismatch("reduce roots", [&] {
    auto x = at::ones({7000});
    ops::reduce(f.ctx(), x, odd ? 0 : 1, ReduceOp::kSum);
  });
  expect_mismatch("reduce ops", [&] {
    auto x = at::ones({7000});
    ops::reduce(f.ctx(), x, 0, odd ? ReduceOp::kSum : ReduceOp::kMax);
  });
  expect_mismatch("barrier vs all_reduce", [&] {
    if (odd) {
      ops::barrier(f.ctx());
    } else {
      auto x = at::ones({10});
      ops::all_reduce(f.ctx(), x, x, ReduceOp::kSum, AllReduceAlgo::kOneShot);
    }
  });
}

}  // namespace
}  // namespace cuda_p2p::test
