#include "p2p_workspace/messages/mailboxes.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "p2p_workspace/host/futex_wait.hpp"  // NOTE [Where the mailboxes live]
#include "p2p_workspace/workspace_records.hpp"

namespace cuda_p2p::host {

// NOTE [Mailboxes]
// Why apart from the collectives: a group's collectives run in one order on every rank (NOTE
// [One order per group] in p2p_workspace/symmetric_workspace.cpp), while messages between two
// ranks come and go whenever those two like, unordered with the collectives and with other
// pairs. So they never touch the collective buffer.
// The outbox:
//  - each rank that sends owns one: a shared block (Device::allocate, mapped by the receivers)
//    made at its first send and published in the group's store ("cuda_p2p/mailbox/<rank>"); a
//    receiver maps a sender's outbox when it first waits for that sender;
//  - one region per destination rank d: [posted | acked | kSlots chunk headers | kSlots data
//    slots of slot_bytes]; `posted` counts the chunks the owner put for d, `acked` those d took;
//  - each word has one writer (posted: the sender, acked: the receiver) and is read with acquire
//    order after the writer's release store (futex_store_and_wake, NOTE [Sleeper bit]): the
//    sender writes a chunk's header and data, then posted; the receiver reads them only after
//    seeing posted, copies them out, then writes acked; the sender reuses a slot only once acked
//    shows it was taken;
//  - chunk c of the pair goes to slot c % kSlots, so at most kSlots chunks are in flight: a
//    larger message streams through the slots (double buffering); one of at most kSlots slots is
//    sent eagerly, its send ending once the chunks are in the mailbox.
// Matching (as Gloo and MPI do):
//  - a receive takes the first message, in the order the sender sent them, with its tag (from its
//    source, or from any rank);
//  - a message at the head of a mailbox that no pending receive wants, while a receive from that
//    rank waits for another tag, is copied into this rank's memory (`unexpected_`) so that later
//    messages can pass it; a receive looks there first;
//  - so is one in a mailbox whose slots are full while a send of this rank waits: two ranks that
//    each send more than the slots hold before they receive would otherwise wait for each other
//    until the timeout (Gloo's sockets buffer such sends; NCCL and MPI deadlock). A sender that
//    merely runs ahead pays that second copy only while the receiver is blocked in a send;
//  - a matched message whose byte size or dtype differs from the receive's tensor fails that
//    receive naming both ranks, and stays queued for a receive that fits.
// Errors: ops time out after the group's timeout, naming both ranks and what was missing; a send
// or receive that times out midway through a message leaves the pair's channel unusable (its
// later ops fail at once, saying why): the chunks left can no longer be told apart.
// Progress:
//  - every call (post, Work.wait, Work.is_completed) drives all pending ops of the group as far as
//    they go without blocking: a message to a rank already waiting moves with no thread hand-off;
//  - a rank whose pending ops cannot finish at once gets one progress thread, which moves them
//    while nobody waits (as a GPU stream or Gloo's transport would) and sleeps on the mailbox
//    words (futex);
//  - that thread stays out of the callers' way: on its condition variable while nothing is
//    pending or a caller drives, and for kGrace after a caller drove (woken on every post it
//    would cost a context switch per message, more than a small message's round trip:
//    docs/measurements/send-recv-2026-11-28.md);
//  - waits back off like every host wait (NOTE [Host waits on shared cores] in
//    p2p_workspace/host/futex_wait.cpp).

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kSequenceMask =
    0x7fffffffu;  // host signal words are 31-bit (NOTE [Sleeper bit])
constexpr int64_t kPostedOffset = 0;
constexpr int64_t kAckedOffset = 64;
constexpr int64_t kHeadersOffset = 128;
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kDataOffset = Mailboxes::kDataOffset;
constexpr auto kLookupInterval = std::chrono::milliseconds(1);
// How long the progress thread leaves pending ops to the callers after one of them drove them.
constexpr auto kGrace = std::chrono::milliseconds(1);
static_assert((Mailboxes::kSlots & (Mailboxes::kSlots - 1)) == 0 &&
                  (kSequenceMask + 1) % Mailboxes::kSlots == 0,
              "slot indices must survive the counters' wrap-around");
static_assert(kHeadersOffset + Mailboxes::kSlots * kHeaderBytes <= kDataOffset);

static_assert(sizeof(ChunkHeader) <= kHeaderBytes);

uint32_t* word_at(uint8_t* region, int64_t offset) {
  return reinterpret_cast<uint32_t*>(region + offset);
}

uint32_t load(const uint32_t* word) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire) &
         kSequenceMask;
}

