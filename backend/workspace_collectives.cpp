// ProcessGroupCudaP2P's entry into the workspace collectives (ops/collectives.hpp): which calls
// the workspace serves, the argument checks that tell the peers, one collective at a time, the
// completed Works, and the fallbacks to the wrapped backend with their counters.
#include <c10/util/Exception.h>

#include <optional>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>

#include "backend/CompletedWork.hpp"
#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/channels.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Op = Counters::Op;

// NOTE [Collectives of a group run one at a time]
// A group's workspace collectives share its buffer halves, its phase counter and the signal
// counts of the collective channel, so they must run in one order on every rank and never
// overlap. On the host they run synchronously on the calling thread (the device's inline stream),
// under collective_mutex_, so threads that share a group cannot interleave them. On CUDA they are
// enqueued on the caller's current stream; each one first waits for the end of the group's
// previous workspace op, a collective or a fused op (NOTE [One order per group] in
// p2p_workspace/symmetric_workspace.cpp), so that ops issued on different streams (FSDP's
// all-gather and reduce-scatter streams) still execute one after another, in issue order, as the
// signal counts and the shared buffer assume.
ops::Outcome ProcessGroupCudaP2P::run_collective(
    const char* what, c10::function_ref<ops::Outcome(const ops::CollectiveContext&)> fn) {
  std::lock_guard<std::mutex> lock(collective_mutex_);
  failure_.check(what);
  ops::check_signature_record(collective_state_.signature, what);
  Device& device = workspace_->device();
  auto stream = device.current_stream();
  // Before anything is enqueued (NOTE [Device failure] in p2p_workspace/watchdog.hpp).
  device.check_healthy(what);
  workspace_->begin_op(*stream);
  const ops::CollectiveContext ctx{*workspace_, *stream, ops::kCollectiveChannel, collective_state_,
                                   config_.collective};
  ops::Outcome outcome;
  try {
    outcome = fn(ctx);
    // NOTE [Host ops return complete] in ops/pipeline_common.hpp (a captured op has not run).
    if (!device.runs_inline(*stream) && device.tensor_device().is_cpu() &&
        !workspace_->capturing(*stream)) {
      device.synchronize(*stream);
    }
  } catch (const ops::SignatureMismatch&) {
    // The op ran nowhere and the phases were settled: the group stays usable.
    workspace_->end_op(*stream);
    throw;
  } catch (const std::exception& e) {
    collective_state_.pending.reset();
    failure_.mark(what, e);
    workspace_->end_op(*stream);
    throw;
  }
  TORCH_INTERNAL_ASSERT(!collective_state_.pending, "cuda_p2p ", what,
                        ": the op's signature was never compared");
  // NOTE [Replay-safe signals]: an op enqueued under capture runs on each replay.
  outcome.graph = workspace_->capturing(*stream);
  workspace_->end_op(*stream);
  return outcome;
}

void ProcessGroupCudaP2P::check_or_reject(const char* what, ops::OpKind kind,
                                          c10::function_ref<void()> checks) {
  ops::check_or_reject(failure_, getSize() > 1, checks, [&](const std::string& reason) {
    run_collective(what, [&](const ops::CollectiveContext& ctx) {
      ops::reject(ctx, kind, reason);
      return ops::Outcome{};
    });
  });
}

// NOTE [Routes agree]
// A collective the workspace serves goes to the wrapped backend on a rank whose call the workspace
// cannot take (a dtype it does not reduce, tensors on another device, several tensors, a reduce op
// it lacks). Were its peers' calls workspace ones, they would wait at their first barrier, and
// this rank in Gloo or NCCL, until the timeout. So on a host workspace such a rank first takes part
// in the op's handshake (ops::announce) with a signature naming its route ("1000 x bool sum
// (wrapped: dtype)"): ranks that route alike agree and go on to the wrapped backend, ranks that
// do not raise the same error (NOTE [Op signatures] in ops/op_signature.cpp), and the group stays
// usable. Its cost is a handshake barrier on the workspace before a wrapped call. Not on a CUDA
// workspace, whose comparison is asynchronous (a disagreement would surface one op later, after
// the wrapped call had waited for its timeout), nor without a workspace.
void ProcessGroupCudaP2P::agree_on_route(const char* what, ops::OpKind kind,
                                         c10::ArrayRef<at::Tensor> tensors,
                                         const std::string& detail, const char* why) {
  if (!uses_workspace_collectives() || !workspace_->device().tensor_device().is_cpu() ||
      getSize() == 1) {
    return;
  }
  const std::string text = ops::describe_tensors(tensors) + detail + " (wrapped: " + why + ")";
  run_collective(what, [&](const ops::CollectiveContext& ctx) {
    ops::announce(ctx, kind, text);
    return ops::Outcome{};
  });
}

