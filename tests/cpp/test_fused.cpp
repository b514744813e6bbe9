// The fused GEMM pipelines on the host device, driven directly over a SymmetricWorkspace (no
// Python, no backend): every rank rebuilds every rank's inputs and checks its result against a
// local, unfused computation.
#include <ATen/ATen.h>

#include <sstream>
#include <thread>

#include "ops/channels.hpp"
#include "ops/fused_ops.hpp"
#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "tests/cpp/cuda_test_device.hpp"
#endif

namespace cuda_p2p::test {
namespace {

using namespace cuda_p2p::ops;  // NOLINT(google-build-using-namespace): the layer under test

constexpr auto kChannels = kPipelineChannels;

// A workspace and the pipeline streams, as a backend would hold them.
struct Pipelines {
  std::unique_ptr<SymmetricWorkspace> ws;
  std::array<std::shared_ptr<Stream>, 2> streams;
  int64_t max_buffer_size = WorkspaceOptions::kDefaultMaxBufferSize;

  explicit Pipelines(int64_t buffer_size = 1 << 20, Millis timeout = std::chrono::seconds(60)) {
    WorkspaceOptions o;
    o.buffer_size = buffer_size;
    o.timeout = timeout;
    ws = std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              test_host_device(), o);
    pipeline::State state;
    streams = pipeline::acquire_streams(ws->device(), state);
  }

  pipeline::Env env() const {
    return pipeline::Env(*ws, ws->device().current_stream(), streams, {kChannels[0], kChannels[1]},
                         max_buffer_size);
  }
};

// Integer-valued inputs: every product and sum below is exact in float32, bfloat16 and float16,
// so fused and unfused results agree to the bit whatever the order of the additions.
at::Tensor input(at::IntArrayRef sizes, at::ScalarType dtype, int64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return at::randint(-2, 3, sizes, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

std::string describe(at::IntArrayRef sizes, int64_t dim, at::ScalarType dtype) {
  std::ostringstream os;
  os << "shape " << sizes << " dim " << dim << " " << dtype << " W=" << world().size;
  return os.str();
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.strides(), want.strides()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), want.to(at::kDouble), 1e-2, 1e-2))
      << what << "\nmax abs diff "
      << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
}

// The unfused all-gather→matmul: gather every rank's shard along gather_dim, then matmul.
std::pair<at::Tensor, at::Tensor> reference_all_gather_matmul(at::IntArrayRef shard_sizes,
                                                              const at::Tensor& B,
                                                              int64_t gather_dim,
                                                              at::ScalarType dtype, int seed) {
  const int W = world().size;
  std::vector<at::Tensor> shards;
  for (int r = 0; r < W; ++r) shards.push_back(input(shard_sizes, dtype, seed + r));
  const int64_t nd = static_cast<int64_t>(shard_sizes.size());
  if (gather_dim == nd - 1) {
    auto A = at::cat(shards, -1);
    return {A, at::matmul(A, B)};
  }
  // all_gather_into_tensor, view(W, *shape).movedim(gather_dim + 1, 1).flatten(0, 1), matmul,
  // movedim(0, gather_dim): the layout PyTorch's unfused path returns.
  auto A = at::stack(shards).movedim(gather_dim + 1, 1).flatten(0, 1);
  return {A.movedim(0, gather_dim), at::matmul(A, B).movedim(0, gather_dim)};
}

// The unfused matmul→reduce-scatter: this rank's slice of sum_r(A_r @ B), contiguous.
at::Tensor reference_matmul_reduce_scatter(at::IntArrayRef a_sizes, const at::Tensor& B,
                                           int64_t scatter_dim, ReduceOp op, at::ScalarType dtype,
                                           int seed) {
  const int W = world().size;
  at::Tensor sum;
  for (int r = 0; r < W; ++r) {
    auto p = at::matmul(input(a_sizes, dtype, seed + r), B).to(at::kDouble);
    sum = r == 0 ? p : sum + p;
  }
  if (op == ReduceOp::kAvg) sum = sum / W;
  return sum.chunk(W, scatter_dim)[world().rank].contiguous().to(dtype);
}

