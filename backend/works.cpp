// The backend's Work types (backend/works.hpp).
#include "backend/works.hpp"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "p2p_workspace/messages/mailboxes.hpp"

namespace cuda_p2p {

namespace {

std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (t.defined() && !t.is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

}  // namespace

EventWork::EventWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                     std::shared_ptr<Device> device, std::shared_ptr<Event> end,
                     std::shared_ptr<AbortHooks> hooks)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      device_(std::move(device)),
      end_(std::move(end)),
      hooks_(std::move(hooks)) {
  // On a GPU markCompleted records an event on the current stream, the op's: not later, when the
  // caller may have moved to another stream.
  if (device_ && !device_->tensor_device().is_cpu()) make_future();
  finish();
}

void EventWork::make_future() {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                     devices_of(outputs_));
  future_->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10::ivalue::Future> EventWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (future_) return future_;
  if (device_ && end_) {
    // CPU outputs of an op still queued (a host device with CUDA's semantics): the future's
    // callbacks and waiters read them on the host, so it completes once the op has run - or holds
    // its failure.
    try {
      synchronize();
    } catch (const std::exception&) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), devices_of(outputs_));
      future_->setError(std::current_exception());
      return future_;
    }
  }
  make_future();
  return future_;
}

bool EventWork::isCompleted() {
  if (!device_ || !end_) return true;  // the host: complete on return
  return failed() || device_->query(*end_);
}

bool EventWork::isSuccess() const { return !device_ || !failed(); }

