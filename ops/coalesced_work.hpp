// A Work over several Works: what endCoalescing() returns for operations that their backend ran
// one by one, and what a pipeline's exchange over a wrapped backend's send/recv returns. It
// completes when all of them have, fails with the first failure, and its future holds the
// concatenation of their results.
#pragma once

#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace cuda_p2p::ops {

class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  const std::vector<c10::intrusive_ptr<c10d::Work>>& works() const { return works_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace cuda_p2p::ops
