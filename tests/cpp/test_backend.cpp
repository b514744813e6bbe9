// ProcessGroupCudaP2P without Python: construction, options, argument checks and routing, with
// recording stand-ins for the wrapped backends.
#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/coalesced_work.hpp"
#include "tests/cpp/harness.hpp"
#include "tests/cpp/test_backend/recording_backend.hpp"

namespace cuda_p2p::test {
namespace {

using namespace backend_tests;  // NOLINT(build/namespaces)

TEST(Backend, ConstructsWithDefaultsAndReportsItself) {
  auto f = make();
  EXPECT_EQ(f.pg->getRank(), world().rank);
  EXPECT_EQ(f.pg->getSize(), world().size);
  EXPECT_EQ(f.pg->getBackendName(), "cuda_p2p");
  auto opts =
      c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P::Options>(f.pg->getBackendOptions());
  ASSERT_TRUE(opts);
  EXPECT_EQ(opts->backend, "cuda_p2p");
  EXPECT_FALSE(opts->buffer_size.has_value());
  EXPECT_FALSE(opts->nccl_options);
  EXPECT_EQ(f.pg->wrapped_backend(c10::DeviceType::CPU).get(), f.cpu.get());
  EXPECT_EQ(f.pg->wrapped_backend(c10::DeviceType::CUDA).get(), nullptr);
}

TEST(Backend, OptionsKeepTheirValuesAndCloneKeepsTheType) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->buffer_size = 1 << 20;
  options->timeout = std::chrono::milliseconds(1234);
  auto f = make(options);
  EXPECT_EQ(f.pg->options()->buffer_size.value(), 1 << 20);
  auto copy = options->clone();
  auto typed = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P::Options>(copy);
  ASSERT_TRUE(typed);
  EXPECT_EQ(typed->buffer_size.value(), 1 << 20);
  EXPECT_EQ(typed->timeout.count(), 1234);
  EXPECT_NE(typed.get(), options.get());
  f.pg->setTimeout(std::chrono::milliseconds(777));
  EXPECT_EQ(f.pg->options()->timeout.count(), 777);
  EXPECT_EQ(f.cpu->timeout_ms, 777);  // and it reached the wrapped backend
}

TEST(Backend, RejectsBadConstructionArguments) {
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "cpu");
  auto store = test_store();
  expect_error(
      [&] { ProcessGroupCudaP2P(store, w.size, w.size, {}, cpu, nullptr); },
      "rank must be in [0, " + std::to_string(w.size) + "), got " + std::to_string(w.size));
  expect_error([&] { ProcessGroupCudaP2P(store, 0, 0, {}, cpu, nullptr); },
               "world size must be >= 1, got 0");
  expect_error([&] { ProcessGroupCudaP2P(store, w.rank, w.size, {}, nullptr, nullptr); },
               "wrapped backend for CPU tensors");
  expect_error([&] { ProcessGroupCudaP2P(nullptr, w.rank, w.size, {}, cpu, nullptr); },
               "Store is required");
  auto other = c10::make_intrusive<RecordingBackend>(w.rank, w.size + 1, "other");
  expect_error([&] { ProcessGroupCudaP2P(store, w.rank, w.size, {}, other, nullptr); },
               "expected rank " + std::to_string(w.rank) + " of " + std::to_string(w.size));
  auto bad = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  bad->buffer_size = 0;
  expect_error([&] { ProcessGroupCudaP2P(store, w.rank, w.size, bad, cpu, nullptr); },
               "Options.buffer_size must be in [1, ");
}

