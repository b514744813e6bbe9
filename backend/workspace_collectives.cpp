// WorkspaceCollectives: the engine (which calls the workspace serves, the argument checks that
// tell the peers, the route's handshake, one collective at a time). Each op's body is in its
// slice (backend/collectives/<op>.cpp).
#include "backend/workspace_collectives.hpp"

#include <c10/util/Exception.h>

#include <numeric>
#include <utility>

#include "backend/counters.hpp"
#include "backend/tensor_args.hpp"
#include "ops/channels.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

WorkspaceCollectives::WorkspaceCollectives(const EngineContext& group, ops::FailureRecord& failure,
                                           std::shared_ptr<std::atomic<int64_t>> splits)
    : group_(group),
      ws_(group.workspace),
      config_(group.config),
      failure_(failure),
      rank_(group.rank),
      size_(group.size) {
  state_.parallel_splits = std::move(splits);
}

std::string WorkspaceCollectives::off_reason() const {
  if (!ws_ || !ws_->available()) {
    return "the workspace is unavailable: " + workspace_unavailable_reason(group_);
  }
  if (!config_.collectives) {
    return "turned off (Options.workspace_collectives = False or "
           "CUDA_P2P_WORKSPACE_COLLECTIVES=0)";
  }
  if (!on_host() && !config_.cuda_collectives) {
    return "collectives on CUDA tensors go to NCCL by default; opt in with "
           "Options.cuda_workspace_collectives = True or CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1";
  }
  return "";
}

const char* WorkspaceCollectives::rejects(c10::ArrayRef<at::Tensor> tensors) const {
  if (!on()) return reason::kWorkspaceOff;
  const at::Device device = ws_->device().tensor_device();
  for (const auto& t : tensors) {
    if (!t.defined() || t.layout() != at::kStrided || t.device() != device) return reason::kDevice;
  }
  return nullptr;
}

const char* WorkspaceCollectives::all_reduce_rejects(const at::Tensor& t) const {
  if (const char* why = rejects({t})) return why;
  return ops::is_reducible_dtype(t.scalar_type()) ? nullptr : reason::kDtype;
}

// NOTE [Mismatches reach the Work] in backend/works.cpp.
std::function<void()> WorkspaceCollectives::recorded_mismatch_check(const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A copy shares the record (the device's pool words, which the device keeps for its life); it
  // never hands out a handshake number.
  ops::SignatureState records = state_.signature;
  if (records.device_record.host == nullptr) return {};
  return [records, what, device = ws_->device_ptr()]() mutable {
    ops::check_signature_record(records, what, device.get());
  };
}

// NOTE [Collectives of a group run one at a time]
// A group's workspace collectives share its buffer halves, its phase counter and the signal
// counts of the collective channel, so they must run in one order on every rank and never
// overlap. On the host they run synchronously on the calling thread (the device's inline stream),
// under the engine's mutex, so threads that share a group cannot interleave them. On CUDA they
// are enqueued on the caller's current stream; each one first waits for the end of the group's
// previous workspace op, a collective or a fused op (NOTE [One order per group] in
// p2p_workspace/symmetric_workspace.cpp), so that ops issued on different streams (FSDP's
// all-gather and reduce-scatter streams) still execute one after another, in issue order, as the
// signal counts and the shared buffer assume.
ops::Outcome WorkspaceCollectives::run(
    const char* what, c10::function_ref<ops::Outcome(const ops::CollectiveContext&)> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  failure_.check(what);
  ops::check_signature_record(state_.signature, what, &ws_->device());
  Device& device = ws_->device();
  auto stream = device.current_stream();
  // Before anything is enqueued (NOTE [Device failure] in p2p_workspace/watchdog.hpp).
  device.check_healthy(what);
  ws_->begin_op(*stream);
  const ops::CollectiveContext ctx{*ws_, *stream, ops::kCollectiveChannel, state_,
                                   config_.collective};
  ops::Outcome outcome;
  try {
    outcome = fn(ctx);
    // NOTE [Host ops return complete] in ops/pipeline_common.hpp (a captured op has not run).
    if (!inline_paths(device, *stream) && device.host_synchronous() && !ws_->capturing(*stream)) {
      device.synchronize(*stream);
    }
  } catch (const ops::SignatureMismatch&) {
    // The op ran nowhere and the phases were settled: the group stays usable.
    keep_in_flight(*stream, /*failed=*/true);
    ws_->end_op(*stream);
    throw;
  } catch (const std::exception& e) {
    keep_in_flight(*stream, /*failed=*/true);
    state_.pending.reset();
    failure_.mark(what, e);
    ws_->end_op(*stream);
    throw;
  }
  keep_in_flight(*stream, /*failed=*/false);
  TORCH_INTERNAL_ASSERT(!state_.pending, "cuda_p2p ", what,
                        ": the op's signature was never compared");
  // NOTE [Replay-safe signals]: an op enqueued under capture runs on each replay.
  outcome.graph = ws_->capturing(*stream);
  ws_->end_op(*stream);
  return outcome;
}

void WorkspaceCollectives::check_or_reject(const char* what, ops::OpId kind,
                                           c10::function_ref<void()> checks) {
  ops::check_or_reject(failure_, size_ > 1, checks, [&](const std::string& reason) {
    run(what, [&](const ops::CollectiveContext& ctx) {
      ops::reject(ctx, kind, reason);
      return ops::Outcome{};
    });
  });
}

// NOTE [Routes agree]
// Why: a collective the workspace serves goes to the wrapped backend on a rank whose call the
// workspace cannot take (a dtype it does not reduce, another device, several tensors, a reduce op
// it lacks). Were its peers' calls workspace ones, they would wait at their first barrier, and
// this rank in Gloo or NCCL, until the timeout.
// How: on a host workspace such a rank first takes part in the op's handshake (ops::announce)
// with a signature naming its route ("1000 x bool sum (wrapped: dtype)"): ranks that route alike
// go on to the wrapped backend, others raise the same error (NOTE [Op signatures]), and the group
// stays usable. Cost: a handshake barrier before a wrapped call.
//  - where the comparison runs in stream order (CUDA, the host with CUDA's semantics) the rank
//    then waits for its stream to have compared (the one synchronize of a call that falls back,
//    on a group whose workspace collectives are on) and raises a disagreement before it enters
//    the wrapped backend; its peers' Works raise it (NOTE [Mismatches reach the Work] in
//    backend/works.cpp) instead of their op taking this rank's next one for its own;
//  - not under capture (nothing is compared there: NOTE [Replay-safe signals]), nor without a
//    workspace.
void WorkspaceCollectives::agree_on_route(const char* what, ops::OpId kind,
                                          c10::ArrayRef<at::Tensor> tensors,
                                          c10::function_ref<std::string()> detail,
                                          const char* why) {
  if (!on() || size_ == 1) return;
  Device& device = ws_->device();
  const auto stream = device.current_stream();
  const bool in_order = !synchronous();  // compared in stream order, after run() returns
  if (in_order && ws_->capturing(*stream)) return;
  const std::string text =
      ops::describe_tensors(tensors) + detail() + " (wrapped: " + reason::text(why) + ")";
  run(what, [&](const ops::CollectiveContext& ctx) {
    ops::announce(ctx, kind, text);
    return ops::Outcome{};
  });
  if (!in_order) return;
  device.synchronize(*stream);
  if (auto check = recorded_mismatch_check(what)) check();
}

void WorkspaceCollectives::set_heap(SymmetricWorkspace* heap) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.heap = heap;
}

