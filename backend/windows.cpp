#include "backend/windows.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <utility>

#include "backend/works.hpp"
#include "ops/op_signature.hpp"

namespace cuda_p2p {

using ops::OpId;

// NOTE [Window registration]
// tensor_register is collective: every rank publishes where its registered memory lies in its
// symmetric heap and what it holds ({offset, bytes, dtype, sizes}: ops::region_record), over the
// wrapped CPU backend's all-gather, and checks every peer's record before any put may use it.
// Which memory: the tensor's own, as NCCL's window registers it, so that the peers' puts land where
// the user reads and the user's writes are what peers read (get_attr's UNIFIED is true):
//  - a contiguous tensor in this group's heap (cuda_p2p.empty, use_symmetric_memory) is
//    registered where it lies;
//  - any other contiguous tensor on the heap's device first has its storage moved into the heap
//    (NOTE [Storage moved into the heap] in symmetric_memory.cpp: the tensor object and its views
//    then alias a heap block; a view of a larger tensor moves that tensor's whole storage), or
//    raises when its memory belongs to another owner (numpy, from_blob, shared or pinned memory);
//  - a non-contiguous tensor raises (the puts address elements in row-major order).
// Counted window.register_in_place / window.register_moved.
// Ranks may register different sizes and dtypes: a put checks the destination's record. The
// window holds what it registered until tensor_deregister whatever `owning` says, since a peer
// may write it until then. A rank whose own checks fail (a second registration, another device,
// a full heap) still takes part in the exchange with a failed record: every rank then raises,
// naming it, and none registers - nobody waits for a rank that left, and no put can reach a
// region that was never published. tensor_deregister is collective the same way: each rank
// first waits for its own puts to have run (Device::quiesce: on a GPU they are queued, on the
// streams its window calls used), then the exchange tells it that every peer has done so, and
// only then is its region dropped (the tensor stays where it is: a moved one in the heap, until its
// storage dies). A registration after it publishes anew.
// NOTE [Mapped tensors outlive no registration]
// A tensor from map_remote_tensor(peer) aliases the peer's registered memory as this process maps
// it; after tensor_deregister the peer's heap may hand that memory to its next allocation, so such
// a tensor would silently read and write someone else's data. The window therefore keeps a weak
// reference to the storage of every peer's tensor it mapped, and tensor_deregister refuses while
// any of them is alive on any rank (its own check fails, so the exchange tells every rank, and the
// window stays registered): drop them (and their views) first. The own rank's is a view of the
// registered tensor itself, which keeps its memory as long as it lives: no hazard, no check.
// The signal counters belong to the window, not to the registration: they count on across
// tensor_deregister and tensor_register.
// Making the window is collective too (the counters' offsets are exchanged); dropping it is not:
// a window must be dropped only once no peer will put into it or signal it any more (after a
// tensor_deregister, or a barrier), since its heap memory is then reused.

namespace {

// Blocks until the work the caller's current stream holds has run: the zeroing or the copy a
// rank does before it publishes where they are. Not on the host's inline stream, whose work ran
// when it was enqueued and which every thread shares: its synchronize would also wait for a
// window wait blocked in another thread.
void settle_current_stream(Device& device) {
  auto stream = device.current_stream();
  if (!inline_paths(device, *stream)) device.synchronize(*stream);
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() > 1 ? "ranks " : "rank ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

WorkspaceWindow::WorkspaceWindow(WindowGroup group) : g_(std::move(group)) {
  g_.heap.ensure();  // collective the first time: every rank makes the heap together
  SymmetricWorkspace* heap = g_.heap.heap();
  const int W = g_.group.size;
  std::exception_ptr error;
  std::optional<int64_t> offset;
  try {
    signals_ = g_.heap.empty({W}, at::kInt);
    signals_.zero_();
    offset = g_.heap.offset(signals_);
    // Zeroed before a peer learns where (NOTE [Window signals]).
    settle_current_stream(heap->device());
  } catch (const std::exception&) {
    error = std::current_exception();
    signals_ = at::Tensor();
  }
  const auto records = ops::parse_signal_records(
      all_gather(ops::signal_record(offset), "new_window"), W, heap->buffer_size());
  if (error) std::rethrow_exception(error);
  TORCH_CHECK(records.failed.empty(), "cuda_p2p new_window: ", ranks_text(records.failed),
              " could not place the window's signal counters in its symmetric heap (its own "
              "error says why); no rank made the window");
  protocol_ = std::make_unique<ops::WindowProtocol>(*heap, records.offsets);
  g_.counters.record(OpId::kWindow, "new");
}

WorkspaceWindow::~WorkspaceWindow() = default;

std::vector<int64_t> WorkspaceWindow::all_gather(const std::vector<int64_t>& mine,
                                                 const char* what) {
  TORCH_CHECK(!g_.coalescing(), "cuda_p2p window ", what,
              ": called while the group is coalescing (inside a coalescing manager or between "
              "startCoalescing and endCoalescing); call it outside");
  at::Tensor input = at::tensor(c10::ArrayRef<int64_t>(mine), at::kLong);
  at::Tensor output = at::empty({g_.group.size * static_cast<int64_t>(mine.size())}, at::kLong);
  c10d::AllgatherOptions opts;
  opts.timeout = g_.timeout();
  g_.exchange->_allgather_base(output, input, opts)->wait(opts.timeout);
  const int64_t* p = output.const_data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + output.numel());
}

int WorkspaceWindow::checked_rank(int64_t r, const char* what, const char* role) const {
  TORCH_CHECK_VALUE(r >= 0 && r < g_.group.size, "cuda_p2p window ", what, ": expected ", role,
                    " in [0, ", g_.group.size, "), got ", r, " on rank ", g_.group.rank);
  return static_cast<int>(r);
}

void WorkspaceWindow::tensor_register(const at::Tensor& tensor, bool /*owning*/) {
  std::lock_guard<std::mutex> lock(registration_mutex_);
  SymmetricWorkspace* heap = g_.heap.heap();
  std::exception_ptr error;
  std::optional<ops::WindowRegion> mine;
  at::Tensor held;
  bool in_place = false;
  try {
    TORCH_CHECK(!protocol_->registered(),
                "cuda_p2p window tensor_register: the window already has a registered tensor "
                "(call tensor_deregister first, on every rank)");
    const at::Device device = g_.heap.device();
    TORCH_CHECK_VALUE(
        tensor.defined() && tensor.layout() == at::kStrided && tensor.device() == device,
        "cuda_p2p window tensor_register: expected a strided tensor on ", device,
        " (the device of this group's symmetric heap), got ",
        tensor.defined() ? tensor.device().str() : std::string("an undefined one"));
    TORCH_CHECK_VALUE(tensor.dim() <= ops::kWindowMaxDims,
                      "cuda_p2p window tensor_register: expected a tensor of at most ",
                      ops::kWindowMaxDims, " dimensions, got ", tensor.dim());
    // NOTE [Window registration]: the puts land in the tensor itself, in row-major order.
    TORCH_CHECK_VALUE(tensor.is_contiguous(),
                      "cuda_p2p window tensor_register: expected a contiguous tensor (the peers' "
                      "puts address its elements in row-major order), got one of sizes ",
                      tensor.sizes(), " and strides ", tensor.strides(),
                      "; register a contiguous one (t.contiguous() is a copy: read that copy)");
    in_place = g_.heap.offset(tensor) >= 0;
    if (!in_place) g_.heap.move_into_heap(tensor);  // NOTE [Storage moved into the heap]
    held = tensor;
    mine = ops::WindowRegion{g_.heap.offset(held), static_cast<int64_t>(held.nbytes()),
                             held.scalar_type(), held.sizes().vec()};
    // What this rank queued that writes the tensor has run before a peer may put into it.
    settle_current_stream(heap->device());
  } catch (const std::exception&) {
    error = std::current_exception();
    mine.reset();
    held = at::Tensor();
  }
  const auto records = ops::parse_region_records(
      all_gather(ops::region_record(mine), "tensor_register"), g_.group.size, heap->buffer_size());
  if (error) std::rethrow_exception(error);
  TORCH_CHECK(records.failed.empty(),
              "cuda_p2p window tensor_register: ", ranks_text(records.failed),
              " could not register its tensor (its own error says why); no rank registered one");
  protocol_->set_regions(records.regions);
  registered_ = std::move(held);
  g_.counters.record(OpId::kWindow, in_place ? "register_in_place" : "register_moved");
}

void WorkspaceWindow::tensor_deregister() {
  std::lock_guard<std::mutex> lock(registration_mutex_);
  std::exception_ptr error;
  try {
    TORCH_CHECK(protocol_->registered(),
                "cuda_p2p window tensor_deregister: the window has no registered tensor");
    const std::string alive = live_mappings();
    TORCH_CHECK(alive.empty(), "cuda_p2p window tensor_deregister: ", alive,
                " still alive on rank ", g_.group.rank,
                "; after tensor_deregister that memory may be reused, so drop them (and their "
                "views) first (NOTE [Mapped tensors outlive no registration])");
    g_.heap.heap()->device().quiesce();  // NOTE [Window registration]: this rank's puts have run
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  const auto words = all_gather({error ? ops::kRecordFailed : ops::kRecordOk}, "tensor_deregister");
  if (error) std::rethrow_exception(error);
  std::vector<int> failed;
  for (int r = 0; r < g_.group.size; ++r) {
    TORCH_CHECK(words[r] == ops::kRecordOk || words[r] == ops::kRecordFailed,
                "cuda_p2p window: malformed deregistration record of rank ", r, ": ", words[r]);
    if (words[r] != ops::kRecordOk) failed.push_back(r);
  }
  TORCH_CHECK(failed.empty(), "cuda_p2p window tensor_deregister: ", ranks_text(failed),
              " could not deregister (its own error says why); the window stays registered");
  protocol_->clear_regions();
  registered_ = at::Tensor();
  g_.counters.record(OpId::kWindow, "deregister");
}

template <typename Fn>
c10::intrusive_ptr<c10d::Work> WorkspaceWindow::run(const char* what, c10d::OpType type,
                                                    std::vector<at::Tensor> outputs, Fn&& fn) {
  const std::shared_ptr<Device>& device = g_.heap.heap()->device_ptr();
  auto stream = device->current_stream();
  const std::string op = std::string("window ") + what;
  device->check_healthy(op.c_str());  // an aborted or shut-down group raises here
  TORCH_CHECK(device->capture_id(*stream) == 0, "cuda_p2p window ", what,
              ": the stream is being captured into a graph; window calls are not captured "
              "(docs/windows.md)");
  fn(*stream);
  if (device->host_synchronous()) {  // it has run (ops/window.cpp)
    return c10::make_intrusive<EventWork>(g_.group.rank, type, std::move(outputs));
  }
  return c10::make_intrusive<EventWork>(g_.group.rank, type, std::move(outputs), device,
                                        device->record(*stream), g_.abort_hooks);
}

c10::intrusive_ptr<c10d::Work> WorkspaceWindow::put(const at::Tensor& tensor, int64_t dstRank,
                                                    int64_t targetOffsetNelems, bool /*asyncOp*/,
                                                    const c10d::PutOptions& /*opts*/) {
  const int dst = checked_rank(dstRank, "put", "dst_rank");
  at::Tensor src = tensor;
  // A strided tensor on the window's device is put in its logical order; ops::WindowProtocol
  // names what else is wrong with it.
  if (src.defined() && src.layout() == at::kStrided && src.device() == g_.heap.device() &&
      !src.is_contiguous()) {
    src = src.contiguous();
  }
  auto work = run("put", c10d::OpType::SEND, {tensor}, [&](Stream& s) {
    protocol_->put(s, src, dst, targetOffsetNelems);
    protocol_->device().record_stream(src, s);
  });
  g_.counters.record(OpId::kWindow, "put");
  return work;
}

c10::intrusive_ptr<c10d::Work> WorkspaceWindow::signal(int64_t peerRank, bool /*asyncOp*/,
                                                       const c10d::SignalOptions& /*opts*/) {
  const int peer = checked_rank(peerRank, "signal", "peer_rank");
  auto work = run("signal", c10d::OpType::SEND, {}, [&](Stream& s) { protocol_->signal(s, peer); });
  g_.counters.record(OpId::kWindow, "signal");
  return work;
}

c10::intrusive_ptr<c10d::Work> WorkspaceWindow::wait_signal(int64_t peerRank, bool /*asyncOp*/,
                                                            const c10d::WaitSignalOptions& opts) {
  const int peer = checked_rank(peerRank, "wait_signal", "peer_rank");
  // kUnsetTimeout (negative): the group's.
  const Millis timeout = opts.timeout.count() < 0 ? g_.timeout() : Millis(opts.timeout);
  auto work = run("wait_signal", c10d::OpType::RECV, {},
                  [&](Stream& s) { protocol_->wait(s, peer, timeout); });
  g_.counters.record(OpId::kWindow, "wait_signal");
  return work;
}

std::string WorkspaceWindow::live_mappings() {
  std::erase_if(mapped_, [](const auto& m) { return m.second.expired(); });
  if (mapped_.empty()) return "";
  std::vector<int> ranks;
  for (const auto& m : mapped_) {
    if (std::find(ranks.begin(), ranks.end(), m.first) == ranks.end()) ranks.push_back(m.first);
  }
  std::sort(ranks.begin(), ranks.end());
  return std::to_string(mapped_.size()) + (mapped_.size() > 1 ? " tensors" : " tensor") +
         " from map_remote_tensor (of " + ranks_text(ranks) + ") " +
         (mapped_.size() > 1 ? "are" : "is");
}

at::Tensor WorkspaceWindow::map_remote_tensor(int64_t rank) {
  const int r = checked_rank(rank, "map_remote_tensor", "a rank");
  std::lock_guard<std::mutex> lock(registration_mutex_);  // NOTE [Mapped tensors outlive ...]
  at::Tensor t = protocol_->remote(r);
  if (r == g_.group.rank) {
    t = registered_.view(t.sizes());  // the same memory, holding it as the registered tensor does
  } else {
    std::erase_if(mapped_, [](const auto& m) { return m.second.expired(); });
    mapped_.emplace_back(
        r, c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()));
  }
  g_.counters.record(OpId::kWindow, "map_remote_tensor");
  return t;
}

c10d::WindowAttr WorkspaceWindow::get_attr(int64_t peerRank) {
  checked_rank(peerRank, "get_attr", "peer_rank");
  // Every peer's registered memory is mapped into this process, one coherent view for host code
  // and the device alike (map_remote_tensor): no separate public copy to synchronise.
  return c10d::WindowAttr{c10d::WindowAccessType::UNIFIED};
}

}  // namespace cuda_p2p