ChunkHeader* header_at(uint8_t* region, uint32_t chunk) {
  return reinterpret_cast<ChunkHeader*>(region + kHeadersOffset +
                                        (chunk % Mailboxes::kSlots) * kHeaderBytes);
}

std::exception_ptr error(const std::string& what) {
  try {
    TORCH_CHECK(false, what);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

std::string bytes_of(int64_t bytes, int32_t dtype) {
  return std::to_string(bytes) + " bytes of " +
         std::string(c10::toString(static_cast<at::ScalarType>(dtype)));
}

int64_t chunks_of(int64_t bytes, int64_t slot_bytes) {
  return std::max<int64_t>(1, (bytes + slot_bytes - 1) / slot_bytes);
}

}  // namespace

std::string chunk_header_error(const ChunkHeader& h, int64_t slot_bytes, int64_t message_bytes) {
  const bool fits = h.total >= 0 && h.bytes >= 0 && h.bytes <= slot_bytes && h.offset >= 0 &&
                    h.offset <= h.total && h.bytes <= h.total - h.offset;
  const bool placed = message_bytes < 0 ? h.offset == 0 : h.total == message_bytes;
  if (fits && placed) return "";
  std::string what = "a chunk header (tag " + std::to_string(h.tag) + ", message of " +
                     std::to_string(h.total) + " bytes, chunk of " + std::to_string(h.bytes) +
                     " bytes at offset " + std::to_string(h.offset) + ") that ";
  if (!fits) {
    return what + "does not fit its message or a slot of " + std::to_string(slot_bytes) + " bytes";
  }
  return message_bytes < 0 ? what + "starts a message at a nonzero offset"
                           : what + "does not belong to the message of " +
                                 std::to_string(message_bytes) + " bytes being received";
}

struct Mailboxes::Unexpected {
  int src;
  int64_t tag;
  int32_t dtype;
  at::Tensor data;  // uint8, the message's bytes
  int64_t received = 0;
  bool complete = false;
};

struct Mailboxes::Peer {
  // --- as a destination of this rank's sends ---
  std::deque<P2POpPtr> sends;  // pending, in the order they were posted
  uint32_t posted = 0;         // chunks put in its region of the outbox
  std::string broken_out;      // why the channel to it is unusable ("" while it is fine)
  // --- as a source of this rank's receives ---
  std::shared_ptr<Block> inbox;  // its outbox, mapped
  int64_t inbox_slot_bytes = 0;
  int64_t inbox_region_bytes = 0;
  uint32_t taken = 0;  // chunks taken from it (what this rank wrote to `acked`)
  Clock::time_point next_lookup{};
  // The message being taken chunk by chunk: into a receive, or into unexpected_.
  P2POpPtr into_op;
  Unexpected* into_unexpected = nullptr;
  std::string broken_in;  // why the channel from it is unusable
};

Mailboxes::Mailboxes(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                     std::shared_ptr<Device> device, int64_t slot_bytes,
                     std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      device_(std::move(device)),
      slot_bytes_(slot_bytes),
      region_bytes_(region_bytes_for(slot_bytes)),
      timeout_ms_(timeout.count()) {
  TORCH_CHECK(device_ && device_->host_paths() != nullptr,
              "cuda_p2p: send/recv mailboxes need a host workspace");
  TORCH_CHECK(slot_bytes_ >= 4096 && slot_bytes_ % 4096 == 0,
              "cuda_p2p: the mailbox slot size must be a positive multiple of 4096 bytes, got ",
              slot_bytes_);
  for (int r = 0; r < world_size_; ++r) peers_.push_back(std::make_unique<Peer>());
}

Mailboxes::~Mailboxes() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<P2POpPtr> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto gone = error("cuda_p2p: the group's mailboxes were destroyed with this op pending");
    for (auto& p : peers_) {
      for (auto& op : p->sends) finish(op, gone, ended);
    }
    for (auto& op : receives_) finish(op, gone, ended);
  }
  complete(ended);
}

