// all_gather(A_shard, gather_dim), then _scaled_mm with each B: the fp8 form of
// fused_all_gather_matmul, on the same schedule (gather_and_consume; NOTE [Scaled matmuls in the
// pipelines]).
#include <c10/util/Exception.h>

#include <vector>

#include "ops/fused_ops.hpp"

namespace cuda_p2p::ops {

namespace {

constexpr const char* kScaledAgOp = "fused_all_gather_scaled_matmul";

// NOTE [Rowwise scales travel with their rows]
// A rowwise A_scale is sharded like A_shard (one float32 per row), and the GEMM of rank src's rows
// needs src's scales. Rather than a second gather (a second protocol, its barriers and a buffer
// of its own), each row is gathered together with its scale: the op packs its shard as bytes,
// [rows, cols + 4] (the row's fp8 values, then its scale's 4 bytes), and the pipeline moves
// those rows as it moves any others. The consumer unpacks a chunk into a contiguous fp8 matrix
// and a [len, 1] scale before its _scaled_mm (one copy of the chunk's bytes, small next to its
// GEMM), and a returned A is unpacked at the end. A tensorwise scale is one number, the same on
// every rank by contract (torchao's tensorwise recipe all-reduces its amax): the shard travels as
// it is, zero-copy where the group's heap allows.

bool is_tensorwise_scale(const at::Tensor& scale) { return scale.numel() == 1; }

std::vector<int64_t> rowwise_scale_shape(const at::Tensor& t) {
  std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
  s.back() = 1;
  return s;
}

std::string scaled_ag_signature(const at::Tensor& A_shard, at::TensorList Bs,
                                const at::Tensor& A_scale, at::TensorList B_scales, int64_t dim,
                                c10::ArrayRef<at::ScalarType> out_dtypes, bool return_A,
                                const char* path) {
  std::string sig = "scaled: A_shard " + pipeline::shape_text(A_shard.sizes()) + " " +
                    dtype_name(A_shard.scalar_type()) + ", A_scale " +
                    pipeline::shape_text(A_scale.sizes()) + ", gather_dim " + std::to_string(dim);
  for (size_t i = 0; i < Bs.size(); ++i) {
    sig += ", B " + pipeline::shape_text(Bs[i].sizes()) + " " + dtype_name(Bs[i].scalar_type()) +
           " scale " + pipeline::shape_text(B_scales[i].sizes()) + " -> " +
           dtype_name(out_dtypes[i]);
  }
  return sig + (return_A ? ", return_A" : "") + ", " + path;
}

// The reference's layout (PyTorch's _fused_all_gather_scaled_matmul_fallback): the gathered A,
// view(W, *shard.shape).movedim(gather_dim + 1, 1).flatten(0, 1); each product the contiguous
// _scaled_mm of A flattened to a matrix, unflattened and moved back to gather_dim.
struct ScaledAgLayout {
  std::optional<at::Tensor> A;
  std::vector<at::Tensor> outputs;
};

ScaledAgLayout make_scaled_ag_layout(const at::Tensor& A_shard, at::TensorList Bs,
                                     int64_t gather_dim, int64_t W,
                                     c10::ArrayRef<at::ScalarType> out_dtypes, bool return_A) {
  ScaledAgLayout l;
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(A_shard.scalar_type());
  auto sizes = A_shard.sym_sizes().vec();
  auto gathered_sizes = sizes;
  gathered_sizes[0] = gathered_sizes[0] * W;
  std::vector<c10::SymInt> split{c10::SymInt(W)};
  split.insert(split.end(), sizes.begin(), sizes.end());
  at::Tensor A = at::empty_symint(gathered_sizes, meta)
                     .view_symint(split)
                     .movedim(gather_dim + 1, 1)
                     .flatten(0, 1);
  const auto like = [](const at::Tensor& m, const at::TensorOptions& o) {
    return at::empty_strided_symint(m.sym_sizes(), m.sym_strides(), o);
  };
  if (return_A) l.A = like(A.movedim(0, gather_dim), A_shard.options());
  for (size_t i = 0; i < Bs.size(); ++i) {
    auto out_sizes = A.sym_sizes().vec();
    out_sizes.back() = Bs[i].sym_size(1);
    at::Tensor out = at::empty_symint(out_sizes, meta.dtype(out_dtypes[i]));
    l.outputs.push_back(like(out.movedim(0, gather_dim), A_shard.options().dtype(out_dtypes[i])));
  }
  return l;
}

struct ScaledProblem {
  ScaledAgLayout layout;
  int64_t gather_dim;
  int64_t cols;
  bool rowwise;
  at::ScalarType fp8;
  at::Tensor A_scale;  // tensorwise
  at::Tensor shard;    // [rows, cols] fp8, or packed [rows, cols + 4] bytes (rowwise)
  at::Tensor stack;    // [W, ...] like shard
  std::vector<at::Tensor> Bs, B_scales;
  std::vector<at::ScalarType> out_dtypes;
  std::vector<at::Tensor> output_stacks;  // [W, rows, N_b]

