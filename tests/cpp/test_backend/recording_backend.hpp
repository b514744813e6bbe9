// The shared part of test_backend (tests/cpp/test_backend.cpp and the files of this folder, one
// binary): a wrapped backend that records which collective reached it, and the group over it.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test::backend_tests {

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
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    barrier_device_ids = opts.device_ids;
    return done("barrier", {});
  }
  std::vector<int64_t> barrier_device_ids;  // of the last barrier
  // c10d::Backend's own setTimeout throws in torch 2.11 and warns in 2.14 (found on the GPU
  // machine's torch 2.11): record the value instead, as Gloo and NCCL take it.
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ms = timeout.count(); }
  int64_t timeout_ms = -1;

 private:
  c10::intrusive_ptr<c10d::Work> done(const std::string& op, std::vector<at::Tensor> result) {
    calls.push_back(op);
    auto fut =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(result));
    return c10::make_intrusive<ReadyWork>(getRank(), std::move(fut), std::move(result));
  }

  class ReadyWork : public c10d::Work {
   public:
    ReadyWork(int rank, c10::intrusive_ptr<c10::ivalue::Future> fut, std::vector<at::Tensor> result)
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

inline Fixture make(c10::intrusive_ptr<ProcessGroupCudaP2P::Options> options = {}) {
  const auto& w = world();
  Fixture f;
  f.cpu = c10::make_intrusive<RecordingBackend>(w.rank, w.size, "recording-cpu");
  f.pg = c10::make_intrusive<ProcessGroupCudaP2P>(test_store(), w.rank, w.size, options, f.cpu,
                                                  nullptr);
  return f;
}

}  // namespace cuda_p2p::test::backend_tests
