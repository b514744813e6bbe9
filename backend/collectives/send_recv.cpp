// send, recv and recv_anysource: the host mailboxes (SendRecv), else the wrapped backend.
#include "backend/entry_sequence.hpp"

namespace cuda_p2p {

using c10d::OpType;
using ops::OpId;

namespace {

void check_peer(int peer, int W, int me, const char* what, const char* role) {
  TORCH_CHECK(peer >= 0 && peer < W && peer != me, "cuda_p2p ", what, ": ", role,
              " must be another rank in [0, ", W, "), got ", peer, " on rank ", me);
}

}  // namespace

template <typename Wrapped>
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::send_or_recv(std::vector<at::Tensor>& tensors,
                                                               c10d::OpType type, int peer, int tag,
                                                               Wrapped&& wrapped) {
  const bool send = type == OpType::SEND, recv = type == OpType::RECV;
  const OpId op = send ? OpId::kSend : recv ? OpId::kRecv : OpId::kRecvAnysource;
  if (const char* why = send_recv_.rejects(tensors)) {
    counters_.fallback(op, why);
    return wrapped_.delegate(tensors, ops::spec(op).c10d_name, wrapped);
  }
  auto work = send_recv_.post(type, tensors[0], peer, tag, options_->timeout);
  counters_.record(op, "direct");
  return wrapped_.track(std::move(work));
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::send(std::vector<at::Tensor>& tensors,
                                                       int dst_rank, int tag) {
  check_peer(dst_rank, getSize(), getRank(), "send", "the destination");
  return send_or_recv(tensors, OpType::SEND, dst_rank, tag,
                      [&](c10d::Backend& b) { return b.send(tensors, dst_rank, tag); });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::recv(std::vector<at::Tensor>& tensors,
                                                       int src_rank, int tag) {
  check_peer(src_rank, getSize(), getRank(), "recv", "the source");
  return send_or_recv(tensors, OpType::RECV, src_rank, tag,
                      [&](c10d::Backend& b) { return b.recv(tensors, src_rank, tag); });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int tag) {
  return send_or_recv(tensors, OpType::RECVANYSOURCE, -1, tag,
                      [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

}  // namespace cuda_p2p
