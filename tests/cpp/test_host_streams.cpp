// The host device's streams in both modes (NOTE [Cooperative host streams] in
// p2p_workspace/host/host_stream.cpp): order within a stream, joins through events, waits that
// let the other stream run, priorities, errors and timeouts. Each rank runs these on its own
// (signal words in private memory).
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "p2p_workspace/host/host_device.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

class HostStreamsTest : public ::testing::TestWithParam<HostStreams> {
 protected:
  std::shared_ptr<Device> dev = make_host_device(1, GetParam());
  std::mutex mu;
  std::vector<std::string> log;
  std::function<void()> note(std::string what) {
    return [this, what] {
      std::lock_guard<std::mutex> lock(mu);
      log.push_back(what);
    };
  }
};

TEST_P(HostStreamsTest, AStreamRunsInOrderAndEventsJoinStreams) {
  auto a = dev->new_stream(false), b = dev->new_stream(true);
  for (int i = 0; i < 5; ++i) dev->host_task(*a, note("a" + std::to_string(i)));
  dev->wait_event(*b, *dev->record(*a));
  dev->host_task(*b, note("b"));
  dev->synchronize(*b);
  ASSERT_EQ(log.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log[i], "a" + std::to_string(i));
  EXPECT_EQ(log[5], "b");
  // Joining into the caller's stream waits too.
  dev->host_task(*a, note("a5"));
  dev->wait_event(*dev->current_stream(), *dev->record(*a));
  EXPECT_EQ(log.back(), "a5");
}

TEST_P(HostStreamsTest, AStreamWaitingForASignalLetsTheOtherStreamRun) {
  // The low-priority stream waits for a word that only the high-priority stream's second task
  // writes, and that task waits for the low-priority stream's first: neither mode may deadlock.
  alignas(4) uint32_t word = 0;
  auto low = dev->new_stream(false), high = dev->new_stream(true);
  dev->host_task(*low, note("low: before"));
  auto low_started = dev->record(*low);
  dev->wait_signals(*low, {{&word, 1, 7}}, Millis(10000), "test wait");
  dev->host_task(*low, note("low: after the signal"));
  dev->wait_event(*high, *low_started);
  dev->host_task(*high, note("high: signals"));
  dev->write_signal(*high, &word, 1);
  dev->synchronize(*low);
  dev->synchronize(*high);
  EXPECT_EQ(log,
            (std::vector<std::string>{"low: before", "high: signals", "low: after the signal"}));
}

TEST_P(HostStreamsTest, ACallerWaitingForASignalRunsTheStreamThatWritesIt) {
  alignas(4) uint32_t word = 0;
  auto s = dev->new_stream(false);
  dev->host_task(*s, note("stream"));
  dev->write_signal(*s, &word, 3);
  dev->wait_signals(*dev->current_stream(), {{&word, 3, 0}}, Millis(10000), "caller wait");
  EXPECT_EQ(log, std::vector<std::string>{"stream"});
  dev->synchronize(*s);
}

TEST_P(HostStreamsTest, AWaitThatTimesOutNamesThePeersAndTheStreamRecovers) {
  alignas(4) uint32_t words[3] = {0, 0, 5};
  auto s = dev->new_stream(true);
  const auto start = std::chrono::steady_clock::now();
  dev->wait_signals(*s, {{&words[0], 1, 4}, {&words[1], 1, 6}, {&words[2], 5, 9}}, Millis(200),
                    "a test barrier");
  dev->host_task(*s, note("skipped after the error"));
  expect_error([&] { dev->synchronize(*s); }, "a test barrier timed out after 200 ms: ranks 4, 6");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(log.empty());
  dev->host_task(*s, note("after"));  // reported once: the stream is usable again
  dev->synchronize(*s);
  EXPECT_EQ(log, std::vector<std::string>{"after"});
}