const char* ProcessGroupCudaP2P::workspace_rejects(c10::ArrayRef<at::Tensor> tensors) const {
  if (!uses_workspace_collectives()) return kWorkspaceOff;
  const at::Device device = workspace_->device().tensor_device();
  for (const auto& t : tensors) {
    if (!t.defined() || t.layout() != at::kStrided || t.device() != device) return "device";
  }
  return nullptr;
}

// NOTE [No Work for a synchronous call]
// torch.distributed's Python API sets the options' asyncOp from async_op, and for a synchronous
// call it waits on the Work only when there is one (`elif work is not None: work.wait()`: every
// collective in torch 2.14.1; PyTorch's PR 150398, before torch 2.8, spared NCCL's synchronous
// calls that wait, so every torch we build against has it). On the host a workspace collective
// has completed when it returns, so the Work of a synchronous call is a cost with no use: its
// allocation, its conversion to a Python object and the wait() call (which releases and takes
// the GIL) - 0.7-0.8 us of a 4.6-4.8 us dist.all_reduce of 8 bytes on 2 ranks
// (docs/collectives.md, "No Work for a synchronous call"). So such a call returns none, unless
//  * asyncOp is true: an async call, and every C++ caller that leaves the options' default
//    (DDP's reducer, the functional collectives) gets its Work;
//  * the workspace is on CUDA, where wait() orders the caller's stream after the op and raises
//    the device's failure (NOTE [Device failure] in p2p_workspace/watchdog.hpp);
//  * the group is coalescing: endCoalescing's Work is made of the tracked ones;
//  * torch's allow_inflight_collective_as_graph_input() is on: ProcessGroup registers the Work
//    of every call for torch.ops._c10d_functional.wait_tensor.
bool ProcessGroupCudaP2P::returns_no_work(bool async_op) {
  if (async_op || !workspace_ || !workspace_->device().tensor_device().is_cpu() ||
      c10d::allow_inflight_collective_as_graph_input()) {
    return false;
  }
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  return !coalescing_;
}

WorkPtr ProcessGroupCudaP2P::completed(c10d::OpType type, std::vector<at::Tensor> outputs,
                                       bool async_op) {
  if (returns_no_work(async_op)) return {};  // NOTE [No Work for a synchronous call]
  // On a GPU the op is enqueued, not done: its Work waits for the event run_collective recorded
  // at its end (none on the host, where it has completed).
  std::shared_ptr<Device> device;
  std::shared_ptr<Event> end;
  if (workspace_ && !workspace_->device().tensor_device().is_cpu()) {
    device = workspace_->device_ptr();
    // Under capture, the op's captured end (NOTE [Replay-safe signals]).
    end = workspace_->last_op(device->capture_id(*device->current_stream()));
  }
  return track(c10::make_intrusive<CompletedWork>(getRank(), type, std::move(outputs),
                                                  std::move(device), std::move(end)));
}

