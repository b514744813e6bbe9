// The signals and barriers of captured ops (NOTE [Replay-safe signals] in
// symmetric_workspace.cpp, NOTE [Graph flags] in graph_flags.hpp): counted signals and graph
// phases in the pad's graph areas, and the flag barriers of kernel ops and of the open and close
// of copy-engine ops. SymmetricWorkspace's eager signals dispatch here while their stream is
// being captured.
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

// The device is asked only once the group has seen a capture: every op calls begin_op first, which
// asks it for every op not on an inline stream, and flags the group at its first captured op. An
// eager op then costs no query per signal (cudaStreamGetCaptureInfo on CUDA).
bool SymmetricWorkspace::capturing(Stream& s) const {
  return capturing_any_.load(std::memory_order_acquire) && device_->capture_id(s) != 0;
}

void SymmetricWorkspace::graph_phase_begin(Stream& s, int channel, const std::string& context) {
  check_channel(channel);
  uint32_t* phases = pad(rank_) + layout_.graph_phases(channel);
  std::vector<CountedWait> waits;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) {
      waits.push_back(CountedWait{pad(rank_) + layout_.graph_done(channel, r), phases, 0, r});
    }
  }
  if (!waits.empty()) {
    device_->wait_counted(s, std::move(waits), timeout(),
                          context + " (graph buffer reuse guard, rank " + std::to_string(rank_) +
                              ", channel " + std::to_string(channel) + ")");
  }
  device_->advance_counter(s, phases, 1);
}

void SymmetricWorkspace::graph_phase_end(Stream& s, int channel) {
  check_channel(channel);
  const uint32_t* phases = pad(rank_) + layout_.graph_phases(channel);
  for (int k = 1; k < world_size_; ++k) {
    const int r = (rank_ + k) % world_size_;
    device_->write_counted(s, pad(r) + layout_.graph_done(channel, rank_), phases, 0);
  }
}

void SymmetricWorkspace::graph_wait_phase_ended(Stream& s, int channel, c10::ArrayRef<int> ranks,
                                                const std::string& context) {
  check_channel(channel);
  const uint32_t* phases = pad(rank_) + layout_.graph_phases(channel);
  std::vector<CountedWait> waits;
  for (int r : ranks) {
    check_rank(r, "graph_wait_phase_ended");
    if (r != rank_) {
      waits.push_back(CountedWait{pad(rank_) + layout_.graph_done(channel, r), phases, 0, r});
    }
  }
  if (waits.empty()) return;
  device_->wait_counted(s, std::move(waits), timeout(),
                        context + " (rank " + std::to_string(rank_) + ", graph)");
}

void SymmetricWorkspace::put_counted(Stream& s, int peer, int channel) {
  uint32_t* sent = pad(rank_) + layout_.graph_sent(channel, peer);
  device_->advance_counter(s, sent, 1);
  device_->write_counted(s, pad(peer) + layout_.graph_signal(channel, rank_), sent, 0);
}

CountedWait SymmetricWorkspace::expect_counted(Stream& s, int peer, int channel) {
  uint32_t* expected = pad(rank_) + layout_.graph_expected(channel, peer);
  device_->advance_counter(s, expected, 1);
  return CountedWait{pad(rank_) + layout_.graph_signal(channel, peer), expected, 0, peer};
}

// A barrier of a captured op. NOTE [Graph flags]: a barrier of every rank is a flag barrier, the
// open op's next one, or an op of its own (two barriers, as every op has at least two); else
// counted signals (NOTE [Replay-safe signals]).
void SymmetricWorkspace::graph_barrier(Stream& s, int channel, const std::vector<int>& members,
                                       Millis limit) {
  if (graph_flags() && static_cast<int>(members.size()) == world_size_) {
    const std::string context = "barrier on channel " + std::to_string(channel) + " (rank " +
                                std::to_string(rank_) + ", graph)";
    uint32_t tag = 0;
    const int slot = next_graph_slot(s, channel, tag);
    if (slot >= 0) {
      device_->graph_kernel(s, graph_launch(channel, tag, {slot}, 1), {}, limit, context);
      return;
    }
    static constexpr char kBarrier[] = "barrier";
    graph_kernel(s, channel, graph_tag(kBarrier, sizeof(kBarrier) - 1), 2, 1, {}, context, limit);
    return;
  }
  counted_barrier(s, channel, members, limit);
}

