// ProcessGroupCudaP2P's all-to-alls: all_to_all_single (alltoall_base), the list all_to_all
// (alltoall) and cuda_p2p.all_to_all_v, on the workspace (ops/all_to_all.cpp) when it serves the
// tensors, else on the wrapped backend, counted (docs/collectives.md, "All-to-all").
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <utility>

#include "backend/CompletedWork.hpp"
#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Op = Counters::Op;

namespace {

// Elements of one row (dim 0) of `t`: the product of its other sizes.
int64_t a2a_row_elems(const at::Tensor& t) { return c10::multiply_integers(t.sizes().slice(1)); }

// The row counts of `t` by rank: `given`, or equal splits when it is empty (torch's convention).
// TORCH_CHECKs them; `name` ("input", "output") and `what` (the op) name them in errors.
std::vector<int64_t> a2a_split_rows(const at::Tensor& t, const std::vector<int64_t>& given, int W,
                                    const char* name, const char* what) {
  TORCH_CHECK(t.dim() >= 1, "cuda_p2p ", what, ": expected an ", name,
              " with at least one dimension (rows), got a ", t.dim(), "-dimensional tensor");
  if (given.empty()) {
    TORCH_CHECK(t.size(0) % W == 0, "cuda_p2p ", what, ": without ", name,
                " split sizes the rows are split evenly, so the ", name,
                "'s rows must be a multiple of the world size ", W, ", got ", t.size(0));
    return std::vector<int64_t>(W, t.size(0) / W);
  }
  TORCH_CHECK(static_cast<int>(given.size()) == W, "cuda_p2p ", what, ": expected ", W, " ", name,
              " split sizes (one per rank), got ", given.size());
  for (int q = 0; q < W; ++q) {
    TORCH_CHECK(given[q] >= 0, "cuda_p2p ", what, ": ", name, " split sizes must be >= 0, got ",
                given[q], " for rank ", q);
  }
  const int64_t sum = std::accumulate(given.begin(), given.end(), int64_t{0});
  TORCH_CHECK(sum == t.size(0), "cuda_p2p ", what, ": the ", name, " split sizes sum to ", sum,
              " rows, but the ", name, " has ", t.size(0));
  return given;
}

// Pointers to consecutive slices of `rows[q]` rows of `row_bytes` bytes each from `base`.
template <typename Ptr>
std::vector<Ptr> a2a_slices(Ptr base, const std::vector<int64_t>& rows, int64_t row_bytes) {
  std::vector<Ptr> out;
  int64_t off = 0;
  for (int64_t r : rows) {
    out.push_back(base + off * row_bytes);
    off += r;
  }
  return out;
}

// A contiguous tensor holding `t`'s values that does not overlap `other`.
at::Tensor a2a_readable_apart(const at::Tensor& t, const at::Tensor& other) {
  if (at::get_overlap_status(t, other) != at::MemOverlapStatus::No) {
    return t.clone(at::MemoryFormat::Contiguous);
  }
  return t.is_contiguous() ? t : t.contiguous();
}

at::Tensor a2a_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// The all-to-alls read their split sizes back on the host, which a graph cannot replay: refused
// before the op's handshake, so the group stays usable (inside the op the error would mark the
// group failed: NOTE [Failed groups]).
void a2a_refuse_capture(SymmetricWorkspace& ws, const char* what) {
  TORCH_CHECK(ws.device().capture_id(*ws.device().current_stream()) == 0, "cuda_p2p ", what,
              ": cannot be captured in a graph (its split sizes are read back on the host); call "
              "it outside the capture");
}

std::string a2a_rows_text(const at::Tensor& t) {
  return "rows of " + std::to_string(a2a_row_elems(t)) + " x " + ops::dtype_name(t.scalar_type());
}

}  // namespace

