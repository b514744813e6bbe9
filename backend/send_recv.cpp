// SendRecv (backend/send_recv.hpp). batch_isend_irecv is these under coalescing.
#include "backend/send_recv.hpp"

#include <c10/util/Exception.h>

#include <thread>
#include <utility>

#include "backend/counters.hpp"
#include "backend/workspace_collectives.hpp"

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

namespace {

// The Work of a send or receive through the mailboxes. Like Gloo's: wait() blocks until the op
// has ended (driving the group's pending ops meanwhile) and raises its error; is_completed()
// drives them once without blocking; source_rank() names the rank a receive from any rank got
// its message from.
class MailboxWork : public Work {
 public:
  MailboxWork(int rank, c10d::OpType type, std::shared_ptr<host::Mailboxes> mailboxes,
              host::P2POpPtr op)
      : Work(rank, type), mailboxes_(std::move(mailboxes)), op_(std::move(op)) {}

  bool isCompleted() override { return mailboxes_->poll(*op_); }
  bool isSuccess() const override { return op_->done() && !op_->error(); }
  std::exception_ptr exception() const override { return op_->error(); }
  int sourceRank() const override {
    TORCH_CHECK(op_->peer() >= 0, "cuda_p2p: source_rank(): the receive has matched no message");
    return op_->peer();
  }
  std::vector<at::Tensor> result() override {
    return op_->future()->completed() && !op_->future()->hasError()
               ? op_->future()->value().toTensorVector()
               : std::vector<at::Tensor>{};
  }
  bool wait(std::chrono::milliseconds timeout) override {
    TORCH_CHECK(timeout == kNoTimeout || timeout.count() >= 0,
                "cuda_p2p: Work.wait(timeout): the timeout must be >= 0, got ", timeout.count(),
                " ms");
    if (timeout != kNoTimeout) {
      // A bounded wait: poll until the op ends or the bound passes (the op itself keeps the
      // group's timeout).
      const auto until = std::chrono::steady_clock::now() + timeout;
      while (!mailboxes_->poll(*op_)) {
        TORCH_CHECK(std::chrono::steady_clock::now() < until, "cuda_p2p: Work.wait(",
                    timeout.count(), " ms) of a ", c10d::opTypeToString(opType_),
                    " timed out with the op still pending (it stays pending)");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    mailboxes_->wait(*op_);
    return true;
  }
  void synchronize() override { mailboxes_->wait(*op_); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return op_->future(); }

 private:
  std::shared_ptr<host::Mailboxes> mailboxes_;
  host::P2POpPtr op_;
};

}  // namespace

SendRecv::SendRecv(const EngineContext& group, const WorkspaceCollectives& collectives)
    : group_(group), collectives_(collectives) {}

const char* SendRecv::rejects(c10::ArrayRef<at::Tensor> tensors) const {
  if (const char* why = collectives_.rejects(tensors)) return why;
  if (!collectives_.on_host()) return "send/recv of CUDA tensors go to NCCL (host mailboxes only)";
  if (tensors.size() != 1) return reason::kSeveralTensors;
  return nullptr;
}

std::shared_ptr<host::Mailboxes> SendRecv::mailboxes() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!mailboxes_) {
    mailboxes_ = std::make_shared<host::Mailboxes>(
        group_.store, group_.rank, group_.size, group_.workspace->device_ptr(),
        group_.config.mailbox_slot_bytes, group_.workspace->timeout());
  }
  return mailboxes_;
}

void SendRecv::set_timeout(std::chrono::milliseconds timeout) {
  if (auto m = made()) m->set_timeout(timeout);
}

std::shared_ptr<host::Mailboxes> SendRecv::made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mailboxes_;
}

c10::intrusive_ptr<c10d::Work> SendRecv::post(c10d::OpType type, const at::Tensor& tensor, int peer,
                                              int tag, std::chrono::milliseconds timeout) {
  auto mb = mailboxes();
  auto posted = type == c10d::OpType::SEND ? mb->send(tensor, peer, tag, timeout)
                                           : mb->recv(tensor, peer, tag, timeout);
  return c10::make_intrusive<MailboxWork>(group_.rank, type, std::move(mb), std::move(posted));
}

void SendRecv::flush(std::chrono::milliseconds limit) {
  const auto mb = made();
  if (!mb) return;
  const std::string missing = mb->flush(limit);
  if (!missing.empty()) {
    TORCH_WARN("cuda_p2p: rank ", group_.rank, "'s shutdown: rank(s) ", missing,
               " did not receive every message this rank sent them within the group's timeout (",
               limit.count(), " ms); those messages are dropped (NOTE [Shutdown flushes])");
  }
}

void SendRecv::fail(const std::string& why) {
  if (const auto mb = made()) mb->fail("cuda_p2p send/recv: " + why);
}

}  // namespace cuda_p2p
