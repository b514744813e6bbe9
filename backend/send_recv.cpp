// SendRecv (backend/send_recv.hpp). batch_isend_irecv is these under coalescing.
#include "backend/send_recv.hpp"

#include <c10/util/Exception.h>

#include <utility>

#include "backend/counters.hpp"
#include "backend/works.hpp"
#include "backend/workspace_collectives.hpp"

namespace cuda_p2p {

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
