// What the workspace collectives' bodies (WorkspaceCollectives' members, in each op's slice,
// backend/collectives/<op>.cpp) do alike with a call's tensors before they hand them to ops/: rows
// and their split sizes, an input that does not overlap the outputs, an output to compute into, and
// the text an op signature compares. One set, so that the ops check and word them alike.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cuda_p2p::detail {

// Elements of one row (dim 0) of `t`: the product of its other sizes.
int64_t row_elements(const at::Tensor& t);

// Elements [i * count, (i + 1) * count) of a contiguous tensor, as a 1-D view: rank i's part of
// an all-gather's output or a reduce-scatter's input.
at::Tensor element_chunk(const at::Tensor& t, int64_t i, int64_t count);

// The row counts of `t` by rank: `given`, or equal splits when it is empty (torch's convention).
// TORCH_CHECKs them; `name` ("input", "output") and `what` (the op) name them in errors.
std::vector<int64_t> split_rows(const at::Tensor& t, const std::vector<int64_t>& given, int W,
                                const char* name, const char* what);

// Pointers to consecutive slices of `rows[q]` rows of `row_bytes` bytes each from `base`.
template <typename Ptr>
std::vector<Ptr> row_slices(Ptr base, const std::vector<int64_t>& rows, int64_t row_bytes) {
  std::vector<Ptr> out;
  int64_t off = 0;
  for (int64_t r : rows) {
    out.push_back(base + off * row_bytes);
    off += r;
  }
  return out;
}

// A contiguous tensor holding `t`'s values that overlaps none of `others` (the outputs it is
// read alongside): `t` itself where it can be.
at::Tensor readable_apart(const at::Tensor& t, c10::ArrayRef<at::Tensor> others);

// `t` itself when it is contiguous, else a contiguous copy: an input as ops/ reads it.
inline at::Tensor contiguous_input(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// TORCH_CHECKs that `whole` holds world size times the elements of `part`, in its dtype: an
// all-gather's output and input, a reduce-scatter's input and output. `what` names the op.
void check_whole_of_parts(const at::Tensor& whole, const char* whole_name, const at::Tensor& part,
                          const char* part_name, int world_size, const std::string& what);

// TORCH_CHECKs a root in [0, W).
void check_root(const char* what, int64_t root, int W);

// A contiguous tensor to compute into for the output `t`: `t` itself when it is contiguous, else
// a new one the caller copies back (WorkspaceCollectives::copy_back).
at::Tensor contiguous_output(const at::Tensor& t);

// "rows of <elements> x <dtype>": what the ranks' op signatures compare for a call that moves
// rows of `t`.
std::string rows_text(const at::Tensor& t);

}  // namespace cuda_p2p::detail
