// WorkspaceCollectives' all-to-alls (ops/all_to_all.cpp): all_to_all_single (alltoall_base), the
// list all_to_all (alltoall) and cuda_p2p.all_to_all_v (docs/collectives.md, "All-to-all").
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <utility>

#include "backend/workspace_collectives.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

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

// Why the all-to-alls cannot be captured in a graph: a graph cannot replay what the host reads.
constexpr const char* kSplitsReadBack = " (its split sizes are read back on the host)";

std::string a2a_rows_text(const at::Tensor& t) {
  return "rows of " + std::to_string(a2a_row_elems(t)) + " x " + ops::dtype_name(t.scalar_type());
}

}  // namespace

ops::Outcome WorkspaceCollectives::all_to_all_single(
    at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
    const std::vector<int64_t>& input_split_sizes) {
  const int W = size_;
  refuse_capture("all_to_all_single", kSplitsReadBack);
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
  return run("all_to_all_single", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o =
        ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
          return a2a_slices<char*>(static_cast<char*>(out.data_ptr()), out_rows, row_bytes);
        }).outcome;
    hold({in, input});
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
  return run("all_to_all", [&](const ops::CollectiveContext& ctx) {
    const ops::Outcome o = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>&) {
                             std::vector<char*> ptrs;
                             for (auto& out : outs)
                               ptrs.push_back(static_cast<char*>(out.data_ptr()));
                             return ptrs;
                           }).outcome;
    hold(joined(ins, inputs));
    for (int q = 0; q < W; ++q) copy_back(outputs[q], outs[q]);
    return o;
  });
}

void WorkspaceCollectives::check_all_to_all_v(const at::Tensor& input,
                                              const std::vector<int64_t>& input_splits, int W) {
  TORCH_CHECK(input.defined(), "cuda_p2p all_to_all_v: expected a tensor, got None");
  TORCH_CHECK(!input_splits.empty(), "cuda_p2p all_to_all_v: expected ", W,
              " input split sizes (one per rank), got none");
  a2a_split_rows(input, input_splits, W, "input", "all_to_all_v");
}

WorkspaceCollectives::Rows WorkspaceCollectives::all_to_all_v(
    const at::Tensor& input, const std::vector<int64_t>& input_splits) {
  constexpr const char* kWhat = "all_to_all_v";
  refuse_capture(kWhat, kSplitsReadBack);
  check_or_reject(kWhat, ops::OpKind::kAllToAllV,
                  [&] { check_all_to_all_v(input, input_splits, size_); });
  std::vector<int64_t> out_sizes = input.sizes().vec();
  const int64_t row_bytes = a2a_row_elems(input) * static_cast<int64_t>(input.element_size());
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  ops::AllToAllArgs args;
  args.kind = ops::OpKind::kAllToAllV;
  args.text = a2a_rows_text(input);
  args.send = a2a_slices<const char*>(static_cast<const char*>(in.const_data_ptr()), input_splits,
                                      row_bytes);
  args.send_counts = input_splits;
  args.unit_bytes = row_bytes;
  Rows r;
  r.outcome = run(kWhat, [&](const ops::CollectiveContext& ctx) {
    auto done = ops::all_to_all(ctx, args, [&](const std::vector<int64_t>& rows) {
      out_sizes[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      r.output = at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
      return a2a_slices<char*>(static_cast<char*>(r.output.data_ptr()), rows, row_bytes);
    });
    r.recv = std::move(done.recv);
    hold({in, input});
    return done.outcome;
  });
  return r;
}

}  // namespace cuda_p2p