WorkPtr ProcessGroupCudaP2P::alltoall_base(at::Tensor& output, at::Tensor& input,
                                           std::vector<int64_t>& output_split_sizes,
                                           std::vector<int64_t>& input_split_sizes,
                                           const c10d::AllToAllOptions& opts) {
  const int W = getSize();
  const char* why = workspace_rejects({input, output});
  if (!why && input.scalar_type() != output.scalar_type()) why = "shapes";  // wrapped reports it
  if (why) {
    agree_on_route("all_to_all_single", ops::OpKind::kAllToAllSingle, {input}, "", why);
    counters_->fallback(Op::kAllToAllSingle, why);
    return delegate(input, "all_to_all_single", [&](c10d::Backend& b) {
      return b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
    });
  }
  a2a_refuse_capture(*workspace_, "all_to_all_single");
  std::vector<int64_t> in_rows, out_rows;
  check_or_reject("all_to_all_single", ops::OpKind::kAllToAllSingle, [&] {
    in_rows = a2a_split_rows(input, input_split_sizes, W, "input", "all_to_all_single");
    out_rows = a2a_split_rows(output, output_split_sizes, W, "output", "all_to_all_single");
    TORCH_CHECK(a2a_row_elems(output) == a2a_row_elems(input),
                "cuda_p2p all_to_all_single: the output's rows must have the input's ",
                a2a_row_elems(input), " elements, got ", a2a_row_elems(output), " (input ",
                input.sizes(), ", output ", output.sizes(), ")");
  });
  const at::Tensor in = a2a_readable_apart(input, output);
  at::Tensor out = a2a_output(output);
  const int64_t row_bytes = a2a_row_elems(input) * static_cast<int64_t>(input.element_size());
  ops::AllToAllArgs args;
  args.kind = ops::OpKind::kAllToAllSingle;
  args.text = a2a_rows_text(input);
  args.send =
      a2a_slices<const char*>(static_cast<const char*>(in.const_data_ptr()), in_rows, row_bytes);
  args.send_counts = in_rows;
  args.recv_counts = out_rows;
  args.unit_bytes = row_bytes;
  counters_->record(Op::kAllToAllSingle,
                    run_collective("all_to_all_single", [&](const ops::CollectiveContext& ctx) {
                      const ops::Outcome o =
                          ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
                            return a2a_slices<char*>(static_cast<char*>(out.data_ptr()), out_rows,
                                                     row_bytes);
                          }).outcome;
                      if (!out.is_same(output)) output.copy_(out);
                      return o;
                    }));
  return completed(c10d::OpType::ALLTOALL_BASE, {output}, opts.asyncOp);
}

WorkPtr ProcessGroupCudaP2P::alltoall(std::vector<at::Tensor>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const c10d::AllToAllOptions& opts) {
  const int W = getSize();
  const char* why = workspace_rejects(inputs);
  if (!why) why = workspace_rejects(outputs);
  if (!why && (static_cast<int>(inputs.size()) != W || static_cast<int>(outputs.size()) != W)) {
    why = "shapes";  // the wrapped backend reports it
  }
  for (int q = 0; !why && q < W; ++q) {
    if (inputs[q].scalar_type() != inputs[0].scalar_type() ||
        outputs[q].scalar_type() != inputs[0].scalar_type()) {
      why = "shapes";
    }
  }
  if (why) {
    agree_on_route("all_to_all", ops::OpKind::kAllToAll, inputs, "", why);
    counters_->fallback(Op::kAllToAll, why);
    return delegate(inputs, "all_to_all",
                    [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); });
  }
  a2a_refuse_capture(*workspace_, "all_to_all");
  std::vector<at::Tensor> ins, outs;
  ops::AllToAllArgs args;
  args.kind = ops::OpKind::kAllToAll;
  args.text = "tensors of " + ops::dtype_name(inputs[0].scalar_type());
  args.unit_bytes = static_cast<int64_t>(inputs[0].element_size());
  args.unit = "elements";
  for (int q = 0; q < W; ++q) {
    at::Tensor in = inputs[q].is_contiguous() ? inputs[q] : inputs[q].contiguous();
    for (const auto& o : outputs) {
      if (at::get_overlap_status(in, o) != at::MemOverlapStatus::No) {
        in = in.clone(at::MemoryFormat::Contiguous);
        break;
      }
    }
    ins.push_back(in);
    outs.push_back(a2a_output(outputs[q]));
    args.send.push_back(static_cast<const char*>(in.const_data_ptr()));
    args.send_counts.push_back(in.numel());
    args.recv_counts.push_back(outputs[q].numel());
  }
  counters_->record(
      Op::kAllToAll, run_collective("all_to_all", [&](const ops::CollectiveContext& ctx) {
        const ops::Outcome outcome = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
                                       std::vector<char*> ptrs;
                                       for (auto& o : outs)
                                         ptrs.push_back(static_cast<char*>(o.data_ptr()));
                                       return ptrs;
                                     }).outcome;
        for (int q = 0; q < W; ++q) {
          if (!outs[q].is_same(outputs[q])) outputs[q].copy_(outs[q]);
        }
        return outcome;
      }));
  return completed(c10d::OpType::ALLTOALL, outputs, opts.asyncOp);
}

