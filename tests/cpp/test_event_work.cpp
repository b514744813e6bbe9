// EventWork, the Work of a workspace collective: free on the host (the op completed when it
// returned); where the op was only enqueued (a GPU), wait() orders the caller's current stream
// after the op's end event and synchronize() blocks until it has run. The enqueued case is driven
// here with a host device and an event recorded on one of its side streams, the same calls the
// CUDA device receives; is_completed() of such work with a device whose events complete when the
// test says so.
#include <ATen/ATen.h>

#include <atomic>
#include <thread>

#include "backend/works.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "tests/cpp/forwarding_device.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

TEST(EventWork, OnTheHostItIsCompleteAndWaitIsFree) {
  auto out = at::ones({3});
  auto work =
      c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{out});
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
    auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE,
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
  auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{},
                                             dev, dev->record(*side));
  dev->abort("a wait missed its deadline (test)");
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "Work.wait");
  expect_error([&] { work->synchronize(); }, "a wait missed its deadline (test)");
}

TEST_P(EnqueuedWork, AShutdownFlushesTheQueuedOpsAndTheirWorksSucceed) {
  // NOTE [Shutdown flushes]: retire() drains first; the op queued before ran to its end, so its
  // Work succeeds, while a new op on the device raises the shutdown.
  auto dev = make_host_device(1, GetParam());
  auto side = dev->new_stream(false);
  std::atomic<int> ran{0};
  dev->host_task(*side, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ran = 1;
  });
  auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{},
                                             dev, dev->record(*side));
  EXPECT_TRUE(dev->retire("the group was shut down (test)", std::chrono::seconds(30)));
  EXPECT_EQ(ran.load(), 1);  // drained before it returned
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->isSuccess());
  EXPECT_TRUE(work->wait(std::chrono::milliseconds(0)));
  work->synchronize();
  expect_error([&] { dev->check_healthy("all_reduce"); }, "the group was shut down (test)");
}

TEST(EventWork, AShutdownThatCannotDrainIsAnAbortAndTheWorkRaises) {
  // A stream that does not finish within the limit: its op never ran to its end.
  auto dev = make_host_device(1, HostStreams::kThreads);
  auto side = dev->new_stream(false);
  std::atomic<bool> go{false};
  dev->host_task(*side, [&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{},
                                             dev, dev->record(*side));
  EXPECT_FALSE(dev->retire("the group was shut down (test)", std::chrono::milliseconds(50)));
  EXPECT_FALSE(work->isSuccess());
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "the group was shut down");
  go = true;
  EXPECT_TRUE(dev->drain(std::chrono::seconds(30)));
}

// A host device whose events complete when the test says so: is_completed() of enqueued work
// must ask the device (without blocking) instead of answering true.
class ManualEventsDevice : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  std::atomic<bool> done{false};
  std::atomic<int> queries{0};

  bool query(const Event& /*e*/) override {
    ++queries;
    return done.load();
  }
};

TEST(EventWork, EnqueuedWorkIsCompletedOnlyOnceItsEndEventHasRun) {
  auto dev = std::make_shared<ManualEventsDevice>(make_host_device(1, HostStreams::kThreads));
  auto side = dev->new_stream(false);
  auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{},
                                             dev, dev->record(*side));
  EXPECT_FALSE(work->isCompleted());
  EXPECT_FALSE(work->isCompleted());
  EXPECT_EQ(dev->queries.load(), 2);
  EXPECT_TRUE(work->isSuccess());
  dev->done = true;
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->isSuccess());
}

TEST(EventWork, EnqueuedWorkOfAFailedDeviceIsCompletedWithoutSuccess) {
  auto dev = std::make_shared<ManualEventsDevice>(make_host_device(1, HostStreams::kThreads));
  auto side = dev->new_stream(false);
  auto work = c10::make_intrusive<EventWork>(0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{},
                                             dev, dev->record(*side));
  EXPECT_FALSE(work->isCompleted());
  dev->abort("a wait missed its deadline (test)");
  // Its end event never runs; the Work is over, and wait() says why.
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "a wait missed its deadline");
}

TEST(EventWork, TheHostDeviceAnswersQueriesAsTheHost) {
  // Device::query's default: an op on the host has run when it returns.
  auto dev = make_host_device(1, HostStreams::kCooperative);
  auto e = dev->record(*dev->current_stream());
  EXPECT_TRUE(dev->query(*e));
}

INSTANTIATE_TEST_SUITE_P(HostStreams, EnqueuedWork,
                         ::testing::Values(HostStreams::kCooperative, HostStreams::kThreads));

}  // namespace
}  // namespace cuda_p2p::test
