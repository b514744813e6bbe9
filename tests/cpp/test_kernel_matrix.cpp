// The kernels' bodies (NOTE [One kernel source] in ops/kernel_body.hpp: the code the CUDA kernels
// run) on their host instantiation, with every thread of the GPU's launch shape run one after
// another. The captured collectives' (ops/graph_collective_body.hpp) for W = 1..8 ranks simulated
// in one process, over the matrix issue 55 asks of it: every dtype the kernels take, every reduce
// op, sizes from one element to past a block's range and to the graph region's edge, odd tails, and
// inputs and outputs off 16-byte alignment (the element-wise path) - each result compared with
// plain ATen computing the same arithmetic in the same order (rank order, in the accumulate type:
// float32 for float16 / bfloat16), bit for bit. The ranks run step by step: every rank's block b
// runs step s only after every rank's block b ran step s - 1, which is what the flag barriers
// between the steps guarantee (NOTE [Graph flags]). The eager reduction kernel's
// (ops/cuda/reduce_kernel.cu) over the same dtypes and ops, 1 to 64 sources, sources and a
// destination in the accumulate type (a ring's partials), a second destination, in place, off
// alignment, and past its largest grid.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/graph_layout.hpp"
#include "ops/kernel_host.hpp"
#include "ops/signature_body.hpp"
#include "ops/sleep_body.hpp"
#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/signal_wait_body.hpp"
#include "p2p_workspace/wait_pacing_body.hpp"
#include "tests/cpp/kernel_matrix.hpp"