  ScaledProblem(const at::Tensor& A_shard, at::TensorList Bs_, const at::Tensor& A_scale_,
                at::TensorList B_scales_, int64_t gather_dim_,
                c10::ArrayRef<at::ScalarType> out_dtypes_, int64_t W, bool return_A)
      : layout(make_scaled_ag_layout(A_shard, Bs_, gather_dim_, W, out_dtypes_, return_A)),
        gather_dim(gather_dim_),
        cols(A_shard.size(-1)),
        rowwise(!is_tensorwise_scale(A_scale_)),
        fp8(A_shard.scalar_type()),
        A_scale(A_scale_),
        Bs(Bs_.vec()),
        B_scales(B_scales_.vec()),
        out_dtypes(out_dtypes_.vec()) {
    const int64_t rows = A_shard.numel() / std::max<int64_t>(cols, 1);
    at::Tensor moved = A_shard.movedim(gather_dim, 0).contiguous().view({rows, cols});
    if (rowwise) {
      // NOTE [Rowwise scales travel with their rows]
      shard = at::empty({rows, cols + 4}, A_shard.options().dtype(at::kByte));
      shard.narrow(1, 0, cols).copy_(moved.view(at::kByte));
      // A fresh [rows, 1]: a size-1 dim of a "contiguous" tensor may have any stride, which the
      // byte view refuses.
      const at::Tensor src = A_scale_.movedim(gather_dim, 0);
      at::Tensor scale = at::empty({rows, 1}, A_scale_.options());
      scale.view(src.sizes()).copy_(src);
      shard.narrow(1, cols, 4).copy_(scale.view(at::kByte));
      stack = at::empty({W, rows, cols + 4}, shard.options());
    } else {
      shard = moved;
      if (layout.A) {
        at::Tensor m = layout.A->movedim(gather_dim, 0);
        if (m.is_contiguous()) stack = m.view({W, rows, cols});
      }
      if (!stack.defined()) stack = at::empty({W, rows, cols}, A_shard.options());
    }
    for (size_t b = 0; b < Bs.size(); ++b) {
      at::Tensor m = layout.outputs[b].movedim(gather_dim, 0);
      output_stacks.push_back(
          m.is_contiguous() ? m.view({W, rows, Bs[b].size(1)})
                            : at::empty({W, rows, Bs[b].size(1)}, layout.outputs[b].options()));
    }
  }

  void consume(int src, int64_t row0, const at::Tensor& rows) {
    const int64_t len = rows.size(0);
    if (len == 0) return;
    at::Tensor a = rows, sa = A_scale;
    if (rowwise) {
      // NOTE [Rowwise scales travel with their rows]
      a = rows.narrow(1, 0, cols).contiguous().view(fp8);
      sa = rows.narrow(1, cols, 4).contiguous().view(at::kFloat);
    }
    for (size_t b = 0; b < Bs.size(); ++b) {
      at::Tensor out = output_stacks[b][src].narrow(0, row0, len);
      if (out.size(1) == 0) continue;
      at::_scaled_mm_out(out, a, Bs[b], sa, B_scales[b], std::nullopt, std::nullopt, out_dtypes[b],
                         false);
    }
  }

