// The workspace collectives on the CUDA device (copy engine, stream signals, ATen reductions on
// the stream): every algorithm against the host reference values. Skips without a GPU (CI has
// none); run it on a GPU machine, where ranks share the GPUs round-robin.
#include <ATen/ATen.h>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"
#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace cuda_p2p::test {
namespace {

#ifdef CUDA_P2P_WITH_CUDA
using ops::AllGatherAlgo;
using ops::AllReduceAlgo;
using ops::ReduceOp;
using ops::ReduceScatterAlgo;

// Small integers: exact in every dtype and summation order.
at::Tensor input(int64_t seed, int rank, int64_t n, at::ScalarType dtype) {
  return ((at::arange(n, at::kLong) * 7 + rank * 13 + seed) % 17 - 8).to(dtype);
}

struct CudaFixture {
  int dev;
  std::unique_ptr<SymmetricWorkspace> ws;
  std::shared_ptr<Stream> stream;
  ops::CollectiveState state;
  ops::CollectiveConfig config;

  CudaFixture() : dev(world().rank % gpu_count()) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(dev));
    WorkspaceOptions o;
    o.buffer_size = 1 << 16;  // several rounds for the larger sizes
    o.timeout = std::chrono::seconds(60);
    ws = std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              make_cuda_device(dev), o);
    stream = ws->device().current_stream();
    config.chunk_bytes = 0;
  }
  ops::CollectiveContext ctx() { return {*ws, *stream, 1, state, config}; }
  at::TensorOptions on_gpu(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, dev);
  }
};

TEST(CudaCollectives, EveryAlgorithmMatchesTheHostReference) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  const auto& w = world();
  CudaFixture f;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kInt}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{40000}}) {
      std::vector<at::Tensor> all;
      for (int q = 0; q < w.size; ++q) all.push_back(input(n, q, n, dtype));
      auto sum = all[0].to(at::kDouble);
      for (int q = 1; q < w.size; ++q) sum = sum + all[q].to(at::kDouble);
      const auto want_sum = sum.to(dtype);
      const auto mine = all[w.rank].to(f.on_gpu(dtype));
      for (auto algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
        auto out = at::empty({n}, f.on_gpu(dtype));
        ops::all_reduce(f.ctx(), mine, out, ReduceOp::kSum, algo);
        f.ws->device().synchronize(*f.stream);
        EXPECT_TRUE(out.cpu().equal(want_sum)) << ops::to_string(algo) << " " << dtype << " " << n;
      }
      for (auto algo : {AllGatherAlgo::kDirect, AllGatherAlgo::kRing}) {
        auto out = at::empty({n * w.size}, f.on_gpu(dtype));
        std::vector<at::Tensor> outs;
        for (int q = 0; q < w.size; ++q) outs.push_back(out.narrow(0, q * n, n));
        ops::all_gather(f.ctx(), mine, outs, algo);
        f.ws->device().synchronize(*f.stream);
        EXPECT_TRUE(out.cpu().equal(at::cat(all))) << ops::to_string(algo) << " " << dtype;
      }
      for (auto algo : {ReduceScatterAlgo::kDirect, ReduceScatterAlgo::kRing}) {
        const int64_t m = n / w.size;
        std::vector<at::Tensor> per_rank;
        for (int q = 0; q < w.size; ++q) per_rank.push_back(input(n + 5, q, m * w.size, dtype));
        auto total = per_rank[0].to(at::kDouble);
        for (int q = 1; q < w.size; ++q) total = total + per_rank[q].to(at::kDouble);
        const auto in = per_rank[w.rank].to(f.on_gpu(dtype));
        std::vector<at::Tensor> chunks;
        for (int q = 0; q < w.size; ++q) chunks.push_back(in.narrow(0, q * m, m));
        auto out = at::empty({m}, f.on_gpu(dtype));
        ops::reduce_scatter(f.ctx(), chunks, out, ReduceOp::kSum, algo);
        f.ws->device().synchronize(*f.stream);
        EXPECT_TRUE(out.cpu().equal(total.narrow(0, w.rank * m, m).to(dtype)))
            << ops::to_string(algo) << " " << dtype;
      }
      for (int root = 0; root < w.size; ++root) {
        auto t = input(root, w.rank, n, dtype).to(f.on_gpu(dtype));
        ops::broadcast(f.ctx(), t, root);
        f.ws->device().synchronize(*f.stream);
        EXPECT_TRUE(t.cpu().equal(input(root, root, n, dtype))) << "root " << root;
      }
    }
  }
}

TEST(CudaCollectives, AtenReductionOnTheGpuEqualsTheHostKernel) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  c10::cuda::CUDAGuard guard(world().rank % gpu_count());
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<at::Tensor> host, gpu;
      for (int s = 0; s < 4; ++s) {
        at::manual_seed(s);
        host.push_back(at::randn({5000}).to(dtype));
        gpu.push_back(host.back().cuda());
      }
      auto a = at::empty({5000}, at::TensorOptions().dtype(dtype));
      auto b = at::empty({5000}, gpu[0].options());
      at::Tensor s1, s2;
      ops::reduce(a, host, op, 4, s1);
      ops::reduce(b, gpu, op, 4, s2);
      EXPECT_TRUE(a.equal(b.cpu())) << dtype << " " << ops::to_string(op);
    }
  }
}
#else
TEST(CudaCollectives, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace cuda_p2p::test
