// The watchdog that enforces wait deadlines on devices whose waits run where the host cannot see
// them (CUDA streams), driven here with scripted waits: it is device-independent code, and on
// the host this is where it runs (NOTE [Device failure] in p2p_workspace/watchdog.hpp).
#include <atomic>
#include <mutex>
#include <thread>

#include "p2p_workspace/watchdog.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

using namespace std::chrono_literals;

// A wait whose progress the test scripts. It polls one word of its own (unless it is given
// another) for `value`.
struct Script {
  alignas(4) uint32_t own_word = 0;
  uint32_t* word = &own_word;
  uint32_t value = 1;
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::vector<int> given_up;  // set before `finished`
  std::vector<int> missing{1, 3};
  std::atomic<int> missing_calls{0};
  // NOTE [Releasing blocked waits]: how often, and in which order among all scripts, release()
  // ran (a release lets the stream pass: it finishes).
  std::atomic<int> releases{0};
  int release_order = -1;
};

// The order in which scripts were released.
std::atomic<int> release_clock{0};

class ScriptedWait : public WatchedWait {
 public:
  explicit ScriptedWait(std::shared_ptr<Script> s, const void* stream = nullptr)
      : s_(std::move(s)), stream_(stream) {}
  bool started() override { return s_->started.load(); }
  bool finished() override { return s_->finished.load(); }
  std::vector<int> given_up() override { return s_->given_up; }
  std::vector<int> missing() override {
    ++s_->missing_calls;
    return s_->missing;
  }
  std::vector<SignalWait> awaited() const override { return {{s_->word, s_->value, 1}}; }
  // The stream passes once its word has reached the value.
  void release(uint32_t* word, uint32_t value) override {
    EXPECT_EQ(word, s_->word);
    std::atomic_ref<uint32_t>(*word).store(value);
    s_->release_order = release_clock++;
    ++s_->releases;
    s_->started = true;
    if (signal_reached(value, s_->value)) s_->finished = true;
  }
  const void* stream() const override { return stream_; }

 private:
  std::shared_ptr<Script> s_;
  const void* stream_;
};

// Stream identities for the scripts.
const char kStreamA = 'a', kStreamB = 'b';

// What the watchdog reports (it may report from its own thread).
struct Reports {
  std::mutex mu;
  std::vector<std::string> messages;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(m);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mu);
    return messages;
  }
};

// Polls `cond` for up to `limit`.
template <typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return cond();
}

TEST(Watchdog, WaitsThatFinishInTimeRetireWithoutError) {
  FailureState failure;
  Watchdog dog(failure, nullptr, 20ms);
  std::vector<std::shared_ptr<Script>> scripts;
  for (int i = 0; i < 5; ++i) {
    scripts.push_back(std::make_shared<Script>());
    // Each on a stream of its own: they finish in any order.
    dog.track(std::make_unique<ScriptedWait>(scripts.back(), &scripts.back()), 200ms,
              "op " + std::to_string(i));
  }
  EXPECT_EQ(dog.pending(), 5u);
  // Out of order, as waits on different streams do.
  for (int i : {3, 0, 4, 1, 2}) {
    scripts[i]->started = true;
    scripts[i]->finished = true;
  }
  EXPECT_TRUE(eventually([&] { return dog.pending() == 0; }));
  EXPECT_FALSE(failure.failed());
  EXPECT_NO_THROW(failure.check("next op"));
}

