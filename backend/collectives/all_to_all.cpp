// all_to_all: all_to_all_single under both of its names (NOTE [Canonical entries]), the list
// form, and cuda_p2p's own all_to_all_v (its checks run on either route).
#include <numeric>

#include "backend/entry_sequence.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

namespace {

// Why the all-to-alls cannot be captured in a graph: a graph cannot replay what the host reads.
constexpr const char* kSplitsReadBack = " (its split sizes are read back on the host)";

// Why the workspace cannot take all_to_all_single's call (nullptr: it can).
const char* all_to_all_single_screen(const WorkspaceCollectives& collectives,
                                     const at::Tensor& output, const at::Tensor& input) {
  if (const char* why = collectives.rejects({input, output})) return why;
  return input.scalar_type() != output.scalar_type() ? reason::kShapes : nullptr;
}

// ... of the list form's: W inputs and W outputs of one dtype.
const char* all_to_all_screen(const WorkspaceCollectives& collectives,
                              const std::vector<at::Tensor>& outputs,
                              const std::vector<at::Tensor>& inputs, int W) {
  if (const char* why = collectives.rejects(inputs)) return why;
  if (const char* why = collectives.rejects(outputs)) return why;
  if (static_cast<int>(inputs.size()) != W || static_cast<int>(outputs.size()) != W) {
    return reason::kShapes;
  }
  for (int q = 0; q < W; ++q) {
    if (inputs[q].scalar_type() != inputs[0].scalar_type() ||
        outputs[q].scalar_type() != inputs[0].scalar_type()) {
      return reason::kShapes;
    }
  }
  return nullptr;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_to_all_single_entry(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  return serve(
      call(OpId::kAllToAllSingle),
      {input, input, all_to_all_single_screen(collectives_, output, input), opts.asyncOp},
      detail::no_detail,
      [&] { return collectives_.all_to_all_single(output, input, output_splits, input_splits); },
      [&](c10d::Backend& b) {
        return b.alltoall_base(output, input, output_splits, input_splits, opts);
      },
      [&] { return std::vector<at::Tensor>{output}; });
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return all_to_all_single_entry(output, input, output_split_sizes, input_split_sizes, opts);
}

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  return serve(
      call(OpId::kAllToAll),
      {inputs, inputs, all_to_all_screen(collectives_, outputs, inputs, getSize()), opts.asyncOp},
      detail::no_detail, [&] { return collectives_.all_to_all(outputs, inputs); },
      [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); }, [&] { return outputs; });
}

std::pair<at::Tensor, std::vector<int64_t>> ProcessGroupCudaP2P::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& input_splits) {
  const char* why = input.defined() ? collectives_.rejects(input) : reason::kDevice;
  if (!why) {
    auto r = collectives_.all_to_all_v(input, input_splits);
    counters_.record(OpId::kAllToAllV, r.outcome);
    settle_cpu_outputs("all_to_all_v");
    return {std::move(r.output), std::move(r.recv)};
  }
  if (input.defined()) {
    collectives_.agree_on_route("all_to_all_v", OpId::kAllToAllV, input, detail::no_detail, why);
  }
  WorkspaceCollectives::check_all_to_all_v(input, input_splits, getSize());
  auto r = wrapped_.all_to_all_v(input, input_splits);
  counters_.fallback(OpId::kAllToAllV, why);
  return r;
}

#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::all_to_all_single(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return all_to_all_single_entry(output, input, output_split_sizes, input_split_sizes, opts);
}
#endif

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::all_to_all_single(
    at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
    const std::vector<int64_t>& input_split_sizes) {
  const int W = size_;
  refuse_capture("all_to_all_single", kSplitsReadBack);
  std::vector<int64_t> in_rows, out_rows;
  check_or_reject("all_to_all_single", ops::OpId::kAllToAllSingle, [&] {
    in_rows = detail::split_rows(input, input_split_sizes, W, "input", "all_to_all_single");
    out_rows = detail::split_rows(output, output_split_sizes, W, "output", "all_to_all_single");
    TORCH_CHECK(detail::row_elements(output) == detail::row_elements(input),
                "cuda_p2p all_to_all_single: the output's rows must have the input's ",
                detail::row_elements(input), " elements, got ", detail::row_elements(output),
                " (input ", input.sizes(), ", output ", output.sizes(), ")");
  });
  const at::Tensor in = detail::readable_apart(input, output);
  at::Tensor out = detail::contiguous_output(output);
  const int64_t row_bytes =
      detail::row_elements(input) * static_cast<int64_t>(input.element_size());
  ops::AllToAllArgs args;
  args.kind = ops::OpId::kAllToAllSingle;
  args.text = detail::rows_text(input);
  args.send = detail::row_slices<const char*>(static_cast<const char*>(in.const_data_ptr()),
                                              in_rows, row_bytes);
  args.send_counts = in_rows;
  args.recv_counts = out_rows;
  args.unit_bytes = row_bytes;
  return run("all_to_all_single", [&](const ops::CollectiveContext& ctx) {
    keep({in, input, out});
    const ops::Outcome o =
        ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
          return detail::row_slices<char*>(static_cast<char*>(out.data_ptr()), out_rows, row_bytes);
        }).outcome;
    copy_back(output, out);
    return o;
  });
}

