// The one-sided window protocol: torch's c10d::Window (Backend::new_window, torch 2.14) on a
// group's symmetric heap (docs/windows.md). Each rank registers a region of its own heap that its
// peers write with puts, and owns a block of signal counters there, one per peer. Written once
// over the device interface, so that the host (shared memory) and CUDA (IPC) run the same code:
//   put          Device::copy into the peer's region as this rank maps it (the copy engine on CUDA)
//   signal       Device::write_signal of the next sequence number into the peer's counter of me
//   wait_signal  Device::wait_signals on this rank's counter of the peer, with the timeout
// (NOTE [Window signals]). The backend (backend/windows.*) makes it a c10d::Window: it allocates
// the heap memory, exchanges the records below among the ranks and turns calls into Works.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "p2p_workspace/device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p::ops {

// What every rank publishes when a window is made and when a tensor is registered, int64 words
// each: a status, then what it registered. A rank whose own checks failed publishes
// kRecordFailed, so that every rank raises (naming it) instead of waiting for it, and no rank
// changes its window (NOTE [Window registration]).
inline constexpr int64_t kRecordOk = 0;
inline constexpr int64_t kRecordFailed = 1;
// A window's signal counters: {status, offset of the rank's W counters in its heap}.
inline constexpr int kSignalRecordWords = 2;
// A registered region: {status, offset in the heap, bytes, dtype, dims, sizes[kWindowMaxDims]}.
inline constexpr int kWindowMaxDims = 16;
inline constexpr int kRegionRecordWords = 5 + kWindowMaxDims;

// One rank's registered memory: `nbytes` at `offset` of its heap, a contiguous tensor of `sizes`
// and `dtype`.
struct WindowRegion {
  int64_t offset = 0;
  int64_t nbytes = 0;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes;
};

// This rank's records (nullopt: its checks failed).
std::vector<int64_t> signal_record(std::optional<int64_t> offset);
std::vector<int64_t> region_record(const std::optional<WindowRegion>& region);

// Every rank's records, rank r's at words [r * K, (r + 1) * K), read and checked against a heap
// of `heap_bytes` per rank for `world_size` ranks: what peers publish is validated like the
// workspace's records (a malformed one raises, naming its rank). `failed`: the ranks whose own
// checks failed (then the other fields are empty).
struct SignalRecords {
  std::vector<int64_t> offsets;
  std::vector<int> failed;
};
SignalRecords parse_signal_records(c10::ArrayRef<int64_t> words, int world_size,
                                   int64_t heap_bytes);
struct RegionRecords {
  std::vector<WindowRegion> regions;
  std::vector<int> failed;
};
RegionRecords parse_region_records(c10::ArrayRef<int64_t> words, int world_size,
                                   int64_t heap_bytes);

// The protocol of one window, over the group's symmetric heap (every rank maps every peer's).
// Calls may come from several threads: puts and signals are enqueued one at a time, and waits
// for one peer one at a time (NOTE [Window signals]).
class WindowProtocol {
 public:
  // `signal_offsets[r]`: where rank r's W counters lie in its heap (parse_signal_records), zeroed
  // by each rank before it published them.
  WindowProtocol(SymmetricWorkspace& heap, std::vector<int64_t> signal_offsets);

  int rank() const { return heap_.rank(); }
  int world_size() const { return heap_.world_size(); }
  Device& device() const { return heap_.device(); }

  // Every rank's region, from parse_region_records: puts and map_remote_tensor may use them.
  void set_regions(std::vector<WindowRegion> regions);
  void clear_regions();
  bool registered() const;
  // Rank `rank`'s region (`what` names the call in the errors).
  WindowRegion region(int rank, const char* what) const;

  // Copies `src` (contiguous, on the heap's device, of the destination's dtype) into `dst`'s
  // region at element `offset`, in the order of `s`. Everything is checked before anything is
  // enqueued: no put writes outside the destination's region.
  void put(Stream& s, const at::Tensor& src, int dst, int64_t offset);
  // Tells `peer` one more signal, after everything enqueued on `s` before it (the puts).
  void signal(Stream& s, int peer);
  // Waits for one more signal from `peer` (NOTE [Window signals]); the timeout's error names the
  // peer. A wait that raises on a synchronous host device consumed nothing.
  void wait(Stream& s, int peer, Millis timeout);
  // A tensor aliasing `peer`'s region as this rank maps it (its sizes and dtype).
  at::Tensor remote(int peer) const;

 private:
  void check_rank(int r, const char* what, const char* role) const;
  uint32_t* counter(int owner, int src) const;

  SymmetricWorkspace& heap_;
  const std::vector<int64_t> signal_offsets_;
  mutable std::mutex mutex_;  // regions_, sent_, last_signal_ and the order of puts and signals
  std::vector<WindowRegion> regions_;
  std::vector<uint32_t> sent_;
  // Where calls return queued: the end of the last signal to each peer (NOTE [Window signals]).
  std::vector<std::shared_ptr<Event>> last_signal_;
  // expected_[p] under wait_mutex_[p]: a host wait blocks while it holds its peer's lock only.
  std::unique_ptr<std::mutex[]> wait_mutex_;
  std::vector<uint32_t> expected_;
};

}  // namespace cuda_p2p::ops
