// The Work of a collective that ran on the workspace: on the host it has completed when the call
// returns; on CUDA it is enqueued on the caller's current stream, which is all a stream-ordered
// consumer needs (as with NCCL after wait()). Its future is completed and holds the outputs;
// for CUDA outputs the future records an event on the current stream, so that callbacks and
// waiters on other streams are ordered after the collective.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace cuda_p2p {

class CompletedWork : public c10d::Work {
 public:
  CompletedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace cuda_p2p