void SymmetricWorkspace::counted_barrier(Stream& s, int channel, const std::vector<int>& members,
                                         Millis timeout) {
  std::vector<CountedWait> counted;
  for (int r : members) {
    if (r != rank_) put_counted(s, r, channel);
  }
  for (int r : members) {
    if (r != rank_) counted.push_back(expect_counted(s, r, channel));
  }
  if (counted.empty()) return;
  device_->wait_counted(s, std::move(counted), timeout,
                        "barrier on channel " + std::to_string(channel) + " (rank " +
                            std::to_string(rank_) + ", graph)");
}

uint32_t* SymmetricWorkspace::graph_flag(int target, int channel, int block, int slot,
                                         int src) const {
  check_available("graph_flag");
  check_rank(target, "graph_flag");
  check_rank(src, "graph_flag");
  check_channel(channel);
  TORCH_CHECK(block >= 0 && block < kMaxGraphBlocks && slot >= 0 && slot < kGraphSlots,
              "cuda_p2p graph_flag: block must be in [0, ", kMaxGraphBlocks, ") and slot in [0, ",
              kGraphSlots, "), got ", block, " and ", slot);
  return pad(target) + layout_.graph_flag(channel, block, slot, src);
}

GraphLaunch SymmetricWorkspace::graph_launch(int channel, uint32_t tag,
                                             std::initializer_list<int> slots, int blocks) const {
  TORCH_INTERNAL_ASSERT(graph_flags() && blocks >= 1 && blocks <= kMaxGraphBlocks &&
                        slots.size() <= static_cast<size_t>(kMaxGraphBarriers));
  GraphLaunch g;
  g.tag = tag;
  g.rank = rank_;
  g.world_size = world_size_;
  g.blocks = blocks;
  for (int slot : slots) g.slot[g.barriers++] = static_cast<uint8_t>(slot);
  g.own = graph_flag(rank_, channel, 0, 0, 0);
  for (int r = 0; r < world_size_; ++r) g.peer[r] = graph_flag(r, channel, 0, 0, 0);
  g.busy = pad(rank_) + layout_.graph_busy();
  return g;
}

uint32_t SymmetricWorkspace::next_graph_owner() {
  while (true) {
    const uint32_t owner = graph_owners_.fetch_add(1, std::memory_order_relaxed) + 1;
    if ((owner & kGraphOwnerMask) != 0) return owner & kGraphOwnerMask;
  }
}

int SymmetricWorkspace::next_graph_slot(Stream& s, int channel, uint32_t& tag) {
  check_channel(channel);
  const uint64_t capture = device_->capture_id(s);
  std::lock_guard<std::mutex> lock(graph_mu_);
  const auto it = graph_open_.find(capture);
  if (it == graph_open_.end()) return -1;
  tag = it->second.tag;
  return 1 + it->second.barriers[channel]++ % 2;  // NOTE [Graph flags]: slots 1 and 2 alternate
}

void SymmetricWorkspace::graph_abandon(Stream& s) {
  const uint64_t capture = device_->capture_id(s);
  uint32_t owner = 0;
  {
    std::lock_guard<std::mutex> lock(graph_mu_);
    const auto it = graph_open_.find(capture);
    if (it == graph_open_.end()) return;
    owner = it->second.owner;
    graph_open_.erase(it);
  }
  if (owner == 0 || !graph_flags()) return;
  // NOTE [One captured op at a time]: the open took the busy word; nothing closes it.
  GraphLaunch g = graph_launch(0, 0, {}, 1);
  g.owner = owner;
  g.releases = true;
  device_->graph_kernel(
      s, g, {}, timeout(),
      "the end of an abandoned captured op (rank " + std::to_string(rank_) + ", graph)");
}

