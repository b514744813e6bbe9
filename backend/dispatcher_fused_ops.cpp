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

constexpr const char* kAllGatherMatmul = "fused_all_gather_matmul";
constexpr const char* kMatmulReduceScatter = "fused_matmul_reduce_scatter";

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_matmul(
    const at::Tensor& A_shard, at::TensorList Bs, int64_t gather_dim, const std::string& group_name,
    bool return_A, const std::string& algorithm) {
  TORCH_CHECK(A_shard.defined(), "cuda_p2p ", kAllGatherMatmul, ": A_shard is undefined");
  auto& pg = resolve_backend(group_name, A_shard.device().type(), kAllGatherMatmul);
  auto& state = pg.pipeline_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto group = pg.pipeline_group(A_shard.device().type());
  auto r = ops::fused_all_gather_matmul(group, A_shard, Bs, gather_dim, return_A, algorithm);
  return {r.A, r.outputs};
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B,
                                       const std::string& reduce_op, int64_t scatter_dim,
                                       const std::string& group_name, const std::string& algorithm,
                                       int64_t ring_steps) {
  TORCH_CHECK(A.defined(), "cuda_p2p ", kMatmulReduceScatter, ": A is undefined");
  auto& pg = resolve_backend(group_name, A.device().type(), kMatmulReduceScatter);
  auto& state = pg.pipeline_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto group = pg.pipeline_group(A.device().type());
  return ops::fused_matmul_reduce_scatter(group, A, B, reduce_op, scatter_dim, algorithm,
                                          ring_steps);
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

}  // namespace
}  // namespace cuda_p2p

TORCH_LIBRARY(cuda_p2p, m) {
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
}

#ifdef CUDA_P2P_WITH_CUDA
TORCH_LIBRARY_IMPL(cuda_p2p, CUDA, m) {
  m.impl("fused_all_gather_matmul", &cuda_p2p::fused_all_gather_matmul);
  m.impl("fused_matmul_reduce_scatter", &cuda_p2p::fused_matmul_reduce_scatter);
}
#endif

TORCH_LIBRARY_IMPL(cuda_p2p, Meta, m) {
  m.impl("fused_all_gather_matmul", &cuda_p2p::fused_all_gather_matmul_meta);
  m.impl("fused_matmul_reduce_scatter", &cuda_p2p::fused_matmul_reduce_scatter_meta);
}