namespace cuda_p2p::test {
namespace {

using kernel_matrix::collective_matrix;
using kernel_matrix::kind_name;
using kernel_matrix::kTypes;
using kernel_matrix::reduce_matrix;
using kernel_matrix::run_case;
using kernel_matrix::run_reduce;
using kernel_matrix::Runner;
using kernel_matrix::Type;
using ops::ReduceOp;
using ops::graph::KernelArgs;
using ops::graph::Kind;
using ops::graph::Layout;

// The bodies on their host instantiation, every thread of the GPU's launch shape run one after
// another.
Runner host_runner() {
  Runner r;
  r.collective = [](const std::vector<KernelArgs>& args, int steps) {
    for (int step = 0; step < steps; ++step) {
      for (const KernelArgs& a : args) {
        for (int b = 0; b < a.layout.blocks; ++b) {
          ops::graph::host_collective_step(a, step, b, ops::graph::kThreads);
        }
      }
    }
  };
  r.reduce = [](const ops::kernel::ReduceArgs& a, ops::kernel::ReducePlan* plan) {
    const ops::kernel::ReducePlan p = ops::kernel::host_reduce_kernel(a);
    if (plan != nullptr) *plan = p;
  };
  return r;
}

TEST(KernelMatrix, EveryDtypeOpSizeAndAlignmentMatchesATen) {
  at::manual_seed(55);
  const int cases =
      collective_matrix(host_runner(), [](const std::string& err, const std::string& what) {
        EXPECT_EQ(err, "") << what;
        return err.empty();
      });
  EXPECT_GT(cases, 3000);
}

// 3 and 8 ranks, with every block of the op busy (kMaxGraphBlocks).
TEST(KernelMatrix, AtTheRegionsEdge) {
  at::manual_seed(56);
  const Type f32 = kTypes[0];
  for (int W : {3, 8}) {
    for (Kind kind : {Kind::kOneShot, Kind::kTwoShot}) {
      Layout l;
      l.kind = kind;
      l.world_size = W;
      l.esize = 4;
      l.numel = (2 << 20) / 4;
      while (l.region_bytes() > (2 << 20)) l.numel -= 16;
      ASSERT_EQ(ops::graph::blocks_for(l.staged()), kMaxGraphBlocks);
      EXPECT_EQ(run_case(host_runner(), kind, W, l.numel - 5, f32, ReduceOp::kSum, 0), "")
          << kind_name(kind) << " W=" << W << " numel=" << l.numel - 5;
    }
  }
}

TEST(KernelMatrix, ReductionKernelMatchesATen) {
  at::manual_seed(57);
  const int cases =
      reduce_matrix(host_runner(), [](const std::string& err, const std::string& what) {
        EXPECT_EQ(err, "") << what;
        return err.empty();
      });
  EXPECT_GT(cases, 3000);
}

// The launch's shape: packs only where every operand allows them, and the largest grid, whose
// threads then stride over the rest.
TEST(KernelMatrix, ReductionKernelLaunchShape) {
  at::manual_seed(58);
  const Type f32 = kTypes[0];
  const Runner host = host_runner();
  ops::kernel::ReducePlan plan;
  ASSERT_EQ(run_reduce(host, f32, ReduceOp::kSum, 2, 1000, 0, false, false, false, 0, &plan), "");
  EXPECT_TRUE(plan.packed);
  EXPECT_EQ(plan.blocks, 1);  // 250 packs
  ASSERT_EQ(run_reduce(host, f32, ReduceOp::kSum, 2, 1000, 0, false, false, false, 1, &plan), "");
  EXPECT_FALSE(plan.packed);
  EXPECT_EQ(plan.blocks, 4);  // 1000 elements
  const Type bf16 = kTypes[3];
  ASSERT_EQ(run_reduce(host, bf16, ReduceOp::kSum, 3, 1000, 0b10, false, false, false, 0, &plan),
            "");
  EXPECT_FALSE(plan.packed);  // a source in float32
  ASSERT_EQ(run_reduce(host, bf16, ReduceOp::kSum, 3, 1000, 0, true, false, false, 0, &plan), "");
  EXPECT_FALSE(plan.packed);  // the destination in float32
  const int64_t past =
      int64_t{ops::kernel::kMaxReduceBlocks} * ops::kernel::kReduceThreads * 4 * 2 + 13;
  ASSERT_EQ(run_reduce(host, f32, ReduceOp::kMax, 2, past, 0, false, true, false, 0, &plan), "");
  EXPECT_TRUE(plan.packed);
  EXPECT_EQ(plan.blocks, ops::kernel::kMaxReduceBlocks);
}

// The flag barrier's body (p2p_workspace/flag_barrier_body.hpp, run by the CUDA barrier and by
// the host's GraphRun) on plain memory: W ranks' pads, every block's peers, what each poll
// decides and in which order.
struct PlainFlags {
  bool failed_peer = false;
  bool gave_up = false;
  int* host_reads = nullptr;  // counts the failure words' reads (host memory on a GPU)
  uint32_t load_acquire(const uint32_t* p) const { return *p; }
  void store_release(uint32_t* p, uint32_t v) const { *p = v; }
  void clear(uint32_t* p) const { *p = 0; }
  void zero(uint32_t* p) const { *p = 0; }
  bool peer_failed() const {
    if (host_reads != nullptr) ++*host_reads;
    return failed_peer;
  }
  bool ended() const {
    if (host_reads != nullptr) ++*host_reads;
    return gave_up;
  }
  uint32_t busy_cas(uint32_t* p, uint32_t expected, uint32_t desired) const {
    const uint32_t found = *p;
    if (found == expected) *p = desired;
    return found;
  }
};

// NOTE [One captured op at a time] (p2p_workspace/graph_flags.hpp): the busy word's take and give
// back, as every kernel op's blocks, an open and its close, and an abandoned op's end run them.
TEST(FlagBarrier, OneCapturedOpHoldsTheBusyWord) {
  const PlainFlags f;
  uint32_t busy = 0;
  auto launch = [&](uint32_t owner, bool takes, bool releases) {
    GraphLaunch g;
    g.busy = &busy;
    g.owner = owner;
    g.takes = takes;
    g.releases = releases;
    return g;
  };
  const GraphLaunch kernel_a = launch(5, true, true), kernel_b = launch(9, true, true);
  // Op 5's three blocks enter; op 9's block is refused, naming op 5, and changes nothing.
  for (int b = 0; b < 3; ++b) EXPECT_EQ(graph_take(kernel_a, f), 0u);
  EXPECT_EQ(busy, (5u << kGraphBusyCountBits) | 3u);
  EXPECT_EQ(graph_take(kernel_b, f), 5u);
  EXPECT_EQ(busy, (5u << kGraphBusyCountBits) | 3u);
  // A refused op's end never gives back what another op holds.
  graph_release(kernel_b, f);
  EXPECT_EQ(busy, (5u << kGraphBusyCountBits) | 3u);
  for (int b = 0; b < 3; ++b) graph_release(kernel_a, f);
  EXPECT_EQ(busy, 0u);
  EXPECT_EQ(graph_take(kernel_b, f), 0u);
  graph_release(kernel_b, f);
  EXPECT_EQ(busy, 0u);
  // A copy-engine op: its open takes, a barrier inside it neither takes nor gives back (another
  // op still finds it held), its close gives back; an op's end (no barriers) only gives back.
  const GraphLaunch open = launch(11, true, false), inside = launch(11, false, false),
                    close = launch(11, false, true);
  EXPECT_EQ(graph_take(open, f), 0u);
  EXPECT_EQ(graph_take(inside, f), 0u);
  graph_release(inside, f);
  EXPECT_EQ(graph_take(kernel_a, f), 11u);
  graph_release(close, f);
  EXPECT_EQ(busy, 0u);
  EXPECT_EQ(graph_take(open, f), 0u);
  graph_release(launch(11, false, true), f);  // SymmetricWorkspace::graph_abandon's end
  EXPECT_EQ(busy, 0u);
  // Without a word (a launch built by hand, or counted signals) nothing is taken.
  GraphLaunch none = kernel_a;
  none.busy = nullptr;
  EXPECT_EQ(graph_take(none, f), 0u);
  graph_release(none, f);
}

TEST(FlagBarrier, StoresPollsAndDecisions) {
  constexpr int W = 3, kBlocks = 2;
  std::vector<std::vector<uint32_t>> pads(W, std::vector<uint32_t>(graph_flag_words(W), 0));
  std::vector<std::vector<uint32_t>> counts(W, std::vector<uint32_t>(5, 7));
  std::vector<GraphLaunch> g(W);
  for (int r = 0; r < W; ++r) {
    g[r].tag = 0x1234;
    g[r].rank = r;
    g[r].world_size = W;
    g[r].blocks = kBlocks;
    g[r].barriers = 2;
    g[r].slot[0] = 0;
    g[r].slot[1] = 1;
    g[r].own = pads[r].data();
    for (int q = 0; q < W; ++q) g[r].peer[q] = pads[q].data();
    g[r].reset = counts[r].data();
    g[r].reset_words = 5;
  }
  const PlainFlags f;
  uint32_t seen = 0;
  // Barrier 0 (the open): block 0 zeroes the counts, in shares of its threads; every rank's
  // flags pass on every block and are back at zero.
  for (int r = 0; r < W; ++r) {
    for (int b = 0; b < kBlocks; ++b) {
      for (int t = 0; t < 2; ++t) flag_open(g[r], b, 0, t, 2, f);
      for (int q = 0; q < W; ++q) {
        if (q != r) flag_arrive(g[r], b, 0, q, f);
      }
    }
    EXPECT_EQ(counts[r], std::vector<uint32_t>(5, 0));
  }
  for (int r = 0; r < W; ++r) {
    for (int b = 0; b < kBlocks; ++b) {
      for (int q = 0; q < W; ++q) {
        if (q == r) continue;
        EXPECT_EQ(flag_poll(g[r], b, 0, q, false, f, &seen), FlagPoll::kPassed);
        EXPECT_EQ(*g[r].mine(b, 0, q), 0u);
      }
    }
  }
  for (int r = 0; r < W; ++r) EXPECT_EQ(pads[r], std::vector<uint32_t>(graph_flag_words(W), 0));
  // Barrier 1: nothing stored yet - waiting, and each reason to stop in the poll's order.
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, false, f, &seen), FlagPoll::kWaiting);
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, true, f, &seen), FlagPoll::kTimedOut);
  PlainFlags ended = f;
  ended.gave_up = true;
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, true, ended, &seen), FlagPoll::kEnded);
  PlainFlags peer = ended;
  peer.failed_peer = true;
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, true, peer, &seen), FlagPoll::kPeerFailed);
  // A poll that does not ask (NOTE [Wait pacing]) reads no failure word and no deadline: waiting.
  int reads = 0;
  peer.host_reads = &reads;
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, true, peer, &seen, false), FlagPoll::kWaiting);
  EXPECT_EQ(reads, 0);
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, true, peer, &seen, true), FlagPoll::kPeerFailed);
  EXPECT_EQ(reads, 1);
  // Rank 2 is at another op: its flag is foreign to rank 0 and stays for the error to name.
  GraphLaunch other = g[2];
  other.tag = 0x4321;
  flag_arrive(other, 1, 1, 0, f);
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, false, f, &seen), FlagPoll::kForeign);
  EXPECT_EQ(seen, 0x4321u);
  EXPECT_EQ(flag_poll(g[0], 1, 1, 2, false, f, &seen, false), FlagPoll::kForeign);  // asked or not
  // A flag with this op's tag passes whatever else came (a tag that came is used), asked or not.
  flag_arrive(g[0], 0, 1, 1, f);
  EXPECT_EQ(flag_poll(g[1], 0, 1, 0, true, peer, &seen), FlagPoll::kPassed);
  flag_arrive(g[0], 0, 1, 1, f);
  reads = 0;
  EXPECT_EQ(flag_poll(g[1], 0, 1, 0, true, peer, &seen, false), FlagPoll::kPassed);
  EXPECT_EQ(reads, 0);
  // Only the open resets the counts.
  counts[0].assign(5, 9);
  flag_open(g[0], 0, 1, 0, 1, f);
  flag_open(g[0], 1, 0, 0, 1, f);
  EXPECT_EQ(counts[0], std::vector<uint32_t>(5, 9));
  // NOTE [Who traps]: only this rank's deadline and a foreign tag fail (trap) by default; a peer's
  // failure ends quietly unless the group traps at one.
  for (bool trap : {false, true}) {
    EXPECT_EQ(flag_outcome(FlagPoll::kPassed, trap), FlagOutcome::kPass);
    EXPECT_EQ(flag_outcome(FlagPoll::kEnded, trap), FlagOutcome::kEnd);
    EXPECT_EQ(flag_outcome(FlagPoll::kForeign, trap), FlagOutcome::kFail);
    EXPECT_EQ(flag_outcome(FlagPoll::kTimedOut, trap), FlagOutcome::kFail);
  }
  EXPECT_EQ(flag_outcome(FlagPoll::kPeerFailed, false), FlagOutcome::kEnd);
  EXPECT_EQ(flag_outcome(FlagPoll::kPeerFailed, true), FlagOutcome::kFail);
}