at::Tensor ProcessGroupCudaP2P::all_gather_v(const at::Tensor& input,
                                             const std::vector<int64_t>& sizes) {
  const int W = getSize(), me = getRank();
  auto checks = [&] {
    TORCH_CHECK(input.defined() && input.dim() >= 1,
                "cuda_p2p all_gather_v: expected a tensor with at least one dimension (rows), got ",
                input.defined() ? std::to_string(input.dim()) + " dimensions" : "None");
    TORCH_CHECK(static_cast<int>(sizes.size()) == W, "cuda_p2p all_gather_v: expected ", W,
                " sizes (rows of every rank), got ", sizes.size());
    for (int q = 0; q < W; ++q) {
      TORCH_CHECK(sizes[q] >= 0, "cuda_p2p all_gather_v: sizes must be >= 0, got ", sizes[q],
                  " for rank ", q);
    }
    TORCH_CHECK(input.size(0) == sizes[me], "cuda_p2p all_gather_v: rank ", me, " has ",
                input.size(0), " rows, but sizes[", me, "] is ", sizes[me]);
  };
  if (input.defined() && !workspace_rejects({input})) {
    check_or_reject("all_gather_v", ops::OpKind::kAllGatherV, checks);
  } else if (hierarchy_) {
    // NOTE [Hierarchical agreement]: the flat path's Gloo all-gather takes the largest size.
    hierarchy_->agree_flat(
        ops::OpKind::kAllGatherV, {input}, checks,
        [&] {
          const int64_t row_bytes =
              c10::multiply_integers(input.sizes().slice(1)) * input.element_size();
          std::string text = ops::dtype_name(input.scalar_type()) + ", bytes [";
          for (int q = 0; q < W; ++q)
            text += (q ? ", " : "") + std::to_string(sizes[q] * row_bytes);
          return text + "]";
        },
        options_->timeout);
  } else {
    checks();
  }
  std::vector<int64_t> out_sizes = input.sizes().vec();
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  out_sizes[0] = total;
  at::Tensor output =
      at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t row_elems = input.size(0) > 0 ? input.numel() / input.size(0)
                                              : c10::multiply_integers(input.sizes().slice(1));
  if (!workspace_rejects({input})) {
    const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
    std::vector<int64_t> bytes;
    std::vector<at::Tensor> outs;
    int64_t row = 0;
    for (int q = 0; q < W; ++q) {
      bytes.push_back(sizes[q] * row_elems * static_cast<int64_t>(input.element_size()));
      outs.push_back(output.narrow(0, row, sizes[q]));
      row += sizes[q];
    }
    counters_->record(Op::kAllGatherV,
                      run_collective("all_gather_v", [&](const ops::CollectiveContext& ctx) {
                        return ops::all_gather_v(ctx, in, bytes, outs);
                      }));
    return output;
  }
  // Without the workspace: pad every rank's rows to the largest count, gather, drop the padding.
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> padded_sizes = input.sizes().vec();
  padded_sizes[0] = largest;
  at::Tensor padded = at::zeros(padded_sizes, input.options());
  padded.narrow(0, 0, sizes[me]).copy_(input);
  std::vector<int64_t> gathered_sizes = padded_sizes;
  gathered_sizes[0] = largest * W;
  at::Tensor gathered = at::empty(gathered_sizes, input.options());
  route(input, "all_gather_v")._allgather_base(gathered, padded, c10d::AllgatherOptions())->wait();
  int64_t row = 0;
  for (int q = 0; q < W; ++q) {
    output.narrow(0, row, sizes[q]).copy_(gathered.narrow(0, q * largest, sizes[q]));
    row += sizes[q];
  }
  counters_->fallback(Op::kAllGatherV, workspace_rejects({input}));
  return output;
}

