// The kernels' matrix (tests/cpp/kernel_matrix.hpp: issue 55, item 2) on a GPU: the captured
// collectives' data steps (launch_graph_collective_step: the shared body compiled by nvcc, every
// rank's step s on one stream before any rank's step s + 1, W simulated ranks in one process on
// one GPU) and the eager reduction kernel (launch_reduce), over the same cases and against the
// same reference as test_kernel_matrix.cpp, whose host instantiation CI runs: results that match
// the reference bit for bit on both match each other bit for bit. What it checks that CI cannot:
// the GPU's partitioning of blocks and threads, its 16-byte packed loads and stores, and its
// arithmetic. The flag protocol between the steps is the graph suites' (scripts/gpu_check.sh).
// Skips without a GPU (CI has none); scripts/gpu_check.sh runs it, and under compute-sanitizer's
// memcheck where the toolkit has it. Never run yet: no GPU was lent since it was written.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/cpp/harness.hpp"
#include "tests/cpp/kernel_matrix.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "ops/cuda/graph_collectives.cuh"
#include "ops/cuda/reduce_kernel.cuh"
#endif

namespace cuda_p2p::test {
namespace {

#ifdef CUDA_P2P_WITH_CUDA
using kernel_matrix::collective_matrix;
using kernel_matrix::reduce_matrix;
using kernel_matrix::Runner;
using ops::graph::KernelArgs;

// A CUDA error as a test failure that names the call.
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// The kernels on the current GPU, on the current stream, each case waited for before its results
// are read.
Runner gpu_runner() {
  Runner r;
  r.device = at::Device(at::kCUDA, c10::cuda::current_device());
  r.collective = [](const std::vector<KernelArgs>& args, int steps) {
    const cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
    for (int step = 0; step < steps; ++step) {
      for (const KernelArgs& a : args) {
        check(cuda::launch_graph_collective_step(a, step, s), "launch_graph_collective_step");
      }
    }
    check(cudaStreamSynchronize(s), "the collective's steps");
  };
  r.reduce = [](const ops::kernel::ReduceArgs& a, ops::kernel::ReducePlan* /*plan*/) {
    const cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
    check(cuda::launch_reduce(a, s), "launch_reduce");
    check(cudaStreamSynchronize(s), "the reduction");
  };
  return r;
}

// CUDA_P2P_KERNEL_MATRIX_STRIDE=N: every N-th case only (scripts/gpu_check.sh's memcheck run).
int stride() {
  const char* v = std::getenv("CUDA_P2P_KERNEL_MATRIX_STRIDE");
  return v != nullptr && std::atoi(v) > 1 ? std::atoi(v) : 1;
}

// Stops at the first mismatch: the rest would mostly repeat it.
bool expect_none(const std::string& err, const std::string& what) {
  EXPECT_EQ(err, "") << what;
  return err.empty();
}

TEST(CudaKernelMatrix, CollectiveStepsMatchTheHostsReference) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  at::manual_seed(55);
  EXPECT_GT(collective_matrix(gpu_runner(), expect_none, stride()), 3000 / stride());
}

TEST(CudaKernelMatrix, ReductionKernelMatchesTheHostsReference) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  at::manual_seed(57);
  EXPECT_GT(reduce_matrix(gpu_runner(), expect_none, stride()), 3000 / stride());
}
#else
TEST(CudaKernelMatrix, NeedsABuildWithCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace cuda_p2p::test
