// WorkspaceCollectives: the engine (which calls the workspace serves, the argument checks that
// tell the peers, the route's handshake, one collective at a time) and the bodies of the
// all-reduce, all-gather, reduce-scatter, broadcast, barrier and all-gather-v.
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
  // A copy shares the records (the host's by a shared pointer, the device's pinned words, which
  // the device keeps for its life); it never hands out a handshake number.
  ops::SignatureState records = state_.signature;
  if (!records.host_record && records.device_record.host == nullptr) return {};
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

// --- bodies -------------------------------------------------------------------------------------

namespace {

at::Tensor contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// TORCH_CHECKs that `whole` holds world size times the elements of `part`, in its dtype: an
// all-gather's output and input, a reduce-scatter's input and output. `what` names the op.
void check_whole_of_parts(const at::Tensor& whole, const char* whole_name, const at::Tensor& part,
                          const char* part_name, int world_size, const std::string& what) {
  TORCH_CHECK(
      whole.numel() == part.numel() * world_size && whole.scalar_type() == part.scalar_type(),
      "cuda_p2p ", what, ": the ", whole_name, " must have world size (", world_size,
      ") times the ", part_name, "'s ", part.numel(), " elements of ", part.scalar_type(), ", got ",
      whole.numel(), " of ", whole.scalar_type());
}

}  // namespace

ops::Outcome WorkspaceCollectives::all_reduce(at::Tensor& t, ops::ReduceOp op) {
  // Checked first without the closures check_or_reject takes: this is the small all-reduce's
  // path (NOTE [Inline one-shot] in ops/all_reduce.cpp), and they allocate.
  if (!ops::reduce_op_applies(op, t.scalar_type())) {
    check_or_reject("all_reduce", ops::OpId::kAllReduce,
                    [&] { ops::check_reduce_op(op, t.scalar_type(), "all_reduce"); });
  }
  struct {
    at::Tensor& t;
    at::Tensor work;
    ops::ReduceOp op;
  } call{t, contiguous(t), op};
  return run("all_reduce", [this, &call](const ops::CollectiveContext& ctx) {
    // The small all-reduce's path allocates nothing: on an inline stream nothing is queued.
    if (!inline_paths(ws_->device(), ctx.stream)) keep({call.work});
    const ops::Outcome o =
        ops::all_reduce(ctx, call.work, call.work, call.op, ops::AllReduceAlgo::kAuto);
    copy_back(call.t, call.work);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::all_gather(const at::Tensor& input,
                                              const std::vector<at::Tensor>& outputs) {
  // Outputs are computed contiguously and copied back where the caller's are not.
  std::vector<at::Tensor> outs;
  for (const auto& o : outputs) outs.push_back(detail::contiguous_output(o));
  const at::Tensor in = contiguous(input);
  return run("all_gather", [&](const ops::CollectiveContext& ctx) {
    keep({in, input});
    keep(outs);
    const ops::Outcome o = ops::all_gather(ctx, in, outs, ops::AllGatherAlgo::kAuto);
    for (size_t i = 0; i < outs.size(); ++i) copy_back(outputs[i], outs[i]);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::all_gather_into_tensor(at::Tensor& output,
                                                          const at::Tensor& input,
                                                          const std::string& what) {
  check_or_reject("all_gather_into_tensor", ops::OpId::kAllGather,
                  [&] { check_whole_of_parts(output, "output", input, "input", size_, what); });
  at::Tensor out = detail::contiguous_output(output);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < size_; ++q) chunks.push_back(detail::element_chunk(out, q, input.numel()));
  const ops::Outcome o = all_gather(input, chunks);
  copy_back(output, out);
  return o;
}

ops::Outcome WorkspaceCollectives::reduce_scatter(const std::vector<at::Tensor>& inputs,
                                                  const at::Tensor& output, ops::ReduceOp op) {
  check_or_reject("reduce_scatter", ops::OpId::kReduceScatter,
                  [&] { ops::check_reduce_op(op, output.scalar_type(), "reduce_scatter"); });
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(contiguous(t));
  at::Tensor out = detail::contiguous_output(output);
  return run("reduce_scatter", [&](const ops::CollectiveContext& ctx) {
    keep(joined(ins, inputs));
    keep({out});
    const ops::Outcome o = ops::reduce_scatter(ctx, ins, out, op, ops::ReduceScatterAlgo::kAuto);
    copy_back(output, out);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::reduce_scatter_tensor(const at::Tensor& output,
                                                         const at::Tensor& input, ops::ReduceOp op,
                                                         const std::string& what) {
  check_or_reject("reduce_scatter_tensor", ops::OpId::kReduceScatter,
                  [&] { check_whole_of_parts(input, "input", output, "output", size_, what); });
  const at::Tensor in = contiguous(input);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < size_; ++q) chunks.push_back(detail::element_chunk(in, q, output.numel()));
  return reduce_scatter(chunks, output, op);  // which keeps the chunks, so `in`
}

ops::Outcome WorkspaceCollectives::broadcast(at::Tensor& t, int64_t root) {
  check_or_reject("broadcast", ops::OpId::kBroadcast, [&] {
    TORCH_CHECK(root >= 0 && root < size_, "cuda_p2p broadcast: root must be a rank in [0, ", size_,
                "), got ", root);
  });
  at::Tensor work = contiguous(t);
  return run("broadcast", [&](const ops::CollectiveContext& ctx) {
    keep({work});
    const ops::Outcome o = ops::broadcast(ctx, work, static_cast<int>(root));
    copy_back(t, work);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::barrier(std::optional<Millis> timeout) {
  return run("barrier", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o = ops::barrier(ctx, timeout);
    // A barrier blocks the caller, also when the workspace is on a GPU.
    ws_->device().synchronize(ctx.stream);
    return o;
  });
}

WorkspaceCollectives::Rows WorkspaceCollectives::all_gather_v(const at::Tensor& input,
                                                              const std::vector<int64_t>& sizes) {
  std::vector<int64_t> out_sizes = input.sizes().vec();
  out_sizes[0] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  Rows r;
  r.output = at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t row_elems = detail::row_elements(input);
  const at::Tensor in = contiguous(input);
  std::vector<int64_t> bytes;
  std::vector<at::Tensor> outs;
  int64_t row = 0;
  for (int q = 0; q < size_; ++q) {
    bytes.push_back(sizes[q] * row_elems * static_cast<int64_t>(input.element_size()));
    outs.push_back(r.output.narrow(0, row, sizes[q]));
    row += sizes[q];
  }
  r.outcome = run("all_gather_v", [&](const ops::CollectiveContext& ctx) {
    keep({in, input, r.output});
    const ops::Outcome o = ops::all_gather_v(ctx, in, bytes, outs);
    return o;
  });
  return r;
}

}  // namespace cuda_p2p
