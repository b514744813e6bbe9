// Groups made from a cuda_p2p group through the C++ API (issue 50, points 2-5): split (the
// backend's and c10d::ProcessGroup::splitGroup's), shrink past a rank that stopped taking part,
// merge; abort hooks and getError; the canonical single-tensor entries. The wrapped backend is a
// stand-in that splits and merges the way Gloo does and is never asked to run a collective: every
// op here runs on the workspace.
#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

// Splits and merges like Gloo (a new backend over the child's ranks; none for a rank outside),
// cannot shrink, and runs nothing.
class SplittableBackend : public c10d::Backend {
 public:
  SplittableBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "splittable"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>&, const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override {
    splits++;
    last_split_options = opts;
    auto it = std::find(ranks.begin(), ranks.end(), getRank());
    if (it == ranks.end()) return nullptr;
    return c10::make_intrusive<SplittableBackend>(static_cast<int>(it - ranks.begin()),
                                                  static_cast<int>(ranks.size()));
  }
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>&,
                                          const c10::intrusive_ptr<c10d::Backend::Options>&,
                                          const int& rank, const int& size) override {
    return c10::make_intrusive<SplittableBackend>(rank, size);
  }
  int splits = 0;
  c10::intrusive_ptr<c10d::Backend::Options> last_split_options;

 private:
  c10::intrusive_ptr<c10d::Backend::Options> options_ =
      c10::make_intrusive<c10d::Backend::Options>("splittable");
};

// A stand-in for the wrapped NCCL (NOTE [Shrinking a CUDA backend never used] in
// backend/child_groups.cpp): counts its shrinks and barriers, and runs nothing else.
class ShrinkableCuda : public c10d::Backend {
 public:
  ShrinkableCuda(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "shrinkable-cuda"; }
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& excluded, int,
      const c10::intrusive_ptr<c10d::Backend::Options>&) override {
    ++shrinks;
    int rank = getRank();
    for (int64_t r : excluded) rank -= r < getRank() ? 1 : 0;
    return c10::make_intrusive<ShrinkableCuda>(rank, getSize() - static_cast<int>(excluded.size()));
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    ++barriers;
    return c10::make_intrusive<Done>(getRank());
  }
  int shrinks = 0;
  int barriers = 0;

 private:
  class Done : public c10d::Work {
   public:
    explicit Done(int rank) : c10d::Work(rank) { finish(); }
  };
};

c10::intrusive_ptr<ProcessGroupCudaP2P> make_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    c10::intrusive_ptr<ProcessGroupCudaP2P::Options> options = {}) {
  const auto& w = world();
  return c10::make_intrusive<ProcessGroupCudaP2P>(
      store, w.rank, w.size, std::move(options),
      c10::make_intrusive<SplittableBackend>(w.rank, w.size), nullptr);
}

c10::intrusive_ptr<c10d::Store> child_store(const char* name) {
  return c10::make_intrusive<c10d::PrefixStore>(name, test_store());
}

// `g` (over `ranks` of the parent, in that order) all-reduces and all-gathers right, on its
// workspace.
void expect_works(ProcessGroupCudaP2P& g, const std::vector<int>& ranks) {
  const int me = world().rank;
  ASSERT_TRUE(g.is_p2p_available()) << g.p2p_unavailable_reason();
  std::vector<at::Tensor> t{at::full({7}, static_cast<float>(me + 1))};
  g.allreduce(t, c10d::AllreduceOptions())->wait();
  float sum = 0;
  for (int r : ranks) sum += static_cast<float>(r + 1);
  EXPECT_TRUE(t[0].equal(at::full({7}, sum))) << t[0];
  at::Tensor out = at::empty({2 * static_cast<int64_t>(ranks.size())});
  at::Tensor in = at::full({2}, static_cast<float>(me));
  g._allgather_base(out, in, c10d::AllgatherOptions())->wait();
  std::vector<float> want;
  for (int r : ranks) want.insert(want.end(), 2, static_cast<float>(r));
  EXPECT_TRUE(out.equal(at::tensor(want))) << out;
  EXPECT_EQ(g.counters().count("all_reduce.wrapped"), 0u);
}

// This process's mappings of cuda_p2p's memfds: workspace blocks and failure areas.
int memfd_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("memfd:cuda_p2p") != std::string::npos;
  }
  return n;
}