TEST(Watchdog, AMissedDeadlineFailsTheDeviceNamingTheOpAndTheMissingRanks) {
  FailureState failure;
  Reports reports;
  Watchdog dog(failure, nullptr, 20ms, reports.sink());
  auto s = std::make_shared<Script>();
  s->started = true;
  const auto start = std::chrono::steady_clock::now();
  dog.track(std::make_unique<ScriptedWait>(s), 100ms, "barrier on channel 2 (rank 0)");
  // How soon after the deadline depends on the machine (a scan every 20 ms, when the watchdog's
  // thread gets a CPU): only "never before" is the protocol's.
  ASSERT_TRUE(eventually([&] { return failure.failed(); }, 30s));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 100ms);  // never before the deadline
  const std::string why = failure.reason();
  EXPECT_NE(why.find("barrier on channel 2 (rank 0) timed out after 100 ms"), std::string::npos)
      << why;
  EXPECT_NE(why.find("ranks 1, 3 never arrived"), std::string::npos) << why;
  // Sticky: later ops raise it, naming themselves.
  expect_error([&] { failure.check("all_reduce"); }, "cuda_p2p all_reduce:");
  expect_error([&] { failure.check("all_reduce"); }, "ranks 1, 3 never arrived");
  // The group's pending work is released and dropped, and nothing more is tracked. The watchdog's
  // thread records the failure first and releases the waits after (NOTE [Releasing blocked
  // waits]): this thread may see the failure before the release.
  EXPECT_TRUE(eventually([&] { return dog.pending() == 0 && s->releases.load() >= 1; }, 30s));
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(s->releases.load(), 1);
  auto later = std::make_shared<Script>();
  dog.track(std::make_unique<ScriptedWait>(later), 1ms, "later");
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(later->releases.load(), 1);  // enqueued after the failure: released at once
  // Said once, when it happened, for a process that hangs outside cuda_p2p behind the stream.
  EXPECT_TRUE(eventually([&] { return !reports.get().empty(); }, 30s));
  const auto said = reports.get();
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("device failed: " + why), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("The waits were released"), std::string::npos) << said[0];
}

TEST(Watchdog, AMissedDeadlineReleasesEveryPendingWaitOldestFirstPerStream) {
  // NOTE [Releasing blocked waits]: the stuck wait, the waits queued behind it on its stream,
  // and the waits of the device's other streams all let their streams pass.
  FailureState failure;
  Watchdog dog(failure, nullptr, 10ms, [](const std::string&) {});
  std::vector<std::shared_ptr<Script>> a, b;
  for (int i = 0; i < 3; ++i) {
    a.push_back(std::make_shared<Script>());
    dog.track(std::make_unique<ScriptedWait>(a.back(), &kStreamA), 80ms, "a" + std::to_string(i));
    b.push_back(std::make_shared<Script>());
    dog.track(std::make_unique<ScriptedWait>(b.back(), &kStreamB), 60s, "b" + std::to_string(i));
  }
  a[0]->started = true;  // stream A is stuck at its first wait; B has not reached its waits
  ASSERT_TRUE(eventually([&] { return failure.failed(); }));
  EXPECT_NE(failure.reason().find("a0 timed out after 80 ms"), std::string::npos)
      << failure.reason();
  EXPECT_NE(failure.reason().find("released"), std::string::npos) << failure.reason();
  // Recorded (and published) first, released next: wait for the releases.
  EXPECT_TRUE(eventually([&] { return dog.pending() == 0; }));
  for (const auto& v : {a, b}) {
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(v[i]->releases.load(), 1) << i;
      if (i > 0) {
        EXPECT_LT(v[i - 1]->release_order, v[i]->release_order) << i;
      }
    }
  }
  EXPECT_EQ(dog.pending(), 0u);
}

TEST(Watchdog, AWaitTrackedWhileTheScanReadsTheBlockedWordsIsReleasedToo) {
  // Issue 48, finding 1a: the scan that finds a missed deadline reads the blocked words
  // (missing(): on CUDA a copy that may take up to a second), and the host, running ahead of its
  // streams, tracks more waits meanwhile. Those must be released with the rest.
  FailureState failure;
  Watchdog dog(failure, nullptr, 5ms, [](const std::string&) {});
  struct SlowRead : ScriptedWait {
    using ScriptedWait::ScriptedWait;
    std::vector<int> missing() override {
      auto peers = ScriptedWait::missing();
      std::this_thread::sleep_for(300ms);
      return peers;
    }
  };
  auto stuck = std::make_shared<Script>();
  stuck->started = true;
  dog.track(std::make_unique<SlowRead>(stuck, &kStreamA), 30ms, "stuck");
  ASSERT_TRUE(eventually([&] { return stuck->missing_calls.load() > 0; }));
  auto late = std::make_shared<Script>();
  dog.track(std::make_unique<ScriptedWait>(late, &kStreamB), 60s, "tracked during the scan");
  ASSERT_TRUE(eventually([&] { return failure.failed(); }));
  // The failure is recorded (and published) before anything is released: wait for the release.
  EXPECT_TRUE(eventually([&] { return stuck->releases.load() == 1; }, 2000ms));
  EXPECT_TRUE(eventually([&] { return late->releases.load() == 1; }, 2000ms))
      << "a wait tracked while the scan read the words was never released";
}

