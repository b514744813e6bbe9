// The Works the backend hands back, in one place: a workspace collective's (EventWork) and a
// send's or receive's through the mailboxes (MailboxWork). The third, CoalescedWork (several
// Works as one: endCoalescing(), a pipeline's exchange over a wrapped backend's send/recv), is
// ops/coalesced_work.hpp: the fused pipelines in ops/ make it, and ops may not include backend/.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "backend/abort_hooks.hpp"
#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

namespace host {
class Mailboxes;
class P2POp;
}  // namespace host

// The Work of a collective that ran on the workspace. On a synchronous host device it has
// completed when the call returns, and its wait() is free. On CUDA (and on a host device with
// CUDA's semantics) it is enqueued on the caller's stream; like NCCL's
// Work, isCompleted() says whether the event recorded at the op's end has run, wait() makes the
// caller's current stream wait for that event (with a timeout, or for CPU outputs, which the
// calling thread reads itself, it blocks the host until the event has run) and synchronize()
// blocks the host until it has run; wait and synchronize raise the device's failure (a wait that
// missed its deadline, an abort: NOTE [Device failure] in p2p_workspace/watchdog.hpp). Its future
// is completed and holds the outputs; for CUDA outputs the future records an event on the current
// stream, so that callbacks and waiters on other streams are ordered after the collective.
class EventWork : public c10d::Work {
 public:
  // `device` and `end` only for work enqueued on a GPU (null on the host); `hooks`, the group's
  // abort hooks, run before a failure of the device this Work finds reaches its caller (NOTE
  // [Errors of queued ops] in works.cpp).
  EventWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::shared_ptr<Device> device = nullptr, std::shared_ptr<Event> end = nullptr,
            std::shared_ptr<AbortHooks> hooks = nullptr);

  // On a GPU: whether the op's end event has run (asked without blocking), or the device failed
  // (then wait() and synchronize() raise the failure, as NCCL's Work does).
  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // On the host made on the first call: a synchronous dist.all_reduce never asks for it, and a
  // completed Future (a list type, an IValue list of the outputs, its mutex and condition
  // variable) is a part of a small collective's cost (docs/collectives.md, "Against DeepSpeed").
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // Called once the op has run, before wait() or synchronize() return: raises a disagreement of
  // the ranks that the op's comparison recorded in stream order (NOTE [Mismatches reach the
  // Work] in works.cpp).
  void set_mismatch_check(std::function<void()> check) { mismatch_check_ = std::move(check); }

 private:
  void make_future();
  // Blocks the host until the op's end event has run; raises the device's failure, or an error
  // once `timeout` has passed.
  void wait_for_end(std::chrono::milliseconds timeout);
  // Whether the device has failed (an abort, a missed deadline): the op will never complete.
  bool failed() const;
  // Runs the group's abort hooks when the device has failed (NOTE [Errors of queued ops]).
  void hooks_on_failure() const noexcept;
  void wait_impl(std::chrono::milliseconds timeout);
  void synchronize_impl();

  std::vector<at::Tensor> outputs_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<Event> end_;
  std::shared_ptr<AbortHooks> hooks_;
  std::function<void()> mismatch_check_;
};

// The Work of a send or receive through the mailboxes (backend/send_recv.hpp). Like Gloo's: wait()
// blocks until the op has ended (driving the group's pending ops meanwhile) and raises its error;
// is_completed() drives them once without blocking; source_rank() names the rank a receive from
// any rank got its message from.
class MailboxWork : public c10d::Work {
 public:
  MailboxWork(int rank, c10d::OpType type, std::shared_ptr<host::Mailboxes> mailboxes,
              std::shared_ptr<host::P2POp> op);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::shared_ptr<host::Mailboxes> mailboxes_;
  std::shared_ptr<host::P2POp> op_;
};

}  // namespace cuda_p2p