#ifdef CUDA_P2P_C10D_HAS_SPLIT
TEST(ChildGroups, SplitReversedIsACudaP2PGroupWithItsOwnWorkspace) {
  const auto& w = world();
  auto parent = make_group(test_store());
  EXPECT_TRUE(parent->supportsSplitting());
  std::vector<int> ranks;
  for (int r = w.size - 1; r >= 0; --r) ranks.push_back(r);
#ifdef CUDA_P2P_C10D_HAS_OPTIONS_CLONE
  auto opts = parent->getBackendOptions()->clone();
#else  // torch 2.11: c10d's Options has no clone(); the group's own options have
  auto opts = parent->options()->clone();
#endif
  opts->group_name = "reversed";
  auto child_backend = parent->split(child_store("reversed/"), ranks, opts);
  auto child = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(child_backend);
  ASSERT_TRUE(child);
  EXPECT_EQ(child->getRank(), w.size - 1 - w.rank);
  EXPECT_EQ(child->getSize(), w.size);
  EXPECT_EQ(child->options()->group_name, "reversed");
  EXPECT_NE(child->workspace(), parent->workspace());
  expect_works(*child, ranks);
  // The wrapped backend was split for the child, with a copy of its own options.
  auto* wrapped = dynamic_cast<SplittableBackend*>(parent->wrapped_backend(c10::kCPU).get());
  ASSERT_NE(wrapped, nullptr);
  EXPECT_EQ(wrapped->splits, 1);
  ASSERT_TRUE(wrapped->last_split_options);
  EXPECT_EQ(wrapped->last_split_options->group_name, "reversed");
  EXPECT_NE(wrapped->last_split_options.get(), wrapped->getBackendOptions().get());
  std::vector<int> all;  // and the parent works on
  for (int r = 0; r < w.size; ++r) all.push_back(r);
  expect_works(*parent, all);
}

TEST(ChildGroups, ProcessGroupSplitGroupMakesCudaP2PSubgroups) {
  const auto& w = world();
  auto parent = make_group(test_store());
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(test_store(), w.rank, w.size);
  pg->setBackend(c10::kCPU, c10d::ProcessGroup::BackendType::CUSTOM, parent);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  // Rank 0 and the last rank; the others get no group.
  const std::vector<int> ranks =
      w.size == 1 ? std::vector<int>{0} : std::vector<int>{0, w.size - 1};
  auto sub =
      pg->splitGroup(ranks, std::chrono::milliseconds(60000), std::nullopt, "ends", std::nullopt);
  const bool member = w.rank == 0 || w.rank == w.size - 1;
  ASSERT_EQ(static_cast<bool>(sub), member);
  if (member) {
    auto b = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(sub->getBackend(c10::kCPU));
    ASSERT_TRUE(b);
    EXPECT_EQ(b->options()->timeout.count(), 60000);
    EXPECT_EQ(sub->getGroupName(), "ends");
    expect_works(*b, ranks);
  }
  store_barrier("split-group-done");
}

TEST(ChildGroups, SplitRefusesForeignOptionsAndBadRanks) {
  const auto& w = world();
  auto parent = make_group(test_store());
  std::vector<int> all;
  for (int r = 0; r < w.size; ++r) all.push_back(r);
  expect_error(
      [&] {
        parent->split(child_store("x/"), all, c10::make_intrusive<c10d::Backend::Options>("gloo"));
      },
      "expected the options of a cuda_p2p group");
  // c10d's own options naming this backend (torch 2.11's getBackendOptions()) are taken: the
  // parent's options with the timeout and name they set.
  auto plain = c10::make_intrusive<c10d::Backend::Options>(kBackendName, std::chrono::seconds(77));
  plain->group_name = "plain";
  auto child = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(
      parent->split(child_store("plain/"), all, plain));
  ASSERT_TRUE(child);
  EXPECT_EQ(child->options()->group_name, "plain");
  EXPECT_EQ(child->options()->timeout, std::chrono::seconds(77));
  EXPECT_EQ(child->options()->buffer_size, parent->options()->buffer_size);
  expect_works(*child, all);
  expect_error([&] { parent->split(child_store("y/"), {0, 0}, nullptr); }, "listed twice");
  expect_error([&] { parent->split(child_store("z/"), {w.size}, nullptr); }, "ranks must be in");
}
#endif

#ifdef CUDA_P2P_C10D_HAS_MERGE
TEST(ChildGroups, MergeMakesACudaP2PGroupOfTheJoiningRanks) {
  const auto& w = world();
  auto parent = make_group(test_store());
  auto merged = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(
      parent->merge(child_store("merged/"), nullptr, w.size - 1 - w.rank, w.size));
  ASSERT_TRUE(merged);
  std::vector<int> ranks;
  for (int r = w.size - 1; r >= 0; --r) ranks.push_back(r);
  expect_works(*merged, ranks);
}
#endif