TEST(Watchdog, EveryWordIsReleasedAtTheHighestValueAnyPendingWaitAwaits) {
  // NOTE [Releasing blocked waits]: one group's ops on two caller streams, all polling one word:
  // B waits for 1, A for 2, B for 3. Released stream by stream, the word would end at 2.
  FailureState failure;
  Watchdog dog(failure, nullptr, 10ms, [](const std::string&) {});
  alignas(4) uint32_t word = 0;
  std::vector<std::shared_ptr<Script>> scripts;
  const std::vector<std::pair<const void*, uint32_t>> order = {
      {&kStreamB, 1}, {&kStreamA, 2}, {&kStreamB, 3}};
  for (const auto& [stream, value] : order) {
    scripts.push_back(std::make_shared<Script>());
    scripts.back()->word = &word;
    scripts.back()->value = value;
    dog.track(std::make_unique<ScriptedWait>(scripts.back(), stream), 60s, "op");
  }
  dog.fail("aborted by the test");
  EXPECT_EQ(word, 3u);
  for (const auto& s : scripts) EXPECT_TRUE(s->finished.load());
  // A wait tracked later for an older value leaves the word where it is.
  auto late = std::make_shared<Script>();
  late->word = &word;
  late->value = 2;
  dog.track(std::make_unique<ScriptedWait>(late, &kStreamA), 60s, "late");
  EXPECT_EQ(word, 3u);
  EXPECT_TRUE(late->finished.load());
  EXPECT_EQ(dog.pending(), 0u);
}

TEST(Watchdog, OnlyTheOldestWaitOfAStreamCanBeLate) {
  // Two waits on one stream: the second cannot be reached before the first passes, whatever a
  // query of it says (on a GPU its "before" event may complete early only if the stream moved).
  FailureState failure;
  Watchdog dog(failure, nullptr, 5ms, [](const std::string&) {});
  auto first = std::make_shared<Script>(), second = std::make_shared<Script>();
  second->started = true;
  dog.track(std::make_unique<ScriptedWait>(first, &kStreamA), 60s, "first");
  dog.track(std::make_unique<ScriptedWait>(second, &kStreamA), 30ms, "second");
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(failure.failed()) << failure.reason();
  first->started = true;
  first->finished = true;
  // Now the second is the head: started long ago as far as its script says, but its deadline
  // counts from the poll that first sees it started at the head.
  ASSERT_TRUE(eventually([&] { return failure.failed(); }));
  EXPECT_NE(failure.reason().find("second timed out"), std::string::npos) << failure.reason();
}

TEST(Watchdog, TheDeadlineCountsFromWhenTheStreamReachesTheWait) {
  // A wait queued behind long work (a stream still busy with a GEMM) is not late.
  FailureState failure;
  Watchdog dog(failure, nullptr, 10ms);
  auto s = std::make_shared<Script>();
  // Queued longer than its timeout; once started it finishes well within it (a wide margin: a
  // loaded CI machine once overslept a 20 ms sleep past a 50 ms timeout here).
  dog.track(std::make_unique<ScriptedWait>(s), 250ms, "queued");
  std::this_thread::sleep_for(400ms);
  EXPECT_FALSE(failure.failed()) << failure.reason();
  s->started = true;
  std::this_thread::sleep_for(20ms);
  s->finished = true;
  EXPECT_TRUE(eventually([&] { return dog.pending() == 0; }));
  EXPECT_FALSE(failure.failed()) << failure.reason();
}