uint8_t* Mailboxes::region(uint8_t* outbox, int dst) const {
  return outbox + static_cast<int64_t>(dst) * region_bytes_;
}

uint8_t* Mailboxes::inbox_region(const Peer& p) const {
  // The sender's layout, as it published it: its slots may differ from this rank's.
  return static_cast<uint8_t*>(p.inbox->data()) +
         static_cast<int64_t>(rank_) * p.inbox_region_bytes;
}

std::string Mailboxes::size_of(const P2POp& op) {
  return bytes_of(static_cast<int64_t>(op.data_.nbytes()),
                  static_cast<int32_t>(op.data_.scalar_type()));
}

std::string Mailboxes::describe(const P2POp& op) {
  return "tag " + std::to_string(op.tag_) + ", " + size_of(op);
}

std::exception_ptr Mailboxes::mismatch(const P2POp& op, int src, int64_t tag, int64_t bytes,
                                       int32_t dtype) const {
  return error("cuda_p2p recv: rank " + std::to_string(rank_) + " expected " + size_of(op) +
               " from rank " + std::to_string(src) + " with tag " + std::to_string(tag) +
               ", but rank " + std::to_string(src) + " sent " + bytes_of(bytes, dtype) +
               " with that tag; the message stays queued for a receive that fits");
}

P2POpPtr Mailboxes::send(const at::Tensor& t, int dst, int tag, std::chrono::milliseconds timeout) {
  TORCH_CHECK(dst >= 0 && dst < world_size_ && dst != rank_, "cuda_p2p send: rank ", rank_,
              " cannot send to rank ", dst);
  auto op = std::make_shared<P2POp>();
  op->send_ = true;
  op->peer_.store(dst, std::memory_order_release);
  op->tag_ = tag;
  op->user_ = t;
  op->data_ = t.is_contiguous() ? t : t.contiguous();
  op->timeout_ = timeout;
  return post(std::move(op));
}

P2POpPtr Mailboxes::recv(const at::Tensor& t, int src, int tag, std::chrono::milliseconds timeout) {
  TORCH_CHECK(src == -1 || (src >= 0 && src < world_size_ && src != rank_), "cuda_p2p recv: rank ",
              rank_, " cannot receive from rank ", src);
  auto op = std::make_shared<P2POp>();
  op->peer_.store(src, std::memory_order_release);
  op->tag_ = tag;
  op->user_ = t;
  op->data_ = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  op->timeout_ = timeout;
  return post(std::move(op));
}

P2POpPtr Mailboxes::post(P2POpPtr op) {
  op->future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  // Saturated: a group's timeout may be as large as a timedelta holds.
  const auto now = Clock::now();
  op->deadline_ = op->timeout_ >= std::chrono::duration_cast<std::chrono::milliseconds>(
                                      Clock::time_point::max() - now)
                      ? Clock::time_point::max()
                      : now + op->timeout_;
  std::vector<P2POpPtr> ended;
  std::vector<SignalWait> waits;
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (op->send_) {
      ensure_outbox();
      peers_[op->peer()]->sends.push_back(op);
    } else {
      receives_.push_back(op);
    }
    drive_locked(waits, ended);
    pending = any_pending();
    if (pending && !thread_.joinable()) thread_ = std::thread([this] { run_thread(); });
    pending = pending && thread_idle_;  // a thread in its grace or asleep wakes by itself
  }
  complete(ended);
  if (pending) cv_.notify_all();
  return op;
}