ops::Outcome WorkspaceCollectives::all_to_all(std::vector<at::Tensor>& outputs,
                                              const std::vector<at::Tensor>& inputs) {
  const int W = size_;
  refuse_capture("all_to_all", kSplitsReadBack);
  std::vector<at::Tensor> ins, outs;
  ops::AllToAllArgs args;
  args.kind = ops::OpId::kAllToAll;
  args.text = "tensors of " + ops::dtype_name(inputs[0].scalar_type());
  args.unit_bytes = static_cast<int64_t>(inputs[0].element_size());
  args.unit = "elements";
  for (int q = 0; q < W; ++q) {
    const at::Tensor in = detail::readable_apart(inputs[q], outputs);
    ins.push_back(in);
    outs.push_back(detail::contiguous_output(outputs[q]));
    args.send.push_back(static_cast<const char*>(in.const_data_ptr()));
    args.send_counts.push_back(in.numel());
    args.recv_counts.push_back(outputs[q].numel());
  }
  return run("all_to_all", [&](const ops::CollectiveContext& ctx) {
    keep(joined(ins, inputs));
    keep(outs);
    const ops::Outcome o = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
                             std::vector<char*> ptrs;
                             for (auto& out : outs)
                               ptrs.push_back(static_cast<char*>(out.data_ptr()));
                             return ptrs;
                           }).outcome;
    for (int q = 0; q < W; ++q) copy_back(outputs[q], outs[q]);
    return o;
  });
}

void WorkspaceCollectives::check_all_to_all_v(const at::Tensor& input,
                                              const std::vector<int64_t>& input_splits, int W) {
  TORCH_CHECK(input.defined(), "cuda_p2p all_to_all_v: expected a tensor, got None");
  TORCH_CHECK(!input_splits.empty(), "cuda_p2p all_to_all_v: expected ", W,
              " input split sizes (one per rank), got none");
  detail::split_rows(input, input_splits, W, "input", "all_to_all_v");
}

WorkspaceCollectives::Rows WorkspaceCollectives::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& input_splits) {
  constexpr const char* kWhat = "all_to_all_v";
  refuse_capture(kWhat, kSplitsReadBack);
  check_or_reject(kWhat, ops::OpId::kAllToAllV,
                  [&] { check_all_to_all_v(input, input_splits, size_); });
  std::vector<int64_t> out_sizes = input.sizes().vec();
  const int64_t row_bytes =
      detail::row_elements(input) * static_cast<int64_t>(input.element_size());
  const at::Tensor in = detail::contiguous_input(input);
  ops::AllToAllArgs args;
  args.kind = ops::OpId::kAllToAllV;
  args.text = detail::rows_text(input);
  args.send = detail::row_slices<const char*>(static_cast<const char*>(in.const_data_ptr()),
                                              input_splits, row_bytes);
  args.send_counts = input_splits;
  args.unit_bytes = row_bytes;
  Rows r;
  r.outcome = run(kWhat, [&](const ops::CollectiveContext& ctx) {
    keep({in, input});
    auto done = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>& rows) {
      out_sizes[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      r.output = at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
      keep({r.output});
      return detail::row_slices<char*>(static_cast<char*>(r.output.data_ptr()), rows, row_bytes);
    });
    r.recv = std::move(done.recv);
    return done.outcome;
  });
  return r;
}

}  // namespace cuda_p2p
