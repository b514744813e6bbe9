// reduce_scatter(_scaled_mm(A, B, A_scale, B_scale, out_dtype), scatter_dim): the fp8 form of
// fused_matmul_reduce_scatter, on the same pipeline and ring (NOTE [Scaled matmuls in the
// pipelines]).
#include <c10/util/Exception.h>

#include "ops/fused_ops.hpp"

namespace cuda_p2p::ops {

namespace {

constexpr const char* kScaledRsOp = "fused_scaled_matmul_reduce_scatter";

void check_scaled_rs_algorithm(const std::string& algorithm) {
  TORCH_CHECK_VALUE(algorithm == "auto" || algorithm == "pipeline" || algorithm == "ring",
                    "cuda_p2p ", kScaledRsOp,
                    ": algorithm must be \"auto\", \"pipeline\" or \"ring\", got \"", algorithm,
                    "\"");
}

// Everything the ranks must agree on (NOTE [Op signatures]); "scaled" keeps it apart from the
// unscaled op's, which shares its kind.
std::string scaled_rs_signature(const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale,
                                const at::Tensor& B_scale, ReduceOp op, int64_t dim,
                                at::ScalarType out_dtype, const std::string& path) {
  return "scaled: A " + pipeline::shape_text(A.sizes()) + " " + dtype_name(A.scalar_type()) +
         ", B " + pipeline::shape_text(B.sizes()) + " " + dtype_name(B.scalar_type()) +
         ", A_scale " + pipeline::shape_text(A_scale.sizes()) + ", B_scale " +
         pipeline::shape_text(B_scale.sizes()) + ", out " + dtype_name(out_dtype) + ", " +
         lower_name(op) + ", scatter_dim " + std::to_string(dim) + ", " + path;
}

}  // namespace

int64_t check_scaled_matmul_reduce_scatter_args(const at::Tensor& A, const at::Tensor& B,
                                                const at::Tensor& A_scale,
                                                const at::Tensor& B_scale, int64_t scatter_dim,
                                                at::ScalarType out_dtype, int64_t world_size) {
  TORCH_CHECK(A.defined() && B.defined() && A_scale.defined() && B_scale.defined(), "cuda_p2p ",
              kScaledRsOp, ": A, B, A_scale and B_scale must be defined");
  TORCH_CHECK(A.layout() == at::kStrided && B.layout() == at::kStrided, "cuda_p2p ", kScaledRsOp,
              ": expected strided (dense) A and B, got layouts ", A.layout(), " and ", B.layout());
  check_below_autograd(kScaledRsOp, {A, B, A_scale, B_scale});  // NOTE [Fused ops below autograd]
  scatter_dim = check_reduce_scatter_shapes(kScaledRsOp, A, B, scatter_dim);
  TORCH_CHECK(is_float8(A.scalar_type()) && is_float8(B.scalar_type()), "cuda_p2p ", kScaledRsOp,
              ": expected float8 A and B (float8_e4m3fn, float8_e5m2, or their fnuz forms), got ",
              A.scalar_type(), " and ", B.scalar_type());
  TORCH_CHECK(
      B.device() == A.device() && A_scale.device() == A.device() && B_scale.device() == A.device(),
      "cuda_p2p ", kScaledRsOp, ": expected B and the scales on ", A.device(), " like A, got B on ",
      B.device(), ", A_scale on ", A_scale.device(), ", B_scale on ", B_scale.device());
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16, "cuda_p2p ", kScaledRsOp,
              ": expected out_dtype float32 or bfloat16, got ", out_dtype);
  TORCH_CHECK(A_scale.scalar_type() == at::kFloat && B_scale.scalar_type() == at::kFloat,
              "cuda_p2p ", kScaledRsOp, ": expected float32 scales, got A_scale ",
              A_scale.scalar_type(), " and B_scale ", B_scale.scalar_type());
  std::vector<int64_t> rowwise_a(A.sizes().begin(), A.sizes().end());
  rowwise_a.back() = 1;
  const bool a_tensorwise = A_scale.numel() == 1;
  TORCH_CHECK(a_tensorwise || A_scale.sizes() == at::IntArrayRef(rowwise_a), "cuda_p2p ",
              kScaledRsOp, ": expected A_scale with 1 element (tensorwise) or of shape ",
              at::IntArrayRef(rowwise_a), " (rowwise: A's leading dims, then 1), got shape ",
              A_scale.sizes());
  const bool b_tensorwise = B_scale.numel() == 1;
  TORCH_CHECK(b_tensorwise || B_scale.sizes() == at::IntArrayRef({1, B.size(1)}), "cuda_p2p ",
              kScaledRsOp, ": expected B_scale with 1 element (tensorwise) or of shape [1, ",
              B.size(1), "] (rowwise), got shape ", B_scale.sizes());
  check_reduce_scatter_product(kScaledRsOp, A, B, scatter_dim, world_size);
  return scatter_dim;
}

