// SymmetricWorkspace: one block per rank, [buffer | signal pad], every rank mapping every peer's
// block (docs/design.md §4). Created collectively over a c10d store; every method marked
// "collective" must be called by all ranks of the group in the same order.
#pragma once

#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

#include "p2p_workspace/device.hpp"
#include "p2p_workspace/pad_layout.hpp"

namespace cuda_p2p {

struct WorkspaceOptions {
  // 32 MiB: covers activations of the shapes we target; larger payloads grow the workspace or
  // are processed in rounds.
  static constexpr int64_t kDefaultBufferSize = 32 << 20;
  // 256 MiB: how far an op may grow the buffer by default before it runs in rounds instead
  // (Options.max_buffer_size).
  static constexpr int64_t kDefaultMaxBufferSize = int64_t{256} << 20;
  static constexpr int kDefaultChannels = 4;
  // 2 MiB: what a captured collective run as one kernel may stage per rank (NOTE [Graph flags]
  // in p2p_workspace/graph_flags.hpp; docs/workspace.md, "Graph capture").
  static constexpr int64_t kDefaultGraphRegionBytes = 2 << 20;

  int64_t buffer_size = kDefaultBufferSize;
  // Signal channels; one per stream that issues signals, so that barriers issued from two
  // streams never consume each other's signals.
  int num_channels = kDefaultChannels;
  // How long a signal wait or a rendezvous step may take before it fails.
  Millis timeout{std::chrono::minutes(5)};
  // Whether to offer reads of peers' private memory (cross_memory_read) when the device has a
  // reader and the probe at rendezvous succeeds on every rank.
  bool cross_memory_reads = true;
  // This rank's host identity; empty: hostname + boot id. Ranks with different identities do
  // not share a workspace (tests simulate several hosts with CUDA_P2P_HOST_ID).
  std::string host_id;
  // Test hook: every read of peers' private memory fails as under Yama ptrace_scope (EPERM).
  bool deny_cross_memory_reads = false;
  // The graph region of each block, after its pad: where captured collectives run as one kernel
  // stage their data (NOTE [Graph flags]); 0: none (they keep the copy engine).
  int64_t graph_region_bytes = kDefaultGraphRegionBytes;
  // Kernels trap at a peer's failure instead of ending quietly (NOTE [Who traps] in
  // p2p_workspace/flag_barrier_body.hpp): for jobs that prefer to die fast.
  bool trap_on_peer_failure = false;
};

class BlockRetirement;  // p2p_workspace/block_retirement.hpp

// This process's host identity: `host_id` when not empty, else hostname + boot id.
std::string host_identity(const std::string& host_id = "");

class SymmetricWorkspace {
 public:
  // Collective: allocates this rank's block, maps every peer's. If the ranks span hosts (or a
  // peer's block cannot be mapped) the workspace is unavailable on every rank, with a reason.
  SymmetricWorkspace(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                     std::shared_ptr<Device> device, WorkspaceOptions options);
  ~SymmetricWorkspace();
  SymmetricWorkspace(const SymmetricWorkspace&) = delete;
  SymmetricWorkspace& operator=(const SymmetricWorkspace&) = delete;