struct AgCase {
  std::vector<int64_t> shard;
  int64_t gather_dim;
};

std::vector<AgCase> ag_cases() {
  return {{{5, 3}, 0},    {{5, 3}, 1},    {{3, 4, 5}, 0},
          {{3, 4, 5}, 1}, {{3, 4, 5}, 2}, {{3, 4, 5}, -1}};
}

TEST(FusedAllGatherMatmul, EveryGatherDimAndDtypeMatchesTheUnfusedReference) {
  Pipelines p;
  ASSERT_TRUE(p.ws->available());
  const int W = world().size;
  int seed = 100;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto& c : ag_cases()) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool return_A = variant < 2;
        const auto algorithm =
            variant % 2 ? AllGatherAlgorithm::kPullAhead : AllGatherAlgorithm::kPipeline;
        seed += 10;
        const int64_t nd = static_cast<int64_t>(c.shard.size());
        const int64_t gd = c.gather_dim < 0 ? c.gather_dim + nd : c.gather_dim;
        const int64_t k = gd == nd - 1 ? c.shard.back() * W : c.shard.back();
        auto B1 = input({k, 7}, dtype, 7), B2 = input({k, 2}, dtype, 8);
        auto env = p.env();
        Outcome outcome;
        auto A_shard = input(c.shard, dtype, seed + world().rank);
        auto got = all_gather_matmul_pipeline(env, A_shard, {B1, B2}, c.gather_dim, return_A,
                                              outcome, algorithm);
        const auto what =
            describe(c.shard, c.gather_dim, dtype) + (variant % 2 ? " pull_ahead" : " pipeline");
        auto [A_ref, out1] = reference_all_gather_matmul(c.shard, B1, gd, dtype, seed);
        auto out2 = reference_all_gather_matmul(c.shard, B2, gd, dtype, seed).second;
        ASSERT_EQ(got.A.has_value(), return_A) << what;
        if (return_A) expect_same(*got.A, A_ref, what + " (A)");
        ASSERT_EQ(got.outputs.size(), 2u);
        expect_same(got.outputs[0], out1, what + " (B1)");
        expect_same(got.outputs[1], out2, what + " (B2)");
        EXPECT_EQ(outcome.rounds, 1) << what;
      }
    }
  }
}

TEST(FusedAllGatherMatmul, ABufferTooSmallGrowsOrIsUsedInRounds) {
  const int W = world().size;
  // Shard rows of 64 floats (256 bytes): 37 rows need 9472 bytes.
  for (int variant = 0; variant < 4; ++variant) {
    const bool may_grow = variant < 2;
    Pipelines p(/*buffer_size=*/4096);
    p.max_buffer_size = may_grow ? 1 << 20 : 4096;
    auto env = p.env();
    Outcome outcome;
    auto A_shard = input({37, 64}, at::kFloat, 50 + world().rank);
    auto B = input({64, 9}, at::kFloat, 3);
    auto got = all_gather_matmul_pipeline(
        env, A_shard, {B}, 0, true, outcome,
        variant % 2 ? AllGatherAlgorithm::kPullAhead : AllGatherAlgorithm::kPipeline);
    auto [A_ref, out_ref] = reference_all_gather_matmul({37, 64}, B, 0, at::kFloat, 50);
    expect_same(*got.A, A_ref, "rounds");
    expect_same(got.outputs[0], out_ref, "rounds");
    if (may_grow) {
      EXPECT_TRUE(outcome.grew);
      EXPECT_EQ(outcome.rounds, 1);
      EXPECT_GE(p.ws->buffer_size(), 37 * 64 * 4);
    } else {
      EXPECT_FALSE(outcome.grew);
      EXPECT_EQ(outcome.rounds, 3);  // 16 rows fit in 4096 bytes
      EXPECT_EQ(p.ws->buffer_size(), 4096);
    }
    (void)W;
  }
}

