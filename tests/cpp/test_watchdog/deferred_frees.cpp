// The CUDA device's queue of block frees (NOTE [Deferred frees] in
// p2p_workspace/deferred_frees.hpp): device-independent, like the watchdog, and run on the host
// only here.
#include "p2p_workspace/deferred_frees.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace cuda_p2p::test {
namespace {

TEST(DeferredFrees, QueuedUntilRunOldestFirst) {
  DeferredFrees frees;
  std::vector<int> freed;
  frees.add([&] { freed.push_back(1); });
  frees.add([&] { freed.push_back(2); });
  EXPECT_TRUE(freed.empty());  // a block's destructor frees nothing itself
  EXPECT_EQ(frees.queued(), 2u);
  EXPECT_EQ(frees.run(), 2u);
  EXPECT_EQ(freed, (std::vector<int>{1, 2}));
  EXPECT_EQ(frees.run(), 0u);  // each free runs once
  EXPECT_EQ(freed.size(), 2u);
}

TEST(DeferredFrees, AFreeThatQueuesAnotherDoesNotDeadlock) {
  DeferredFrees frees;
  int freed = 0;
  frees.add([&] {
    ++freed;
    frees.add([&] { ++freed; });  // a block whose free drops the last reference to another
  });
  EXPECT_EQ(frees.run(), 1u);
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(frees.run(), 1u);
  EXPECT_EQ(freed, 2);
}

TEST(DeferredFrees, CloseFreesTheQueueThenFreesAtOnce) {
  DeferredFrees frees;
  int freed = 0;
  frees.add([&] { ++freed; });
  frees.close(/*keep=*/false);
  EXPECT_EQ(freed, 1);
  frees.add([&] { ++freed; });  // a block that outlives its device
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(frees.queued(), 0u);
}

TEST(DeferredFrees, CloseWithKeepLeaksTheQueue) {
  DeferredFrees frees;
  int freed = 0;
  frees.add([&] { ++freed; });
  frees.close(/*keep=*/true);  // NOTE [Blocks of an undrained device]
  EXPECT_EQ(freed, 0);
  EXPECT_EQ(frees.queued(), 0u);
}

// Blocks dropped by several threads while the owner runs the queue: every free runs exactly once
// (TSan runs this binary too).
TEST(DeferredFrees, EveryFreeOnceUnderConcurrentAddsAndRuns) {
  DeferredFrees frees;
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::atomic<int>> freed(kThreads * kPerThread);
  std::atomic<bool> done{false};
  std::thread owner([&] {
    while (!done.load()) {
      frees.run();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> droppers;
  for (int t = 0; t < kThreads; ++t) {
    droppers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        frees.add([&freed, k = t * kPerThread + i] { freed[k].fetch_add(1); });
      }
    });
  }
  for (auto& d : droppers) d.join();
  done.store(true);
  owner.join();
  frees.close(/*keep=*/false);
  for (size_t k = 0; k < freed.size(); ++k) ASSERT_EQ(freed[k].load(), 1) << "free " << k;
}

}  // namespace
}  // namespace cuda_p2p::test
