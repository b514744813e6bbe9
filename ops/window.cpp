#include "ops/window.hpp"

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <string>
#include <utility>

#include "ops/op_signature.hpp"

namespace cuda_p2p::ops {

// NOTE [Window signals]
// The counters: a window's signals are sequence numbers, like the workspace's (NOTE [Signal
// sequence numbers] in p2p_workspace/symmetric_workspace.cpp), in counters of its own: W 32-bit
// words per rank in that rank's heap, word `src` written only by rank src (Device::write_signal
// into the peer's mapping) and read only by the owner, so that a wait polls its own memory.
// Invariants:
//  - a signal writes the count of signals sent so far; a wait for the k-th signal from a peer is
//    satisfied once the peer's word reaches k: a wait consumes exactly one signal, one sent
//    before the wait is already there, extra ones stay counted for the next waits (torch's NCCL
//    window: ncclSignal / ncclWaitSignal). A put sends no signal of its own (ncclPutSignal
//    cannot leave it out): a put then a signal is one signal;
//  - write_signal is ordered after the work enqueued before it on its stream (CUDA:
//    cuStreamWriteValue32's fence; host: the stream's order, a release store): a peer that waited
//    for it sees every put this rank enqueued before it on that stream;
//  - the counts advance in the order the words are written, or a word could go back: signals
//    are enqueued one at a time under the window's lock, and where calls return queued (CUDA)
//    each signal's stream first waits for the end of the previous signal to the same peer (an
//    event). Only signals to one peer are chained, and window calls do not join the group's one
//    order (NOTE [One order per group]): a wait queued on one stream must not hold back a put or
//    a signal issued later on another, which its peer may be waiting for;
//  - a wait's count advances only once the wait is enqueued (a synchronous host device: has
//    returned): a wait that timed out there consumed nothing and the window stays usable; on
//    CUDA a missed deadline fails the group's device;
//  - the owner zeroes its counters before it publishes where they are, and nobody signals before
//    it has every rank's record: no signal is lost to the zeroing.

namespace {

std::string window_rank_text(int r) { return "rank " + std::to_string(r); }

[[noreturn]] void malformed_record(const char* what, int rank, const std::string& why) {
  TORCH_CHECK(false, "cuda_p2p window: malformed ", what, " record of rank ", rank,
              " (the ranks' records are checked, not trusted): ", why);
}

// The status word of rank r's record: true when it is ok, false when the rank's checks failed.
bool window_record_ok(int64_t status, const char* what, int r) {
  if (status == kRecordOk) return true;
  if (status == kRecordFailed) return false;
  malformed_record(what, r, "status " + std::to_string(status));
}

// Every rank's record in `words` (`per` words each; `what` names them in errors): `parse(r, w)`
// for each rank whose record is ok, into `parsed`; returns the ranks whose checks failed, and
// where any did, keeps nothing parsed (the caller raises, naming them).
template <typename T, typename Parse>
std::vector<int> parse_records(c10::ArrayRef<int64_t> words, int world_size, int64_t per,
                               const char* what, std::vector<T>& parsed, Parse&& parse) {
  TORCH_CHECK(words.size() == static_cast<size_t>(world_size * per), "cuda_p2p window: expected ",
              world_size * per, " words of ", what, " records, got ", words.size());
  std::vector<int> failed;
  for (int r = 0; r < world_size; ++r) {
    const int64_t* w = words.data() + static_cast<size_t>(r * per);
    if (window_record_ok(w[0], what, r)) {
      parsed.push_back(parse(r, w));
    } else {
      failed.push_back(r);
    }
  }
  if (!failed.empty()) parsed.clear();
  return failed;
}

}  // namespace

std::vector<int64_t> signal_record(std::optional<int64_t> offset) {
  if (!offset) return {kRecordFailed, 0};
  return {kRecordOk, *offset};
}

std::vector<int64_t> region_record(const std::optional<WindowRegion>& region) {
  std::vector<int64_t> words(kRegionRecordWords, 0);
  if (!region) {
    words[0] = kRecordFailed;
    return words;
  }
  TORCH_CHECK(static_cast<int>(region->sizes.size()) <= kWindowMaxDims,
              "cuda_p2p window: expected a tensor of at most ", kWindowMaxDims, " dimensions, got ",
              region->sizes.size());
  words[0] = kRecordOk;
  words[1] = region->offset;
  words[2] = region->nbytes;
  words[3] = static_cast<int64_t>(region->dtype);
  words[4] = static_cast<int64_t>(region->sizes.size());
  for (size_t d = 0; d < region->sizes.size(); ++d) words[5 + d] = region->sizes[d];
  return words;
}

SignalRecords parse_signal_records(c10::ArrayRef<int64_t> words, int world_size,
                                   int64_t heap_bytes) {
  const int64_t block = int64_t{4} * world_size;
  SignalRecords out;
  out.failed = parse_records(
      words, world_size, kSignalRecordWords, "signal", out.offsets, [&](int r, const int64_t* w) {
        const int64_t offset = w[1];
        if (offset < 0 || offset % 4 != 0 || block > heap_bytes || offset > heap_bytes - block) {
          malformed_record("signal", r,
                           "counters at offset " + std::to_string(offset) + " (" +
                               std::to_string(block) + " bytes) outside a heap of " +
                               std::to_string(heap_bytes) + " bytes");
        }
        return offset;
      });
  return out;
}

RegionRecords parse_region_records(c10::ArrayRef<int64_t> words, int world_size,
                                   int64_t heap_bytes) {
  RegionRecords out;
  out.failed = parse_records(
      words, world_size, kRegionRecordWords, "region", out.regions, [&](int r, const int64_t* w) {
        WindowRegion region;
        region.offset = w[1];
        region.nbytes = w[2];
        const int64_t dtype = w[3], dims = w[4];
        if (region.offset < 0 || region.nbytes < 0 || region.offset > heap_bytes ||
            region.nbytes > heap_bytes - region.offset) {
          malformed_record("region", r,
                           std::to_string(region.nbytes) + " bytes at offset " +
                               std::to_string(region.offset) + " outside a heap of " +
                               std::to_string(heap_bytes) + " bytes");
        }
        if (dtype < 0 || dtype >= static_cast<int64_t>(at::ScalarType::NumOptions) ||
            dtype == static_cast<int64_t>(at::ScalarType::Undefined) ||
            c10::isQIntType(static_cast<at::ScalarType>(dtype))) {
          malformed_record("region", r, "dtype " + std::to_string(dtype));
        }
        region.dtype = static_cast<at::ScalarType>(dtype);
        const auto item = static_cast<int64_t>(c10::elementSize(region.dtype));
        if (region.offset % item != 0) {
          malformed_record("region", r,
                           "offset " + std::to_string(region.offset) +
                               " is not a multiple of the " + std::to_string(item) +
                               "-byte elements");
        }
        if (dims < 0 || dims > kWindowMaxDims) {
          malformed_record("region", r, std::to_string(dims) + " dimensions");
        }
        uint64_t numel = 1;
        for (int64_t d = 0; d < dims; ++d) {
          const int64_t s = w[5 + d];
          if (s < 0 || c10::mul_overflows(numel, static_cast<uint64_t>(s), &numel)) {
            malformed_record("region", r,
                             "size " + std::to_string(s) + " of dimension " + std::to_string(d));
          }
          region.sizes.push_back(s);
        }
        uint64_t bytes = 0;
        if (c10::mul_overflows(numel, static_cast<uint64_t>(item), &bytes) ||
            bytes != static_cast<uint64_t>(region.nbytes)) {
          malformed_record("region", r,
                           std::to_string(numel) + " elements of " + dtype_name(region.dtype) +
                               " in " + std::to_string(region.nbytes) + " bytes");
        }
        return region;
      });
  return out;
}

WindowProtocol::WindowProtocol(SymmetricWorkspace& heap, std::vector<int64_t> signal_offsets)
    : heap_(heap),
      signal_offsets_(std::move(signal_offsets)),
      sent_(heap.world_size(), 0),
      last_signal_(heap.world_size()),
      wait_mutex_(std::make_unique<std::mutex[]>(heap.world_size())),
      expected_(heap.world_size(), 0) {
  TORCH_CHECK(static_cast<int>(signal_offsets_.size()) == heap.world_size(),
              "cuda_p2p window: expected ", heap.world_size(), " signal offsets, got ",
              signal_offsets_.size());
}

void WindowProtocol::check_rank(int r, const char* what, const char* role) const {
  TORCH_CHECK_VALUE(r >= 0 && r < world_size(), "cuda_p2p window ", what, ": expected ", role,
                    " in [0, ", world_size(), "), got ", r, " on rank ", rank());
}

uint32_t* WindowProtocol::counter(int owner, int src) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(heap_.buffer(owner)) +
                                     signal_offsets_[owner]) +
         src;
}

