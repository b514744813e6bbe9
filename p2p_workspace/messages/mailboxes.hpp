// Point-to-point messages between the ranks of one host: send, recv (from one rank or any) and
// their async forms, through mailboxes in shared memory (mailboxes.cpp, NOTE [Mailboxes]). What
// ProcessGroupCudaP2P's send/recv/recvAnysource run on a host workspace
// (backend/send_recv.cpp; docs/send_recv.md).
//
// NOTE [Where the mailboxes live]
// The mailboxes are a message engine of their own over the c10d store and the workspace's shared
// blocks, not an algorithm over the device interface's streams: a receive polls and sleeps on the
// shared words itself, with the host's wait primitives (p2p_workspace/host/futex_wait.hpp), and
// needs a device with the host's capability (NOTE [Host fast paths]). So they have their own
// folder in the bottom layer, p2p_workspace/messages/, with a rule
// tests/python/project/test_layers.py checks: from a device implementation they include only
// host/futex_wait.hpp, and only the backend includes them (ops/, the workspace and the devices do
// not).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::host {

// The header of one chunk in a mailbox slot (NOTE [Mailboxes] in mailboxes.cpp): written by the
// sender before it posts the chunk, read by the receiver after it saw the post.
struct ChunkHeader {
  int64_t tag;
  int64_t total;   // the message's bytes
  int64_t offset;  // of this chunk in the message
  int64_t bytes;   // of this chunk
  int32_t dtype;   // at::ScalarType of the sender's tensor
  int32_t unused;
};
// Why a receiver must not copy the chunk `h` read from a peer's mailbox whose slots hold
// `slot_bytes`, or "" when it may: its bytes fit the slot and its offset and bytes lie inside its
// message; `message_bytes` is the size of the message being received (its first chunk: -1, the
// offset must then be 0). A header that fails is a protocol error (memory written by other than
// a peer of this build), never trusted, since the receiver copies to `offset` of its tensor.
std::string chunk_header_error(const ChunkHeader& h, int64_t slot_bytes, int64_t message_bytes);

// What a rank publishes in the store for its mailbox (NOTE [Mailbox records] in
// mailbox_records.cpp):
// its slot size, the bytes of one peer's region and its outbox's handle.
struct MailboxRecord {
  int64_t slot_bytes = 0;
  int64_t region_bytes = 0;
  std::vector<uint8_t> handle;
};
std::string serialize(const MailboxRecord& r);
// Parses rank `src`'s record strictly; a malformed one is an error naming `src`.
MailboxRecord parse_mailbox_record(const std::string& record, int src);

// One send or receive. Made by Mailboxes::send / recv; its fields other than the ones below are
// the engine's, guarded by its lock.
class P2POp {
 public:
  // The peer: the destination of a send; the source of a receive (-1 for one from any rank until
  // a message matched it).
  int peer() const { return peer_.load(std::memory_order_acquire); }
  // Whether it has ended (successfully or not); error() then says which.
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() const { return error_; }
  // Completed with the op's tensor when it ends (or with its error).
  const c10::intrusive_ptr<c10::ivalue::Future>& future() const { return future_; }

 private:
  friend class Mailboxes;
  bool send_ = false;
  std::atomic<int> peer_{-1};
  int tag_ = 0;
  at::Tensor user_;  // what the caller passed
  at::Tensor data_;  // user_, or a contiguous copy (a receive copies it back at the end)
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};
  int64_t chunks_done_ = 0;  // send: chunks posted; receive: chunks taken (once matched)
  bool matched_ = false;     // receive: a message is being delivered into it
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
using P2POpPtr = std::shared_ptr<P2POp>;

// The mailboxes of one group on a host workspace (NOTE [Mailboxes] in
// p2p_workspace/messages/mailboxes.cpp). Not a collective: ops of different pairs of ranks run
// independently of each other and of the group's collectives. Thread-safe.
class Mailboxes {
 public:
  // Each slot holds one chunk of a message; a rank's outbox holds kSlots per peer.
  static constexpr int kSlots = 2;
  // Where a peer's region of an outbox keeps its slots (after the words and chunk headers), and
  // the region's bytes for slots of `slot_bytes` (NOTE [Mailboxes] in mailboxes.cpp).
  static constexpr int64_t kDataOffset = 4096;
  static constexpr int64_t region_bytes_for(int64_t slot_bytes) {
    return kDataOffset + kSlots * slot_bytes;
  }

  // `device` must be a host device; `store` the group's (keys under "cuda_p2p/mailbox/");
  // `timeout` the group's, for mapping a peer's mailbox (set_timeout changes it).
  Mailboxes(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
            std::shared_ptr<Device> device, int64_t slot_bytes, std::chrono::milliseconds timeout);
  ~Mailboxes();
  Mailboxes(const Mailboxes&) = delete;
  Mailboxes& operator=(const Mailboxes&) = delete;