void Mailboxes::ensure_outbox() {
  if (outbox_) return;
  const int64_t bytes = region_bytes_ * world_size_;  // this rank's layout, published below
  auto block = device_->allocate(static_cast<size_t>(bytes));
  auto exporter = device_->export_block(block, world_size_ - 1);
  // NOTE [Mailbox records]
  store_->set("cuda_p2p/mailbox/" + std::to_string(rank_),
              serialize(MailboxRecord{slot_bytes_, region_bytes_, exporter->handle()}));
  outbox_ = std::move(block);
  exporter_ = std::move(exporter);
}

bool Mailboxes::map_source(int src) {
  Peer& p = *peers_[src];
  if (p.inbox) return true;
  const auto now = Clock::now();
  if (now < p.next_lookup) return false;
  p.next_lookup = now + kLookupInterval;
  const std::string key = "cuda_p2p/mailbox/" + std::to_string(src);
  if (!store_->check({key})) return false;
  const auto bytes = store_->get(key);
  const MailboxRecord record =
      parse_mailbox_record(std::string(bytes.begin(), bytes.end()), src);  // NOTE [Mailbox records]
  p.inbox =
      device_->import_block(record.handle, static_cast<size_t>(record.region_bytes * world_size_),
                            std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)));
  p.inbox_slot_bytes = record.slot_bytes;
  p.inbox_region_bytes = record.region_bytes;
  return true;
}

bool Mailboxes::any_pending() const {
  if (!receives_.empty()) return true;
  for (const auto& p : peers_) {
    if (!p->sends.empty()) return true;
  }
  return false;
}

void Mailboxes::finish(const P2POpPtr& op, std::exception_ptr err, std::vector<P2POpPtr>& ended) {
  op->error_ = std::move(err);
  ended.push_back(op);
}

void Mailboxes::complete(std::vector<P2POpPtr>& ended) {
  for (auto& op : ended) {
    if (!op->error_ && !op->send_ && !op->data_.is_same(op->user_)) {
      try {
        op->user_.copy_(op->data_);
      } catch (...) {
        op->error_ = std::current_exception();
      }
    }
    op->done_.store(true, std::memory_order_release);
    // The future runs its callbacks here, on whichever thread ended the op (the progress thread
    // too): one that throws must not take that thread, or the other ops, with it.
    try {
      if (op->error_) {
        op->future_->setError(op->error_);
      } else {
        op->future_->markCompleted(c10::IValue(std::vector<at::Tensor>{op->user_}));
      }
    } catch (const std::exception& e) {
      TORCH_WARN("cuda_p2p send/recv: a callback of a Work's future raised: ", e.what());
    }
  }
  ended.clear();
}

void Mailboxes::fail(const std::string& why) {
  std::vector<P2POpPtr> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) failed_ = why;
    std::vector<SignalWait> waits;
    progress_locked(waits, ended);  // fails every pending op
  }
  complete(ended);
  cv_.notify_all();
}

std::string Mailboxes::untaken() const {
  std::string ranks;
  for (int d = 0; d < world_size_; ++d) {
    const Peer& p = *peers_[d];
    // A channel a timed-out send left unusable will never be emptied: its error said so.
    const bool taken =
        outbox_ == nullptr || !p.broken_out.empty() ||
        load(word_at(region(static_cast<uint8_t*>(outbox_->data()), d), kAckedOffset)) == p.posted;
    if (!p.sends.empty() || !taken) ranks += (ranks.empty() ? "" : ", ") + std::to_string(d);
  }
  return ranks;
}

std::string Mailboxes::flush(std::chrono::milliseconds limit) {
  const auto since = Clock::now();
  std::vector<SignalWait> waits;
  std::vector<P2POpPtr> ended;
  while (true) {
    std::string missing;
    waits.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_locked(waits, ended);
      missing = untaken();
      if (!missing.empty() && outbox_) {
        // Also wake when a receiver takes what the sends already put in the mailbox.
        for (int d = 0; d < world_size_; ++d) {
          const uint32_t* acked =
              word_at(region(static_cast<uint8_t*>(outbox_->data()), d), kAckedOffset);
          if (d != rank_ && peers_[d]->sends.empty() && peers_[d]->broken_out.empty() &&
              load(acked) != peers_[d]->posted) {
            waits.push_back({acked, peers_[d]->posted, d});
          }
        }
      }
    }
    complete(ended);
    if (missing.empty() || Clock::now() - since >= limit) return missing;
    back_off(waits, since);
  }
}