void WindowProtocol::set_regions(std::vector<WindowRegion> regions) {
  TORCH_CHECK(static_cast<int>(regions.size()) == world_size(), "cuda_p2p window: expected ",
              world_size(), " regions, got ", regions.size());
  std::lock_guard<std::mutex> lock(mutex_);
  regions_ = std::move(regions);
}

void WindowProtocol::clear_regions() {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.clear();
}

bool WindowProtocol::registered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !regions_.empty();
}

WindowRegion WindowProtocol::region(int rank, const char* what) const {
  check_rank(rank, what, "a rank");
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!regions_.empty(), "cuda_p2p window ", what,
              ": the window has no registered tensor (call tensor_register, or new_window with a "
              "tensor, on every rank first)");
  return regions_[rank];
}

// NOTE [Host ops return complete] in ops/pipeline_common.hpp: on a synchronous host device a
// call has run when it returns, also on a stream that does not run inline.
namespace {
void finish_window_call(Device& device, Stream& s) {
  if (device.host_synchronous() && !inline_paths(device, s)) device.synchronize(s);
}
}  // namespace

void WindowProtocol::put(Stream& s, const at::Tensor& src, int dst, int64_t offset) {
  check_rank(dst, "put", "dst_rank");
  const at::Device device = heap_.device().tensor_device();
  TORCH_CHECK_VALUE(src.defined() && src.layout() == at::kStrided && src.device() == device,
                    "cuda_p2p window put: expected a strided tensor on ", device,
                    " (the window's device), got ",
                    src.defined() ? src.device().str() : std::string("an undefined tensor"));
  TORCH_CHECK_VALUE(src.is_contiguous(), "cuda_p2p window put: expected a contiguous tensor");
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!regions_.empty(),
              "cuda_p2p window put: the window has no registered tensor (call tensor_register, "
              "or new_window with a tensor, on every rank first)");
  const WindowRegion& r = regions_[dst];
  TORCH_CHECK_VALUE(src.scalar_type() == r.dtype, "cuda_p2p window put: rank ", dst,
                    "'s window holds ", dtype_name(r.dtype), ", but the tensor put is ",
                    dtype_name(src.scalar_type()), " (on rank ", rank(), ")");
  const auto item = static_cast<int64_t>(c10::elementSize(r.dtype));
  const int64_t capacity = r.nbytes / item, n = src.numel();
  TORCH_CHECK_VALUE(offset >= 0, "cuda_p2p window put: expected an element offset >= 0, got ",
                    offset, " (on rank ", rank(), ")");
  TORCH_CHECK_VALUE(offset <= capacity && n <= capacity - offset, "cuda_p2p window put: rank ", dst,
                    "'s window holds ", capacity, " elements of ", dtype_name(r.dtype),
                    ", but the put writes ", n, " elements at element offset ", offset,
                    " (up to element ", static_cast<uint64_t>(offset) + static_cast<uint64_t>(n),
                    "; on rank ", rank(), "): nothing was written");
  if (n == 0) return;
  void* to = static_cast<char*>(heap_.buffer(dst)) + r.offset + offset * item;
  heap_.device().copy(s, to, src.data_ptr(), static_cast<size_t>(n * item));
  finish_window_call(heap_.device(), s);
}

