// The workspace collectives (ops/collectives.hpp) on the host device, under mpirun (1, 2, 3 and 4
// ranks), without Python: every algorithm x dtype x reduce op x size (0, 1, odd, exactly one
// round, one round +- an element, several rounds), against reference values each rank computes
// itself from every rank's (deterministic) input. Outputs are slices of larger tensors whose
// margins must stay untouched.
#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <exception>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"
#include "ops/reduction_kernel.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

using ops::AllGatherAlgo;
using ops::AllReduceAlgo;
using ops::ReduceOp;
using ops::ReduceScatterAlgo;

constexpr int64_t kBuffer = 8192;  // a small buffer: rounds start at a few KiB
constexpr int kChannel = 1;
constexpr int64_t kMargin = 16;  // guard elements before and after every output
constexpr double kGuard = 77;

const std::vector<at::ScalarType> kAllDtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                                at::kBFloat16, at::kChar,   at::kByte,
                                                at::kShort,    at::kInt,    at::kLong};

std::vector<ReduceOp> ops_for(at::ScalarType t) {
  if (at::isFloatingType(t)) {
    return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  }
  return {ReduceOp::kSum,  ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
}

// The input of `rank` for a case: small integers, so that every summation order gives the same
// result in every dtype (PRODUCT uses -2..2, so products of up to 4 ranks stay exact in bfloat16).
at::Tensor make_input(int64_t seed, int rank, int64_t n, at::ScalarType dtype, ReduceOp op) {
  auto i = at::arange(n, at::kLong);
  at::Tensor v;
  if (op == ReduceOp::kProduct) {
    v = (i * 7 + rank * 3 + seed) % 5 - 2;
  } else if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    v = (i * 2654435761LL + rank * 40503 + seed * 977) % 251;
  } else {
    v = (i * 7 + rank * 13 + seed) % 17 - 8;
  }
  return v.to(dtype);
}

// op over `xs` as ops::reduce defines it (float accumulation, AVG divided once in the
// accumulate type), computed with plain ATen.
at::Tensor reference_reduce(const std::vector<at::Tensor>& xs, ReduceOp op) {
  const at::ScalarType dtype = xs[0].scalar_type();
  const auto stacked = at::stack(xs);
  switch (op) {
    case ReduceOp::kMin:
      return stacked.amin(0);
    case ReduceOp::kMax:
      return stacked.amax(0);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: {
      at::Tensor r = xs[0].clone();
      for (size_t i = 1; i < xs.size(); ++i) {
        r = op == ReduceOp::kBand  ? at::bitwise_and(r, xs[i])
            : op == ReduceOp::kBor ? at::bitwise_or(r, xs[i])
                                   : at::bitwise_xor(r, xs[i]);
      }
      return r;
    }
    default:
      break;
  }
  const bool floating = at::isFloatingType(dtype);
  const at::ScalarType wide = floating ? at::kDouble : at::kLong;
  at::Tensor r = xs[0].to(wide);
  for (size_t i = 1; i < xs.size(); ++i) {
    r = op == ReduceOp::kProduct ? r * xs[i].to(wide) : r + xs[i].to(wide);
  }
  if (op == ReduceOp::kAvg) {
    const at::ScalarType acc = ops::accumulate_type(dtype);
    return (r.to(acc) / static_cast<double>(xs.size())).to(dtype);
  }
  return r.to(dtype);  // integers wrap like the collectives
}

// A tensor of n elements in the middle of a larger one filled with kGuard.
struct Guarded {
  at::Tensor whole;
  at::Tensor inner;
  Guarded(int64_t n, at::ScalarType dtype) {
    whole = at::full({n + 2 * kMargin}, kGuard, at::TensorOptions().dtype(dtype));
    inner = whole.narrow(0, kMargin, n);
  }
  // Whether the margins still hold kGuard.
  bool margins_intact() const {
    const auto g = at::full({kMargin}, kGuard, at::TensorOptions().dtype(whole.scalar_type()));
    return whole.narrow(0, 0, kMargin).equal(g) &&
           whole.narrow(0, whole.numel() - kMargin, kMargin).equal(g);
  }
};