MatmulReduceScatterResult fused_scaled_matmul_reduce_scatter(
    pipeline::Group& group, const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale,
    const at::Tensor& B_scale, const std::string& reduce_op, int64_t scatter_dim,
    at::ScalarType out_dtype, const std::string& algorithm, int64_t ring_steps) {
  const int64_t W = group.world_size;
  pipeline::State& state = group.state;
  const bool on_workspace = pipeline::workspace_serves(group.workspace, A.device());
  ReduceOp op = ReduceOp::kSum;
  int64_t steps = W, dim = scatter_dim;
  // NOTE [Op signatures]: a rank whose own arguments are wrong tells its peers, before any data
  // moves.
  pipeline::check_or_reject(group, on_workspace, OpId::kFusedMatmulReduceScatter, [&] {
    op = parse_reduce_op(reduce_op, {ReduceOp::kSum, ReduceOp::kAvg}, kScaledRsOp);
    check_scaled_rs_algorithm(algorithm);
    dim =
        check_scaled_matmul_reduce_scatter_args(A, B, A_scale, B_scale, scatter_dim, out_dtype, W);
    steps = check_ring_steps(ring_steps, W);
    TORCH_CHECK(ring_steps == 0 || algorithm != "pipeline", "cuda_p2p ", kScaledRsOp,
                ": ring_steps applies to the ring, got ring_steps=", ring_steps,
                " with algorithm=\"pipeline\"");
  });
  const ScaledMatmul scaled{A_scale, B_scale, out_dtype};
  // NOTE [The fused ops' auto by device] in backend/config.hpp.
  const bool ring = pipeline::reduce_scatter_runs_ring(group, algorithm, ring_steps);
  if (on_workspace) {
    pipeline::Env env = pipeline::make_env(group);
    const std::string sig =
        scaled_rs_signature(A, B, A_scale, B_scale, op, dim, out_dtype,
                            ring ? "ring (" + std::to_string(steps) + " steps)" : "pipeline");
    MatmulReduceScatterResult r{.outcome = {.algorithm = ring ? "ring" : "pipeline",
                                            .graph = env.captured}};  // NOTE [Replay-safe signals]
    r.output = pipeline::run_or_mark_failed(group.failure, kScaledRsOp, [&] {
      pipeline::agree(env, state, OpSignature::of(OpId::kFusedMatmulReduceScatter, sig));
      return ring
                 ? matmul_reduce_scatter_ring(env, A, B, op, scatter_dim, steps, r.outcome, &scaled)
                 : matmul_reduce_scatter_pipeline(env, A, B, op, scatter_dim, r.outcome, &scaled);
    });
    if (env.trace) state.last_trace = env.trace->events();
    return r;
  }
  TORCH_CHECK(group.wrapped, "cuda_p2p ", kScaledRsOp, ": the workspace cannot serve ", A.device(),
              " tensors and the group has no wrapped backend for them");
  return {matmul_reduce_scatter_send_recv(*group.wrapped, A, B, op, scatter_dim, steps, &scaled),
          {.algorithm = "send_recv"}};
}

at::Tensor fused_scaled_matmul_reduce_scatter_meta(
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale, const at::Tensor& B_scale,
    const std::string& reduce_op, int64_t scatter_dim, at::ScalarType out_dtype, int64_t W,
    const std::string& algorithm, int64_t ring_steps) {
  parse_reduce_op(reduce_op, {ReduceOp::kSum, ReduceOp::kAvg}, kScaledRsOp);
  check_scaled_rs_algorithm(algorithm);
  check_ring_steps(ring_steps, W);
  const bool concrete = !A.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                        !B.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                        !A_scale.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  if (concrete) {
    scatter_dim =
        check_scaled_matmul_reduce_scatter_args(A, B, A_scale, B_scale, scatter_dim, out_dtype, W);
  } else {
    TORCH_CHECK(A.dim() >= 2 && scatter_dim >= -A.dim() && scatter_dim < A.dim(), "cuda_p2p ",
                kScaledRsOp, ": scatter_dim must be in [", -A.dim(), ", ", A.dim(), "), got ",
                scatter_dim);
    TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16, "cuda_p2p ", kScaledRsOp,
                ": expected out_dtype float32 or bfloat16, got ", out_dtype);
    if (scatter_dim < 0) scatter_dim += A.dim();
  }
  // The reference: reduce_scatter_tensor of the contiguous product, moved back: contiguous.
  auto sizes = A.sym_sizes().vec();
  sizes.back() = B.sym_size(1);
  sizes[scatter_dim] = sizes[scatter_dim] / W;
  return at::empty_symint(sizes, A.options().dtype(out_dtype));
}

}  // namespace cuda_p2p::ops