TEST(Backend, RoutesCpuTensorsToTheCpuBackend) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->enable_workspace = false;
  auto f = make(options);
  std::vector<at::Tensor> t{at::ones({7})};
  EXPECT_TRUE(f.pg->allreduce(t, c10d::AllreduceOptions())->wait());
  EXPECT_TRUE(f.pg->broadcast(t, c10d::BroadcastOptions())->wait());
  at::Tensor out = at::empty({7 * world().size});
  f.pg->_allgather_base(out, t[0], c10d::AllgatherOptions())->wait();
  f.pg->barrier(c10d::BarrierOptions())->wait();
  EXPECT_EQ(f.cpu->calls,
            (std::vector<std::string>{"allreduce", "broadcast", "_allgather_base", "barrier"}));
  const auto counters = f.pg->counters();
  EXPECT_EQ(counters.at("all_reduce.wrapped"), 1);
  EXPECT_EQ(counters.at("broadcast.wrapped"), 1);
  EXPECT_EQ(counters.at("all_gather.wrapped"), 1);
  EXPECT_EQ(counters.at("barrier.wrapped"), 1);
}

TEST(Backend, RunsCollectivesOnTheWorkspaceAndCountsThePath) {
  const auto& w = world();
  auto f = make();
  ASSERT_TRUE(f.pg->is_p2p_available()) << f.pg->p2p_unavailable_reason();
  std::vector<at::Tensor> t{at::full({5}, static_cast<float>(w.rank + 1))};
  auto work = f.pg->allreduce(t, c10d::AllreduceOptions());
  EXPECT_TRUE(work->isCompleted());
  EXPECT_TRUE(work->wait());
  const float sum = static_cast<float>(w.size * (w.size + 1) / 2);
  EXPECT_TRUE(t[0].equal(at::full({5}, sum)));
  auto fut = work->getFuture();
  ASSERT_TRUE(fut->completed());
  EXPECT_TRUE(fut->value().toTensorVector()[0].is_same(t[0]));

  std::vector<at::Tensor> b{at::full({3}, static_cast<float>(w.rank))};
  c10d::BroadcastOptions bo;
  bo.rootRank = w.size - 1;
  f.pg->broadcast(b, bo)->wait();
  EXPECT_TRUE(b[0].equal(at::full({3}, static_cast<float>(w.size - 1))));

  at::Tensor in = at::full({2}, static_cast<float>(w.rank));
  at::Tensor out = at::empty({2 * w.size});
  f.pg->_allgather_base(out, in, c10d::AllgatherOptions())->wait();
  EXPECT_TRUE(out.equal(at::arange(w.size, at::kFloat).repeat_interleave(2)));

  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < w.size; ++r) outs[0].push_back(at::empty({2}));
  std::vector<at::Tensor> ins{in};
  f.pg->allgather(outs, ins, c10d::AllgatherOptions())->wait();
  for (int r = 0; r < w.size; ++r) EXPECT_TRUE(outs[0][r].equal(at::full({2}, 1.0f * r)));

  at::Tensor rs_in = at::arange(3 * w.size, at::kFloat);
  at::Tensor rs_out = at::empty({3});
  c10d::ReduceScatterOptions ro;
  ro.reduceOp = c10d::ReduceOp::MAX;
  f.pg->_reduce_scatter_base(rs_out, rs_in, ro)->wait();
  EXPECT_TRUE(rs_out.equal(at::arange(3 * w.rank, 3 * w.rank + 3, at::kFloat)));

  std::vector<at::Tensor> list_out{at::empty({3})};
  std::vector<std::vector<at::Tensor>> list_in(1);
  for (int r = 0; r < w.size; ++r) list_in[0].push_back(at::full({3}, 1.0f * r));
  f.pg->reduce_scatter(list_out, list_in, c10d::ReduceScatterOptions())->wait();
  EXPECT_TRUE(list_out[0].equal(at::full({3}, static_cast<float>(w.size * w.rank))));

  f.pg->barrier(c10d::BarrierOptions())->wait();

  std::vector<int64_t> sizes;
  for (int r = 0; r < w.size; ++r) sizes.push_back(r);
  auto gathered = f.pg->all_gather_v(at::full({w.rank, 2}, static_cast<float>(w.rank)), sizes);
  ASSERT_EQ(gathered.size(0), w.size * (w.size - 1) / 2);
  EXPECT_EQ(gathered.size(1), 2);

  EXPECT_TRUE(f.cpu->calls.empty()) << f.cpu->calls.front();
  const auto c = f.pg->counters();
  EXPECT_EQ(c.at("all_reduce.one_shot"), 1);
  EXPECT_EQ(c.at("broadcast.direct"), 1);
  const auto& cfg = f.pg->collective_config();
  EXPECT_EQ(c.at(std::string("all_gather.") +
                 ops::to_string(ops::select_all_gather(cfg, 8 * w.size, w.size))),
            2);
  EXPECT_EQ(c.at(std::string("reduce_scatter.") +
                 ops::to_string(ops::select_reduce_scatter(cfg, 12 * w.size, w.size))),
            2);
  EXPECT_EQ(c.at("barrier.workspace"), 1);
  EXPECT_EQ(c.at("all_gather_v.direct"), 1);
  EXPECT_EQ(c.count("all_reduce.wrapped"), 0u);
}

// NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp: "cpu" keeps a host
// workspace in a group that also wraps a CUDA backend (a GPU machine), and "cuda" is refused,
// naming the knob, where the group has no CUDA backend. Both run on every machine: the CUDA
// backend here is a recording one, and CUDA tensors are only used where a GPU is.
TEST(Backend, WorkspaceDeviceCpuKeepsAHostWorkspaceBesideACudaBackend) {
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  auto cuda = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cuda");
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->buffer_size = 1 << 20;
  options->workspace_device = "cpu";
  auto pg =
      c10::make_intrusive<ProcessGroupCudaP2P>(test_store(), w.rank, w.size, options, cpu, cuda);
  ASSERT_TRUE(pg->is_p2p_available()) << pg->p2p_unavailable_reason();
  EXPECT_TRUE(pg->workspace()->device().tensor_device().is_cpu());
  std::vector<at::Tensor> t{at::full({5}, static_cast<float>(w.rank + 1))};
  pg->allreduce(t, c10d::AllreduceOptions());
  EXPECT_TRUE(t[0].equal(at::full({5}, static_cast<float>(w.size * (w.size + 1) / 2))));
  EXPECT_EQ(pg->counters().at("all_reduce.one_shot"), 1);
  EXPECT_TRUE(cpu->calls.empty());
  if (gpu_count() > 0) {  // CUDA tensors go to the CUDA backend, opted in or not
    std::vector<at::Tensor> g{at::ones({5}, at::kCUDA)};
    pg->allreduce(g, c10d::AllreduceOptions())->wait();
    EXPECT_EQ(cuda->calls, std::vector<std::string>{"allreduce"});
    EXPECT_EQ(pg->counters().at("all_reduce.wrapped"), 1);
  }
}

