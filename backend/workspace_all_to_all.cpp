// WorkspaceCollectives' all-to-alls (ops/all_to_all.cpp): all_to_all_single (alltoall_base), the
// list all_to_all (alltoall) and cuda_p2p.all_to_all_v (docs/collectives.md, "All-to-all").
#include <c10/util/Exception.h>

#include <numeric>
#include <utility>

#include "backend/tensor_args.hpp"
#include "backend/workspace_collectives.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

namespace {

// Why the all-to-alls cannot be captured in a graph: a graph cannot replay what the host reads.
constexpr const char* kSplitsReadBack = " (its split sizes are read back on the host)";

}  // namespace

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
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
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