TEST(Watchdog, AKernelThatGaveUpIsAFailureNotStaleData) {
  FailureState failure;
  Reports reports;
  Watchdog dog(failure, nullptr, 1000ms, reports.sink());
  auto s = std::make_shared<Script>();
  s->given_up = {2};
  s->started = true;
  s->finished = true;  // the fallback kernel returned at its deadline
  dog.track(std::make_unique<ScriptedWait>(s), 100ms, "all_gather (rank 0, phase 3)");
  // synchronize() polls once after the stream is idle: the failure is there before it returns.
  dog.poll_now();
  ASSERT_TRUE(failure.failed());
  EXPECT_NE(failure.reason().find("all_gather (rank 0, phase 3)"), std::string::npos);
  EXPECT_NE(failure.reason().find("rank 2 never arrived"), std::string::npos) << failure.reason();
  EXPECT_NE(failure.reason().find("stale"), std::string::npos) << failure.reason();
  EXPECT_EQ(s->missing_calls.load(), 0);  // the kernel named the peers itself
  const auto said = reports.get();
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("The stream went on with stale data"), std::string::npos) << said[0];
}

TEST(Watchdog, AbortReleasesEveryWaitStopsWatchingAndKeepsTheFirstFailure) {
  FailureState failure;
  Reports reports;
  Watchdog dog(failure, nullptr, 10ms, reports.sink());
  auto s = std::make_shared<Script>();
  s->started = true;
  dog.track(std::make_unique<ScriptedWait>(s), 50s, "never finishes");
  auto queued = std::make_shared<Script>();
  dog.track(std::make_unique<ScriptedWait>(queued), 50s, "queued behind it");
  dog.fail("aborted by the test");
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(s->releases.load(), 1);
  EXPECT_EQ(queued->releases.load(), 1);
  EXPECT_LT(s->release_order, queued->release_order);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(failure.reason(), "aborted by the test");
  EXPECT_FALSE(failure.fail("a later failure"));
  EXPECT_EQ(failure.reason(), "aborted by the test");
  dog.fail("a second abort");
  EXPECT_EQ(failure.reason(), "aborted by the test");
  EXPECT_TRUE(reports.get().empty());  // an abort is the caller's own doing: nothing to report
}

TEST(Watchdog, AFailureAfterTheWorkRanKeepsItsWorksSuccessfulUnlessAWaitWasReleased) {
  // NOTE [Shutdown flushes]: fail(why, work_done) after a drain; a wait the stream had not
  // passed (released now), or one tracked after the failure, makes the Works raise after all.
  for (const int late : {0, 1, 2}) {  // 0: every wait finished; 1: one pending; 2: one after
    FailureState failure;
    Watchdog dog(failure, nullptr, 10ms);
    auto done = std::make_shared<Script>();
    done->started = true;
    done->finished = true;
    dog.track(std::make_unique<ScriptedWait>(done), 50s, "ran");
    auto pending = std::make_shared<Script>();
    if (late == 1) dog.track(std::make_unique<ScriptedWait>(pending), 50s, "still pending");
    dog.fail("the group was shut down (test)", /*work_done=*/true);
    if (late == 2) dog.track(std::make_unique<ScriptedWait>(pending), 50s, "after");
    EXPECT_EQ(pending->releases.load(), late == 0 ? 0 : 1) << late;
    EXPECT_TRUE(failure.failed());
    expect_error([&] { failure.check("all_reduce"); }, "shut down (test)");
    if (late == 0) {
      EXPECT_NO_THROW(failure.check_work("Work.wait")) << late;
    } else {
      expect_error([&] { failure.check_work("Work.wait"); }, "shut down (test)");
    }
  }
  // Without work_done (abort), a Work raises even if every wait finished.
  FailureState failure;
  failure.fail("aborted (test)");
  expect_error([&] { failure.check_work("Work.wait"); }, "aborted (test)");
}

TEST(Watchdog, StopDropsWaitsWithoutReleasingThem) {
  // The destructor's path, once the device's streams drained: nothing is left to release.
  FailureState failure;
  Watchdog dog(failure, nullptr, 10ms);
  auto s = std::make_shared<Script>();
  dog.track(std::make_unique<ScriptedWait>(s), 50s, "pending");
  dog.stop();
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(s->releases.load(), 0);
  EXPECT_FALSE(failure.failed());
}