// NOTE [Barriers order the GPU] in backend/wrapped_backends.cpp: a group that drives a GPU sends
// every barrier the workspace does not run to its CUDA backend, whatever device torch passed
// ("cpu" from dist.barrier() without device_id); a group that keeps a host workspace beside its
// CUDA backend keeps its CPU barriers on the host.
TEST(Backend, BarriersOfAGroupDrivingAGpuGoToItsCudaBackend) {
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  auto cuda = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cuda");
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->enable_workspace = false;  // no workspace on either build: the wrapped backends only
  auto pg =
      c10::make_intrusive<ProcessGroupCudaP2P>(test_store(), w.rank, w.size, options, cpu, cuda);
  pg->barrier(c10d::BarrierOptions())->wait();  // no device
  c10d::BarrierOptions on_cpu;
  on_cpu.device = c10::Device(c10::DeviceType::CPU);
  pg->barrier(on_cpu)->wait();
  EXPECT_TRUE(cuda->barrier_device_ids.empty());  // no workspace: NCCL's own choice
  c10d::BarrierOptions on_gpu1;
  on_gpu1.device = c10::Device(c10::DeviceType::CUDA, 1);
  pg->barrier(on_gpu1)->wait();
  EXPECT_EQ(cuda->barrier_device_ids, std::vector<int64_t>{1});
  c10d::BarrierOptions named;
  named.device_ids = {3};
  pg->barrier(named)->wait();
  EXPECT_EQ(cuda->barrier_device_ids, std::vector<int64_t>{3});  // the caller's, untouched
  EXPECT_EQ(cuda->calls, (std::vector<std::string>{"barrier", "barrier", "barrier", "barrier"}));
  EXPECT_TRUE(cpu->calls.empty()) << cpu->calls.front();
  EXPECT_EQ(pg->counters().at("barrier.wrapped"), 4);

  // workspace_device "cpu": a host workspace beside the CUDA backend; a barrier on the CPU stays
  // on the host (the CPU backend here: workspace collectives off), one on a GPU goes to NCCL.
  auto cpu2 = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  auto cuda2 = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cuda");
  auto host = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  host->buffer_size = 1 << 20;
  host->workspace_device = "cpu";
  host->workspace_collectives = false;
  auto pg2 =
      c10::make_intrusive<ProcessGroupCudaP2P>(test_store(), w.rank, w.size, host, cpu2, cuda2);
  ASSERT_TRUE(pg2->is_p2p_available()) << pg2->p2p_unavailable_reason();
  pg2->barrier(c10d::BarrierOptions())->wait();
  pg2->barrier(on_cpu)->wait();
  EXPECT_EQ(cpu2->calls, (std::vector<std::string>{"barrier", "barrier"}));
  pg2->barrier(on_gpu1)->wait();
  EXPECT_EQ(cuda2->calls, std::vector<std::string>{"barrier"});
  EXPECT_EQ(cuda2->barrier_device_ids, std::vector<int64_t>{1});
}

TEST(Backend, WorkspaceDeviceCudaIsRefusedWithoutACudaBackend) {
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->workspace_device = "cuda";
  expect_error([&] { ProcessGroupCudaP2P(test_store(), w.rank, w.size, options, cpu, nullptr); },
               "Options.workspace_device asks for a workspace on the GPU ('cuda'), but");
}

// NOTE [Zero-copy collectives] in ops/zero_copy.cpp: the exchange is read by the host, so a group
// whose workspace is on the GPU refuses it, naming the knob.
TEST(Backend, ZeroCopyExchangeIsRefusedOnAGpuWorkspace) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU";
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  auto cuda = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cuda");
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->zero_copy_agreement = "exchange";
  expect_error([&] { ProcessGroupCudaP2P(test_store(), w.rank, w.size, options, cpu, cuda); },
               "Options.zero_copy_agreement asks for 'exchange', which needs a host workspace");
}

TEST(Backend, FallsBackOnlyForWhatTheWorkspaceDoesNotRunAndCountsIt) {
  const auto& w = world();
  auto f = make();
  // bool reductions, several tensors per rank: the wrapped backend.
  std::vector<at::Tensor> flags{at::ones({3}, at::kBool)};
  f.pg->allreduce(flags, c10d::AllreduceOptions())->wait();
  std::vector<at::Tensor> two{at::ones({3}), at::ones({3})};
  f.pg->broadcast(two, c10d::BroadcastOptions())->wait();
  EXPECT_EQ(f.cpu->calls, (std::vector<std::string>{"allreduce", "broadcast"}));
  auto c = f.pg->counters();
  EXPECT_EQ(c.at("all_reduce.wrapped"), 1);
  EXPECT_EQ(c.at("broadcast.wrapped"), 1);
  // Non-contiguous tensors run on the workspace (through a contiguous copy).
  auto base = at::zeros({4, 2});
  std::vector<at::Tensor> column{base.select(1, 1)};
  column[0].fill_(static_cast<float>(w.rank));
  f.pg->allreduce(column, c10d::AllreduceOptions())->wait();
  EXPECT_TRUE(
      base.select(1, 1).equal(at::full({4}, static_cast<float>(w.size * (w.size - 1) / 2))));
  EXPECT_TRUE(base.select(1, 0).equal(at::zeros({4})));
  EXPECT_EQ(f.pg->counters().at("all_reduce.one_shot"), 1);
  // AVG on integers and bitwise ops on floats are errors, on every rank, as with Gloo.
  std::vector<at::Tensor> ints{at::ones({3}, at::kLong)};
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp::AVG;
  EXPECT_THROW(f.pg->allreduce(ints, avg), c10::Error);
  c10d::AllreduceOptions band;
  band.reduceOp = c10d::ReduceOp::BAND;
  std::vector<at::Tensor> floats{at::ones({3})};
  EXPECT_THROW(f.pg->allreduce(floats, band), c10::Error);
  // The group still works afterwards (the errors came before any signal).
  f.pg->allreduce(floats, c10d::AllreduceOptions())->wait();
  EXPECT_TRUE(floats[0].equal(at::full({3}, static_cast<float>(w.size))));
}