  bool available() const { return available_; }
  // Why the workspace is unavailable ("" when it is available).
  const std::string& unavailable_reason() const { return reason_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int num_channels() const { return options_.num_channels; }
  // How long a signal wait or a store exchange may take; set_timeout changes it (c10d's
  // setTimeout), for the ops enqueued from then on, and the device's host-side waits.
  Millis timeout() const { return Millis(timeout_ms_.load(std::memory_order_relaxed)); }
  void set_timeout(Millis timeout);
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& device_ptr() const { return device_; }
  int64_t buffer_size() const;

  // Address of `rank`'s buffer as mapped in this process.
  void* buffer(int rank) const;
  // The offset of [p, p + n) in this rank's own buffer when it lies wholly inside, else -1 (a
  // symmetric heap's tensors: their offset is the same in every peer's mapping).
  int64_t own_offset(const void* p, int64_t n) const;
  // Changes whenever the mapping does (growth): addresses taken from buffer() and the slot
  // accessors stay valid while it holds the value read before taking them. One load, where
  // buffer() takes a lock: the inline all-reduce's check of its cached addresses.
  uint64_t mapping_version() const { return mapping_version_.load(std::memory_order_acquire); }
  // Signal slot `src` writes in `target`'s pad on `channel`: pad[target] + channel * W + src.
  uint32_t* signal_slot(int target, int channel, int src) const;
  // The pad's other areas (NOTE [Signal pad layout] in p2p_workspace/pad_layout.hpp). Like signal
  // slots, each is written by `src` into `target`'s pad, and read by `target` only, so that every
  // wait polls the waiter's own memory:
  //  - the done word of `src` on `channel`: the number of collective phases `src` has ended
  //    (NOTE [Collective phases] in ops/collectives.cpp);
  //  - the op descriptor `src` published on `channel` for a handshake of parity `parity`,
  //    kDescriptorWords words (NOTE [Op signatures] in ops/op_signature.cpp).
  static constexpr int kDescriptorWords = PadLayout::kDescriptorWords;
  uint32_t* done_slot(int target, int channel, int src) const;
  uint32_t* descriptor_slot(int target, int channel, int parity, int src) const;

  // Whether cross_memory_read works: the device has a reader (the host), it is turned on, and
  // every rank could read every peer's probe word at rendezvous. Identical on every rank.
  bool cross_memory_reads() const { return available_ && cross_memory_reads_; }
  // Why it does not ("" when it does).
  const std::string& cross_memory_reads_reason() const { return cross_memory_reads_reason_; }
  // Copies `n` bytes at `src` in `peer`'s address space (any memory of that process, e.g. the
  // tensor it passed to a collective) to `dst`, in the order of stream `s`. Only when
  // cross_memory_reads(); the caller makes sure `src` stays valid until the read has run (NOTE
  // [Cross-memory reads] in ops/collectives.cpp).
  void cross_memory_read(Stream& s, void* dst, int peer, const void* src, size_t n);
  // The same, with the source address published by the peer in shared memory: the read copies
  // from *address_word + offset, loading the word when the read runs in stream order (after the
  // wait that made it visible), not when it is enqueued.
  void cross_memory_read(Stream& s, void* dst, int peer, const uint64_t* address_word,
                         int64_t offset, size_t n);

  // A tensor aliasing `rank`'s buffer (this rank's included). It keeps the mapping alive, even
  // across a growth of the workspace.
  at::Tensor get_buffer(int rank, at::IntArrayRef sizes, at::ScalarType dtype,
                        int64_t storage_offset = 0) const;

  // --- signals (NOTE [Signal sequence numbers] in the .cpp) ---
  void put_signal(Stream& s, int peer, int channel);
  void wait_signal(Stream& s, int peer, int channel, std::optional<Millis> timeout = {});
  // Every rank in `ranks` (all when empty; must include this rank) signals every other and waits
  // for all of them on `channel`.
  void barrier(Stream& s, int channel, std::optional<Millis> timeout = {},
               const std::vector<int>& ranks = {});
  // For a caller that runs a barrier of all ranks on `channel` itself, signal by signal (NOTE
  // [Inline signals] in device.hpp): advances the counts with `peer` exactly as barrier() does
  // and returns {the value to write into peer's slot signal_slot(peer, channel, rank()), the
  // value to wait for in this rank's slot signal_slot(rank(), channel, peer)}.
  std::pair<uint32_t, uint32_t> next_barrier_signal(int channel, int peer);

  // Collective: ranks agree on the largest request; if it exceeds the buffer, every rank maps a
  // new, larger workspace (tensors aliasing the old one stay valid).
  void ensure_min_buffer_size(int64_t nbytes);
  // Collective, for callers that know every rank asks for the same size: grows without an
  // exchange when `nbytes` exceeds the buffer.
  void grow_to(int64_t nbytes);

  // --- the group's op order (NOTE [One order per group] in the .cpp) ---
  // Makes `caller` wait for the end of the group's previous workspace op: called by every op
  // before it enqueues anything on `caller` or its own streams.
  void begin_op(Stream& caller);
  // Records the end of the op: called once everything the op enqueued is joined into `caller`.
  void end_op(Stream& caller);
  // The end of the last op on a stream that does not run inline (null: none is pending), if it
  // was enqueued in the capture `capture` (0: outside any; Device::capture_id).
  std::shared_ptr<Event> last_op(uint64_t capture = 0) const;

  // --- capture (NOTE [Replay-safe signals] in the .cpp) ---
  // Whether `s` is being captured: put_signal, wait_signal and barrier then use the graph
  // counts, and an op uses the graph_* calls below where it would use done words. Exact once the
  // op's begin_op has run (before it, false until the group's first captured op).
  bool capturing(Stream& s) const;
  // A phase of a captured op begins: waits until every peer has ended every graph phase this
  // rank has begun on `channel`, then counts one more.
  void graph_phase_begin(Stream& s, int channel, const std::string& context);
  // Tells the peers this rank has ended its current graph phase on `channel`.
  void graph_phase_end(Stream& s, int channel);
  // Waits until every rank in `ranks` has ended this rank's current graph phase on `channel`.
  void graph_wait_phase_ended(Stream& s, int channel, c10::ArrayRef<int> ranks,
                              const std::string& context);

  // --- graph flags (NOTE [Graph flags] in p2p_workspace/graph_flags.hpp) ---
  // Whether captured ops use flags: 2 to kMaxGraphRanks ranks (more: counted signals only).
  bool graph_flags() const { return world_size_ >= 2 && world_size_ <= kMaxGraphRanks; }
  // `rank`'s graph region (after its pad): what kernel ops stage, and nothing else uses.
  char* graph_region(int rank) const;
  int64_t graph_region_bytes() const;
  // The flag `src` sets in `target`'s pad for barriers on `slot` of `block` on `channel`.
  uint32_t* graph_flag(int target, int channel, int block, int slot, int src) const;
  // A kernel op on `channel` (Device::graph_kernel): `barriers` flag barriers, on slots 0, 1,
  // 2, ..., of `blocks` blocks, tagged `tag`, with `body` between them; its waits give up after
  // `limit` (default: the group's timeout).
  void graph_kernel(Stream& s, int channel, uint32_t tag, int barriers, int blocks,
                    GraphKernelBody body, const std::string& context,
                    std::optional<Millis> limit = std::nullopt);
  // The open of an op that keeps the copy engine under capture: clears this rank's graph counts,
  // then a flag barrier on slot 0 of `channel`, tagged `tag`. Until graph_close, the op's full
  // barriers (barrier()) on every channel are flag barriers on the alternating slots. Without
  // flags: a counted barrier (NOTE [Replay-safe signals]).
  void graph_open(Stream& s, int channel, uint32_t tag, const std::string& context);
  // The close of the open op: a barrier on `channel`'s next slot. Nothing when no op is open.
  void graph_close(Stream& s, int channel, const std::string& context);
  // Forgets the open op of `s`'s capture: an op that raised after its open, or a rejection. The
  // capture's next barrier-only op is then an op of its own. What it enqueues is a kernel of no
  // barriers that gives back the graph busy word the open took (NOTE [One captured op at a time]
  // in graph_flags.hpp).
  void graph_abandon(Stream& s);

  // Fails the device for good (Device::abort): pending and later waits raise; the destructor
  // then waits for no peer (NOTE [Block lifetime] in block_retirement.cpp). Thread-safe.
  void abort(const std::string& why);
  // The ranks in `ranks` are gone for good (dead, and excluded from the group's successor): the
  // closing handshake no longer waits for them (NOTE [Block lifetime]), and the device writes
  // their failure words no more and unmaps their failure areas (Device::forget_failure_peers).
  // Thread-safe.
  void forget_peers(const std::vector<int>& ranks);
  // This rank's blocks of earlier generations still mapped by a peer (NOTE [Block lifetime]).
  size_t retired_blocks() const;
  // How long the destructor waits for peers to close this rank's blocks (capped by `timeout`).
  static constexpr Millis kCloseWait{10000};

 private:
  struct Mapping;
  void rendezvous(int64_t buffer_size);
  std::shared_ptr<Mapping> mapping() const;
  void check_rank(int r, const char* what) const;
  void check_channel(int channel) const;
  void check_available(const char* what) const;
  // `target`'s pad as mapped here (NOTE [Signal pad layout]).
  uint32_t* pad(int target) const;
  void put_counted(Stream& s, int peer, int channel);
  CountedWait expect_counted(Stream& s, int peer, int channel);
  void counted_barrier(Stream& s, int channel, const std::vector<int>& members, Millis timeout);
  void graph_barrier(Stream& s, int channel, const std::vector<int>& members, Millis timeout);
  // NOTE [Graph flags]: a run of flag barriers on `slots` of `blocks` blocks of `channel`.
  GraphLaunch graph_launch(int channel, uint32_t tag, std::initializer_list<int> slots,
                           int blocks) const;
  // The slot of the open op's next full barrier on `channel` in `s`'s capture, or -1 when no op
  // is open there.
  int next_graph_slot(Stream& s, int channel, uint32_t& tag);

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int world_size_;
  std::shared_ptr<Device> device_;
  WorkspaceOptions options_;
  const PadLayout layout_;  // NOTE [Signal pad layout]

  bool available_ = false;
  std::string reason_;
  // Reads of peers' private memory (NOTE [Cross-memory probe] in the .cpp).
  std::shared_ptr<CrossMemoryReader> reader_;
  bool cross_memory_reads_ = false;
  std::string cross_memory_reads_reason_;
  std::vector<int64_t> pids_;  // by rank
  uint64_t probe_token_ = 0;   // what peers must read at &probe_token_
  int generation_ = 0;
  int exchange_count_ = 0;

  std::shared_ptr<BlockRetirement> retirement_;  // NOTE [Block lifetime]
  mutable std::mutex order_mutex_;
  // NOTE [One order per group]: the end of the last eager op on a stream that does not run inline
  // (has_last_op_: there is one), and apart from it the end of the last captured op and its
  // capture's id.
  std::shared_ptr<Event> last_op_;
  std::atomic<bool> has_last_op_{false};
  std::shared_ptr<Event> last_captured_op_;
  uint64_t last_capture_ = 0;
  // NOTE [Replay-safe signals]: set by the first captured op; the mappings captures used.
  std::atomic<bool> capturing_any_{false};
  std::vector<std::shared_ptr<Mapping>> captured_;
  // NOTE [Graph flags]: per capture (by its id), the copy-engine op being captured between
  // graph_open and graph_close: its tag, and per channel its full barriers so far (which slot the
  // next one takes). Per capture, so that two threads capturing on one group, or a capture after
  // one whose op raised, never take another capture's open for their own.
  struct GraphOpenOp {
    uint32_t tag = 0;
    std::vector<int> barriers;
    uint32_t owner = 0;  // NOTE [One captured op at a time]: its close gives the busy word back
  };
  // The next captured op's owner number (NOTE [One captured op at a time]): nonzero, in
  // kGraphOwnerMask.
  uint32_t next_graph_owner();
  std::atomic<uint32_t> graph_owners_{0};
  std::mutex graph_mu_;
  std::unordered_map<uint64_t, GraphOpenOp> graph_open_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mapping_mutex_;
  std::shared_ptr<Mapping> mapping_;
  std::atomic<uint64_t> mapping_version_{0};  // see mapping_version()
  // Per (channel, peer): signals sent to / expected from that peer. Each channel is driven by one
  // stream (one thread) at a time, so entries need no lock.
  std::vector<uint32_t> sent_;
  std::vector<uint32_t> expected_;
  std::atomic<int64_t> timeout_ms_{0};  // timeout()
};

}  // namespace cuda_p2p