void WindowProtocol::signal(Stream& s, int peer) {
  check_rank(peer, "signal", "peer_rank");
  Device& device = heap_.device();
  std::lock_guard<std::mutex> lock(mutex_);
  const bool queued = !device.host_synchronous();  // NOTE [Window signals]: in issue order
  if (queued && last_signal_[peer]) device.wait_event(s, *last_signal_[peer]);
  const uint32_t value = sent_[peer] + 1;
  device.write_signal(s, counter(peer, rank()), value);
  sent_[peer] = value;
  if (queued) last_signal_[peer] = device.record(s);
  finish_window_call(device, s);
}

void WindowProtocol::wait(Stream& s, int peer, Millis timeout) {
  check_rank(peer, "wait_signal", "peer_rank");
  std::lock_guard<std::mutex> lock(wait_mutex_[peer]);
  const uint32_t value = expected_[peer] + 1;
  heap_.device().wait_signals(s, {SignalWait{counter(rank(), peer), value, peer}}, timeout,
                              window_rank_text(rank()) + "'s window wait_signal for signal #" +
                                  std::to_string(value) + " from " + window_rank_text(peer));
  finish_window_call(heap_.device(), s);
  expected_[peer] = value;  // NOTE [Window signals]: only a wait that did not raise consumed one
}

at::Tensor WindowProtocol::remote(int peer) const {
  const WindowRegion r = region(peer, "map_remote_tensor");
  const auto item = static_cast<int64_t>(c10::elementSize(r.dtype));
  return heap_.get_buffer(peer, r.sizes, r.dtype, r.offset / item);
}

}  // namespace cuda_p2p::ops
