// Multi-process GoogleTest harness: every rank of the launcher (mpirun, or anything setting
// RANK/WORLD_SIZE) runs the same binary; ranks rendezvous over a c10d TCPStore hosted by rank 0.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::test {

struct World {
  int rank = 0;
  int size = 1;
  c10::intrusive_ptr<c10d::Store> store;  // the job-wide TCPStore
};

const World& world();

// A store whose keys are private to the running test (prefix = test suite + name + a counter), so
// tests never read each other's keys.
c10::intrusive_ptr<c10d::Store> test_store();

// Every rank waits until all ranks reached this point of the running test.
void store_barrier(const std::string& tag);

// GPUs this process can use (0 without CUDA support or a driver): GPU tests skip on 0.
int gpu_count();

// Whether this run gives the host devices CUDA's semantics (NOTE [Host device with CUDA's
// semantics] in p2p_workspace/host/host_device.hpp): CUDA_P2P_TEST_SEMANTICS=cuda, which ctest
// sets for a second instantiation of the suites that drive the protocols
// (tests/cpp/CMakeLists.txt). A test whose expectations differ there (an op returns before its work
// has run; a disagreement or a failure is raised by a later call) asks this.
bool cuda_semantics();

// A test that uses no group (a kernel's arithmetic, a parser, a policy) runs in its binary's
// one-rank entry on the synchronous host only: every rank of the binary's other entries would
// compute the same again. Its first statement:
//   if (!groupless_test_runs_here()) GTEST_SKIP() << kRunsOnTheOneRankEntry;
// A skip whose message starts with "elsewhere: " runs in another entry of the same binary (another
// world size, host mode or stream kind), so CUDA_P2P_TEST_FAIL_ON_SKIP lets it pass.
bool groupless_test_runs_here();
inline constexpr const char* kRunsOnTheOneRankEntry =
    "elsewhere: a test without a group runs on the one-rank entry";

// A host device for `processes` ranks whose streams run as CUDA_P2P_HOST_STREAMS says (ctest runs
// some binaries once more with "threads"), resolved by the backend's own configuration rules, with
// CUDA's semantics when cuda_semantics().
std::shared_ptr<Device> test_host_device(int processes = 0);
// Gives a device a group made (before its first op) CUDA's semantics when cuda_semantics().
void apply_test_semantics(Device& device);

// Float32 integers in [lo, hi] drawn from `seed`: every rank draws a peer's input alike, and their
// sums are exact in float32 whatever the order.
inline at::Tensor small_ints(at::IntArrayRef sizes, int64_t seed, int lo = -2, int hi = 2) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return at::randint(lo, hi + 1, sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

// A wrapped backend no test op may reach: every op under test runs on the workspace.
class Unreachable : public c10d::Backend {
 public:
  Unreachable(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "unreachable"; }
};

// Expects `fn` to throw a c10::Error whose message contains `needle`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Whether an error names `rank` among the ranks it lists ("rank 2 never arrived", "ranks 1, 2
// never arrived"): on a loaded machine a rank that did come may be late too, and named beside the
// one that never came.
bool names_rank(const std::string& what, int rank);

// Expects `fn` to throw a c10::Error containing `needle` and naming `rank` (names_rank).
template <typename Fn>
void expect_error_naming_rank(Fn&& fn, const std::string& needle, int rank) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "' naming rank " << rank;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_TRUE(names_rank(e.what(), rank)) << "rank " << rank << " not named: " << e.what();
  }
}

}  // namespace cuda_p2p::test