// NOTE [Wait pacing] (p2p_workspace/wait_pacing_body.hpp), on made-up times: a wait spins without
// sleeping for its first kWaitSpinNs, then sleeps 64 ns, doubling up to 1 us; it asks the host
// words first kWaitAskEveryNs after its start, then once per kWaitAskEveryNs, and its deadline
// counts from its start.
TEST(WaitPacing, SpinsThenSleepsCappedAndAsksTheHostWordsRarely) {
  constexpr uint64_t t0 = 5'000'000'000ull;  // %globaltimer is far from zero
  WaitPacing p = wait_pacing_start(t0);
  int asks = 0;
  uint64_t now = t0;
  std::vector<uint32_t> sleeps;
  // 200 us of polls, one every 100 ns of spinning or after each sleep.
  while (now - t0 < 200'000) {
    if (wait_asks(p, now)) ++asks;
    const uint32_t s = wait_sleep_ns(p, now);
    if (now - t0 < kWaitSpinNs) {
      EXPECT_EQ(s, 0u) << now - t0;
    }
    if (s != 0) sleeps.push_back(s);
    now += s != 0 ? s : 100;
  }
  ASSERT_GE(sleeps.size(), 6u);
  EXPECT_EQ(std::vector<uint32_t>(sleeps.begin(), sleeps.begin() + 6),
            (std::vector<uint32_t>{64, 128, 256, 512, 1024, 1024}));
  for (uint32_t s : sleeps) EXPECT_LE(s, kWaitMaxSleepNs);
  // 200 us: the host words asked 9 or 10 times (every 20 us, never on the first poll), where an
  // unpaced wait asked them at every one of its polls.
  EXPECT_GE(asks, 9);
  EXPECT_LE(asks, 10);
  WaitPacing q = wait_pacing_start(t0);
  EXPECT_FALSE(wait_asks(q, t0));
  EXPECT_FALSE(wait_asks(q, t0 + kWaitAskEveryNs - 1));
  EXPECT_TRUE(wait_asks(q, t0 + kWaitAskEveryNs));
  EXPECT_FALSE(wait_asks(q, t0 + kWaitAskEveryNs + 1));
  EXPECT_FALSE(wait_past(q, t0 + 1000, 1000));
  EXPECT_TRUE(wait_past(q, t0 + 1001, 1000));
}