TEST(Backend, CollectiveOptionsAndEnvironmentChooseTheAlgorithm) {
  const auto& w = world();
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->all_reduce_algo = "two_shot";
  ::setenv("CUDA_P2P_ALL_REDUCE_ALGO", "one_shot", 1);  // the option wins over the environment
  ::setenv("CUDA_P2P_ALL_GATHER_ALGO", "ring", 1);      // the environment wins over auto
  auto f = make(options);
  ::unsetenv("CUDA_P2P_ALL_REDUCE_ALGO");
  ::unsetenv("CUDA_P2P_ALL_GATHER_ALGO");
  EXPECT_EQ(f.pg->collective_config().all_reduce, ops::AllReduceAlgo::kTwoShot);
  EXPECT_EQ(f.pg->collective_config().all_gather, ops::AllGatherAlgo::kRing);
  std::vector<at::Tensor> t{at::ones({100})};
  f.pg->allreduce(t, c10d::AllreduceOptions())->wait();
  at::Tensor out = at::empty({100 * w.size});
  f.pg->_allgather_base(out, t[0], c10d::AllgatherOptions())->wait();
  EXPECT_TRUE(out.equal(at::full({100 * w.size}, static_cast<float>(w.size))));
  EXPECT_EQ(f.pg->counters().at("all_reduce.two_shot"), 1);
  EXPECT_EQ(f.pg->counters().at("all_gather.ring"), 1);

  auto bad = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  bad->all_gather_algo = "fastest";
  EXPECT_THROW(make(bad), c10::Error);
  auto steps = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  steps->ring_steps = w.size + 1;
  if (w.size > 1) {
    EXPECT_THROW(make(steps), c10::Error);
  }
  ::setenv("CUDA_P2P_ALL_REDUCE_ALGO", "fastest", 1);
  EXPECT_THROW(make(), c10::Error);
  ::unsetenv("CUDA_P2P_ALL_REDUCE_ALGO");
}

TEST(Backend, CollectivesCanBeSentToTheWrappedBackendWithTheWorkspaceUp) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->workspace_collectives = false;
  auto f = make(options);
  EXPECT_TRUE(f.pg->is_p2p_available());
  EXPECT_FALSE(f.pg->uses_workspace_collectives());
  std::vector<at::Tensor> t{at::ones({3})};
  f.pg->allreduce(t, c10d::AllreduceOptions())->wait();
  f.pg->barrier(c10d::BarrierOptions())->wait();
  EXPECT_EQ(f.cpu->calls, (std::vector<std::string>{"allreduce", "barrier"}));
  ::setenv("CUDA_P2P_WORKSPACE_COLLECTIVES", "0", 1);
  auto g = make();
  ::setenv("CUDA_P2P_WORKSPACE_COLLECTIVES", "nope", 1);
  EXPECT_THROW(make(), c10::Error);
  ::unsetenv("CUDA_P2P_WORKSPACE_COLLECTIVES");
  EXPECT_FALSE(g.pg->uses_workspace_collectives());
  g.pg->allreduce(t, c10d::AllreduceOptions())->wait();
  EXPECT_EQ(g.pg->counters().at("all_reduce.wrapped"), 1);
}