TEST(Watchdog, TrackingDoesNotWaitForAScanThatQueriesTheDevice) {
  // NOTE on Watchdog's locks: a scan queries the device (slow on a GPU); wait_signals' track()
  // must not queue behind it.
  FailureState failure;
  Watchdog dog(failure, nullptr, 1ms);
  struct SlowWait : ScriptedWait {
    using ScriptedWait::ScriptedWait;
    bool started() override {
      std::this_thread::sleep_for(1s);
      return false;
    }
  };
  dog.track(std::make_unique<SlowWait>(std::make_shared<Script>(), &kStreamA), 60s, "slow");
  std::this_thread::sleep_for(50ms);  // the watchdog thread is inside the slow query now
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    dog.track(std::make_unique<ScriptedWait>(std::make_shared<Script>(), &kStreamB), 60s, "fast");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  EXPECT_EQ(dog.pending(), 11u);
  dog.stop();
}

TEST(Watchdog, DescribesRanks) {
  EXPECT_EQ(describe_ranks({4}), "rank 4");
  EXPECT_EQ(describe_ranks({0, 2}), "ranks 0, 2");
  EXPECT_EQ(describe_ranks({}), "rank ?");
}

TEST(Watchdog, ThreadStartsOnFirstUseAndRunsItsInit) {
  FailureState failure;
  std::atomic<int> inits{0};
  {
    Watchdog dog(failure, [&] { ++inits; }, 10ms);
    EXPECT_EQ(inits.load(), 0);
    auto s = std::make_shared<Script>();
    dog.track(std::make_unique<ScriptedWait>(s), 1s, "w");
    EXPECT_TRUE(eventually([&] { return inits.load() == 1; }));
    s->started = true;
    s->finished = true;
    dog.track(std::make_unique<ScriptedWait>(s), 1s, "w2");
    EXPECT_TRUE(eventually([&] { return dog.pending() == 0; }));
  }
  EXPECT_EQ(inits.load(), 1);
  EXPECT_FALSE(failure.failed());
}

// NOTE [Failure words]: three ranks' words as one process sees them - word[r] is rank r's - with
// this FailureState as rank 1's.
struct Words {
  std::vector<uint32_t> area[3] = {
      std::vector<uint32_t>(FailureState::area_bytes(3) / sizeof(uint32_t)),
      std::vector<uint32_t>(FailureState::area_bytes(3) / sizeof(uint32_t)),
      std::vector<uint32_t>(FailureState::area_bytes(3) / sizeof(uint32_t))};
  uint32_t* word[3] = {area[0].data(), area[1].data(), area[2].data()};
  uint32_t load(int r) const { return std::atomic_ref<uint32_t>(*word[r]).load(); }
  void store(int r, uint32_t v) { std::atomic_ref<uint32_t>(*word[r]).store(v); }
  void give(FailureState& f, int rank = 1) {
    std::vector<uint32_t*> peers;
    for (int r = 0; r < 3; ++r) peers.push_back(r == rank ? nullptr : word[r]);
    f.set_words(rank, word[rank], peers);
  }
};

TEST(Watchdog, AFailureIsPublishedToEveryPeerAndTheFirstOriginStays) {
  FailureState failure;
  Words w;
  w.give(failure);
  w.store(2, 1);  // rank 0's failure reached rank 2 first
  EXPECT_TRUE(failure.fail("rank 1's own failure"));
  EXPECT_EQ(w.load(0), 2u);  // 1 + rank 1
  EXPECT_EQ(w.load(2), 1u);  // rank 0's stays
  EXPECT_EQ(w.load(1), 0u);  // nobody wrote rank 1's own
}

TEST(Watchdog, AForgottenPeerIsToldNothing) {
  FailureState failure;
  Words w;
  w.give(failure);
  failure.forget_peers({2, 7, -1});  // a rank the group never had is ignored
  EXPECT_TRUE(failure.fail("rank 1's own failure"));
  EXPECT_EQ(w.load(0), 2u);
  EXPECT_EQ(w.load(2), 0u) << "a failure was written into a forgotten peer's area";
}