WorkPtr ProcessGroupCudaP2P::broadcast(std::vector<at::Tensor>& tensors,
                                       const c10d::BroadcastOptions& opts) {
  if (hierarchy_ && ran_hierarchically(Op::kBroadcast, hierarchy_->broadcast(tensors, opts))) {
    return hierarchical_done(c10d::OpType::BROADCAST, tensors);
  }
  const char* why = workspace_rejects(tensors);
  if (!why && (tensors.size() != 1 || opts.rootTensor != 0)) why = "several tensors";
  if (why) {
    agree_on_route("broadcast", ops::OpKind::kBroadcast, tensors,
                   " from root " + std::to_string(opts.rootRank), why);
    counters_->fallback(Op::kBroadcast, why);
    return delegate(tensors, "broadcast",
                    [&](c10d::Backend& b) { return b.broadcast(tensors, opts); });
  }
  check_or_reject("broadcast", ops::OpKind::kBroadcast, [&] {
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(),
                "cuda_p2p broadcast: root must be a rank in [0, ", getSize(), "), got ",
                opts.rootRank);
  });
  at::Tensor& t = tensors[0];
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  counters_->record(
      Op::kBroadcast, run_collective("broadcast", [&](const ops::CollectiveContext& ctx) {
        const ops::Outcome o = ops::broadcast(ctx, work, static_cast<int>(opts.rootRank));
        if (!work.is_same(t)) t.copy_(work);
        return o;
      }));
  return completed(c10d::OpType::BROADCAST, tensors, opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::allreduce(std::vector<at::Tensor>& tensors,
                                       const c10d::AllreduceOptions& opts) {
  if (hierarchy_ && ran_hierarchically(Op::kAllReduce, hierarchy_->all_reduce(tensors, opts))) {
    return hierarchical_done(c10d::OpType::ALLREDUCE, tensors);
  }
  const auto op = to_reduce_op(opts.reduceOp);
  if (tensors.size() == 1 && op && all_reduce_on_workspace(tensors[0], *op)) {
    return completed(c10d::OpType::ALLREDUCE, tensors, opts.asyncOp);
  }
  // Why, for the route's handshake and the debug line (NOTE [Routes agree], NOTE [Debug lines]).
  const char* why = tensors.size() != 1 ? "several tensors" : !op ? "reduce op" : nullptr;
  if (!why) why = workspace_rejects(tensors);
  if (!why && !ops::is_reducible_dtype(tensors[0].scalar_type())) why = "dtype";
  agree_on_route("all_reduce", ops::OpKind::kAllReduce, tensors,
                 " " + reduce_op_text(opts.reduceOp), why);
  counters_->fallback(Op::kAllReduce, why);
  return delegate(tensors, "allreduce",
                  [&](c10d::Backend& b) { return b.allreduce(tensors, opts); });
}

bool ProcessGroupCudaP2P::all_reduce_on_workspace(at::Tensor& t, ops::ReduceOp op) {
  if (workspace_rejects({t}) || !ops::is_reducible_dtype(t.scalar_type())) return false;
  // Checked first without the closures check_or_reject takes: this is the small all-reduce's
  // path (NOTE [Inline one-shot] in ops/all_reduce.cpp), and they allocate.
  if (!ops::reduce_op_applies(op, t.scalar_type())) {
    check_or_reject("all_reduce", ops::OpKind::kAllReduce,
                    [&] { ops::check_reduce_op(op, t.scalar_type(), "all_reduce"); });
  }
  struct {
    at::Tensor& t;
    at::Tensor work;
    ops::ReduceOp op;
  } call{t, t.is_contiguous() ? t : t.contiguous(), op};
  counters_->record(
      Op::kAllReduce, run_collective("all_reduce", [&call](const ops::CollectiveContext& ctx) {
        const ops::Outcome o =
            ops::all_reduce(ctx, call.work, call.work, call.op, ops::AllReduceAlgo::kAuto);
        if (!call.work.is_same(call.t)) call.t.copy_(call.work);
        return o;
      }));
  return true;
}

namespace {
// A contiguous tensor to compute into for `t`, and whether it must be copied back.
at::Tensor contiguous_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// Chunk i of W equal chunks of a contiguous tensor's elements.
at::Tensor flat_chunk(const at::Tensor& t, int64_t i, int64_t count) {
  return t.view({-1}).narrow(0, i * count, count);
}

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

ops::Outcome ProcessGroupCudaP2P::all_gather_on_workspace(const at::Tensor& input,
                                                          const std::vector<at::Tensor>& outputs) {
  // Outputs are computed contiguously and copied back where the caller's are not.
  std::vector<at::Tensor> outs;
  for (const auto& o : outputs) outs.push_back(contiguous_output(o));
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  return run_collective("all_gather", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o = ops::all_gather(ctx, in, outs, ops::AllGatherAlgo::kAuto);
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].is_same(outputs[i])) outputs[i].copy_(outs[i]);
    }
    return o;
  });
}

ops::Outcome ProcessGroupCudaP2P::all_gather_into_tensor_on_workspace(at::Tensor& output,
                                                                      const at::Tensor& input,
                                                                      const std::string& what) {
  check_or_reject("all_gather_into_tensor", ops::OpKind::kAllGather,
                  [&] { check_whole_of_parts(output, "output", input, "input", getSize(), what); });
  at::Tensor out = contiguous_output(output);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(out, q, input.numel()));
  const ops::Outcome o = all_gather_on_workspace(input, chunks);
  if (!out.is_same(output)) output.copy_(out);
  return o;
}

ops::Outcome ProcessGroupCudaP2P::reduce_scatter_tensor_on_workspace(const at::Tensor& output,
                                                                     const at::Tensor& input,
                                                                     ops::ReduceOp op,
                                                                     const std::string& what) {
  check_or_reject("reduce_scatter_tensor", ops::OpKind::kReduceScatter,
                  [&] { check_whole_of_parts(input, "input", output, "output", getSize(), what); });
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(in, q, output.numel()));
  return reduce_scatter_on_workspace(chunks, output, op);
}