  AllGatherMatmulResult finish() {
    auto unstack = [&](at::Tensor& out, const at::Tensor& st) {
      at::Tensor moved = out.movedim(gather_dim, 0);
      if (st.data_ptr() != moved.data_ptr()) moved.copy_(st.view(moved.sizes()));
    };
    if (layout.A) {
      at::Tensor gathered = rowwise ? stack.narrow(2, 0, cols).view(fp8) : stack;
      unstack(*layout.A, gathered);
    }
    for (size_t b = 0; b < Bs.size(); ++b) unstack(layout.outputs[b], output_stacks[b]);
    return {layout.A, layout.outputs};
  }
};

}  // namespace

bool is_float8(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2 ||
         dtype == at::kFloat8_e4m3fnuz || dtype == at::kFloat8_e5m2fnuz;
}

// Every check that needs no peer; returns gather_dim in [0, A_shard.dim() - 1).
int64_t check_all_gather_scaled_matmul_args(const at::Tensor& A_shard, at::TensorList Bs,
                                            const at::Tensor& A_scale, at::TensorList B_scales,
                                            int64_t gather_dim,
                                            c10::ArrayRef<at::ScalarType> out_dtypes) {
  TORCH_CHECK(A_shard.defined() && A_scale.defined(), "cuda_p2p ", kScaledAgOp,
              ": A_shard and A_scale must be defined");
  TORCH_CHECK(A_shard.layout() == at::kStrided, "cuda_p2p ", kScaledAgOp,
              ": expected a strided (dense) A_shard, got layout ", A_shard.layout());
  check_below_autograd(kScaledAgOp, {A_shard, A_scale});  // NOTE [Fused ops below autograd]
  check_below_autograd(kScaledAgOp, Bs);
  check_below_autograd(kScaledAgOp, B_scales);
  const int64_t nd = A_shard.dim();
  TORCH_CHECK(nd >= 2, "cuda_p2p ", kScaledAgOp,
              ": expected A_shard with at least 2 dims, got shape ", A_shard.sizes());
  TORCH_CHECK(gather_dim >= -nd && gather_dim < nd, "cuda_p2p ", kScaledAgOp,
              ": gather_dim must be in [", -nd, ", ", nd, ") for a ", nd, "-D A_shard, got ",
              gather_dim);
  if (gather_dim < 0) gather_dim += nd;
  TORCH_CHECK(gather_dim != nd - 1, "cuda_p2p ", kScaledAgOp,
              ": gather_dim is the last (contraction) dim; expected a dim in [0, ", nd - 1,
              "): a scaled matmul of a gathered contraction dim has no per-rank scale");
  TORCH_CHECK(is_float8(A_shard.scalar_type()), "cuda_p2p ", kScaledAgOp,
              ": expected a float8 A_shard (float8_e4m3fn, float8_e5m2, or their fnuz forms), "
              "got ",
              A_shard.scalar_type());
  TORCH_CHECK(A_scale.scalar_type() == at::kFloat && A_scale.device() == A_shard.device(),
              "cuda_p2p ", kScaledAgOp, ": expected a float32 A_scale on ", A_shard.device(),
              ", got ", A_scale.scalar_type(), " on ", A_scale.device());
  const auto row_shape = rowwise_scale_shape(A_shard);
  const bool a_tensorwise = is_tensorwise_scale(A_scale);
  TORCH_CHECK(a_tensorwise || A_scale.sizes() == at::IntArrayRef(row_shape), "cuda_p2p ",
              kScaledAgOp, ": expected A_scale with 1 element (tensorwise) or of shape ",
              at::IntArrayRef(row_shape), " (rowwise: A_shard's leading dims, then 1), got shape ",
              A_scale.sizes());
  TORCH_CHECK(!Bs.empty(), "cuda_p2p ", kScaledAgOp, ": expected at least one B, got none");
  TORCH_CHECK(B_scales.size() == Bs.size() && out_dtypes.size() == Bs.size(), "cuda_p2p ",
              kScaledAgOp, ": expected one B_scale and one out_dtype per B (", Bs.size(), "), got ",
              B_scales.size(), " B_scales and ", out_dtypes.size(), " out_dtypes");
  for (size_t i = 0; i < Bs.size(); ++i) {
    const auto& B = Bs[i];
    const auto& s = B_scales[i];
    TORCH_CHECK(B.defined() && s.defined(), "cuda_p2p ", kScaledAgOp, ": Bs[", i, "] or B_scales[",
                i, "] is undefined");
    TORCH_CHECK(B.layout() == at::kStrided && B.dim() == 2, "cuda_p2p ", kScaledAgOp,
                ": expected every B to be a strided matrix, got Bs[", i, "] of shape ", B.sizes());
    TORCH_CHECK(is_float8(B.scalar_type()), "cuda_p2p ", kScaledAgOp,
                ": expected float8 Bs, got Bs[", i, "] of ", B.scalar_type());
    TORCH_CHECK(B.device() == A_shard.device() && s.device() == A_shard.device(), "cuda_p2p ",
                kScaledAgOp, ": expected Bs and B_scales on ", A_shard.device(),
                " like A_shard, got Bs[", i, "] on ", B.device(), " and B_scales[", i, "] on ",
                s.device());
    TORCH_CHECK(B.size(0) == A_shard.size(-1), "cuda_p2p ", kScaledAgOp, ": Bs[", i, "] has ",
                B.size(0), " rows, but A_shard has ", A_shard.size(-1), " columns");
    TORCH_CHECK(s.scalar_type() == at::kFloat, "cuda_p2p ", kScaledAgOp,
                ": expected float32 B_scales, got B_scales[", i, "] of ", s.scalar_type());
    TORCH_CHECK(is_tensorwise_scale(s) || s.sizes() == at::IntArrayRef({1, B.size(1)}), "cuda_p2p ",
                kScaledAgOp, ": expected B_scales[", i,
                "] with 1 element (tensorwise) or of shape [1, ", B.size(1),
                "] (rowwise), got shape ", s.sizes());
    TORCH_CHECK(out_dtypes[i] == at::kFloat || out_dtypes[i] == at::kBFloat16, "cuda_p2p ",
                kScaledAgOp, ": expected out_dtypes float32 or bfloat16, got out_dtypes[", i,
                "] = ", out_dtypes[i]);
  }
  return gather_dim;
}

AllGatherMatmulResult fused_all_gather_scaled_matmul(pipeline::Group& group,
                                                     const at::Tensor& A_shard, at::TensorList Bs,
                                                     const at::Tensor& A_scale,
                                                     at::TensorList B_scales, int64_t gather_dim,
                                                     c10::ArrayRef<at::ScalarType> out_dtypes,
                                                     bool return_A, const std::string& algorithm) {
  pipeline::State& state = group.state;
  const int64_t W = group.world_size;
  const bool on_workspace = pipeline::workspace_serves(group.workspace, A_shard.device());
  AllGatherAlgorithm algo = AllGatherAlgorithm::kPipeline;
  int64_t dim = gather_dim;
  // NOTE [Op signatures]: a rank whose own arguments are wrong tells its peers.
  pipeline::check_or_reject(group, on_workspace, OpId::kFusedAllGatherMatmul, [&] {
    algo = parse_all_gather_algorithm(algorithm, group.auto_all_gather);
    dim =
        check_all_gather_scaled_matmul_args(A_shard, Bs, A_scale, B_scales, gather_dim, out_dtypes);
  });
  ScaledProblem p(A_shard, Bs, A_scale, B_scales, dim, out_dtypes, W, return_A);
  const auto consume = [&p](int src, int64_t row0, const at::Tensor& rows, int) {
    p.consume(src, row0, rows);
  };
  // The own slot of the stack is needed only for a returned A.
  const bool fill = return_A;
  if (on_workspace) {
    pipeline::Env env = pipeline::make_env(group);
    const char* name = to_string(algo);
    const std::string sig =
        scaled_ag_signature(A_shard, Bs, A_scale, B_scales, dim, out_dtypes, return_A, name);
    Outcome outcome{.algorithm = name, .graph = env.captured};  // NOTE [Replay-safe signals]
    AllGatherMatmulResult r = pipeline::run_or_mark_failed(group.failure, kScaledAgOp, [&] {
      pipeline::agree(env, state, OpSignature::of(OpId::kFusedAllGatherMatmul, sig));
      // NOTE [Zero-copy all-gather→matmul] needs the signature's claim, which this op does not
      // make: zero-copy only where the exchange decides (a tensorwise shard in the heap).
      gather_and_consume(env, p.shard, p.stack, consume, fill,
                         algo == AllGatherAlgorithm::kPullAhead, outcome,
                         !p.rowwise && !env.signature_agreement);
      AllGatherMatmulResult out;
      env.on_caller("finish", [&] { out = p.finish(); });
      return out;
    });
    r.outcome = outcome;
    if (env.trace) state.last_trace = env.trace->events();
    return r;
  }
  TORCH_CHECK(group.wrapped, "cuda_p2p ", kScaledAgOp, ": the workspace cannot serve ",
              A_shard.device(), " tensors and the group has no wrapped backend for them");
  gather_and_consume_send_recv(*group.wrapped, p.shard, p.stack, consume);
  AllGatherMatmulResult r = p.finish();
  r.outcome = {.algorithm = "send_recv"};
  return r;
}

AllGatherMatmulResult fused_all_gather_scaled_matmul_meta(
    const at::Tensor& A_shard, at::TensorList Bs, const at::Tensor& A_scale,
    at::TensorList B_scales, int64_t gather_dim, c10::ArrayRef<at::ScalarType> out_dtypes,
    int64_t W, bool return_A, const std::string& algorithm) {
  parse_all_gather_algorithm(algorithm, AllGatherAlgorithm::kPipeline);  // its check only
  bool concrete = !A_shard.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                  !A_scale.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  for (const auto& B : Bs)
    concrete = concrete && !B.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  if (concrete) {
    gather_dim =
        check_all_gather_scaled_matmul_args(A_shard, Bs, A_scale, B_scales, gather_dim, out_dtypes);
  } else {
    const int64_t nd = A_shard.dim();
    TORCH_CHECK(nd >= 2 && gather_dim >= -nd && gather_dim < nd - 1, "cuda_p2p ", kScaledAgOp,
                ": gather_dim must be in [", -nd, ", ", nd - 1, "), got ", gather_dim);
    TORCH_CHECK(out_dtypes.size() == Bs.size(), "cuda_p2p ", kScaledAgOp,
                ": expected one out_dtype per B (", Bs.size(), "), got ", out_dtypes.size());
    if (gather_dim < 0) gather_dim += nd;
  }
  auto l = make_scaled_ag_layout(A_shard, Bs, gather_dim, W, out_dtypes, return_A);
  return {l.A, l.outputs};
}

}  // namespace cuda_p2p::ops