bool EventWork::failed() const {
  try {
    device_->check_work("Work.is_completed");
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

// NOTE [Errors of queued ops]
// On a GPU (and a host device with CUDA's semantics) an op returns queued, and its failure - a
// wait that missed its deadline on the stream, a peer's failure - fails the device later, in the
// thread that runs the stream (or the watchdog). It reaches the caller through this Work (wait,
// synchronize, the future) or the group's next op. Either way the group's abort hooks run first,
// in the caller's thread (a Python hook takes the GIL: the thread running the stream must not
// wait for it), once (NOTE [Abort hooks] in backend/abort_hooks.cpp); getError() already names
// the failure then (NOTE [Error kinds]). The hooks are the group's, shared with its Works: a Work
// that outlives its group finds them disarmed by the shutdown (a shutdown is no abort). A Work's
// own timeout (wait(timeout) on an op still queued) fails nothing and runs no hook.
void EventWork::hooks_on_failure() const noexcept {
  if (!hooks_ || !device_) return;
  try {
    device_->check_healthy("Work");
  } catch (const c10::Error& e) {
    hooks_->run(e.what_without_backtrace());
  } catch (...) {  // NOLINT(bugprone-empty-catch): the caller's own error propagates
  }
}

bool EventWork::wait(std::chrono::milliseconds timeout) {
  try {
    wait_impl(timeout);
  } catch (...) {
    hooks_on_failure();
    throw;
  }
  return true;
}

void EventWork::synchronize() {
  try {
    synchronize_impl();
  } catch (...) {
    hooks_on_failure();
    throw;
  }
}

void EventWork::wait_impl(std::chrono::milliseconds timeout) {
  if (!device_) return;  // the host: complete on return
  device_->check_work("Work.wait");
  if (!end_) return;
  if (end_->captured()) {
    // NOTE [Captured events] (p2p_workspace/device.hpp): captured, not run; the graph's replay
    // runs it, and a replay's failure reaches the group's next call.
    device_->wait_event(*device_->current_stream(), *end_);
    return;
  }
  // As NCCL's Work: with a timeout the host blocks until the op has run and raises past it.
  if (timeout != ::kNoTimeout) wait_for_end(timeout);
  if (device_->tensor_device().is_cpu()) {
    // CPU outputs are read by the calling thread itself, not by work on its current stream: the
    // op must have run when wait() returns (a host device with CUDA's semantics).
    synchronize_impl();
  } else {
    device_->wait_event(*device_->current_stream(), *end_);
    // NOTE [Mismatches reach the Work]: raised where the op has run already.
    if (mismatch_check_ && device_->query(*end_)) mismatch_check_();
  }
}

void EventWork::wait_for_end(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(1);
  // Each query of a host device with CUDA's semantics also runs a step of its streams.
  while (!device_->query(*end_)) {
    device_->check_work("Work.wait");
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                "cuda_p2p: Work.wait(timeout=", timeout.count(), " ms) on rank ", rank_, ": the ",
                c10d::opTypeToString(opType_),
                " has not run by then (it is still queued behind its stream's earlier work or "
                "a peer is late; the group's own timeout fails the group)");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// NOTE [Mismatches reach the Work]
// Where the ranks' signatures are compared in stream order (a GPU; a host device with CUDA's
// semantics: NOTE [Op signatures] in ops/op_signature.cpp), an op whose ranks passed different
// arguments returns queued, and its comparison records the disagreement when the stream reaches
// it. A caller that waits for the op's Work and reads its outputs must not get them without an
// error: so once the op has run - synchronize(), wait() for CPU outputs (which synchronizes), and
// wait() on a GPU where the op's end has already run - the Work asks the group's records and
// raises the disagreement (naming every rank and what it passed), failing the group's device
// with it, as the group's next op would: every later call raises it too. The check reads the
// group's records, not the op's own: a disagreement of an earlier op nobody waited for is raised
// here as well ("this one or an earlier one"). On a GPU whose op has not run yet, wait() only
// orders the caller's stream after it (as NCCL's Work); synchronize() and the next op raise.
void EventWork::synchronize_impl() {
  if (!device_) return;
  // A device retired after a drain (NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp)
  // has run this op to its end, and its synchronize() would raise the retirement: only
  // check_work speaks then.
  bool healthy = true;
  try {
    device_->check_healthy("Work.synchronize");
  } catch (const c10::Error&) {
    healthy = false;
  }
  if (end_ && healthy) device_->synchronize(*end_);
  device_->check_work("Work.synchronize");
  if (mismatch_check_) mismatch_check_();
}

// --- MailboxWork ---------------------------------------------------------------------------------

MailboxWork::MailboxWork(int rank, c10d::OpType type, std::shared_ptr<host::Mailboxes> mailboxes,
                         std::shared_ptr<host::P2POp> op)
    : c10d::Work(rank, type), mailboxes_(std::move(mailboxes)), op_(std::move(op)) {}

bool MailboxWork::isCompleted() { return mailboxes_->poll(*op_); }

bool MailboxWork::isSuccess() const { return op_->done() && !op_->error(); }

std::exception_ptr MailboxWork::exception() const { return op_->error(); }

int MailboxWork::sourceRank() const {
  TORCH_CHECK(op_->peer() >= 0, "cuda_p2p: source_rank(): the receive has matched no message");
  return op_->peer();
}

std::vector<at::Tensor> MailboxWork::result() {
  return op_->future()->completed() && !op_->future()->hasError()
             ? op_->future()->value().toTensorVector()
             : std::vector<at::Tensor>{};
}

bool MailboxWork::wait(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout == ::kNoTimeout || timeout.count() >= 0,
              "cuda_p2p: Work.wait(timeout): the timeout must be >= 0, got ", timeout.count(),
              " ms");
  if (timeout != ::kNoTimeout) {
    // A bounded wait: poll until the op ends or the bound passes (the op itself keeps the
    // group's timeout).
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!mailboxes_->poll(*op_)) {
      TORCH_CHECK(std::chrono::steady_clock::now() < until, "cuda_p2p: Work.wait(", timeout.count(),
                  " ms) of a ", c10d::opTypeToString(opType_),
                  " timed out with the op still pending (it stays pending)");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  mailboxes_->wait(*op_);
  return true;
}

void MailboxWork::synchronize() { mailboxes_->wait(*op_); }

c10::intrusive_ptr<c10::ivalue::Future> MailboxWork::getFuture() { return op_->future(); }

}  // namespace cuda_p2p