struct RsCase {
  std::vector<int64_t> a;  // sizes of A with the scattered dim divided by W (times W below)
  int64_t scatter_dim;
  int64_t n;  // B's columns (times W when the last dim is scattered)
};

std::vector<RsCase> rs_cases() {
  return {{{3, 5}, 0, 7},    {{6, 5}, 1, 3},    {{2, 4, 5}, 0, 7},
          {{4, 3, 5}, 1, 6}, {{4, 3, 5}, 2, 3}, {{4, 3, 5}, -1, 2}};
}

std::vector<int64_t> rs_a_sizes(const RsCase& c, int W) {
  auto sizes = c.a;
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const int64_t sd = c.scatter_dim < 0 ? c.scatter_dim + nd : c.scatter_dim;
  if (sd != nd - 1) sizes[sd] *= W;
  return sizes;
}

int64_t rs_n(const RsCase& c, int W) {
  const int64_t nd = static_cast<int64_t>(c.a.size());
  const int64_t sd = c.scatter_dim < 0 ? c.scatter_dim + nd : c.scatter_dim;
  return sd == nd - 1 ? c.n * W : c.n;
}

TEST(FusedMatmulReduceScatter, EveryScatterDimDtypeOpAndAlgorithmMatchesTheUnfusedReference) {
  Pipelines p;
  ASSERT_TRUE(p.ws->available());
  const int W = world().size;
  int seed = 1000;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto& c : rs_cases()) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        // 0: the pipeline; else the ring in that many steps.
        for (int64_t steps : {int64_t{0}, int64_t{W}, int64_t{3 * W}}) {
          seed += 10;
          const auto a_sizes = rs_a_sizes(c, W);
          auto B = input({c.a.back(), rs_n(c, W)}, dtype, 9);
          auto A = input(a_sizes, dtype, seed + world().rank);
          auto env = p.env();
          Outcome outcome;
          auto got = steps == 0
                         ? matmul_reduce_scatter_pipeline(env, A, B, op, c.scatter_dim, outcome)
                         : matmul_reduce_scatter_ring(env, A, B, op, c.scatter_dim, steps, outcome);
          const int64_t nd = static_cast<int64_t>(a_sizes.size());
          const int64_t sd = c.scatter_dim < 0 ? c.scatter_dim + nd : c.scatter_dim;
          auto want = reference_matmul_reduce_scatter(a_sizes, B, sd, op, dtype, seed);
          expect_same(got, want,
                      describe(a_sizes, c.scatter_dim, dtype) +
                          (op == ReduceOp::kAvg ? " avg" : " sum") + " steps " +
                          std::to_string(steps));
        }
      }
    }
  }
}

TEST(FusedMatmulReduceScatter, ABufferTooSmallGrowsOrIsUsedInRounds) {
  const int W = world().size;
  for (bool ring : {false, true}) {
    for (bool may_grow : {true, false}) {
      Pipelines p(/*buffer_size=*/4096);
      p.max_buffer_size = may_grow ? 1 << 20 : 4096;
      auto env = p.env();
      Outcome outcome;
      // Parts of 21 rows x 32 floats: 2 x 2688 bytes for the double buffer or the ring's slots.
      auto A = input({21 * W, 16}, at::kFloat, 60 + world().rank);
      auto B = input({16, 32}, at::kFloat, 4);
      auto got = ring ? matmul_reduce_scatter_ring(env, A, B, ReduceOp::kSum, 0, W, outcome)
                      : matmul_reduce_scatter_pipeline(env, A, B, ReduceOp::kSum, 0, outcome);
      auto want =
          reference_matmul_reduce_scatter({21 * W, 16}, B, 0, ReduceOp::kSum, at::kFloat, 60);
      expect_same(got, want, ring ? "ring rounds" : "pipeline rounds");
      EXPECT_EQ(outcome.grew, may_grow);
      EXPECT_EQ(outcome.rounds, may_grow ? 1 : 2);
    }
  }
}

