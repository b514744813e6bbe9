// ProcessGroupCudaP2P's send, recv and recvAnysource: through the group's mailboxes
// (p2p_workspace/host/mailboxes.cpp, NOTE [Mailboxes]) on a host workspace, else on the wrapped
// backend, counted (docs/collectives.md, "Send and receive"). batch_isend_irecv is these under
// coalescing.
#include <c10/util/Exception.h>

#include <utility>

#include "backend/ProcessGroupCudaP2P.hpp"

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

void check_peer(int peer, int W, int me, const char* what, const char* role) {
  TORCH_CHECK(peer >= 0 && peer < W && peer != me, "cuda_p2p ", what, ": ", role,
              " must be another rank in [0, ", W, "), got ", peer, " on rank ", me);
}

}  // namespace

const char* ProcessGroupCudaP2P::mailbox_rejects(const std::vector<at::Tensor>& tensors) const {
  if (const char* why = workspace_rejects(tensors)) return why;
  if (!workspace_on_host()) return "send/recv of CUDA tensors go to NCCL (host mailboxes only)";
  if (tensors.size() != 1) return "several tensors";
  return nullptr;
}

std::shared_ptr<host::Mailboxes> ProcessGroupCudaP2P::mailboxes() {
  std::lock_guard<std::mutex> lock(mailboxes_mutex_);
  if (!mailboxes_) {
    mailboxes_ = std::make_shared<host::Mailboxes>(
        store_, getRank(), getSize(), workspace_->device_ptr(), config_.mailbox_slot_bytes);
  }
  return mailboxes_;
}

void ProcessGroupCudaP2P::flush_mailboxes(std::chrono::milliseconds limit) {
  std::shared_ptr<host::Mailboxes> mb;
  {
    std::lock_guard<std::mutex> lock(mailboxes_mutex_);
    mb = mailboxes_;
  }
  if (!mb) return;
  const std::string missing = mb->flush(limit);
  if (!missing.empty()) {
    TORCH_WARN("cuda_p2p: rank ", getRank(), "'s shutdown: rank(s) ", missing,
               " did not receive every message this rank sent them within the group's timeout (",
               limit.count(), " ms); those messages are dropped (NOTE [Shutdown flushes])");
  }
}

void ProcessGroupCudaP2P::fail_mailboxes(const std::string& why) {
  std::shared_ptr<host::Mailboxes> mb;
  {
    std::lock_guard<std::mutex> lock(mailboxes_mutex_);
    mb = mailboxes_;
  }
  if (mb) mb->fail("cuda_p2p send/recv: " + why);
}

WorkPtr ProcessGroupCudaP2P::p2p(std::vector<at::Tensor>& tensors, c10d::OpType type, int peer,
                                 int tag, c10::function_ref<WorkPtr(c10d::Backend&)> wrapped) {
  const bool send = type == c10d::OpType::SEND, recv = type == c10d::OpType::RECV;
  const Counters::Op op = send   ? Counters::Op::kSend
                          : recv ? Counters::Op::kRecv
                                 : Counters::Op::kRecvAnysource;
  if (const char* why = mailbox_rejects(tensors)) {
    counters_->fallback(op, why);
    return delegate(tensors, send ? "send" : recv ? "recv" : "recv_anysource", wrapped);
  }
  auto mb = mailboxes();
  auto posted = type == c10d::OpType::SEND ? mb->send(tensors[0], peer, tag, options_->timeout)
                                           : mb->recv(tensors[0], peer, tag, options_->timeout);
  counters_->record(op, "direct");
  return track(c10::make_intrusive<MailboxWork>(getRank(), type, std::move(mb), std::move(posted)));
}

WorkPtr ProcessGroupCudaP2P::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_peer(dst_rank, getSize(), getRank(), "send", "the destination");
  return p2p(tensors, c10d::OpType::SEND, dst_rank, tag,
             [&](c10d::Backend& b) { return b.send(tensors, dst_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_peer(src_rank, getSize(), getRank(), "recv", "the source");
  return p2p(tensors, c10d::OpType::RECV, src_rank, tag,
             [&](c10d::Backend& b) { return b.recv(tensors, src_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return p2p(tensors, c10d::OpType::RECVANYSOURCE, -1, tag,
             [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

}  // namespace cuda_p2p