TEST(Watchdog, EveryRankSaysWhyTheFirstOneFailed) {
  Words w;
  FailureState rank[3];
  for (int r = 0; r < 3; ++r) w.give(rank[r], r);
  EXPECT_TRUE(rank[0].fail("barrier timed out after 5 ms: rank 2 never arrived"));
  // Rank 2 learns from rank 1, which learnt from rank 0: the origin and its reason stay.
  std::atomic_ref<uint32_t>(*w.word[2]).store(0);
  expect_error([&] { rank[1].check("op"); },
               "rank 0's device failed first, and its failure reached rank 1 through this rank's "
               "failure word (NOTE [Failure words]): barrier timed out after 5 ms: rank 2 never "
               "arrived; the ops");
  expect_error([&] { rank[2].check("op"); }, "rank 0's device failed first");
  expect_error([&] { rank[2].check("op"); }, "rank 2 never arrived");
}

TEST(Watchdog, ARetireThatDrainedPublishesNothingUnlessAWaitIsReleased) {
  FailureState failure;
  Words w;
  w.give(failure);
  EXPECT_TRUE(failure.fail("shut down", /*work_done=*/true));
  EXPECT_EQ(w.load(0) + w.load(2), 0u) << "a clean shutdown made the peers' results raise";
  failure.publish();  // what a release does first
  EXPECT_EQ(w.load(0), 2u);
}

TEST(Watchdog, APeersFailureWordFailsTheDeviceNamingTheRankThatFailedFirst) {
  FailureState failure;
  Words w;
  w.give(failure);
  EXPECT_NO_THROW(failure.check("op"));
  w.store(1, 1 + 2);  // rank 2 failed
  expect_error([&] { failure.check("op"); }, "rank 2's device failed first");
  EXPECT_TRUE(failure.failed());
  EXPECT_EQ(failure.peer_failure(), 2);
  EXPECT_EQ(w.load(0), 3u) << "the failure is published on, naming its origin";
  expect_error([&] { failure.check_work("Work.wait"); }, "rank 2's device failed first");
}

// The release of a memop wait (which cannot watch the word) comes from the watchdog's scan, and
// the failing rank's words are written before any of its waits is released.
TEST(Watchdog, TheWatchdogFailsOnAPeersWordAndReleasesOnlyAfterPublishing) {
  FailureState failure;
  Words w;
  w.give(failure, /*rank=*/0);
  Reports reports;
  Watchdog dog(failure, nullptr, 20ms, reports.sink());
  auto s = std::make_shared<Script>();
  s->started = true;  // blocked, with an hour to go
  dog.track(std::make_unique<ScriptedWait>(s), 3600s, "all_reduce");
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(failure.failed());
  w.store(0, 1 + 1);  // rank 1 failed
  EXPECT_TRUE(eventually([&] { return s->finished.load(); })) << "the wait was not released";
  expect_error([&] { failure.check("next op"); }, "rank 1's device failed first");
  EXPECT_EQ(w.load(2), 2u);
  ASSERT_EQ(reports.get().size(), 1u);
  EXPECT_NE(reports.get()[0].find("rank 1's device failed first"), std::string::npos);
}

// What a PublishCheck saw, shared with the test: the watchdog destroys the wait once it finished.
struct PublishSeen {
  std::atomic<bool> released{false}, published_first{false};
};

struct PublishCheck : public WatchedWait {
  PublishCheck(Words* words, std::shared_ptr<PublishSeen> seen) : w(words), seen(std::move(seen)) {}
  Words* w;
  std::shared_ptr<PublishSeen> seen;
  alignas(4) uint32_t word = 0;
  bool started() override { return true; }
  bool finished() override { return seen->released.load(); }
  std::vector<int> given_up() override { return {}; }
  std::vector<int> missing() override { return {2}; }
  std::vector<SignalWait> awaited() const override {
    return {{const_cast<uint32_t*>(&word), 1, 2}};
  }
  void release(uint32_t*, uint32_t) override {
    seen->published_first = w->load(0) != 0 && w->load(2) != 0;
    seen->released = true;
  }
  const void* stream() const override { return this; }
};