#ifdef CUDA_P2P_C10D_HAS_SHRINK
TEST(ChildGroups, ShrinkPastASilentRankWaitsForItNowhere) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks (a shrink excludes one)";
  auto parent = make_group(test_store());
  EXPECT_TRUE(parent->supportsShrinking());
  std::vector<int> all;
  for (int r = 0; r < w.size; ++r) all.push_back(r);
  expect_works(*parent, all);  // its workspace is mapped, failure areas included
  const int silent = w.size - 1;
  if (w.rank != silent) {
    const int before = memfd_mappings();
    expect_error([&] { parent->shrink({w.rank}, 0, nullptr); }, "only the ranks that stay");
    expect_error([&] { parent->shrink({silent, silent}, 0, nullptr); }, "excluded twice");
    expect_error([&] { parent->shrink({w.size}, 0, nullptr); }, "must be in [0, ");
    expect_error([&] { parent->shrink({silent}, 2, nullptr); }, "SHRINK_ABORT (1), got 2");
    expect_error([&] { parent->shrink({}, 0, nullptr); }, "at least one rank");
    auto child = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(
        parent->shrink({silent}, 0, nullptr));
    ASSERT_TRUE(child);
    std::vector<int> survivors;
    for (int r = 0; r < silent; ++r) survivors.push_back(r);
    EXPECT_EQ(child->getSize(), silent);
    expect_works(*child, survivors);
    // NOTE [Failure words]: the parent dropped its mapping of the silent rank's failure area;
    // the child maps its blocks and, with peers, every survivor's area.
    const int child_mappings = silent > 1 ? 2 * silent : 1;
    EXPECT_EQ(memfd_mappings(), before - 1 + child_mappings);
    // The silent rank still maps this rank's blocks; the parent's teardown does not wait for it.
    const auto t0 = std::chrono::steady_clock::now();
    parent->shutdown();
    parent.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  }
  store_barrier("shrunk");
}

// NOTE [Shrinking a CUDA backend never used]: a wrapped CUDA backend that never ran anything has no
// communicator, so the child gets a fresh one from the group's factory over the survivors (before,
// its shrink was called: torch's NCCL raises, or initializes over every parent rank, the dead one
// included, and hangs); one that ran something is shrunk.
TEST(ChildGroups, ShrinkGivesAnUnusedCudaBackendAFreshOneAndShrinksAUsedOne) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks (a shrink excludes one)";
  const int silent = w.size - 1;
  for (const bool used : {false, true}) {
    auto cuda = c10::make_intrusive<ShrinkableCuda>(w.rank, w.size);
    auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
    options->workspace_device = "cpu";  // a host workspace beside the CUDA backend
    auto parent = c10::make_intrusive<ProcessGroupCudaP2P>(
        child_store(used ? "used/" : "unused/"), w.rank, w.size, options,
        c10::make_intrusive<SplittableBackend>(w.rank, w.size), cuda);
    struct Made {
      int rank, size;
      std::vector<uint64_t> global;
    };
    std::vector<Made> made;
    parent->set_cuda_backend_factory([&](const c10::intrusive_ptr<c10d::Store>&, int rank, int size,
                                         std::chrono::milliseconds,
                                         const std::vector<uint64_t>& global) {
      made.push_back({rank, size, global});
      return c10::make_intrusive<ShrinkableCuda>(rank, size);
    });
    if (used) {  // a barrier on a GPU goes to the CUDA backend
      c10d::BarrierOptions on_gpu;
      on_gpu.device = c10::Device(c10::DeviceType::CUDA, 0);
      parent->barrier(on_gpu)->wait();
      EXPECT_EQ(cuda->barriers, 1);
    }
    if (w.rank != silent) {
      auto child = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(
          parent->shrink({silent}, 0, nullptr));
      ASSERT_TRUE(child);
      std::vector<int> survivors;
      std::vector<uint64_t> global;
      for (int r = 0; r < silent; ++r) {
        survivors.push_back(r);
        global.push_back(static_cast<uint64_t>(r));
      }
      EXPECT_EQ(cuda->shrinks, used ? 1 : 0) << "used " << used;
      if (used) {
        EXPECT_TRUE(made.empty());
      } else {
        ASSERT_EQ(made.size(), 1u);
        EXPECT_EQ(made[0].rank, w.rank);
        EXPECT_EQ(made[0].size, silent);
        EXPECT_EQ(made[0].global, global);
      }
      expect_works(*child, survivors);
    }
    store_barrier(used ? "shrunk-used" : "shrunk-unused");
  }
}