  // Posts a message of `t`'s bytes to rank `dst` with `tag` and starts it; the op ends once every
  // chunk is in the mailbox (the receiver need not have taken it). `t` must stay unchanged until
  // then. An op still pending after `timeout` fails, naming both ranks.
  P2POpPtr send(const at::Tensor& t, int dst, int tag, std::chrono::milliseconds timeout);
  // Posts a receive into `t` from rank `src` (-1: any rank) of a message with `tag`; it takes the
  // first such message, in the order they were sent, which must have `t`'s byte size and dtype.
  P2POpPtr recv(const at::Tensor& t, int src, int tag, std::chrono::milliseconds timeout);
  // Blocks until `op` has ended (driving every pending op meanwhile); rethrows its error.
  void wait(const P2POp& op);
  // Drives the pending ops once, without blocking; whether `op` has ended.
  bool poll(const P2POp& op);
  // Fails every pending op, and every later one, with `why` (abort, shutdown).
  void fail(const std::string& why);
  // Waits, at most `limit`, until the receivers have taken every message this rank sent (a
  // shutdown's flush: NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp). Returns ""
  // when they have, else which ranks have not.
  std::string flush(std::chrono::milliseconds limit);
  // The group's new timeout (c10d setTimeout), for the mappings made from now on.
  void set_timeout(std::chrono::milliseconds timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

 private:
  struct Peer;
  struct Unexpected;
  using Clock = std::chrono::steady_clock;

  P2POpPtr post(P2POpPtr op);
  // One pass over the pending ops under mu_: moves what can move, fails what timed out. Appends
  // the words it would wait for to `waits` and the ops that ended to `ended`.
  void progress_locked(std::vector<SignalWait>& waits, std::vector<P2POpPtr>& ended);
  void progress_sends(Peer& p, int dst, std::vector<SignalWait>& waits,
                      std::vector<P2POpPtr>& ended);
  // `drain`: a send of this rank is blocked, so full mailboxes towards it are emptied into
  // unexpected_ (NOTE [Mailboxes]).
  void progress_receives(Peer& p, int src, std::vector<SignalWait>& waits,
                         std::vector<P2POpPtr>& ended, bool drain);
  // Fails the receives from `src` that no message matched yet with p.broken_in.
  void fail_receives_from(const Peer& p, int src, std::vector<P2POpPtr>& ended);
  // Gives the complete messages of unexpected_ to the pending receives that take them.
  void match_unexpected(std::vector<P2POpPtr>& ended);
  void expire(Clock::time_point now, std::vector<P2POpPtr>& ended);
  void finish(const P2POpPtr& op, std::exception_ptr error, std::vector<P2POpPtr>& ended);
  // Ends the ops progress_locked returned, outside mu_ (copies back, futures).
  static void complete(std::vector<P2POpPtr>& ended);
  void ensure_outbox();
  bool map_source(int src);
  // This rank's region for `dst` in its own outbox; its region in a sender's mapped outbox.
  uint8_t* region(uint8_t* outbox, int dst) const;
  uint8_t* inbox_region(const Peer& p) const;
  static std::string size_of(const P2POp& op);
  static std::string describe(const P2POp& op);
  std::exception_ptr mismatch(const P2POp& op, int src, int64_t tag, int64_t bytes,
                              int32_t dtype) const;
  std::string waiting_from(int src) const;
  bool any_pending() const;
  // The ranks that have not taken every message this rank sent them (under mu_).
  std::string untaken() const;
  // progress_locked for a caller (post, wait, poll): the progress thread then stays away for a
  // while (NOTE [Mailboxes]).
  void drive_locked(std::vector<SignalWait>& waits, std::vector<P2POpPtr>& ended);
  void run_thread();
  // Sleeps until one of `waits` moves (or a short while when there are none), polling first
  // while the wait is young.
  void back_off(const std::vector<SignalWait>& waits, Clock::time_point since) const;

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int world_size_;
  std::shared_ptr<Device> device_;
  const int64_t slot_bytes_;
  const int64_t region_bytes_;
  std::atomic<int64_t> timeout_ms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string failed_;  // why every op fails ("" while healthy)
  std::shared_ptr<Block> outbox_;
  std::unique_ptr<BlockExporter> exporter_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank
  std::deque<P2POpPtr> receives_;             // pending receives, in the order they were posted
  std::deque<std::unique_ptr<Unexpected>> unexpected_;  // messages taken before their receive
  int waiters_ = 0;
  Clock::time_point driven_{};  // when a caller last drove the pending ops
  bool thread_idle_ = false;    // the progress thread waits for a notify
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cuda_p2p::host
