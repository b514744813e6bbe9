// ProcessGroupCudaP2P without Python: construction, options, argument checks and routing, with
// recording stand-ins for the wrapped backends.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>

#include "backend/CoalescedWork.hpp"
#include "backend/ProcessGroupCudaP2P.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

// A wrapped backend that records which collective reached it and completes at once.
class RecordingBackend : public c10d::Backend {
 public:
  RecordingBackend(int rank, int size, std::string name)
      : c10d::Backend(rank, size), name_(std::move(name)) {}
  const std::string getBackendName() const override { return name_; }

  std::vector<std::string> calls;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions&) override {
    return done("allreduce", tensors);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions&) override {
    return done("broadcast", tensors);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor&,
                                                 const c10d::AllgatherOptions&) override {
    return done("_allgather_base", {out});
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int, int) override {
    return done("send", tensors);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return done("barrier", {});
  }

 private:
  c10::intrusive_ptr<c10d::Work> done(const std::string& op, std::vector<at::Tensor> result) {
    calls.push_back(op);
    auto fut = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(result));
    return c10::make_intrusive<CompletedWork>(getRank(), std::move(fut), std::move(result));
  }

  class CompletedWork : public c10d::Work {
   public:
    CompletedWork(int rank, c10::intrusive_ptr<c10::ivalue::Future> fut,
                  std::vector<at::Tensor> result)
        : c10d::Work(rank), fut_(std::move(fut)), result_(std::move(result)) {
      finish();
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }
    std::vector<at::Tensor> result() override { return result_; }

   private:
    c10::intrusive_ptr<c10::ivalue::Future> fut_;
    std::vector<at::Tensor> result_;
  };

  std::string name_;
};

struct Fixture {
  c10::intrusive_ptr<RecordingBackend> cpu;
  c10::intrusive_ptr<ProcessGroupCudaP2P> pg;
};

Fixture make(c10::intrusive_ptr<ProcessGroupCudaP2P::Options> options = {}) {
  const auto& w = world();
  Fixture f;
  f.cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  f.pg = c10::make_intrusive<ProcessGroupCudaP2P>(test_store(), w.rank, w.size, options, f.cpu,
                                                  nullptr);
  return f;
}

TEST(Backend, ConstructsWithDefaultsAndReportsItself) {
  auto f = make();
  EXPECT_EQ(f.pg->getRank(), world().rank);
  EXPECT_EQ(f.pg->getSize(), world().size);
  EXPECT_EQ(f.pg->getBackendName(), "cuda_p2p");
  auto opts = c10::dynamic_intrusive_pointer_cast<ProcessGroupCudaP2P::Options>(
      f.pg->getBackendOptions());
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
}

TEST(Backend, RejectsBadConstructionArguments) {
  const auto& w = world();
  auto cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "cpu");
  auto store = test_store();
  auto expect_error = [&](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { ProcessGroupCudaP2P(store, w.size, w.size, {}, cpu, nullptr); },
               "rank must be in [0, " + std::to_string(w.size) + "), got " +
                   std::to_string(w.size));
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
               "buffer_size must be positive");
}

TEST(Backend, RoutesCpuTensorsToTheCpuBackend) {
  auto f = make();
  std::vector<at::Tensor> t{at::ones({7})};
  EXPECT_TRUE(f.pg->allreduce(t, c10d::AllreduceOptions())->wait());
  EXPECT_TRUE(f.pg->broadcast(t, c10d::BroadcastOptions())->wait());
  at::Tensor out = at::empty({7 * world().size});
  f.pg->_allgather_base(out, t[0], c10d::AllgatherOptions())->wait();
  f.pg->barrier(c10d::BarrierOptions())->wait();
  EXPECT_EQ(f.cpu->calls,
            (std::vector<std::string>{"allreduce", "broadcast", "_allgather_base", "barrier"}));
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
  auto coalesced = c10::dynamic_intrusive_pointer_cast<CoalescedWork>(work);
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