TEST(FusedPipelines, BackToBackOpsReuseTheBufferSafely) {
  // Alternating ops rewrite the same buffer regions at once (no opening barrier): a missing or
  // misplaced closing barrier shows up as a wrong value here.
  Pipelines p(1 << 16);
  const int W = world().size;
  for (int i = 0; i < 30; ++i) {
    auto env = p.env();
    Outcome outcome;
    const int seed = 5000 + 10 * i;
    if (i % 3 == 0) {
      auto A_shard = input({9, 8}, at::kFloat, seed + world().rank);
      auto B = input({8, 5}, at::kFloat, 1);
      auto got = all_gather_matmul_pipeline(
          env, A_shard, {B}, 0, true, outcome,
          i % 2 ? AllGatherAlgorithm::kPullAhead : AllGatherAlgorithm::kPipeline);
      auto [A_ref, out_ref] = reference_all_gather_matmul({9, 8}, B, 0, at::kFloat, seed);
      expect_same(*got.A, A_ref, "iteration " + std::to_string(i));
      expect_same(got.outputs[0], out_ref, "iteration " + std::to_string(i));
    } else {
      auto A = input({4 * W, 8}, at::kFloat, seed + world().rank);
      auto B = input({8, 6}, at::kFloat, 2);
      auto got = i % 3 == 1
                     ? matmul_reduce_scatter_pipeline(env, A, B, ReduceOp::kSum, 0, outcome)
                     : matmul_reduce_scatter_ring(env, A, B, ReduceOp::kSum, 0, 2 * W, outcome);
      expect_same(
          got, reference_matmul_reduce_scatter({4 * W, 8}, B, 0, ReduceOp::kSum, at::kFloat, seed),
          "iteration " + std::to_string(i));
    }
  }
}

TEST(FusedPipelines, APipelineWritesItsBufferOnlyAfterEveryReaderOfItIsDone) {
  // Another user of the workspace (like the workspace collectives) returns while a peer still
  // reads this rank's buffer: rank 0 reads everyone's buffer late. A pipeline started at once on
  // the other ranks must not overwrite their buffers before rank 0 has read them.
  Pipelines p(1 << 16);
  const int W = world().size;
  auto& dev = p.ws->device();
  for (int which = 0; which < 4; ++which) {
    const float mark = 1000.0f * static_cast<float>(which + 1);
    p.ws->get_buffer(world().rank, {256}, at::kFloat).fill_(mark + world().rank);
    p.ws->barrier(*dev.current_stream(), 0);
    if (world().rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (int r = 0; r < W; ++r) {
        auto seen = p.ws->get_buffer(r, {256}, at::kFloat);
        EXPECT_TRUE(seen.eq(mark + r).all().item<bool>())
            << "rank " << r << "'s buffer was overwritten before rank 0 read it (op " << which
            << ")";
      }
    }
    auto env = p.env();
    Outcome outcome;
    const int seed = 7000 + 10 * which;
    auto B = input({16, 4}, at::kFloat, 3);
    if (which == 0 || which == 3) {
      auto got = all_gather_matmul_pipeline(
          env, input({16, 16}, at::kFloat, seed + world().rank), {B}, 0, true, outcome,
          which == 0 ? AllGatherAlgorithm::kPipeline : AllGatherAlgorithm::kPullAhead);
      expect_same(got.outputs[0],
                  reference_all_gather_matmul({16, 16}, B, 0, at::kFloat, seed).second, "ag");
    } else {
      auto A = input({16 * W, 16}, at::kFloat, seed + world().rank);
      auto got = which == 1 ? matmul_reduce_scatter_pipeline(env, A, B, ReduceOp::kSum, 0, outcome)
                            : matmul_reduce_scatter_ring(env, A, B, ReduceOp::kSum, 0, W, outcome);
      expect_same(
          got,
          reference_matmul_reduce_scatter({16 * W, 16}, B, 0, ReduceOp::kSum, at::kFloat, seed),
          which == 1 ? "pipeline" : "ring");
    }
  }
}