void SymmetricWorkspace::graph_kernel(Stream& s, int channel, uint32_t tag, int barriers,
                                      int blocks, GraphKernelBody body, const std::string& context,
                                      std::optional<Millis> limit) {
  TORCH_CHECK(graph_flags() && barriers >= 2 && barriers <= kMaxGraphBarriers,
              "cuda_p2p graph_kernel: needs 2 to ", kMaxGraphRanks, " ranks and 2 to ",
              kMaxGraphBarriers, " barriers, got ", world_size_, " and ", barriers);
  GraphLaunch g = graph_launch(channel, tag, {}, blocks);
  // NOTE [Graph flags]: the open on slot 0, then 1 and 2 alternating.
  for (int i = 0; i < barriers; ++i) {
    g.slot[g.barriers++] = static_cast<uint8_t>(i == 0 ? 0 : 1 + (i - 1) % 2);
  }
  graph_abandon(s);              // an op of its own: its first barrier is an open
  g.owner = next_graph_owner();  // NOTE [One captured op at a time]: the whole kernel holds it
  g.takes = g.releases = true;
  device_->graph_kernel(s, g, std::move(body), limit.value_or(timeout()), context);
}

void SymmetricWorkspace::graph_open(Stream& s, int channel, uint32_t tag,
                                    const std::string& context) {
  check_channel(channel);
  uint32_t owner = 0;
  {
    const uint64_t capture = device_->capture_id(s);
    std::lock_guard<std::mutex> lock(graph_mu_);
    owner = next_graph_owner();
    graph_open_[capture] = GraphOpenOp{tag, std::vector<int>(options_.num_channels, 0), owner};
  }
  if (!graph_flags()) {
    std::vector<int> all(world_size_);
    std::iota(all.begin(), all.end(), 0);
    counted_barrier(s, channel, all, timeout());
    return;
  }
  GraphLaunch g = graph_launch(channel, tag, {0}, 1);
  g.owner = owner;  // NOTE [One captured op at a time]: held until the close
  g.takes = true;
  // This rank's graph signals, done words and counters (NOTE [Signal pad layout]).
  g.reset = pad(rank_) + layout_.graph_counts();
  g.reset_words = static_cast<uint32_t>(layout_.graph_counts_words());
  device_->graph_kernel(s, g, {}, timeout(),
                        context + " (open, rank " + std::to_string(rank_) + ", graph)");
}

void SymmetricWorkspace::graph_close(Stream& s, int channel, const std::string& context) {
  check_channel(channel);
  uint32_t tag = 0, owner = 0;
  int slot = -1;
  {
    const uint64_t capture = device_->capture_id(s);
    std::lock_guard<std::mutex> lock(graph_mu_);
    const auto it = graph_open_.find(capture);
    if (it == graph_open_.end()) return;
    tag = it->second.tag;
    owner = it->second.owner;
    slot = 1 + it->second.barriers[channel]++ % 2;
    graph_open_.erase(it);
  }
  const std::string what = context + " (close, rank " + std::to_string(rank_) + ", graph)";
  if (!graph_flags()) {
    std::vector<int> all(world_size_);
    std::iota(all.begin(), all.end(), 0);
    counted_barrier(s, channel, all, timeout());
    return;
  }
  GraphLaunch g = graph_launch(channel, tag, {slot}, 1);
  g.owner = owner;  // NOTE [One captured op at a time]: the open took it
  g.releases = true;
  device_->graph_kernel(s, g, {}, timeout(), what);
}

}  // namespace cuda_p2p