// The sleep kernel's body (ops/sleep_body.hpp) on a made-up clock whose sleeps return early, on
// time or late: it sleeps in steps of at most kSleepStepNs until the clock says the time passed.
struct FakeClock {
  uint64_t* now;
  uint32_t* slept_max;
  uint32_t early_by;  // a sleep of s advances the clock by s - early_by (at least 1)
  uint64_t now_ns() const { return *now; }
  void sleep(uint32_t ns) const {
    *slept_max = std::max(*slept_max, ns);
    *now += ns > early_by ? ns - early_by : 1;
  }
};

TEST(SleepBody, SleepsUntilTheClockSaysSoInShortSteps) {
  for (uint32_t early : {0u, 200u, 300u}) {
    for (uint32_t ns : {0u, 1u, 255u, 2000u, 100000u}) {
      uint64_t now = 123'456'789;
      uint32_t slept_max = 0;
      ops::kernel::sleep_for(ns, FakeClock{&now, &slept_max, early});
      EXPECT_GE(now - 123'456'789, ns) << "early " << early << " ns " << ns;
      // It stops within one step of the end.
      EXPECT_LT(now - 123'456'789, uint64_t{ns} + ops::kernel::kSleepStepNs) << early << " " << ns;
      EXPECT_LE(slept_max, ops::kernel::kSleepStepNs);
      if (ns == 0) {
        EXPECT_EQ(slept_max, 0u);
      }
    }
  }
}