void Mailboxes::progress_locked(std::vector<SignalWait>& waits, std::vector<P2POpPtr>& ended) {
  if (failed_.empty()) {
    try {
      device_->check_healthy("send/recv");
    } catch (const c10::Error& e) {
      failed_ = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failed_ = e.what();
    }
  }
  if (!failed_.empty()) {
    const auto err = error(failed_);
    for (auto& p : peers_) {
      for (auto& op : p->sends) finish(op, err, ended);
      p->sends.clear();
    }
    for (auto& op : receives_) finish(op, err, ended);
    receives_.clear();
    return;
  }
  match_unexpected(ended);
  bool blocked = false;  // a send of this rank waits for its receiver to take chunks
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    progress_sends(*peers_[r], r, waits, ended);
    blocked = blocked || !peers_[r]->sends.empty();
  }
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) progress_receives(*peers_[r], r, waits, ended, blocked);
  }
  expire(Clock::now(), ended);
}

void Mailboxes::progress_sends(Peer& p, int dst, std::vector<SignalWait>& waits,
                               std::vector<P2POpPtr>& ended) {
  if (p.sends.empty()) return;
  uint8_t* reg = region(static_cast<uint8_t*>(outbox_->data()), dst);
  while (!p.sends.empty()) {
    const P2POpPtr op = p.sends.front();
    if (!p.broken_out.empty()) {
      finish(op, error(p.broken_out), ended);
      p.sends.pop_front();
      continue;
    }
    const int64_t total = static_cast<int64_t>(op->data_.nbytes());
    const int64_t chunks = chunks_of(total, slot_bytes_);
    const auto* src = static_cast<const uint8_t*>(op->data_.data_ptr());
    while (op->chunks_done_ < chunks) {
      const uint32_t* acked = word_at(reg, kAckedOffset);
      if (((p.posted - load(acked)) & kSequenceMask) >= static_cast<uint32_t>(kSlots)) {
        waits.push_back({acked, (p.posted - kSlots + 1) & kSequenceMask, dst});
        return;  // the receiver has not taken the earlier chunks yet
      }
      const int64_t offset = op->chunks_done_ * slot_bytes_;
      const int64_t bytes = std::min(slot_bytes_, total - offset);
      ChunkHeader* h = header_at(reg, p.posted);
      *h = ChunkHeader{
          op->tag_, total, offset, bytes, static_cast<int32_t>(op->data_.scalar_type()), 0};
      if (bytes > 0) {
        std::memcpy(reg + kDataOffset + (p.posted % kSlots) * slot_bytes_, src + offset,
                    static_cast<size_t>(bytes));
      }
      p.posted = (p.posted + 1) & kSequenceMask;
      host::futex_store_and_wake(word_at(reg, kPostedOffset), p.posted);  // NOTE [Mailboxes]
      ++op->chunks_done_;
    }
    finish(op, nullptr, ended);
    p.sends.pop_front();
  }
}