TEST(FusedPipelines, BadArgumentsSayWhatWasExpected) {
  Pipelines p;
  const int W = world().size;
  auto env = p.env();
  Outcome outcome;
  auto A = input({3, 4}, at::kFloat, 1);
  expect_error(
      [&] { all_gather_matmul_pipeline(env, A, {input({5, 2}, at::kFloat, 1)}, 0, true, outcome); },
      "Bs[0] has 5 rows, but the gathered A has 4 columns");
  expect_error([&] { all_gather_matmul_pipeline(env, A, {}, 0, true, outcome); }, "at least one B");
  expect_error(
      [&] { all_gather_matmul_pipeline(env, A, {input({4, 2}, at::kFloat, 1)}, 2, true, outcome); },
      "gather_dim must be in [-2, 2)");
  expect_error(
      [&] {
        all_gather_matmul_pipeline(env, A.to(at::kInt), {input({4, 2}, at::kInt, 1)}, 0, true,
                                   outcome);
      },
      "floating-point");
  if (W > 1) {
    auto odd = input({W * 3 + 1, 4}, at::kFloat, 1);
    expect_error(
        [&] {
          matmul_reduce_scatter_pipeline(env, odd, input({4, 2}, at::kFloat, 1), ReduceOp::kSum, 0,
                                         outcome);
        },
        "must be divisible by the group size " + std::to_string(W));
    expect_error(
        [&] {
          matmul_reduce_scatter_ring(env, input({W, 4}, at::kFloat, 1),
                                     input({4, 2}, at::kFloat, 1), ReduceOp::kSum, 0, W + 1,
                                     outcome);
        },
        "ring_steps must be a positive multiple of the group size");
  }
  expect_error([&] { parse_reduce_op("max", {ReduceOp::kSum, ReduceOp::kAvg}, "op"); },
               "reduce_op must be one of \"sum\", \"avg\", got \"max\"");
  // Nothing above touched the workspace: a real op still runs in step on every rank.
  auto got =
      matmul_reduce_scatter_pipeline(env, input({W, 4}, at::kFloat, 2 + world().rank),
                                     input({4, 2}, at::kFloat, 1), ReduceOp::kSum, 0, outcome);
  expect_same(got,
              reference_matmul_reduce_scatter({W, 4}, input({4, 2}, at::kFloat, 1), 0,
                                              ReduceOp::kSum, at::kFloat, 2),
              "after errors");
}

TEST(FusedPipelines, ARankThatNeverJoinsIsNamedAndTheStreamsRecover) {
  const int W = world().size;
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  store_barrier("before");  // the rendezvous below runs under the short timeout too
  Pipelines p(1 << 16, Millis(2000));
  const int absent = W - 1;
  auto A = input({2 * W, 4}, at::kFloat, 1);
  auto B = input({4, 3}, at::kFloat, 2);
  if (world().rank != absent) {
    auto env = p.env();
    Outcome outcome;
    const auto start = std::chrono::steady_clock::now();
    expect_error([&] { matmul_reduce_scatter_pipeline(env, A, B, ReduceOp::kSum, 0, outcome); },
                 "never arrived");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    if (cuda_semantics()) {
      // A missed deadline fails the device for good (NOTE [Device failure]); its released
      // streams drain.
      expect_error([&] { p.ws->device().synchronize(*p.streams[1]); }, "never arrived");
      EXPECT_TRUE(p.ws->device().drain(Millis(5000)));
    } else {
      // The streams report an error once and run again.
      at::Tensor x;
      p.ws->device().launch(*p.streams[1], [&] { x = at::ones({2}); });
      p.ws->device().synchronize(*p.streams[1]);
      EXPECT_TRUE(x.defined());
    }
  }
  store_barrier("after-timeout");
}

