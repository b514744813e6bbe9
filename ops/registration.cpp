// The dispatcher ops of the cuda_p2p namespace: schemas, and the CPU, CUDA and Meta kernels.
//
// This file owns TORCH_LIBRARY(cuda_p2p): a namespace has exactly one. Ops defined elsewhere go
// through TORCH_LIBRARY_FRAGMENT(cuda_p2p, m) in their own file.
#include <torch/library.h>

#include "ops/fused_ops.hpp"

namespace cuda_p2p {

void ensure_fused_ops_registered() {}

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