void WorkspaceCollectives::refuse_capture(const char* what, const char* why) const {
  TORCH_CHECK(ws_->device().capture_id(*ws_->device().current_stream()) == 0, "cuda_p2p ", what,
              ": cannot be captured in a graph", why, "; call it outside the capture");
}

// NOTE [Tensors in stream order]
// On CUDA, and on a host device with CUDA's semantics, an op is still queued when the call
// returns, and its tensors must live until its stream has run it, whatever the caller drops:
//  - on CUDA the caching allocator gives that: a block freed is reused only by work enqueued
//    after it on the stream (the op's, the caller's current one);
//  - on the host a closure the op leaves on its stream holds them, except under capture, where
//    a graph's tensors are the caller's to keep, as on CUDA. An op can leave by an exception (a
//    timeout, a peer's failure) with its work still queued, and a released wait lets that work
//    run on (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp): so a body names what
//    its work touches (keep, before the op; the op's host temporaries go in
//    CollectiveState::in_flight) and run() leaves the closure that holds them on the stream
//    whichever way the body left (copy_back's closure holds its two); on CUDA, after a failure,
//    it records them on the stream for the caching allocators (Device::record_stream: device
//    memory and pinned host memory, which a host allocator would otherwise hand out again at
//    once);
//  - a synchronous host device has run the op when it returns.
// A window's put (backend/windows.cpp) holds its source with Device::record_stream, which on a
// host device with CUDA's semantics leaves such a closure on the stream too.
// Where the caller's tensors are not contiguous (or overlap), a body computes into contiguous
// temporaries, and the copy back into the caller's tensor is launched on the op's stream after it
// (on CUDA an ATen copy on the current stream, called at once: in stream order).
void WorkspaceCollectives::copy_back(const at::Tensor& dst, const at::Tensor& src) const {
  if (dst.is_same(src)) return;  // the op's body kept it
  Device& device = ws_->device();
  device.launch(*device.current_stream(), [dst, src] { dst.copy_(src); });
}

void WorkspaceCollectives::keep(std::initializer_list<at::Tensor> tensors) {
  state_.in_flight.insert(state_.in_flight.end(), tensors.begin(), tensors.end());
}

void WorkspaceCollectives::keep(const std::vector<at::Tensor>& tensors) {
  state_.in_flight.insert(state_.in_flight.end(), tensors.begin(), tensors.end());
}

void WorkspaceCollectives::keep_in_flight(Stream& stream, bool failed) noexcept {
  std::vector<at::Tensor> held = std::move(state_.in_flight);
  state_.in_flight.clear();
  if (held.empty() || ws_->capturing(stream)) return;  // a graph's tensors: the caller keeps them
  Device& device = ws_->device();
  const HostPaths* host = device.host_paths();
  // A synchronous host device has run the op when it returns, unless it raised.
  if (host != nullptr && host->synchronous() && !failed) return;
  try {
    if (host == nullptr) {
      // CUDA: the caching allocators (device and pinned host memory) hand the blocks out again
      // only after the stream has passed this point; the op's end on success is stream order.
      if (failed) {
        for (const auto& t : held) device.record_stream(t, stream);
      }
      return;
    }
    device.launch(stream, [held = std::move(held)] {});
  } catch (...) {
    // Nothing better is possible (the launch itself failed); the op's own error propagates.
  }
}

// The bodies of the collectives are in their slices (backend/collectives/<op>.cpp).

}  // namespace cuda_p2p