WorkPtr ProcessGroupCudaP2P::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(Op::kAllGather, hierarchy_->all_gather(outputs, inputs, opts))) {
    return hierarchical_done(c10d::OpType::ALLGATHER, outputs[0]);
  }
  const char* why = workspace_rejects(inputs);
  if (!why && (inputs.size() != 1 || outputs.size() != 1 ||
               outputs[0].size() != static_cast<size_t>(getSize()))) {
    why = "several tensors";
  }
  if (!why) why = workspace_rejects(outputs[0]);
  if (!why) {
    for (const auto& o : outputs[0]) {
      if (o.numel() != inputs[0].numel() || o.scalar_type() != inputs[0].scalar_type()) {
        why = "shapes";  // the wrapped backend reports the mismatch
      }
    }
  }
  if (why) {
    agree_on_route("all_gather", ops::OpKind::kAllGather, inputs, "", why);
    counters_->fallback(Op::kAllGather, why);
    return delegate(inputs, "allgather",
                    [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); });
  }
  counters_->record(Op::kAllGather, all_gather_on_workspace(inputs[0], outputs[0]));
  return completed(c10d::OpType::ALLGATHER, outputs[0], opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::_allgather_base(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(Op::kAllGather, hierarchy_->all_gather_into_tensor(output, input, opts))) {
    return hierarchical_done(c10d::OpType::_ALLGATHER_BASE, {output});
  }
  const char* why = workspace_rejects({input, output});
  if (why) {
    agree_on_route("all_gather_into_tensor", ops::OpKind::kAllGather, {input}, "", why);
    counters_->fallback(Op::kAllGather, why);
    return delegate(input, "all_gather_into_tensor",
                    [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); });
  }
  counters_->record(Op::kAllGather,
                    all_gather_into_tensor_on_workspace(output, input, "all_gather_into_tensor"));
  // Decided before the views below are made (NOTE [No Work for a synchronous call]).
  if (returns_no_work(opts.asyncOp)) return {};
  // The future holds what the wrapped backend's would: Gloo's the W chunks, NCCL's the output.
  if (output.is_cpu() && output.is_contiguous()) {
    std::vector<at::Tensor> views;
    for (int q = 0; q < getSize(); ++q) views.push_back(flat_chunk(output, q, input.numel()));
    return completed(c10d::OpType::_ALLGATHER_BASE, std::move(views));
  }
  return completed(c10d::OpType::_ALLGATHER_BASE, {output});
}

WorkPtr ProcessGroupCudaP2P::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  if (hierarchy_ && ran_hierarchically(Op::kAllGather, hierarchy_->all_gather_into_tensor_coalesced(
                                                           outputs, inputs, opts))) {
    return hierarchical_done(c10d::OpType::COALESCED, outputs);
  }
  const char* why = workspace_rejects(inputs);
  if (!why) why = workspace_rejects(outputs);
  if (!why && outputs.size() != inputs.size()) why = "shapes";
  if (why) {
    agree_on_route("all_gather_into_tensor", ops::OpKind::kAllGather, inputs, "", why);
    counters_->fallback(Op::kAllGather, why);
    return delegate(inputs, "allgather_into_tensor_coalesced", [&](c10d::Backend& b) {
      return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
    });
  }
  // One workspace all-gather per pair, in order.
  for (size_t i = 0; i < inputs.size(); ++i) {
    counters_->record(Op::kAllGather,
                      all_gather_into_tensor_on_workspace(
                          outputs[i], inputs[i],
                          "all_gather_into_tensor (coalesced, tensor " + std::to_string(i) + ")"));
  }
  return completed(c10d::OpType::COALESCED, outputs, opts.asyncOp);
}