// The context of one op call. With CUDA's semantics (cuda_semantics()) an op returns with its work
// queued: the call's context synchronizes the stream at the end of the statement that made it,
// before the outputs are read (and while that statement's named inputs are alive: a call passes
// no temporary the op reads). A statement that throws has nothing queued to wait for.
struct Call {
  ops::CollectiveContext ctx;
  ~Call() noexcept(false) {
    if (std::uncaught_exceptions() == 0) ctx.ws.device().synchronize(ctx.stream);
  }
  operator const ops::CollectiveContext&() const { return ctx; }  // NOLINT: implicit by design
};

struct Fixture {
  std::unique_ptr<SymmetricWorkspace> ws;
  std::shared_ptr<Stream> stream;
  ops::CollectiveState state;
  ops::CollectiveConfig config;

  // cross_memory_reads: off by default, so that the staged paths keep their coverage here.
  explicit Fixture(int64_t buffer = kBuffer, Millis timeout = std::chrono::seconds(60),
                   bool cross_memory_reads = false) {
    WorkspaceOptions o;
    o.buffer_size = buffer;
    o.timeout = timeout;
    o.cross_memory_reads = cross_memory_reads;
    ws = std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              test_host_device(world().size), o);
    stream = ws->device().current_stream();
    config.chunk_bytes = 0;  // rounds of a whole half-buffer unless a test says otherwise
  }
  Call ctx() { return Call{{*ws, *stream, kChannel, state, config}}; }
};

std::string describe(const char* what, const char* algo, at::ScalarType dtype, int64_t n,
                     std::optional<ReduceOp> op = {}) {
  std::ostringstream os;
  os << what << " algo=" << algo << " dtype=" << dtype << " n=" << n;
  if (op) os << " op=" << ops::to_string(*op);
  os << " W=" << world().size << " rank=" << world().rank;
  return os.str();
}

// Element counts that hit the round boundaries of a collective staging `unit_bytes` per element
// in regions of `round` bytes: 0, 1, odd, exactly one round, one round +- 1, several rounds.
std::vector<int64_t> sizes_for(int64_t round_elems) {
  std::vector<int64_t> s = {0, 1, 7, round_elems, round_elems + 1, 3 * round_elems + 5};
  if (round_elems > 1) s.push_back(round_elems - 1);
  return s;
}

// ---------------------------------------------------------------------------------------------
// The reduction kernel (single process)