TEST(Backend, AllGatherVWithoutTheWorkspacePadsAndGathers) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->enable_workspace = false;
  auto f = make(options);
  std::vector<int64_t> sizes(world().size, 1);
  sizes[0] = 3;
  auto out = f.pg->all_gather_v(at::ones({sizes[world().rank], 4}), sizes);
  EXPECT_EQ(out.size(0), world().size + 2);
  EXPECT_EQ(f.cpu->calls, (std::vector<std::string>{"_allgather_base"}));
  EXPECT_EQ(f.pg->counters().at("all_gather_v.wrapped"), 1);
  EXPECT_THROW(f.pg->all_gather_v(at::ones({2, 4}), sizes), c10::Error);  // wrong row count
}

TEST(Backend, RejectsTensorsNoBackendServes) {
  auto f = make();
  std::vector<at::Tensor> meta{at::empty({3}, at::TensorOptions().device(at::kMeta))};
  EXPECT_THROW(f.pg->allreduce(meta, c10d::AllreduceOptions()), c10::Error);
  std::vector<at::Tensor> mixed{at::ones({3}), meta[0]};
  try {
    f.pg->allreduce(mixed, c10d::AllreduceOptions());
    ADD_FAILURE() << "mixed devices accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("one device type"), std::string::npos) << e.what();
  }
  std::vector<at::Tensor> none;
  EXPECT_THROW(f.pg->allreduce(none, c10d::AllreduceOptions()), c10::Error);
  EXPECT_TRUE(f.cpu->calls.empty());
}

TEST(Backend, RejectsSendToItselfOrOutOfRange) {
  auto f = make();
  std::vector<at::Tensor> t{at::ones({2})};
  EXPECT_THROW(f.pg->send(t, world().rank, 0), c10::Error);
  EXPECT_THROW(f.pg->send(t, world().size, 0), c10::Error);
  EXPECT_THROW(f.pg->recv(t, -1, 0), c10::Error);
  EXPECT_TRUE(f.cpu->calls.empty());
}

TEST(Backend, CoalescingCollectsEveryCpuWork) {
  auto f = make();
  std::vector<at::Tensor> a{at::full({2}, 1.0)}, b{at::full({3}, 2.0)};
  f.pg->startCoalescing();
  EXPECT_THROW(f.pg->startCoalescing(), c10::Error);
  f.pg->allreduce(a, c10d::AllreduceOptions());
  f.pg->allreduce(b, c10d::AllreduceOptions());
  auto work = f.pg->endCoalescing();
  auto coalesced = c10::dynamic_intrusive_pointer_cast<ops::CoalescedWork>(work);
  ASSERT_TRUE(coalesced);
  EXPECT_EQ(coalesced->works().size(), 2u);
  EXPECT_TRUE(work->wait());
  EXPECT_TRUE(work->isCompleted());
  auto fut = work->getFuture();
  ASSERT_TRUE(fut->completed());
  auto values = fut->value().toTensorVector();
  ASSERT_EQ(values.size(), 2u);
  EXPECT_TRUE(values[1].equal(b[0]));
  // Outside coalescing, nothing is collected; ending twice is an error.
  EXPECT_THROW(f.pg->endCoalescing(), c10::Error);
  f.pg->startCoalescing();
  auto empty = f.pg->endCoalescing();
  EXPECT_TRUE(empty->wait());
  EXPECT_TRUE(empty->getFuture()->completed());
}

TEST(Harness, StoreIsSharedByAllRanks) {
  auto store = test_store();
  store->set("rank" + std::to_string(world().rank), std::vector<uint8_t>{'x'});
  for (int r = 0; r < world().size; ++r) {
    store->wait({"rank" + std::to_string(r)});
  }
  EXPECT_EQ(store->add("count", 1) <= world().size, true);
  store_barrier("done");
  EXPECT_EQ(store->add("count", 0), world().size);
}

}  // namespace
}  // namespace cuda_p2p::test