void Mailboxes::progress_receives(Peer& p, int src, std::vector<SignalWait>& waits,
                                  std::vector<P2POpPtr>& ended, bool drain) {
  const auto wants = [&](const P2POpPtr& op) {
    return !op->matched_ && (op->peer() == src || op->peer() == -1);
  };
  if (!p.into_op && !p.into_unexpected && !drain &&
      std::none_of(receives_.begin(), receives_.end(), wants)) {
    return;
  }
  if (!p.broken_in.empty()) {
    fail_receives_from(p, src, ended);
    return;
  }
  try {
    if (!map_source(src)) return;  // it has sent nothing yet; looked up again later
  } catch (const std::exception& e) {
    p.broken_in = "cuda_p2p recv: rank " + std::to_string(rank_) + " could not map rank " +
                  std::to_string(src) + "'s mailbox: " + e.what();
    return;
  }
  uint8_t* reg = inbox_region(p);
  const int64_t slot_bytes = p.inbox_slot_bytes;
  while (true) {
    const uint32_t* posted = word_at(reg, kPostedOffset);
    const uint32_t in_flight = (load(posted) - p.taken) & kSequenceMask;
    if (in_flight == 0) {
      if (p.into_op || p.into_unexpected || drain ||
          std::any_of(receives_.begin(), receives_.end(), wants)) {
        waits.push_back({posted, (p.taken + 1) & kSequenceMask, src});
      }
      return;
    }
    const ChunkHeader h = *header_at(reg, p.taken);
    const int64_t receiving = p.into_op           ? static_cast<int64_t>(p.into_op->data_.nbytes())
                              : p.into_unexpected ? p.into_unexpected->data.numel()
                                                  : -1;
    if (std::string bad = chunk_header_error(h, slot_bytes, receiving); !bad.empty()) {
      // Never copied: the channel is unusable, and what was being received from it fails.
      p.broken_in = "cuda_p2p recv: the channel from rank " + std::to_string(src) + " to rank " +
                    std::to_string(rank_) + " is unusable: its mailbox holds " + bad +
                    " (a protocol error)";
      if (p.into_op) {
        if (auto it = std::find(receives_.begin(), receives_.end(), p.into_op);
            it != receives_.end()) {
          receives_.erase(it);
        }
        finish(p.into_op, error(p.broken_in), ended);
        p.into_op = nullptr;
      }
      if (p.into_unexpected) {
        const Unexpected* u = p.into_unexpected;
        p.into_unexpected = nullptr;
        if (auto it = std::find_if(unexpected_.begin(), unexpected_.end(),
                                   [u](const auto& x) { return x.get() == u; });
            it != unexpected_.end()) {
          unexpected_.erase(it);
        }
      }
      fail_receives_from(p, src, ended);
      return;
    }
    if (!p.into_op && !p.into_unexpected) {
      // A new message at the head: the first receive that wants it, in posting order.
      auto it = std::find_if(receives_.begin(), receives_.end(),
                             [&](const P2POpPtr& op) { return wants(op) && op->tag_ == h.tag; });
      if (it != receives_.end()) {
        const P2POpPtr op = *it;
        if (static_cast<int64_t>(op->data_.nbytes()) != h.total ||
            static_cast<int32_t>(op->data_.scalar_type()) != h.dtype) {
          finish(op, mismatch(*op, src, h.tag, h.total, h.dtype), ended);
          receives_.erase(it);
          continue;
        }
        op->matched_ = true;
        op->peer_.store(src, std::memory_order_release);
        p.into_op = op;
      } else if (std::any_of(receives_.begin(), receives_.end(), wants) ||
                 (drain && in_flight >= static_cast<uint32_t>(kSlots))) {
        // NOTE [Mailboxes]: a receive from this rank waits for another tag, or this rank's own
        // send waits while the sender's slots towards it are full: let this one pass.
        auto u = std::make_unique<Unexpected>();
        u->src = src;
        u->tag = h.tag;
        u->dtype = h.dtype;
        u->data = at::empty({h.total}, at::kByte);
        p.into_unexpected = u.get();
        unexpected_.push_back(std::move(u));
      } else {
        return;  // nobody here wants it yet: it stays in the mailbox
      }
    }
    uint8_t* dst = p.into_op ? static_cast<uint8_t*>(p.into_op->data_.data_ptr())
                             : p.into_unexpected->data.data_ptr<uint8_t>();
    if (h.bytes > 0) {
      std::memcpy(dst + h.offset, reg + kDataOffset + (p.taken % kSlots) * slot_bytes,
                  static_cast<size_t>(h.bytes));
    }
    p.taken = (p.taken + 1) & kSequenceMask;
    host::futex_store_and_wake(word_at(reg, kAckedOffset), p.taken);  // NOTE [Mailboxes]
    if (h.offset + h.bytes < h.total) {
      if (p.into_op) ++p.into_op->chunks_done_;
      continue;
    }
    if (p.into_op) {
      const P2POpPtr op = std::move(p.into_op);
      p.into_op = nullptr;
      receives_.erase(std::find(receives_.begin(), receives_.end(), op));
      finish(op, nullptr, ended);
    } else {
      p.into_unexpected->complete = true;
      p.into_unexpected = nullptr;
      match_unexpected(ended);
    }
  }
}