TEST(Reduction, HostKernelMatchesAtenForEveryDtypeOpAndSourceCount) {
  for (auto dtype : kAllDtypes) {
    for (auto op : ops_for(dtype)) {
      for (int n_src : {1, 2, 3, 4, 7, 8}) {
        for (int64_t n : {0, 1, 15, 1023, 1025, 5000}) {
          std::vector<at::Tensor> srcs;
          for (int s = 0; s < n_src; ++s) srcs.push_back(make_input(11, s, n, dtype, op));
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
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    std::vector<at::Tensor> srcs;
    for (int s = 0; s < 4; ++s) srcs.push_back(make_input(3, s, 3000, dtype, ReduceOp::kSum));
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
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
    std::vector<at::Tensor> srcs;
    for (int s = 0; s < 3; ++s) srcs.push_back(make_input(7, s, 3001, dtype, ReduceOp::kSum));
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
// Configuration (single process)

TEST(Config, NamesParseAndTheEnvironmentForces) {
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
        const auto input = make_input(5, w.rank, n, dtype, ReduceOp::kSum);
        Guarded out(n * w.size, dtype);
        std::vector<at::Tensor> outs;
        for (int q = 0; q < w.size; ++q) outs.push_back(out.inner.narrow(0, q * n, n));
        EXPECT_STREQ(ops::all_gather(f.ctx(), input, outs, algo).algorithm, ops::to_string(algo));
        std::vector<at::Tensor> want;
        for (int q = 0; q < w.size; ++q) want.push_back(make_input(5, q, n, dtype, ReduceOp::kSum));
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
    mine.copy_(make_input(9, w.rank, n, at::kFloat, ReduceOp::kSum));
    std::vector<at::Tensor> outs;
    for (int q = 0; q < w.size; ++q) outs.push_back(out.narrow(0, q * n, n));
    ops::all_gather(f.ctx(), mine, outs, algo);
    for (int q = 0; q < w.size; ++q) {
      EXPECT_TRUE(outs[q].equal(make_input(9, q, n, at::kFloat, ReduceOp::kSum)))
          << ops::to_string(algo) << " rank " << q;
    }
    // Separate output tensors, in no particular memory order.
    std::vector<at::Tensor> separate;
    for (int q = 0; q < w.size; ++q) separate.push_back(at::full({n}, -1.0f));
    const auto in = make_input(10, w.rank, n, at::kFloat, ReduceOp::kSum);
    ops::all_gather(f.ctx(), in, separate, algo);
    for (int q = 0; q < w.size; ++q) {
      EXPECT_TRUE(separate[q].equal(make_input(10, q, n, at::kFloat, ReduceOp::kSum)));
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
      want.push_back(make_input(20 + l, q, counts[q], at::kFloat, ReduceOp::kSum));
      at_row += counts[q];
    }
    const auto in = make_input(20 + l, w.rank, counts[w.rank], at::kFloat, ReduceOp::kSum);
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
          parts.push_back(make_input(40 + root, q, n, at::kInt, ReduceOp::kSum));
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
            ins.push_back(make_input(50 + root, q, n, at::kInt, ReduceOp::kSum));
          }
        }
        ops::scatter(f.ctx(), ins, mine.inner, root);
        EXPECT_TRUE(mine.inner.equal(make_input(50 + root, w.rank, n, at::kInt, ReduceOp::kSum)))
            << "scatter " << what;
        EXPECT_TRUE(mine.margins_intact()) << "scatter " << what;
      }
    }
  }
}

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
    for (auto dtype : kAllDtypes) {
      const int64_t unit = static_cast<int64_t>(c10::elementSize(
          v.algo == ReduceScatterAlgo::kRing ? ops::accumulate_type(dtype) : dtype));
      auto ctx = f.ctx();
      const int64_t round = ops::detail::round_bytes(ctx, unit, w.size) / unit;
      for (auto op : ops_for(dtype)) {
        for (int64_t n : sizes_for(round)) {
          const std::string algo_name =
              std::string(ops::to_string(v.algo)) + "/S=" + std::to_string(f.config.ring_steps);
          SCOPED_TRACE(describe("reduce_scatter", algo_name.c_str(), dtype, n, op));
          const auto input =
              make_input(n + 31 * static_cast<int>(op), w.rank, n * w.size, dtype, op);
          std::vector<at::Tensor> chunks;
          for (int q = 0; q < w.size; ++q) chunks.push_back(input.narrow(0, q * n, n));
          Guarded out(n, dtype);
          EXPECT_STREQ(ops::reduce_scatter(f.ctx(), chunks, out.inner, op, v.algo).algorithm,
                       ops::to_string(v.algo));
          std::vector<at::Tensor> mine;
          for (int q = 0; q < w.size; ++q) {
            mine.push_back(make_input(n + 31 * static_cast<int>(op), q, n * w.size, dtype, op)
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
    for (auto dtype : kAllDtypes) {
      const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
      auto ctx = f.ctx();
      // One-shot stages a whole round; two-shot about W/(W+1) of the region.
      const int64_t round =
          algo == AllReduceAlgo::kOneShot
              ? ops::detail::round_bytes(ctx, esize) / esize
              : (ops::detail::phase_bytes(ctx) - 128) / esize * w.size / (w.size + 1);
      for (auto op : ops_for(dtype)) {
        for (int64_t n : sizes_for(round)) {
          SCOPED_TRACE(describe("all_reduce", ops::to_string(algo), dtype, n, op));
          const int64_t seed = n + 17 * static_cast<int>(op);
          Guarded out(n, dtype);
          const auto in = make_input(seed, w.rank, n, dtype, op);
          EXPECT_STREQ(ops::all_reduce(f.ctx(), in, out.inner, op, algo).algorithm,
                       ops::to_string(algo));
          std::vector<at::Tensor> all;
          for (int q = 0; q < w.size; ++q) all.push_back(make_input(seed, q, n, dtype, op));
          if (n > 0) {
            EXPECT_TRUE(out.inner.equal(reference_reduce(all, op)));
          }
          EXPECT_TRUE(out.margins_intact());
          // In place.
          auto t = make_input(seed, w.rank, n, dtype, op);
          ops::all_reduce(f.ctx(), t, t, op, algo);
          EXPECT_TRUE(t.equal(out.inner));
        }
      }
    }
  }
}

// The rank that holds a hash of `t` in the store under `key`, compared on every rank.
bool identical_on_every_rank(const at::Tensor& t, const std::string& key) {
  const auto bytes = t.contiguous().view(at::kByte);
  std::vector<uint8_t> mine(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
  auto store = world().store;
  store->set(key + "/" + std::to_string(world().rank), mine);
  bool same = true;
  for (int r = 0; r < world().size; ++r) {
    same = same && store->get(key + "/" + std::to_string(r)) == mine;
  }
  store_barrier(key);
  return same;
}

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
        t.inner.copy_(make_input(root * 100 + n, w.rank, n, dtype, ReduceOp::kSum));
        ops::broadcast(f.ctx(), t.inner, root);
        EXPECT_TRUE(t.inner.equal(make_input(root * 100 + n, root, n, dtype, ReduceOp::kSum)));
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
  for (auto dtype : kAllDtypes) {
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    auto ctx = f.ctx();
    const int64_t round = ops::detail::round_bytes(ctx, esize) / esize;
    int c = 0;
    for (auto op : ops_for(dtype)) {
      for (int64_t n : sizes_for(round)) {
        const int root = c++ % w.size;
        SCOPED_TRACE(describe("reduce", "direct", dtype, n, op) + " root=" + std::to_string(root));
        const int64_t seed = n + 13 * static_cast<int>(op);
        Guarded t(n, dtype);
        t.inner.copy_(make_input(seed, w.rank, n, dtype, op));
        ops::reduce(f.ctx(), t.inner, root, op);
        if (w.rank == root) {
          std::vector<at::Tensor> all;
          for (int q = 0; q < w.size; ++q) all.push_back(make_input(seed, q, n, dtype, op));
          if (n > 0) {
            EXPECT_TRUE(t.inner.equal(reference_reduce(all, op)));
          }
        } else {
          EXPECT_TRUE(t.inner.equal(make_input(seed, w.rank, n, dtype, op)));
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
  for (auto dtype : kAllDtypes) {
    for (int64_t n : sizes) {
      SCOPED_TRACE(describe("cross-memory", "direct", dtype, n));
      // All-gather, its input reused (overwritten) right after the call.
      auto input = make_input(n, w.rank, n, dtype, ReduceOp::kSum);
      std::vector<at::Tensor> got, want;
      for (int q = 0; q < w.size; ++q) {
        got.push_back(at::full({n}, kGuard, at::TensorOptions().dtype(dtype)));
        want.push_back(at::full({n}, kGuard, at::TensorOptions().dtype(dtype)));
      }
      EXPECT_EQ(ops::all_gather(read.ctx(), input, got, AllGatherAlgo::kDirect).cross_memory,
                n > 0 && w.size > 1);
      input.fill_(-1);
      input.copy_(make_input(n, w.rank, n, dtype, ReduceOp::kSum));
      EXPECT_FALSE(ops::all_gather(staged.ctx(), input, want, AllGatherAlgo::kDirect).cross_memory);
      for (int q = 0; q < w.size; ++q) EXPECT_TRUE(got[q].equal(want[q])) << "shard " << q;
      // Reduce-scatter, every op.
      for (auto op : ops_for(dtype)) {
        const auto in = make_input(n + 3, w.rank, n * w.size, dtype, op);
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
      t.inner.copy_(make_input(n + 5, w.rank, n, dtype, ReduceOp::kSum));
      ops::broadcast(read.ctx(), t.inner, root);
      EXPECT_TRUE(t.inner.equal(make_input(n + 5, root, n, dtype, ReduceOp::kSum)));
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
  for (int q = 0; q < w.size; ++q) all.push_back(make_input(1, q, n, at::kFloat, ReduceOp::kSum));
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

// NOTE [Rounds chosen by rank 0]: the policy alone, on made-up times (16 MiB ops).
TEST(RoundPolicy, TriesLargeRoundsWhenChunkedOnesSlowDownAndComesBack) {
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
            all.push_back(make_input(n + 3 + rep, q, n, dtype, ReduceOp::kSum));
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
    auto x = make_input(1, w.rank, 4096, at::kFloat, ReduceOp::kSum);
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
      all.push_back(make_input(2, q, 4096, at::kFloat, ReduceOp::kSum));
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
      xs.push_back(make_input(it, q, n * w.size, at::kInt, ReduceOp::kSum));
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
  if (cuda_semantics()) GTEST_SKIP() << "the synchronous host comparison's promise";
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
      xs.push_back(make_input(7, q, n * w.size, at::kInt, ReduceOp::kSum));
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