// The signal waits' body (p2p_workspace/signal_wait_body.hpp: the CUDA wait kernels, and the host
// device's counted waits with CUDA's semantics) on plain memory, in the GPU's 32-bit sequence
// order: how far a poll gets, what it decides and in which order, what each kind does with that,
// and which waits a give-up records.
struct PlainWaits {
  bool failed_peer = false;
  bool device_ended = false;
  int* host_reads = nullptr;  // counts the failure words' reads (host memory on a GPU)
  bool reached(const uint32_t* word, uint32_t value) const {
    return static_cast<int32_t>(*word - value) >= 0;
  }
  bool peer_failed() const {
    if (host_reads != nullptr) ++*host_reads;
    return failed_peer;
  }
  bool ended() const {
    if (host_reads != nullptr) ++*host_reads;
    return device_ended;
  }
};
struct PlainList {
  std::vector<uint32_t>& words;
  std::vector<uint32_t> values;
  int count() const { return static_cast<int>(values.size()); }
  const uint32_t* addr(int i) const { return &words[i]; }
  uint32_t value(int i) const { return values[i]; }
};

TEST(SignalWaits, PollsDecisionsAndWhatAGiveUpRecords) {
  std::vector<uint32_t> words{0xfffffffeu, 5, 7, 0};
  // The first value wraps around: word 1 is past 0xffffffff in sequence order.
  const PlainList list{words, {1, 5, 8, 1}};
  const PlainWaits f;
  int next = 0;
  EXPECT_EQ(signal_wait_poll(list, &next, false, f), FlagPoll::kWaiting);
  EXPECT_EQ(next, 0);
  words[0] = 1;
  EXPECT_EQ(signal_wait_poll(list, &next, false, f), FlagPoll::kWaiting);
  EXPECT_EQ(next, 2);  // words 0 and 1 reached; word 2 (7 of 8) is missing
  // Each reason to stop, in the poll's order: a peer's failure, the device's end, the deadline.
  EXPECT_EQ(signal_wait_poll(list, &next, true, f), FlagPoll::kTimedOut);
  PlainWaits ended = f;
  ended.device_ended = true;
  EXPECT_EQ(signal_wait_poll(list, &next, true, ended), FlagPoll::kEnded);
  PlainWaits peer = ended;
  peer.failed_peer = true;
  EXPECT_EQ(signal_wait_poll(list, &next, true, peer), FlagPoll::kPeerFailed);
  // A poll that does not ask (NOTE [Wait pacing]) still steps past what was reached, and reads no
  // failure word and no deadline.
  int reads = 0;
  peer.host_reads = &reads;
  EXPECT_EQ(signal_wait_poll(list, &next, true, peer, false), FlagPoll::kWaiting);
  EXPECT_EQ(reads, 0);
  EXPECT_EQ(next, 2);
  // A give-up records the waits from `next` on that are not reached: words 2 and 3, not 0 or 1.
  words[3] = 1;
  std::vector<int> missing;
  signal_wait_missing(list, next, f, [&](int j) { missing.push_back(j); });
  EXPECT_EQ(missing, std::vector<int>{2});
  words[3] = 0;
  missing.clear();
  signal_wait_missing(list, 0, f, [&](int j) { missing.push_back(j); });
  EXPECT_EQ(missing, (std::vector<int>{2, 3}));
  // Every wait reached passes whatever else holds (a signal that came is used).
  words[2] = 8;
  words[3] = 2;
  EXPECT_EQ(signal_wait_poll(list, &next, true, peer), FlagPoll::kPassed);
  EXPECT_EQ(next, 4);
  // The eager wait never fails by itself: it ends and records why, the deadline or a failure.
  for (FlagPoll p : {FlagPoll::kWaiting, FlagPoll::kPassed}) {
    EXPECT_EQ(eager_wait_outcome(p), FlagOutcome::kPass);
    EXPECT_EQ(counted_wait_outcome(p, false), FlagOutcome::kPass);
  }
  for (FlagPoll p : {FlagPoll::kPeerFailed, FlagPoll::kEnded, FlagPoll::kTimedOut}) {
    EXPECT_EQ(eager_wait_outcome(p), FlagOutcome::kEnd);
  }
  EXPECT_EQ(eager_wait_give_up(FlagPoll::kTimedOut), kWaitGaveUp);
  EXPECT_EQ(eager_wait_give_up(FlagPoll::kPeerFailed), kWaitEnded);
  EXPECT_EQ(eager_wait_give_up(FlagPoll::kEnded), kWaitEnded);
  // The counted wait fails at its deadline; it ends quietly at its own failure and at a peer's,
  // unless the group traps at a peer's (NOTE [Who traps]).
  EXPECT_EQ(counted_wait_outcome(FlagPoll::kEnded, true), FlagOutcome::kEnd);
  EXPECT_EQ(counted_wait_outcome(FlagPoll::kPeerFailed, false), FlagOutcome::kEnd);
  EXPECT_EQ(counted_wait_outcome(FlagPoll::kPeerFailed, true), FlagOutcome::kFail);
  EXPECT_EQ(counted_wait_outcome(FlagPoll::kTimedOut, false), FlagOutcome::kFail);
}