TEST(Watchdog, NothingIsReleasedBeforeThePeersAreTold) {
  for (const bool timeout : {true, false}) {
    FailureState failure;
    Words w;
    w.give(failure);
    Watchdog dog(failure, nullptr, 10ms, [](const std::string&) {});
    auto seen = std::make_shared<PublishSeen>();
    dog.track(std::make_unique<PublishCheck>(&w, seen), timeout ? 30ms : 3600s, "barrier");
    if (!timeout) dog.fail("aborted by the test");
    ASSERT_TRUE(eventually([&] { return seen->released.load(); })) << timeout;
    EXPECT_TRUE(seen->published_first.load()) << (timeout ? "missed deadline" : "abort");
    dog.stop();
  }
}

// NOTE [Counted waits end with the failure]: a replay's give-up is in memory the watchdog polls
// once armed, with no eager wait tracked.
TEST(Watchdog, AnArmedWatchdogReportsTheProbesFailureWithNoWaitTracked) {
  FailureState failure;
  Words w;
  w.give(failure);
  Reports reports;
  std::atomic<bool> gave_up{false};
  Watchdog dog(failure, nullptr, 20ms, reports.sink());
  dog.add_probe([&]() -> std::string {
    return gave_up ? "a wait of a replayed graph timed out: rank 2 never arrived" : "";
  });
  dog.arm();
  std::this_thread::sleep_for(60ms);
  EXPECT_FALSE(failure.failed());
  gave_up = true;
  EXPECT_TRUE(eventually([&] { return failure.failed(); }, 2000ms));
  expect_error([&] { failure.check("op"); }, "rank 2 never arrived");
  EXPECT_EQ(w.load(0), 2u) << "the give-up was not published to the peers";
  EXPECT_TRUE(eventually([&] { return reports.get().size() == 1; }));
}

// NOTE [A disagreement fails the device at once] in ops/op_signature.cpp: a probe added after the
// watchdog started is asked from its next scan on; its finding fails the device, is published and
// releases the blocked wait - unless a peer's failure word is set by then, which comes first (a
// stale record is one that a released peer's stream wrote into, after that peer published).
struct ProbedDog {
  FailureState failure;
  Words w;
  Reports reports;
  std::shared_ptr<Script> s = std::make_shared<Script>();
  std::atomic<bool> recorded{false};
  std::atomic<int> asked{0};
  // Scans only when asked (check_memory_now): the test decides what one scan meets.
  Watchdog dog{failure, nullptr, 3600s, reports.sink()};
  ProbedDog() {
    w.give(failure, /*rank=*/0);
    s->started = true;  // blocked, with an hour to go
    dog.track(std::make_unique<ScriptedWait>(s), 3600s, "broadcast");
    dog.add_probe([this]() -> std::string {
      ++asked;
      return recorded ? "an op's ranks disagreed (rank 1 passed 8 x float32 root 0)" : "";
    });
    dog.check_memory_now();
  }
};

TEST(Watchdog, AProbeAddedLaterFailsTheDeviceWithItsFinding) {
  ProbedDog p;
  EXPECT_GE(p.asked.load(), 1) << "a probe added after the first track() was not asked";
  EXPECT_FALSE(p.failure.failed());
  p.recorded = true;
  p.dog.check_memory_now();
  ASSERT_TRUE(p.failure.failed());
  expect_error([&] { p.failure.check("broadcast"); }, "rank 1 passed 8 x float32 root 0");
  EXPECT_EQ(p.w.load(1), 1u) << "the finding was not published to the peers";
  EXPECT_GT(p.s->releases.load(), 0) << "the blocked wait was not released";
}

TEST(Watchdog, APeersWordSetWhenAProbeFindsComesFirst) {
  ProbedDog p;
  p.w.store(0, 1 + 2);  // rank 2's failure reached this rank
  p.recorded = true;
  p.dog.check_memory_now();
  ASSERT_TRUE(p.failure.failed());
  expect_error([&] { p.failure.check("broadcast"); }, "rank 2's device failed first");
  EXPECT_EQ(p.failure.peer_failure(), 2);
  EXPECT_GT(p.s->releases.load(), 0) << "the blocked wait was not released";
}

}  // namespace
}  // namespace cuda_p2p::test
