// The dispatcher ops torch.ops.cuda_p2p.fused_all_gather_matmul and fused_matmul_reduce_scatter:
// their schemas, and the CPU, CUDA and Meta kernels, which find the group's cuda_p2p backend by
// name and hand the op what it needs of the group (ops::pipeline::Group).
//
// This file owns TORCH_LIBRARY(cuda_p2p): a namespace has exactly one. Ops defined elsewhere go
// through TORCH_LIBRARY_FRAGMENT(cuda_p2p, m) in their own file. The backend library is linked
// whole into the Python extension, so that these registrations are kept.
#include <torch/library.h>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/dispatcher_group.hpp"
#include "ops/fused_ops.hpp"

namespace cuda_p2p {
namespace {

using ops::OpId;

constexpr const char* kAllGatherMatmul = "fused_all_gather_matmul";
constexpr const char* kMatmulReduceScatter = "fused_matmul_reduce_scatter";

// NOTE [Unfused below a size]
// Why: a fused op pays a fixed cost the unfused pair does not (its handshake and barriers, two
// streams, the GEMM split per peer); where its GEMM is short that is more than fusion hides, on
// the host always (no copy engine: fusion hides only waiting;
// docs/measurements/fused-measured-results.md).
// What "auto" does below Config::fused_min_flops GEMM flops per rank: what a user would write
// without the fused ops (our all_gather_into_tensor then torch.matmul, or torch.matmul then our
// reduce_scatter_tensor), the outputs laid out exactly as the fused path lays them out, counted
// "<op>.unfused".
// Invariants:
//  - the choice comes from the shapes, the group's size and its configuration; where ranks do
//    not share them (a knob set on one rank, shapes that differ), the unfused pair first runs the
//    fused op's own handshake (NOTE [Op signatures]) with "unfused" where the fused op names its
//    algorithm (ops::agree_all_gather_matmul_unfused): ranks that chose differently all raise,
//    naming what each passed and chose, and the group stays usable (one barrier, small against a
//    GEMM of fused_min_flops);
//  - only calls whose arguments pass the local checks take the unfused path: a bad call goes to
//    the fused op, whose handshake tells every rank, those on the unfused path included.

// Runs `body` with the group's pipeline, under the lock that lets one pipeline op of the group run
// at a time.
template <typename Body>
auto with_pipeline(ProcessGroupCudaP2P& pg, const at::Tensor& t, Body&& body) {
  std::lock_guard<std::mutex> lock(pg.pipeline_state().mutex);
  auto group = pg.pipeline_group(t.device().type());
  return body(group);
}

// Flops of the GEMMs a rank runs: 2 * (rows of the gathered / local A) * K * N, summed over Bs.
double gemm_flops(int64_t a_numel, int64_t a_cols, int64_t k, int64_t n) {
  const double rows = a_cols > 0 ? static_cast<double>(a_numel) / static_cast<double>(a_cols) : 0;
  return 2.0 * rows * static_cast<double>(k) * static_cast<double>(n);
}

bool below_threshold(ProcessGroupCudaP2P& pg, const at::Device& device, double flops) {
  const int64_t min_flops = pg.config().fused_min_flops_for(device.type());
  return min_flops > 0 && flops < static_cast<double>(min_flops);
}

// Whether "auto" takes the unfused path for this all-gather→matmul (NOTE [Unfused below a size]);
// returns gather_dim normalised through `dim`.
bool all_gather_matmul_unfused(ProcessGroupCudaP2P& pg, const at::Tensor& A_shard,
                               at::TensorList Bs, int64_t gather_dim, const std::string& algorithm,
                               int64_t& dim) {
  if (algorithm != "auto") return false;
  // Only where the unfused pair's collective runs on the workspace too: else it would run on the
  // wrapped backend, slower than the fused op (docs/measurements/fused-measured-results.md).
  if (!pg.uses_workspace_collectives()) return false;
  auto group = pg.pipeline_group(A_shard.device().type());
  if (!ops::pipeline::workspace_serves(group.workspace, A_shard.device())) return false;
  try {
    dim = ops::check_all_gather_matmul_args(A_shard, Bs, gather_dim, pg.getSize());
  } catch (const c10::Error&) {
    return false;  // the fused op raises it, on every rank
  }
  const int64_t W = pg.getSize();
  const bool contraction = dim == A_shard.dim() - 1;
  const int64_t k = A_shard.size(-1) * (contraction ? W : 1);
  int64_t n = 0;
  for (const auto& B : Bs) n += B.size(1);
  const int64_t rows_numel = A_shard.numel() * W;  // the gathered A, whatever its layout
  const int64_t cols = contraction ? A_shard.size(-1) * W : A_shard.size(-1);
  return below_threshold(pg, A_shard.device(), gemm_flops(rows_numel, cols, k, n));
}

// NOTE [Unfused below a size]: PyTorch's unfused reference (docs/pipelines.md), on our
// all-gather.
std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> all_gather_matmul_unfused_run(
    ProcessGroupCudaP2P& pg, const at::Tensor& A_shard, at::TensorList Bs, int64_t dim,
    bool return_A) {
  const int64_t W = pg.getSize();
  auto sizes = A_shard.sizes().vec();
  sizes[0] *= W;
  at::Tensor gathered =
      at::empty(sizes, A_shard.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor input = A_shard.contiguous();
  pg._allgather_base(gathered, input, c10d::AllgatherOptions())->wait();
  at::Tensor A;
  int64_t back = 0;
  if (dim == A_shard.dim() - 1) {
    A = at::cat(gathered.chunk(W), -1);
  } else {
    std::vector<int64_t> split{W};
    split.insert(split.end(), A_shard.sizes().begin(), A_shard.sizes().end());
    A = gathered.view(split).movedim(dim + 1, 1).flatten(0, 1);
    back = dim;
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(Bs.size());
  for (const auto& B : Bs) outputs.push_back(at::matmul(A, B).movedim(0, back));
  pg.path_counters().unfused(OpId::kFusedAllGatherMatmul);
  return {return_A ? std::optional<at::Tensor>(A.movedim(0, back)) : std::nullopt, outputs};
}

// Whether "auto" takes the unfused path for this matmul→reduce-scatter; `dim` as above.
bool matmul_reduce_scatter_unfused(ProcessGroupCudaP2P& pg, const at::Tensor& A,
                                   const at::Tensor& B, const std::string& reduce_op,
                                   int64_t scatter_dim, const std::string& algorithm,
                                   int64_t ring_steps, int64_t& dim) {
  if (algorithm != "auto" || ring_steps != 0) return false;  // ring steps ask for the ring
  if (reduce_op != "sum" && reduce_op != "avg") return false;
  // Only where the unfused pair's collective runs on the workspace too: else it would run on the
  // wrapped backend, slower than the fused op (docs/measurements/fused-measured-results.md).
  if (!pg.uses_workspace_collectives()) return false;
  auto group = pg.pipeline_group(A.device().type());
  if (!ops::pipeline::workspace_serves(group.workspace, A.device())) return false;
  try {
    dim = ops::check_matmul_reduce_scatter_args(A, B, scatter_dim, pg.getSize());
  } catch (const c10::Error&) {
    return false;
  }
  return below_threshold(pg, A.device(), gemm_flops(A.numel(), A.size(-1), A.size(-1), B.size(1)));
}

// NOTE [Unfused below a size]: torch.matmul, then our reduce-scatter along `dim` (moved to the
// front first, as funcol.reduce_scatter_tensor does); the result contiguous, like the fused op's.
at::Tensor matmul_reduce_scatter_unfused_run(ProcessGroupCudaP2P& pg, const at::Tensor& A,
                                             const at::Tensor& B, const std::string& reduce_op,
                                             int64_t dim) {
  const int64_t W = pg.getSize();
  at::Tensor product = at::matmul(A, B).movedim(dim, 0).contiguous();
  auto sizes = product.sizes().vec();
  sizes[0] /= W;
  at::Tensor scattered = at::empty(sizes, product.options());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = reduce_op == "avg" ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  pg._reduce_scatter_base(scattered, product, opts)->wait();
  pg.path_counters().unfused(OpId::kFusedMatmulReduceScatter);
  if (dim == 0) return scattered;
  auto out_sizes = A.sizes().vec();
  out_sizes.back() = B.size(1);
  out_sizes[dim] /= W;
  at::Tensor out = at::empty(out_sizes, A.options().memory_format(at::MemoryFormat::Contiguous));
  out.movedim(dim, 0).copy_(scattered);
  return out;
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_matmul(
    const at::Tensor& A_shard, at::TensorList Bs, int64_t gather_dim, const std::string& group_name,
    bool return_A, const std::string& algorithm) {
  TORCH_CHECK(A_shard.defined(), "cuda_p2p ", kAllGatherMatmul, ": A_shard is undefined");
  const auto backend = resolve_backend(group_name, A_shard.device().type(), kAllGatherMatmul);
  auto& pg = *backend;
  int64_t dim = gather_dim;
  if (all_gather_matmul_unfused(pg, A_shard, Bs, gather_dim, algorithm, dim)) {
    with_pipeline(pg, A_shard, [&](auto& group) {
      ops::agree_all_gather_matmul_unfused(group, A_shard, Bs, dim, return_A);
    });
    return all_gather_matmul_unfused_run(pg, A_shard, Bs, dim, return_A);
  }
  auto r = with_pipeline(pg, A_shard, [&](auto& group) {
    auto done = ops::fused_all_gather_matmul(group, A_shard, Bs, gather_dim, return_A, algorithm);
    pg.path_counters().record(OpId::kFusedAllGatherMatmul, done.outcome);
    return done;
  });
  return {r.A, r.outputs};
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B,
                                       const std::string& reduce_op, int64_t scatter_dim,
                                       const std::string& group_name, const std::string& algorithm,
                                       int64_t ring_steps) {
  TORCH_CHECK(A.defined(), "cuda_p2p ", kMatmulReduceScatter, ": A is undefined");
  const auto backend = resolve_backend(group_name, A.device().type(), kMatmulReduceScatter);
  auto& pg = *backend;
  int64_t dim = scatter_dim;
  if (matmul_reduce_scatter_unfused(pg, A, B, reduce_op, scatter_dim, algorithm, ring_steps, dim)) {
    with_pipeline(pg, A, [&](auto& group) {
      ops::agree_matmul_reduce_scatter_unfused(group, A, B, reduce_op, dim);
    });
    return matmul_reduce_scatter_unfused_run(pg, A, B, reduce_op, dim);
  }
  auto r = with_pipeline(pg, A, [&](auto& group) {
    auto done = ops::fused_matmul_reduce_scatter(group, A, B, reduce_op, scatter_dim, algorithm,
                                                 ring_steps);
    pg.path_counters().record(OpId::kFusedMatmulReduceScatter, done.outcome);
    return done;
  });
  return r.output;
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_matmul_meta(
    const at::Tensor& A_shard, at::TensorList Bs, int64_t gather_dim, const std::string& group_name,
    bool return_A, const std::string& algorithm) {
  const int64_t W = resolve_group_size(group_name, kAllGatherMatmul);
  auto r = ops::fused_all_gather_matmul_meta(A_shard, Bs, gather_dim, W, return_A, algorithm);
  return {r.A, r.outputs};
}

at::Tensor fused_matmul_reduce_scatter_meta(const at::Tensor& A, const at::Tensor& B,
                                            const std::string& reduce_op, int64_t scatter_dim,
                                            const std::string& group_name,
                                            const std::string& algorithm, int64_t ring_steps) {
  const int64_t W = resolve_group_size(group_name, kMatmulReduceScatter);
  return ops::fused_matmul_reduce_scatter_meta(A, B, reduce_op, scatter_dim, W, algorithm,
                                               ring_steps);
}

// The fp8 ops (NOTE [Scaled matmuls in the pipelines]): always fused - no unfused path below a
// size, whose reference would be our all-gather of fp8 bytes then _scaled_mm.
constexpr const char* kAllGatherScaledMatmul = "fused_all_gather_scaled_matmul";
constexpr const char* kScaledMatmulReduceScatter = "fused_scaled_matmul_reduce_scatter";

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_scaled_matmul(
    const at::Tensor& A_shard, at::TensorList Bs, const at::Tensor& A_scale,
    at::TensorList B_scales, int64_t gather_dim, const std::string& group_name,
    std::vector<at::ScalarType> out_dtypes, bool return_A, const std::string& algorithm) {
  TORCH_CHECK(A_shard.defined(), "cuda_p2p ", kAllGatherScaledMatmul, ": A_shard is undefined");
  const auto backend = resolve_backend(group_name, A_shard.device().type(), kAllGatherScaledMatmul);
  auto& pg = *backend;
  auto r = with_pipeline(pg, A_shard, [&](auto& group) {
    auto done = ops::fused_all_gather_scaled_matmul(group, A_shard, Bs, A_scale, B_scales,
                                                    gather_dim, out_dtypes, return_A, algorithm);
    pg.path_counters().record(OpId::kFusedAllGatherScaledMatmul, done.outcome);
    return done;
  });
  return {r.A, r.outputs};
}

at::Tensor fused_scaled_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B,
                                              const at::Tensor& A_scale, const at::Tensor& B_scale,
                                              const std::string& reduce_op, int64_t scatter_dim,
                                              const std::string& group_name,
                                              at::ScalarType out_dtype,
                                              const std::string& algorithm, int64_t ring_steps) {
  TORCH_CHECK(A.defined(), "cuda_p2p ", kScaledMatmulReduceScatter, ": A is undefined");
  const auto backend = resolve_backend(group_name, A.device().type(), kScaledMatmulReduceScatter);
  auto& pg = *backend;
  auto r = with_pipeline(pg, A, [&](auto& group) {
    auto done = ops::fused_scaled_matmul_reduce_scatter(
        group, A, B, A_scale, B_scale, reduce_op, scatter_dim, out_dtype, algorithm, ring_steps);
    pg.path_counters().record(OpId::kFusedScaledMatmulReduceScatter, done.outcome);
    return done;
  });
  return r.output;
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_scaled_matmul_meta(
    const at::Tensor& A_shard, at::TensorList Bs, const at::Tensor& A_scale,
    at::TensorList B_scales, int64_t gather_dim, const std::string& group_name,
    std::vector<at::ScalarType> out_dtypes, bool return_A, const std::string& algorithm) {
  const int64_t W = resolve_group_size(group_name, kAllGatherScaledMatmul);
  auto r = ops::fused_all_gather_scaled_matmul_meta(A_shard, Bs, A_scale, B_scales, gather_dim,
                                                    out_dtypes, W, return_A, algorithm);
  return {r.A, r.outputs};
}

at::Tensor fused_scaled_matmul_reduce_scatter_meta(
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale, const at::Tensor& B_scale,
    const std::string& reduce_op, int64_t scatter_dim, const std::string& group_name,
    at::ScalarType out_dtype, const std::string& algorithm, int64_t ring_steps) {
  const int64_t W = resolve_group_size(group_name, kScaledMatmulReduceScatter);
  return ops::fused_scaled_matmul_reduce_scatter_meta(
      A, B, A_scale, B_scale, reduce_op, scatter_dim, out_dtype, W, algorithm, ring_steps);
}

}  // namespace
}  // namespace cuda_p2p

TORCH_LIBRARY(cuda_p2p, m) {
  m.def(
      "fused_all_gather_scaled_matmul(Tensor A_shard, Tensor[] Bs, Tensor A_scale, "
      "Tensor[] B_scales, int gather_dim, str group_name, *, ScalarType[] out_dtypes, "
      "bool return_A=True, str algorithm=\"auto\") -> (Tensor?, Tensor[])");
  m.def(
      "fused_scaled_matmul_reduce_scatter(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, "
      "str reduce_op, int scatter_dim, str group_name, *, ScalarType out_dtype, "
      "str algorithm=\"auto\", int ring_steps=0) -> Tensor");
  m.def(
      "fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, *, "
      "bool return_A=True, str algorithm=\"auto\") -> (Tensor?, Tensor[])");
  m.def(
      "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, "
      "str group_name, *, str algorithm=\"auto\", int ring_steps=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(cuda_p2p, CPU, m) {
  m.impl("fused_all_gather_matmul", &cuda_p2p::fused_all_gather_matmul);
  m.impl("fused_matmul_reduce_scatter", &cuda_p2p::fused_matmul_reduce_scatter);
  m.impl("fused_all_gather_scaled_matmul", &cuda_p2p::fused_all_gather_scaled_matmul);
  m.impl("fused_scaled_matmul_reduce_scatter", &cuda_p2p::fused_scaled_matmul_reduce_scatter);
}

#ifdef CUDA_P2P_WITH_CUDA
TORCH_LIBRARY_IMPL(cuda_p2p, CUDA, m) {
  m.impl("fused_all_gather_matmul", &cuda_p2p::fused_all_gather_matmul);
  m.impl("fused_matmul_reduce_scatter", &cuda_p2p::fused_matmul_reduce_scatter);
  m.impl("fused_all_gather_scaled_matmul", &cuda_p2p::fused_all_gather_scaled_matmul);
  m.impl("fused_scaled_matmul_reduce_scatter", &cuda_p2p::fused_scaled_matmul_reduce_scatter);
}
#endif

TORCH_LIBRARY_IMPL(cuda_p2p, Meta, m) {
  m.impl("fused_all_gather_matmul", &cuda_p2p::fused_all_gather_matmul_meta);
  m.impl("fused_matmul_reduce_scatter", &cuda_p2p::fused_matmul_reduce_scatter_meta);
  m.impl("fused_all_gather_scaled_matmul", &cuda_p2p::fused_all_gather_scaled_matmul_meta);
  m.impl("fused_scaled_matmul_reduce_scatter", &cuda_p2p::fused_scaled_matmul_reduce_scatter_meta);
}