// The op-signature kernels' body (ops/signature_body.hpp: the CUDA publish and compare kernels,
// and the host's handshake) on plain memory, a thread per word as on the GPU: W ranks publish into
// every pad; agreeing descriptors compare equal on every word; one word of one rank's changed (a
// stamp, a size) differs on that word only; the record holds every rank's descriptor.
struct PlainSignature {
  uint32_t load(const uint32_t* p) const { return *p; }
  void store(uint32_t* p, uint32_t v) const { *p = v; }
};

TEST(SignatureKernels, PublishCompareAndRecord) {
  constexpr int W = 3, n = ops::kSignatureBodyWords;
  std::vector<std::vector<uint32_t>> pads(W, std::vector<uint32_t>(W * n, 0));
  auto descriptor = [] {  // every rank's: they agree
    std::vector<uint32_t> d(n);
    for (int i = 0; i < n; ++i) d[i] = 1000u * static_cast<uint32_t>(i) + 7u;
    return d;
  };
  const PlainSignature f;
  for (int r = 0; r < W; ++r) {
    std::vector<uint32_t*> slots;
    for (int q = 0; q < W; ++q) slots.push_back(pads[q].data() + r * n);  // r's slot in q's pad
    const auto d = descriptor();
    for (int i = 0; i < n; ++i) ops::signature_publish_word(d.data(), slots.data(), W, i, f);
  }
  const auto mine = descriptor();
  for (int q = 0; q < W; ++q) {
    for (int i = 0; i < n; ++i) {
      EXPECT_FALSE(ops::signature_word_differs(pads[q].data(), W, mine.data(), i, f)) << q << i;
    }
  }
  pads[1][2 * n + 5] += 1;  // rank 2's word 5 as rank 1 sees it
  pads[1][1 * n + 0] += 1;  // rank 1's own stamp
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(ops::signature_word_differs(pads[1].data(), W, mine.data(), i, f), i == 0 || i == 5)
        << i;
    EXPECT_FALSE(ops::signature_word_differs(pads[0].data(), W, mine.data(), i, f)) << i;
  }
  std::vector<uint32_t> record(W * n, 0);
  for (int i = 0; i < n; ++i) ops::signature_record_word(pads[1].data(), W, i, record.data(), f);
  EXPECT_EQ(record, pads[1]);
}

}  // namespace
}  // namespace cuda_p2p::test