void Mailboxes::fail_receives_from(const Peer& p, int src, std::vector<P2POpPtr>& ended) {
  for (auto it = receives_.begin(); it != receives_.end();) {
    if ((*it)->peer() == src && !(*it)->matched_) {
      finish(*it, error(p.broken_in), ended);
      it = receives_.erase(it);
    } else {
      ++it;
    }
  }
}

void Mailboxes::match_unexpected(std::vector<P2POpPtr>& ended) {
  for (auto it = receives_.begin(); it != receives_.end() && !unexpected_.empty();) {
    const P2POpPtr op = *it;
    // The first message this receive may take, in arrival order; one still arriving blocks the
    // later ones of its sender (messages of one sender and tag are taken in order).
    auto u = unexpected_.end();
    if (!op->matched_) {
      u = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const auto& m) {
        return m->tag == op->tag_ && (op->peer() == -1 || op->peer() == m->src) && m->complete;
      });
    }
    if (u == unexpected_.end()) {
      ++it;
      continue;
    }
    Unexpected& m = **u;
    if (static_cast<int64_t>(op->data_.nbytes()) != m.data.numel() ||
        static_cast<int32_t>(op->data_.scalar_type()) != m.dtype) {
      finish(op, mismatch(*op, m.src, m.tag, m.data.numel(), m.dtype), ended);
    } else {
      if (m.data.numel() > 0) {
        std::memcpy(op->data_.data_ptr(), m.data.data_ptr(), static_cast<size_t>(m.data.numel()));
      }
      op->peer_.store(m.src, std::memory_order_release);
      finish(op, nullptr, ended);
      unexpected_.erase(u);
    }
    it = receives_.erase(it);
  }
}

std::string Mailboxes::waiting_from(int src) const {
  std::ostringstream out;
  int n = 0;
  for (const auto& m : unexpected_) {
    if (m->src == src && m->complete) {
      out << (n++ ? "; " : "") << "tag " << m->tag << ", " << bytes_of(m->data.numel(), m->dtype);
    }
  }
  const Peer& p = *peers_[src];
  if (p.inbox && !p.into_op && !p.into_unexpected) {
    uint8_t* reg = inbox_region(p);
    if (load(word_at(reg, kPostedOffset)) != p.taken) {
      const ChunkHeader h = *header_at(reg, p.taken);
      out << (n++ ? "; " : "") << "tag " << h.tag << ", " << bytes_of(h.total, h.dtype);
    }
  }
  return n ? " (its messages waiting here: " + out.str() + ")" : "";
}