#ifdef CUDA_P2P_WITH_CUDA
// The same pipelines on a GPU: CUDA streams, copy-engine pulls, stream-memory signals, the sleep
// kernel, concurrent GEMMs. Skips without a GPU (CI has none): run it on a GPU machine, where
// ranks share the GPUs round-robin (two processes on one device use CUDA IPC too).
TEST(CudaFusedPipelines, BothPipelinesAndTheRingMatchTheReferenceOnTheGpu) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  const int W = world().size;
  const int dev = world().rank % gpu_count();
  c10::cuda::CUDAGuard guard(dev);
  WorkspaceOptions o;
  o.buffer_size = 1 << 20;
  o.timeout = std::chrono::seconds(60);
  SymmetricWorkspace ws(test_store(), world().rank, W, cuda_device_with_op_kernels(dev), o);
  ASSERT_TRUE(ws.available()) << ws.unavailable_reason();
  pipeline::State state;
  const auto cuda = at::TensorOptions().device(at::kCUDA, dev);
  int seed = 9000;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& c : ag_cases()) {
      seed += 10;
      pipeline::Env env(ws, ws.device().current_stream(),
                        pipeline::acquire_streams(ws.device(), state), {kChannels[0], kChannels[1]},
                        WorkspaceOptions::kDefaultMaxBufferSize);
      Outcome outcome;
      const int64_t nd = static_cast<int64_t>(c.shard.size());
      const int64_t gd = c.gather_dim < 0 ? c.gather_dim + nd : c.gather_dim;
      const int64_t k = gd == nd - 1 ? c.shard.back() * W : c.shard.back();
      auto B = input({k, 7}, dtype, 7);
      auto got =
          all_gather_matmul_pipeline(env, input(c.shard, dtype, seed + world().rank).to(cuda),
                                     {B.to(cuda)}, c.gather_dim, true, outcome);
      auto [A_ref, out_ref] = reference_all_gather_matmul(c.shard, B, gd, dtype, seed);
      const auto what = describe(c.shard, c.gather_dim, dtype) + " on cuda";
      EXPECT_EQ(got.A->strides(), A_ref.strides()) << what;
      EXPECT_EQ(got.outputs[0].strides(), out_ref.strides()) << what;
      expect_same(got.A->cpu().contiguous(), A_ref.contiguous(), what + " (A)");
      expect_same(got.outputs[0].cpu().contiguous(), out_ref.contiguous(), what + " (out)");
    }
    for (const auto& c : rs_cases()) {
      for (int64_t steps : {int64_t{0}, int64_t{2 * W}}) {
        seed += 10;
        pipeline::Env env(ws, ws.device().current_stream(),
                          pipeline::acquire_streams(ws.device(), state),
                          {kChannels[0], kChannels[1]}, WorkspaceOptions::kDefaultMaxBufferSize);
        Outcome outcome;
        const auto a_sizes = rs_a_sizes(c, W);
        auto B = input({c.a.back(), rs_n(c, W)}, dtype, 9);
        auto A = input(a_sizes, dtype, seed + world().rank).to(cuda);
        auto got = steps == 0 ? matmul_reduce_scatter_pipeline(env, A, B.to(cuda), ReduceOp::kSum,
                                                               c.scatter_dim, outcome)
                              : matmul_reduce_scatter_ring(env, A, B.to(cuda), ReduceOp::kSum,
                                                           c.scatter_dim, steps, outcome);
        const int64_t nd = static_cast<int64_t>(a_sizes.size());
        const int64_t sd = c.scatter_dim < 0 ? c.scatter_dim + nd : c.scatter_dim;
        expect_same(
            got.cpu(), reference_matmul_reduce_scatter(a_sizes, B, sd, ReduceOp::kSum, dtype, seed),
            describe(a_sizes, c.scatter_dim, dtype) + " on cuda, steps " + std::to_string(steps));
      }
    }
  }
}
#endif

}  // namespace
}  // namespace cuda_p2p::test
