// The collectives' shared tensor-argument helpers (backend/tensor_args.hpp).
#include "backend/tensor_args.hpp"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <numeric>

#include "ops/common.hpp"
#include "ops/op_signature.hpp"

namespace cuda_p2p::detail {

int64_t row_elements(const at::Tensor& t) { return c10::multiply_integers(t.sizes().slice(1)); }

std::vector<int64_t> split_rows(const at::Tensor& t, const std::vector<int64_t>& given, int W,
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

at::Tensor element_chunk(const at::Tensor& t, int64_t i, int64_t count) {
  return t.view({-1}).narrow(0, i * count, count);
}

at::Tensor readable_apart(const at::Tensor& t, c10::ArrayRef<at::Tensor> others) {
  for (const auto& o : others) {
    if (at::get_overlap_status(t, o) != at::MemOverlapStatus::No) {
      return t.clone(at::MemoryFormat::Contiguous);
    }
  }
  return t.contiguous();
}

at::Tensor contiguous_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

std::string rows_text(const at::Tensor& t) {
  return "rows of " + std::to_string(row_elements(t)) + " x " + ops::dtype_name(t.scalar_type());
}

void check_whole_of_parts(const at::Tensor& whole, const char* whole_name, const at::Tensor& part,
                          const char* part_name, int world_size, const std::string& what) {
  TORCH_CHECK(
      whole.numel() == part.numel() * world_size && whole.scalar_type() == part.scalar_type(),
      "cuda_p2p ", what, ": the ", whole_name, " must have world size (", world_size,
      ") times the ", part_name, "'s ", part.numel(), " elements of ", part.scalar_type(), ", got ",
      whole.numel(), " of ", whole.scalar_type());
}

void check_root(const char* what, int64_t root, int W) {
  TORCH_CHECK(root >= 0 && root < W, "cuda_p2p ", what, ": root must be a rank in [0, ", W,
              "), got ", root);
}

}  // namespace cuda_p2p::detail
