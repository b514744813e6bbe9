// SendRecv: the engine of a group's send, recv and recvAnysource on a host workspace, through
// per-rank mailboxes beside it (p2p_workspace/messages/mailboxes.cpp, NOTE [Mailboxes];
// docs/send_recv.md): messages are not collectives, so they keep out of the
// collective buffer and its one order per group. It owns the mailboxes (made on first use) and
// their lock; the Work of a message is MailboxWork (backend/works.hpp).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "backend/engine_context.hpp"
#include "p2p_workspace/messages/mailboxes.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

class WorkspaceCollectives;

class SendRecv {
 public:
  // `collectives` outlives this; the mailboxes are made on the workspace's (host) device.
  SendRecv(const EngineContext& group, const WorkspaceCollectives& collectives);

  // Why a send or receive of `tensors` goes to the wrapped backend (nullptr: the mailboxes take
  // it). Depends only on what both ranks of a pair agree on, so that both take the same path.
  const char* rejects(c10::ArrayRef<at::Tensor> tensors) const;
  // Posts a send (`type` SEND) or receive (RECV, RECVANYSOURCE with `peer` -1) of `tensor`, which
  // fails after `timeout`; its Work (like Gloo's: wait() drives the group's pending messages).
  c10::intrusive_ptr<c10d::Work> post(c10d::OpType type, const at::Tensor& tensor, int peer,
                                      int tag, std::chrono::milliseconds timeout);
  // A shutdown's flush (NOTE [Shutdown flushes]): waits at most `limit` until the receivers took
  // every message this rank sent; warns naming those that did not.
  void flush(std::chrono::milliseconds limit);
  // Fails the pending and later messages with `why` (abort, shutdown).
  void fail(const std::string& why);
  // The group's new timeout, for the mailboxes' mappings (made or to be made).
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  std::shared_ptr<host::Mailboxes> mailboxes();   // made on the first use
  std::shared_ptr<host::Mailboxes> made() const;  // or null

  const EngineContext group_;
  const WorkspaceCollectives& collectives_;
  mutable std::mutex mutex_;
  std::shared_ptr<host::Mailboxes> mailboxes_;
};

}  // namespace cuda_p2p