TEST(ChildGroups, ShrinkWithAbortRunsTheHooksAndAbortsTheParent) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks (a shrink excludes one)";
  auto parent = make_group(test_store());
  const int silent = w.size - 1;
  int ran = 0;
#ifdef CUDA_P2P_C10D_HAS_ABORT_HOOKS
  parent->registerAbortHook(1, [&] { ++ran; });
  constexpr int kHooks = 1;
#else  // torch 2.11 has no abort hooks: the shrink's abort is checked without one
  constexpr int kHooks = 0;
#endif
  if (w.rank != silent) {
    auto child = parent->shrink({silent}, 1, nullptr);
    EXPECT_EQ(ran, kHooks);
    EXPECT_TRUE(parent->retired());
    std::vector<at::Tensor> t{at::ones({3})};
    expect_error([&] { parent->allreduce(t, c10d::AllreduceOptions()); }, "SHRINK_ABORT");
    std::vector<int> survivors;
    for (int r = 0; r < silent; ++r) survivors.push_back(r);
    expect_works(*c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P>(child), survivors);
  }
  store_barrier("shrunk-abort");
}
#endif

#ifdef CUDA_P2P_C10D_HAS_ABORT_HOOKS
TEST(AbortHooks, RunOnceInIdOrderOnAbort) {
  auto g = make_group(test_store());
  std::vector<int> ran;
  g->registerAbortHook(9, [&] { ran.push_back(9); });
  g->registerAbortHook(2, [&] { ran.push_back(2); });
  g->registerAbortHook(5, [&] { ran.push_back(5); });
  g->unregisterAbortHook(5);
  g->unregisterAbortHook(42);
  g->registerAbortHook(3, [] { throw std::runtime_error("hook failed"); });
#ifdef CUDA_P2P_C10D_HAS_ERROR_TYPE
  EXPECT_EQ(g->getError(), c10d::ErrorType::SUCCESS);
#endif
  store_barrier("hooks-healthy");  // before any rank aborts: an abort reaches the peers' words
  g->abort();
  g->abort();
  EXPECT_EQ(ran, (std::vector<int>{2, 9}));
#ifdef CUDA_P2P_C10D_HAS_ERROR_TYPE
  // The own abort is no error; a peer's abort that reached this rank first is a remote one
  // (NOTE [Error kinds]).
  const auto kind = g->getError();
  EXPECT_TRUE(kind == c10d::ErrorType::SUCCESS || kind == c10d::ErrorType::REMOTE_ERROR);
#endif
}

#ifdef CUDA_P2P_C10D_HAS_ERROR_TYPE
TEST(AbortHooks, APeersAbortIsARemoteError) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto g = make_group(test_store());
  std::vector<int> all;
  for (int r = 0; r < w.size; ++r) all.push_back(r);
  expect_works(*g, all);  // the workspace and its failure words are set up
  store_barrier("peer-abort-ready");
  int ran = 0;
  g->registerAbortHook(1, [&] { ++ran; });
  if (w.rank == 0) g->abort();
  store_barrier("peer-aborted");
  EXPECT_EQ(g->getError(), w.rank == 0 ? c10d::ErrorType::SUCCESS : c10d::ErrorType::REMOTE_ERROR);
  if (w.rank != 0) {
    EXPECT_EQ(ran, 0);  // getError() aborts nothing
    std::vector<at::Tensor> t{at::ones({3})};
    expect_error([&] { g->allreduce(t, c10d::AllreduceOptions()); },
                 "rank 0's device failed first");
  }
  EXPECT_EQ(ran, 1);  // on rank 0 by its abort, on the others before their op's error
  store_barrier("peer-abort-done");
}
#endif
#endif

TEST(ErrorKinds, AreReadFromTheFailure) {
  EXPECT_EQ(classify_failure("", 0), ErrorKind::kSuccess);
  EXPECT_EQ(classify_failure("all_reduce: cuda_p2p: all_reduce (rank 0) timed out after 500 ms: "
                             "rank 1 never arrived",
                             0),
            ErrorKind::kTimeout);
  const std::string growth =
      "fused_all_gather_matmul: cuda_p2p: workspace rendezvous: 1 of 3 ranks could not allocate "
      "their block of 8392704 bytes (rank 2: cuda_p2p: ftruncate to 8392704 bytes failed)";
  EXPECT_EQ(classify_failure(growth, 0), ErrorKind::kRemoteError);
  EXPECT_EQ(classify_failure(growth, 2), ErrorKind::kCommError);
  // NOTE [Failure words]: a peer's failure, a timeout of its own, told through the word.
  EXPECT_EQ(classify_failure("all_reduce: cuda_p2p all_reduce: this group's device is unusable "
                             "(NOTE [Device failure]): rank 0's device failed first, and its "
                             "failure reached rank 1 through this rank's failure word (NOTE "
                             "[Failure words]): barrier timed out after 5 ms: rank 2 never "
                             "arrived; the ops this group ran since may have taken its stale "
                             "data, so none of them is valid",
                             1),
            ErrorKind::kRemoteError);
  EXPECT_EQ(classify_failure("all_gather: cuda_p2p: reading rank 1's memory failed", 0),
            ErrorKind::kCommError);
}

