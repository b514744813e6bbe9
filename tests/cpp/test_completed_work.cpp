// CompletedWork, the Work of a workspace collective: free on the host (the op completed when it
// returned); where the op was only enqueued (a GPU), wait() orders the caller's current stream
// after the op's end event and synchronize() blocks until it has run. The enqueued case is driven
// here with a host device and an event recorded on one of its side streams, the same calls the
// CUDA device receives.
#include <ATen/ATen.h>

#include <atomic>
#include <thread>

#include "backend/CompletedWork.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

TEST(CompletedWork, OnTheHostItIsCompleteAndWaitIsFree) {
  auto out = at::ones({3});
  auto work =
      c10::make_intrusive<CompletedWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{out});
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->wait(std::chrono::milliseconds(0)));
  work->synchronize();
  ASSERT_EQ(work->result().size(), 1u);
  EXPECT_TRUE(work->result()[0].is_same(out));
  EXPECT_TRUE(work->getFuture()->completed());
}

class EnqueuedWork : public ::testing::TestWithParam<HostStreams> {};

TEST_P(EnqueuedWork, WaitOrdersTheCallersStreamAfterTheOpsEnd) {
  for (bool use_synchronize : {false, true}) {
    auto dev = make_host_device(1, GetParam());
    auto side = dev->new_stream(false);
    std::atomic<int> ran{0};
    // The "op": work on a side stream that the caller has not waited for yet.
    dev->host_task(*side, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ran = 1;
    });
    auto end = dev->record(*side);
    auto work = c10::make_intrusive<CompletedWork>(0, c10d::OpType::ALLREDUCE,
                                                   std::vector<at::Tensor>{}, dev, end);
    if (use_synchronize) {
      work->synchronize();
    } else {
      EXPECT_TRUE(work->wait(std::chrono::milliseconds(0)));
    }
    // On the host the caller's stream is the calling thread: ordered after means done.
    EXPECT_EQ(ran.load(), 1) << (use_synchronize ? "synchronize" : "wait");
  }
}

TEST_P(EnqueuedWork, WaitRaisesTheDevicesFailure) {
  auto dev = make_host_device(1, GetParam());
  auto side = dev->new_stream(false);
  auto work = c10::make_intrusive<CompletedWork>(
      0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{}, dev, dev->record(*side));
  dev->abort("a wait missed its deadline (test)");
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "Work.wait");
  expect_error([&] { work->synchronize(); }, "a wait missed its deadline (test)");
}

INSTANTIATE_TEST_SUITE_P(HostStreams, EnqueuedWork,
                         ::testing::Values(HostStreams::kCooperative, HostStreams::kThreads));

}  // namespace
}  // namespace cuda_p2p::test