ops::Outcome ProcessGroupCudaP2P::reduce_scatter_on_workspace(const std::vector<at::Tensor>& inputs,
                                                              const at::Tensor& output,
                                                              ops::ReduceOp op) {
  check_or_reject("reduce_scatter", ops::OpKind::kReduceScatter,
                  [&] { ops::check_reduce_op(op, output.scalar_type(), "reduce_scatter"); });
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(t.is_contiguous() ? t : t.contiguous());
  at::Tensor out = contiguous_output(output);
  return run_collective("reduce_scatter", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o = ops::reduce_scatter(ctx, ins, out, op, ops::ReduceScatterAlgo::kAuto);
    if (!out.is_same(output)) output.copy_(out);
    return o;
  });
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter(std::vector<at::Tensor>& outputs,
                                            std::vector<std::vector<at::Tensor>>& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(Op::kReduceScatter, hierarchy_->reduce_scatter(outputs, inputs, opts))) {
    return hierarchical_done(c10d::OpType::REDUCE_SCATTER, outputs);
  }
  const char* why = workspace_rejects(outputs);
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && (outputs.size() != 1 || inputs.size() != 1 ||
               inputs[0].size() != static_cast<size_t>(getSize()))) {
    why = "several tensors";
  }
  if (!why) why = workspace_rejects(inputs[0]);
  if (!why && !op) why = "reduce op";
  if (!why && !ops::is_reducible_dtype(outputs[0].scalar_type())) why = "dtype";
  if (!why) {
    for (const auto& t : inputs[0]) {
      if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type()) {
        why = "shapes";
      }
    }
  }
  if (why) {
    agree_on_route("reduce_scatter", ops::OpKind::kReduceScatter, outputs,
                   " " + reduce_op_text(opts.reduceOp), why);
    counters_->fallback(Op::kReduceScatter, why);
    return delegate(outputs, "reduce_scatter",
                    [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); });
  }
  counters_->record(Op::kReduceScatter, reduce_scatter_on_workspace(inputs[0], outputs[0], *op));
  return completed(c10d::OpType::REDUCE_SCATTER, outputs, opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ && ran_hierarchically(Op::kReduceScatter,
                                       hierarchy_->reduce_scatter_tensor(output, input, opts))) {
    return hierarchical_done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  }
  const char* why = workspace_rejects({input, output});
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && !op) why = "reduce op";
  if (!why && !ops::is_reducible_dtype(output.scalar_type())) why = "dtype";
  if (why) {
    agree_on_route("reduce_scatter_tensor", ops::OpKind::kReduceScatter, {output},
                   " " + reduce_op_text(opts.reduceOp), why);
    counters_->fallback(Op::kReduceScatter, why);
    return delegate(input, "reduce_scatter_tensor",
                    [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); });
  }
  counters_->record(Op::kReduceScatter, reduce_scatter_tensor_on_workspace(
                                            output, input, *op, "reduce_scatter_tensor"));
  return completed(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (hierarchy_ &&
      ran_hierarchically(Op::kReduceScatter,
                         hierarchy_->reduce_scatter_tensor_coalesced(outputs, inputs, opts))) {
    return hierarchical_done(c10d::OpType::COALESCED, outputs);
  }
  const char* why = workspace_rejects(inputs);
  if (!why) why = workspace_rejects(outputs);
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && outputs.size() != inputs.size()) why = "shapes";
  if (!why && !op) why = "reduce op";
  for (size_t i = 0; !why && i < outputs.size(); ++i) {
    if (!ops::is_reducible_dtype(outputs[i].scalar_type())) why = "dtype";
  }
  if (why) {
    agree_on_route("reduce_scatter_tensor", ops::OpKind::kReduceScatter, outputs,
                   " " + reduce_op_text(opts.reduceOp), why);
    counters_->fallback(Op::kReduceScatter, why);
    return delegate(inputs, "reduce_scatter_tensor_coalesced", [&](c10d::Backend& b) {
      return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    });
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    counters_->record(Op::kReduceScatter,
                      reduce_scatter_tensor_on_workspace(
                          outputs[i], inputs[i], *op,
                          "reduce_scatter_tensor (coalesced, tensor " + std::to_string(i) + ")"));
  }
  return completed(c10d::OpType::COALESCED, outputs, opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::barrier(const c10d::BarrierOptions& opts) {
  if (hierarchy_ && ran_hierarchically(Op::kBarrier, hierarchy_->barrier(opts))) {
    return hierarchical_done(c10d::OpType::BARRIER, {});
  }
  // A barrier for a CUDA device stays with NCCL unless the workspace itself is on CUDA.
  const bool device_ok = !opts.device.has_value() || !opts.device->is_cuda() ||
                         (is_p2p_available() && !workspace_->device().tensor_device().is_cpu());
  if (!uses_workspace_collectives() || !device_ok) {
    counters_->fallback(Op::kBarrier, !uses_workspace_collectives() ? kWorkspaceOff : "device");
    c10d::BarrierOptions wrapped = opts;
    c10d::Backend& b = route_barrier(wrapped);  // NOTE [Barriers order the GPU]
    auto work = b.barrier(wrapped);
    return &b == cpu_backend_.get() ? track(std::move(work)) : work;
  }
  std::optional<Millis> timeout;
  if (opts.timeout > Millis(0)) timeout = opts.timeout;
  counters_->record(Op::kBarrier, run_collective("barrier", [&](const ops::CollectiveContext& ctx) {
                      const ops::Outcome o = ops::barrier(ctx, timeout);
                      // A barrier blocks the caller, also when the workspace is on a GPU.
                      workspace_->device().synchronize(ctx.stream);
                      return o;
                    }));
  return completed(c10d::OpType::BARRIER, {}, opts.asyncOp);
}

}  // namespace cuda_p2p
