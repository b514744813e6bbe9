#include "ops/coalesced_work.hpp"

#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace cuda_p2p::ops {

namespace {

std::vector<at::Tensor> concat_results(const std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  std::vector<at::Tensor> out;
  for (const auto& w : works) {
    for (auto& t : w->result()) out.push_back(std::move(t));
  }
  return out;
}

// Called when every future has completed without error (the Works themselves may not be marked
// completed yet, so their result() cannot be used here).
std::vector<at::Tensor> concat_values(
    const std::vector<c10::intrusive_ptr<c10::ivalue::Future>>& futures) {
  std::vector<at::Tensor> out;
  for (const auto& f : futures) {
    const auto& v = f->constValue();
    if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) out.push_back(t);
    } else if (v.isTensor()) {
      out.push_back(v.toTensor());
    }
  }
  return out;
}

}  // namespace

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

// Built on first use: some Works (Gloo's send/recv) have no future, and must not make the
// coalesced Work unusable for those who only wait().
c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (future_) return future_;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  for (auto& w : works_) {
    try {
      futures.push_back(w->getFuture());
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "cuda_p2p: a coalesced operation (",
                  c10d::opTypeToString(w->retrieveOpType()),
                  ") comes from a backend that offers no future for it; call wait() instead (",
                  e.what_without_backtrace(), ")");
    }
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  if (futures.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return future_;
  }
  // The future completes when the last sub-future does; the first error wins.
  struct State {
    std::atomic<size_t> pending;
    std::mutex mu;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  state->pending = futures.size();
  auto future = future_;
  for (auto& f : futures) {
    f->addCallback([state, futures, future](c10::ivalue::Future& f) {
      if (f.hasError()) {
        std::lock_guard<std::mutex> lock(state->mu);
        if (!state->error) state->error = f.exception_ptr();
      }
      if (--state->pending == 0) {
        if (state->error) {
          future->setError(state->error);
        } else {
          future->markCompleted(c10::IValue(concat_values(futures)));
        }
      }
    });
  }
  return future_;
}

bool CoalescedWork::isCompleted() {
  for (auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (const auto& w : works_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (const auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

std::vector<at::Tensor> CoalescedWork::result() { return concat_results(works_); }

void CoalescedWork::synchronize() {
  for (auto& w : works_) w->synchronize();
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  bool ok = true;
  for (auto& w : works_) ok = w->wait(timeout) && ok;
  return ok;
}

void CoalescedWork::abort() {
  for (auto& w : works_) w->abort();
}

}  // namespace cuda_p2p::ops