TEST_P(HostStreamsTest, AnErrorReachesTheStreamThatJoinsIt) {
  auto a = dev->new_stream(false), b = dev->new_stream(true);
  dev->host_task(*a, [] { TORCH_CHECK(false, "boom in a"); });
  dev->wait_event(*b, *dev->record(*a));
  dev->host_task(*b, note("b must not run"));
  expect_error([&] { dev->synchronize(*b); }, "boom in a");
  expect_error([&] { dev->synchronize(*a); }, "boom in a");
  EXPECT_TRUE(log.empty());
}

TEST_P(HostStreamsTest, LaunchesAndHostTasksRunInOneStreamOrder) {
  // On the host a launch's closure is the device work itself: it runs in stream order, like a
  // host task, and an ATen op launched there sees what the tasks before it wrote.
  auto s = dev->new_stream(false);
  at::Tensor t = at::zeros({4});
  at::Tensor seen;
  dev->host_task(*s, [&] { t.fill_(2); });
  dev->launch(*s, [&] { seen = t * 3; });
  dev->host_task(*s, note("host task after the launch"));
  dev->launch(*s, [&] { TORCH_CHECK(false, "boom in a launch"); });
  dev->host_task(*s, note("skipped after the error"));
  expect_error([&] { dev->synchronize(*s); }, "boom in a launch");
  ASSERT_TRUE(seen.defined());
  EXPECT_TRUE(seen.equal(at::full({4}, 6.0))) << seen;
  EXPECT_EQ(log, std::vector<std::string>{"host task after the launch"});
}

TEST_P(HostStreamsTest, TwoThreadsDriveTheirOwnStreams) {
  std::atomic<int> sum{0};
  auto worker = [&] {
    auto s = dev->new_stream(false);
    for (int i = 0; i < 500; ++i) dev->host_task(*s, [&] { sum.fetch_add(1); });
    dev->synchronize(*s);
  };
  std::thread t1(worker), t2(worker);
  t1.join();
  t2.join();
  EXPECT_EQ(sum.load(), 1000);
}

INSTANTIATE_TEST_SUITE_P(Modes, HostStreamsTest,
                         ::testing::Values(HostStreams::kCooperative, HostStreams::kThreads),
                         [](const auto& info) {
                           return info.param == HostStreams::kCooperative ? "cooperative"
                                                                          : "threads";
                         });

TEST(CooperativeHostStreams, TheHighPriorityStreamGoesFirst) {
  auto dev = make_host_device(1, HostStreams::kCooperative);
  std::vector<std::string> log;
  auto low = dev->new_stream(false), high = dev->new_stream(true);
  dev->host_task(*low, [&] { log.push_back("low"); });
  dev->host_task(*high, [&] { log.push_back("high"); });
  dev->synchronize(*low);
  dev->synchronize(*high);
  EXPECT_EQ(log, (std::vector<std::string>{"high", "low"}));
}

TEST(CooperativeHostStreams, NothingRunsBeforeSomeoneWaits) {
  auto dev = make_host_device(1, HostStreams::kCooperative);
  int ran = 0;
  auto s = dev->new_stream(false);
  dev->host_task(*s, [&] { ++ran; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ran, 0);
  dev->synchronize(*s);
  EXPECT_EQ(ran, 1);
}

TEST(HostStreamsMode, NamesAreParsedAndABadValueIsNamed) {
  EXPECT_EQ(parse_host_streams("auto", "x"), HostStreams::kDefault);
  EXPECT_EQ(parse_host_streams("threads", "x"), HostStreams::kThreads);
  EXPECT_EQ(parse_host_streams("cooperative", "x"), HostStreams::kCooperative);
  expect_error([] { parse_host_streams("fibers", "Options.host_streams"); },
               "Options.host_streams must be 'auto', 'cooperative' or 'threads', got 'fibers'");
  // (Options.host_streams and CUDA_P2P_HOST_STREAMS are resolved in backend/config.cpp: see
  // tests/cpp/test_config.cpp.)
}

}  // namespace
}  // namespace cuda_p2p::test