void Mailboxes::expire(Clock::time_point now, std::vector<P2POpPtr>& ended) {
  const auto ms = [](const P2POp& op) { return std::to_string(op.timeout_.count()) + " ms"; };
  for (int d = 0; d < world_size_; ++d) {
    Peer& p = *peers_[d];
    while (!p.sends.empty() && p.sends.front()->deadline_ <= now) {
      const P2POpPtr op = p.sends.front();
      const int64_t chunks = chunks_of(static_cast<int64_t>(op->data_.nbytes()), slot_bytes_);
      std::string what = "cuda_p2p send: rank " + std::to_string(rank_) + "'s send to rank " +
                         std::to_string(d) + " (" + describe(*op) + ") timed out after " + ms(*op) +
                         ": rank " + std::to_string(d) + " did not take the earlier " +
                         "chunks from its mailbox (" + std::to_string(op->chunks_done_) + " of " +
                         std::to_string(chunks) + " chunks sent)";
      if (op->chunks_done_ > 0) {
        p.broken_out = "cuda_p2p send: the channel from rank " + std::to_string(rank_) +
                       " to rank " + std::to_string(d) + " is unusable: " + what;
        what += "; the channel to rank " + std::to_string(d) + " is now unusable";
      }
      finish(op, error(what), ended);
      p.sends.pop_front();
    }
  }
  for (auto it = receives_.begin(); it != receives_.end();) {
    const P2POpPtr op = *it;
    if (op->deadline_ > now) {
      ++it;
      continue;
    }
    const int src = op->peer();
    std::string what = "cuda_p2p recv: rank " + std::to_string(rank_) + "'s recv from " +
                       (src < 0 ? std::string("any rank") : "rank " + std::to_string(src)) + " (" +
                       describe(*op) + ") timed out after " + ms(*op) + ": ";
    if (op->matched_) {
      Peer& p = *peers_[src];
      what += "rank " + std::to_string(src) + " sent only part of the message";
      p.broken_in = "cuda_p2p recv: the channel from rank " + std::to_string(src) + " to rank " +
                    std::to_string(rank_) + " is unusable: " + what;
      p.into_op = nullptr;
    } else if (src < 0) {
      what += "no rank sent a message with tag " + std::to_string(op->tag_);
    } else if (!peers_[src]->inbox) {
      what += "rank " + std::to_string(src) + " has sent nothing on this group";
    } else {
      what += "rank " + std::to_string(src) + " sent no message with tag " +
              std::to_string(op->tag_) + waiting_from(src);
    }
    finish(op, error(what), ended);
    it = receives_.erase(it);
  }
}

void Mailboxes::back_off(const std::vector<SignalWait>& waits, Clock::time_point since) const {
  const auto now = Clock::now();
  const HostPaths* h = device_->host_paths();
  if (host::poll_more(now - since, h != nullptr && h->oversubscribed())) return;
  if (waits.empty()) {
    std::this_thread::sleep_for(kLookupInterval);  // a sender's outbox not yet published
  } else {
    host::futex_sleep_any(waits, now + host::kMaxSleep);
  }
}

void Mailboxes::wait(const P2POp& op) {
  if (!op.done()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++waiters_;
    }
    struct Leave {
      Mailboxes& m;
      ~Leave() {
        bool wake = false;
        {
          std::lock_guard<std::mutex> lock(m.mu_);
          wake = --m.waiters_ == 0 && m.thread_idle_ && m.any_pending();
        }
        if (wake) m.cv_.notify_all();
      }
    } leave{*this};
    const auto since = Clock::now();
    std::vector<SignalWait> waits;
    std::vector<P2POpPtr> ended;
    while (true) {
      waits.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        drive_locked(waits, ended);
      }
      complete(ended);
      if (op.done()) break;
      back_off(waits, since);
    }
  }
  if (op.error()) std::rethrow_exception(op.error());
}

bool Mailboxes::poll(const P2POp& op) {
  if (op.done()) return true;
  std::vector<SignalWait> waits;
  std::vector<P2POpPtr> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drive_locked(waits, ended);
  }
  complete(ended);
  return op.done();
}

void Mailboxes::drive_locked(std::vector<SignalWait>& waits, std::vector<P2POpPtr>& ended) {
  driven_ = Clock::now();
  progress_locked(waits, ended);
}

void Mailboxes::run_thread() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<SignalWait> waits;
  std::vector<P2POpPtr> ended;
  while (!stop_) {
    if (waiters_ > 0 || !any_pending()) {
      thread_idle_ = true;  // woken by a post, or by the last waiter leaving ops pending
      cv_.wait(lock);
      thread_idle_ = false;
      continue;
    }
    // NOTE [Mailboxes]: a caller that posted or polled a moment ago is likely to wait next.
    if (const auto quiet = driven_ + kGrace; Clock::now() < quiet) {
      cv_.wait_until(lock, quiet);
      continue;
    }
    waits.clear();
    progress_locked(waits, ended);
    lock.unlock();
    const bool moved = !ended.empty();
    complete(ended);
    if (!moved) back_off(waits, Clock::time_point{});  // an old wait: straight to sleep
    lock.lock();
  }
}

}  // namespace cuda_p2p::host