std::pair<at::Tensor, std::vector<int64_t>> ProcessGroupCudaP2P::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& input_splits) {
  const int W = getSize();
  constexpr const char* kWhat = "all_to_all_v";
  auto checks = [&] {
    TORCH_CHECK(input.defined(), "cuda_p2p all_to_all_v: expected a tensor, got None");
    TORCH_CHECK(!input_splits.empty(), "cuda_p2p all_to_all_v: expected ", W,
                " input split sizes (one per rank), got none");
    a2a_split_rows(input, input_splits, W, "input", kWhat);
  };
  const char* why = input.defined() ? workspace_rejects({input}) : "device";
  if (!why) {
    a2a_refuse_capture(*workspace_, kWhat);
    check_or_reject(kWhat, ops::OpKind::kAllToAllV, checks);
  } else {
    if (input.defined()) {
      agree_on_route(kWhat, ops::OpKind::kAllToAllV, {input}, "", why);
    }
    checks();
  }
  std::vector<int64_t> out_sizes = input.sizes().vec();
  const int64_t row_bytes = a2a_row_elems(input) * static_cast<int64_t>(input.element_size());
  if (!why) {
    const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
    ops::AllToAllArgs args;
    args.kind = ops::OpKind::kAllToAllV;
    args.text = a2a_rows_text(input);
    args.send = a2a_slices<const char*>(static_cast<const char*>(in.const_data_ptr()), input_splits,
                                        row_bytes);
    args.send_counts = input_splits;
    args.unit_bytes = row_bytes;
    at::Tensor output;
    std::vector<int64_t> recv;
    counters_->record(
        Op::kAllToAllV, run_collective(kWhat, [&](const ops::CollectiveContext& ctx) {
          auto done = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>& rows) {
            out_sizes[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
            output =
                at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
            return a2a_slices<char*>(static_cast<char*>(output.data_ptr()), rows, row_bytes);
          });
          recv = std::move(done.recv);
          return done.outcome;
        }));
    return {output, recv};
  }
  // Without the workspace: the split sizes first (one int64 to every rank), then the rows.
  c10d::Backend& b = route(input, kWhat);
  at::Tensor send_sizes =
      at::tensor(input_splits, at::TensorOptions().dtype(at::kLong)).to(input.device());
  at::Tensor recv_sizes = at::empty_like(send_sizes);
  std::vector<int64_t> no_splits;
  b.alltoall_base(recv_sizes, send_sizes, no_splits, no_splits, c10d::AllToAllOptions())->wait();
  const at::Tensor sizes_cpu = recv_sizes.cpu();
  std::vector<int64_t> recv(sizes_cpu.data_ptr<int64_t>(), sizes_cpu.data_ptr<int64_t>() + W);
  out_sizes[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  at::Tensor output =
      at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  // Copies: Gloo's alltoall_base takes its split vectors over.
  std::vector<int64_t> in_splits = input_splits, out_splits = recv;
  b.alltoall_base(output, in, out_splits, in_splits, c10d::AllToAllOptions())->wait();
  counters_->fallback(Op::kAllToAllV, why);
  return {output, recv};
}

}  // namespace cuda_p2p
