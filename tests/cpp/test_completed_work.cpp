// CompletedWork, the Work of a workspace collective: free on the host (the op completed when it
// returned); where the op was only enqueued (a GPU), wait() orders the caller's current stream
// after the op's end event and synchronize() blocks until it has run. The enqueued case is driven
// here with a host device and an event recorded on one of its side streams, the same calls the
// CUDA device receives; is_completed() of such work with a device whose events complete when the
// test says so.
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
  auto work = c10::make_intrusive<CompletedWork>(
      0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{}, dev, dev->record(*side));
  EXPECT_TRUE(dev->retire("the group was shut down (test)", std::chrono::seconds(30)));
  EXPECT_EQ(ran.load(), 1);  // drained before it returned
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->isSuccess());
  EXPECT_TRUE(work->wait(std::chrono::milliseconds(0)));
  work->synchronize();
  expect_error([&] { dev->check_healthy("all_reduce"); }, "the group was shut down (test)");
}

TEST(CompletedWork, AShutdownThatCannotDrainIsAnAbortAndTheWorkRaises) {
  // A stream that does not finish within the limit: its op never ran to its end.
  auto dev = make_host_device(1, HostStreams::kThreads);
  auto side = dev->new_stream(false);
  std::atomic<bool> go{false};
  dev->host_task(*side, [&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  auto work = c10::make_intrusive<CompletedWork>(
      0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{}, dev, dev->record(*side));
  EXPECT_FALSE(dev->retire("the group was shut down (test)", std::chrono::milliseconds(50)));
  EXPECT_FALSE(work->isSuccess());
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "the group was shut down");
  go = true;
  EXPECT_TRUE(dev->drain(std::chrono::seconds(30)));
}

// A host device whose events complete when the test says so: is_completed() of enqueued work
// must ask the device (without blocking) instead of answering true.
class ManualEventsDevice : public Device {
 public:
  explicit ManualEventsDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> done{false};
  std::atomic<int> queries{0};

  bool query(const Event& /*e*/) override {
    ++queries;
    return done.load();
  }
  std::string name() const override { return inner_->name(); }
  at::Device tensor_device() const override { return inner_->tensor_device(); }
  int device_index() const override { return inner_->device_index(); }
  std::shared_ptr<Block> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& b, int n) override {
    return inner_->export_block(b, n);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& h, size_t bytes,
                                      Millis timeout) override {
    return inner_->import_block(h, bytes, timeout);
  }
  std::shared_ptr<Stream> current_stream() override { return inner_->current_stream(); }
  std::shared_ptr<Stream> new_stream(bool high) override { return inner_->new_stream(high); }
  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    inner_->copy(s, dst, src, n);
  }
  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    inner_->write_signal(s, addr, value);
  }
  void wait_signals(Stream& s, std::vector<SignalWait> w, Millis t, std::string c) override {
    inner_->wait_signals(s, std::move(w), t, std::move(c));
  }
  uint64_t capture_id(Stream& s) override { return inner_->capture_id(s); }
  void advance_counter(Stream& s, uint32_t* c, uint32_t d) override {
    inner_->advance_counter(s, c, d);
  }
  void write_counted(Stream& s, uint32_t* a, const uint32_t* c, uint32_t o) override {
    inner_->write_counted(s, a, c, o);
  }
  void wait_counted(Stream& s, std::vector<CountedWait> w, Millis t, std::string c) override {
    inner_->wait_counted(s, std::move(w), t, std::move(c));
  }
  void launch(Stream& s, std::function<void()> fn) override { inner_->launch(s, std::move(fn)); }
  void host_task(Stream& s, std::function<void()> fn) override {
    inner_->host_task(s, std::move(fn));
  }
  std::shared_ptr<Event> record(Stream& s) override { return inner_->record(s); }
  void wait_event(Stream& s, const Event& e) override { inner_->wait_event(s, e); }
  void synchronize(Stream& s) override { inner_->synchronize(s); }
  void synchronize(const Event& e) override { inner_->synchronize(e); }
  void quiesce() override { inner_->quiesce(); }
  void abort(const std::string& why) override { inner_->abort(why); }
  bool retire(const std::string& why, Millis limit) override { return inner_->retire(why, limit); }
  void check_healthy(const char* op) override { inner_->check_healthy(op); }
  void check_work(const char* op) override { inner_->check_work(op); }

 private:
  std::shared_ptr<Device> inner_;
};

TEST(CompletedWork, EnqueuedWorkIsCompletedOnlyOnceItsEndEventHasRun) {
  auto dev = std::make_shared<ManualEventsDevice>(make_host_device(1, HostStreams::kThreads));
  auto side = dev->new_stream(false);
  auto work = c10::make_intrusive<CompletedWork>(
      0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{}, dev, dev->record(*side));
  EXPECT_FALSE(work->isCompleted());
  EXPECT_FALSE(work->isCompleted());
  EXPECT_EQ(dev->queries.load(), 2);
  EXPECT_TRUE(work->isSuccess());
  dev->done = true;
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->isSuccess());
}

TEST(CompletedWork, EnqueuedWorkOfAFailedDeviceIsCompletedWithoutSuccess) {
  auto dev = std::make_shared<ManualEventsDevice>(make_host_device(1, HostStreams::kThreads));
  auto side = dev->new_stream(false);
  auto work = c10::make_intrusive<CompletedWork>(
      0, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{}, dev, dev->record(*side));
  EXPECT_FALSE(work->isCompleted());
  dev->abort("a wait missed its deadline (test)");
  // Its end event never runs; the Work is over, and wait() says why.
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
  expect_error([&] { work->wait(std::chrono::milliseconds(0)); }, "a wait missed its deadline");
}

TEST(CompletedWork, TheHostDeviceAnswersQueriesAsTheHost) {
  // Device::query's default: an op on the host has run when it returns.
  auto dev = make_host_device(1, HostStreams::kCooperative);
  auto e = dev->record(*dev->current_stream());
  EXPECT_TRUE(dev->query(*e));
}

INSTANTIATE_TEST_SUITE_P(HostStreams, EnqueuedWork,
                         ::testing::Values(HostStreams::kCooperative, HostStreams::kThreads));

}  // namespace
}  // namespace cuda_p2p::test