#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
TEST(CanonicalEntries, RunTheSameOpsAsTheirOldNamesCountedAlike) {
  const auto& w = world();
  auto g = make_group(test_store());
  std::vector<int> all;
  for (int r = 0; r < w.size; ++r) all.push_back(r);
  const at::Tensor want_gather = at::arange(w.size, at::kFloat).repeat_interleave(3);
  at::Tensor in = at::full({3}, static_cast<float>(w.rank));
  at::Tensor a = at::empty({3 * w.size}), b = at::empty({3 * w.size});
  g->all_gather_single(a, in, c10d::AllgatherOptions())->wait();
  g->_allgather_base(b, in, c10d::AllgatherOptions())->wait();
  EXPECT_TRUE(a.equal(want_gather) && b.equal(want_gather)) << a << b;

  at::Tensor rs_in = at::arange(2 * w.size, at::kFloat);
  at::Tensor rs_a = at::empty({2}), rs_b = at::empty({2});
  g->reduce_scatter_single(rs_a, rs_in, c10d::ReduceScatterOptions())->wait();
  g->_reduce_scatter_base(rs_b, rs_in, c10d::ReduceScatterOptions())->wait();
  const at::Tensor want_rs = at::arange(2 * w.rank, 2 * w.rank + 2, at::kFloat) * w.size;
  EXPECT_TRUE(rs_a.equal(want_rs) && rs_b.equal(want_rs)) << rs_a << rs_b;

  std::vector<at::Tensor> outs{at::empty({3 * w.size})}, ins{in};
  g->all_gather_single_coalesced(outs, ins, c10d::AllgatherOptions())->wait();
  EXPECT_TRUE(outs[0].equal(want_gather));
  std::vector<at::Tensor> rs_outs{at::empty({2})}, rs_ins{rs_in};
  g->reduce_scatter_single_coalesced(rs_outs, rs_ins, c10d::ReduceScatterOptions())->wait();
  EXPECT_TRUE(rs_outs[0].equal(want_rs));

  at::Tensor a2a = at::empty({w.size});
  std::vector<int64_t> none;
  at::Tensor a2a_in = at::full({w.size}, static_cast<float>(w.rank));
  g->all_to_all_single(a2a, a2a_in, none, none, c10d::AllToAllOptions())->wait();
  EXPECT_TRUE(a2a.equal(at::arange(w.size, at::kFloat)));

  const auto c = g->counters();
  const auto runs = [&](const std::string& op) {
    int64_t n = 0;
    for (const char* algo : {".direct", ".ring"}) {
      if (auto it = c.find(op + algo); it != c.end()) n += it->second;
    }
    return n;
  };
  EXPECT_EQ(runs("all_gather"), 3);
  EXPECT_EQ(runs("reduce_scatter"), 3);
  EXPECT_EQ(runs("all_to_all_single"), 1);
}
#endif

#ifdef CUDA_P2P_C10D_HAS_GATHER_SINGLE
TEST(CanonicalEntries, GatherSingleFillsTheRootsOneTensor) {
  const auto& w = world();
  auto g = make_group(test_store());
  for (int root = 0; root < w.size; ++root) {
    at::Tensor out = w.rank == root ? at::full({w.size, 4}, -1.0f) : at::empty({0});
    at::Tensor in = at::full({4}, static_cast<float>(w.rank + 10 * root));
    c10d::GatherOptions opts;
    opts.rootRank = root;
    g->gather_single(out, in, opts)->wait();
    if (w.rank == root) {
      EXPECT_TRUE(out.equal(
          (at::arange(w.size, at::kFloat) + 10.0f * root).unsqueeze(1).expand({w.size, 4})))
          << out;
    }
  }
  EXPECT_EQ(g->counters().at("gather.direct"), w.size);
}
#endif

}  // namespace
}  // namespace cuda_p2p::test
