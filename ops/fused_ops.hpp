// The fused GEMM pipelines (docs/design.md §5, docs/pipelines.md): all-gather→matmul and
// matmul→reduce-scatter.
//
// Three layers:
//  * the entry points fused_all_gather_matmul / fused_matmul_reduce_scatter, which pick a path
//    for an op of a group (pipeline::Group, given by the backend's dispatcher ops in
//    backend/dispatcher_fused_ops.cpp), run it and count it;
//  * the paths below: over the workspace (Env, two streams) or over the wrapped backend's
//    send/recv (no workspace needed), each handling any gather/scatter dim; they are what the
//    GoogleTest binaries drive directly, and which share
//  * the output layouts, also used by the Meta kernels, so that every path and the Meta kernel
//    return the shapes and strides of the unfused reference.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <tuple>
#include <vector>

#include "ops/common.hpp"
#include "ops/outcome.hpp"
#include "ops/pipeline_common.hpp"

namespace cuda_p2p::ops {

// ---- entry points --------------------------------------------------------------------------

struct AllGatherMatmulResult {
  std::optional<at::Tensor> A;
  std::vector<at::Tensor> outputs;
  // What the entry point ran (NOTE [Outcomes] in ops/outcome.hpp); a path function leaves it
  // empty and fills the Outcome it is given.
  Outcome outcome{};
};
struct MatmulReduceScatterResult {
  at::Tensor output{};
  Outcome outcome{};
};

// all_gather(A_shard, gather_dim) @ B for each B in Bs, over `group`. Returns the gathered A
// (unless return_A is false) and the products, laid out like the unfused reference: gathered
// along gather_dim (rank r's shard at index r), then torch.matmul. `algorithm`: "pipeline" (NOTE
// [All-gather→matmul schedule]), "pull_ahead" (NOTE [Pull-ahead all-gather→matmul]) or "auto"
// (the pipeline on CUDA tensors, pull-ahead on CPU tensors). The caller holds group.state.mutex.
// Both entry points also return what ran: "pipeline", "pull_ahead", "ring" or "send_recv", the
// rounds, whether it grew the workspace or read the shards in the heaps, under capture or not.
AllGatherMatmulResult fused_all_gather_matmul(pipeline::Group& group, const at::Tensor& A_shard,
                                              at::TensorList Bs, int64_t gather_dim, bool return_A,
                                              const std::string& algorithm);

// reduce_scatter(A @ B, reduce_op, scatter_dim) over `group`: rank r gets the r-th of W equal
// slices along scatter_dim of the sum (or mean) over ranks of A @ B. `reduce_op`: "sum" or
// "avg". `algorithm`: "pipeline", "ring", or "auto" (the pipeline on CUDA tensors, the ring on
// CPU tensors or when ring_steps is given); `ring_steps` (S, a multiple of the group size; 0
// means the group size) for the ring. The caller holds group.state.mutex.
MatmulReduceScatterResult fused_matmul_reduce_scatter(
    pipeline::Group& group, const at::Tensor& A, const at::Tensor& B, const std::string& reduce_op,
    int64_t scatter_dim, const std::string& algorithm, int64_t ring_steps);

// The handshake of a call that "auto" runs as the unfused pair instead (NOTE [Unfused below a
// size] in backend/dispatcher_fused_ops.cpp): the fused op's, with the same arguments (checked by
// the caller, `gather_dim` / `scatter_dim` normalised) and "unfused" where the fused op names its
// algorithm, so that ranks that chose differently, or whose arguments differ, raise a
// SignatureMismatch naming what each passed instead of waiting in different protocols. The
// caller holds group.state.mutex; nothing when the group has one rank.
void agree_all_gather_matmul_unfused(pipeline::Group& group, const at::Tensor& A_shard,
                                     at::TensorList Bs, int64_t gather_dim, bool return_A);
void agree_matmul_reduce_scatter_unfused(pipeline::Group& group, const at::Tensor& A,
                                         const at::Tensor& B, const std::string& reduce_op,
                                         int64_t scatter_dim);

// Meta kernels for a group of W ranks: outputs with the right shapes, dtypes and strides, no
// data; the same argument checks where the sizes are concrete.
AllGatherMatmulResult fused_all_gather_matmul_meta(const at::Tensor& A_shard, at::TensorList Bs,
                                                   int64_t gather_dim, int64_t W, bool return_A,
                                                   const std::string& algorithm);
at::Tensor fused_matmul_reduce_scatter_meta(const at::Tensor& A, const at::Tensor& B,
                                            const std::string& reduce_op, int64_t scatter_dim,
                                            int64_t W, const std::string& algorithm,
                                            int64_t ring_steps);

// The fp8 ops (NOTE [Scaled matmuls in the pipelines]): all_gather(A_shard, gather_dim), then
// _scaled_mm(A, B, A_scale (gathered with A when rowwise), B_scale, out_dtype) for each B, laid
// out like the unfused reference (PyTorch's fallback: the gathered A flattened to a matrix, the
// product unflattened and moved back to gather_dim); gather_dim is not the last dim. And
// reduce_scatter(_scaled_mm(A, B, ...), reduce_op, scatter_dim). The caller holds
// group.state.mutex.
AllGatherMatmulResult fused_all_gather_scaled_matmul(pipeline::Group& group,
                                                     const at::Tensor& A_shard, at::TensorList Bs,
                                                     const at::Tensor& A_scale,
                                                     at::TensorList B_scales, int64_t gather_dim,
                                                     c10::ArrayRef<at::ScalarType> out_dtypes,
                                                     bool return_A, const std::string& algorithm);
MatmulReduceScatterResult fused_scaled_matmul_reduce_scatter(
    pipeline::Group& group, const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale,
    const at::Tensor& B_scale, const std::string& reduce_op, int64_t scatter_dim,
    at::ScalarType out_dtype, const std::string& algorithm, int64_t ring_steps);
AllGatherMatmulResult fused_all_gather_scaled_matmul_meta(
    const at::Tensor& A_shard, at::TensorList Bs, const at::Tensor& A_scale,
    at::TensorList B_scales, int64_t gather_dim, c10::ArrayRef<at::ScalarType> out_dtypes,
    int64_t W, bool return_A, const std::string& algorithm);
at::Tensor fused_scaled_matmul_reduce_scatter_meta(
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale, const at::Tensor& B_scale,
    const std::string& reduce_op, int64_t scatter_dim, at::ScalarType out_dtype, int64_t W,
    const std::string& algorithm, int64_t ring_steps);

// ---- paths -----------------------------------------------------------------------------------

// NOTE [Fused ops below autograd]
// The kernels write their products with out= ops, on the pipeline's streams, which replay the
// caller's thread-local state (pipeline::Env::tls). They are correct only below autograd: the
// backward formulas registered by the Python package (python/cuda_p2p/_autograd.py) call them with
// the autograd keys excluded. A caller that reaches a kernel with a tensor that requires grad,
// grad mode on and autograd not excluded (the C++ library without the Python package: the
// dispatcher's fallback redispatches without excluding autograd) would fail in the first GEMM,
// midway through the pipeline, after the peers have signalled: the check below raises before.
void check_below_autograd(const char* op, at::TensorList tensors);

// Checks the arguments (every check that needs no peer: run before the first signal, so a bad
// call raises on every rank that makes it and leaves the group usable); returns gather_dim in
// [0, A_shard.dim()).
int64_t check_all_gather_matmul_args(const at::Tensor& A_shard, at::TensorList Bs,
                                     int64_t gather_dim, int64_t world_size);

// "auto" (which runs `auto_choice`: the group's, pipeline::Group::auto_all_gather), "pipeline"
// or "pull_ahead".
AllGatherAlgorithm parse_all_gather_algorithm(const std::string& algorithm,
                                              AllGatherAlgorithm auto_choice);

// A consumer of gathered rows: gets rank src's rows [row0, row0 + shard.size(0)) on pipeline
// stream `stream` (0 or 1; always 0 over send/recv).
using GatherConsumer =
    std::function<void(int src, int64_t row0, const at::Tensor& shard, int stream)>;
// The all-gather schedule of the pipelines (NOTE [All-gather→matmul schedule], NOTE [Pull-ahead
// all-gather→matmul]): gathers the [rows, cols] contiguous `shard` (any dtype: rows travel as
// bytes) into the [W, rows, cols] `stack` and hands every rank's rows to `consume` as they
// arrive. `fill_own_slot`: copy the own shard into its slot too (the stack is returned).
// `zero_copy`: read the peers' shards in their heaps where every rank's shard is there (NOTE
// [Zero-copy all-gather→matmul]); false for a shard the op built itself (never in the heap).
// Sets the rounds, the growth and the zero-copy of `outcome`, as the path functions below do.
void gather_and_consume(pipeline::Env& env, const at::Tensor& shard, const at::Tensor& stack,
                        const GatherConsumer& consume, bool fill_own_slot, bool pull_ahead,
                        Outcome& outcome, bool zero_copy = true);
// The same over the wrapped backend's send/recv (a ring).
void gather_and_consume_send_recv(c10d::Backend& backend, const at::Tensor& shard,
                                  const at::Tensor& stack, const GatherConsumer& consume);

// The all-gather→matmul pipeline over the workspace (NOTE [All-gather→matmul schedule]), or its
// pull-ahead variant (NOTE [Pull-ahead all-gather→matmul]).
AllGatherMatmulResult all_gather_matmul_pipeline(
    pipeline::Env& env, const at::Tensor& A_shard, at::TensorList Bs, int64_t gather_dim,
    bool return_A, Outcome& outcome, AllGatherAlgorithm algorithm = AllGatherAlgorithm::kPipeline);
// The same product over `backend`'s send/recv: a ring all-gather whose shards are consumed as
// they arrive.
AllGatherMatmulResult all_gather_matmul_send_recv(c10d::Backend& backend, const at::Tensor& A_shard,
                                                  at::TensorList Bs, int64_t gather_dim,
                                                  bool return_A);

// NOTE [Scaled matmuls in the pipelines]
// The fp8 ops (fused_all_gather_scaled_matmul, fused_scaled_matmul_reduce_scatter) run the
// pipelines above unchanged; only their per-chunk product is torch._scaled_mm(a, b, scale_a,
// scale_b, out_dtype=...) instead of a.mm(b), with the chunk's own scales: a tensorwise scale (one
// element) as it is, a rowwise A scale ([rows, 1]) narrowed with A's rows, a rowwise B scale
// ([1, N]) narrowed with B's columns where the columns are split. Each output row (or column
// block) is then a _scaled_mm of the same operands as the unfused reference's, over a chunk's
// rows instead of all of them. That is not always bitwise the same: a backend's _scaled_mm may
// sum a row's K products in an order that depends on how many rows the call has (some CPUs'
// do), so a row may differ by the roundings of two float32 sums of K terms (and one bfloat16
// ulp after the final rounding). tests/python/fused/test_fp8.py holds random values to that bound
// and small-integer ones, whose sums are exact, bitwise. The partials of a reduce-scatter are in
// out_dtype and summed in float32, as the unscaled op sums bfloat16 partials.
struct ScaledMatmul {
  at::Tensor A_scale;                     // float32: 1 element, or A's leading dims + [1] (rowwise)
  at::Tensor B_scale;                     // float32: 1 element, or [1, N] (rowwise)
  at::ScalarType out_dtype = at::kFloat;  // float32 or bfloat16
};

// The fp8 dtypes _scaled_mm takes.
bool is_float8(at::ScalarType dtype);
// Checks the arguments of fused_all_gather_scaled_matmul; returns gather_dim in
// [0, A_shard.dim() - 1).
int64_t check_all_gather_scaled_matmul_args(const at::Tensor& A_shard, at::TensorList Bs,
                                            const at::Tensor& A_scale, at::TensorList B_scales,
                                            int64_t gather_dim,
                                            c10::ArrayRef<at::ScalarType> out_dtypes);

// The checks both matmul -> reduce-scatter ops (plain and scaled) share, under `op`'s name: A at
// least 2-D and B a matrix (returns scatter_dim in [0, A.dim())); then, once the dtypes and
// devices are checked, B with A.size(-1) rows and a scattered dim divisible by the group size.
int64_t check_reduce_scatter_shapes(const char* op, const at::Tensor& A, const at::Tensor& B,
                                    int64_t scatter_dim);
void check_reduce_scatter_product(const char* op, const at::Tensor& A, const at::Tensor& B,
                                  int64_t scatter_dim, int64_t world_size);

// Checks the arguments, returns scatter_dim in [0, A.dim()).
int64_t check_matmul_reduce_scatter_args(const at::Tensor& A, const at::Tensor& B,
                                         int64_t scatter_dim, int64_t world_size);
// The number of ring steps for `ring_steps` (0: the group size); checks it is a multiple of W.
int64_t check_ring_steps(int64_t ring_steps, int64_t world_size);

// The same for the scaled product (NOTE [Scaled matmuls in the pipelines]).
int64_t check_scaled_matmul_reduce_scatter_args(const at::Tensor& A, const at::Tensor& B,
                                                const at::Tensor& A_scale,
                                                const at::Tensor& B_scale, int64_t scatter_dim,
                                                at::ScalarType out_dtype, int64_t world_size);

// The matmul→reduce-scatter pipeline over the workspace (NOTE [Matmul→reduce-scatter schedule]).
// With `scaled`, the products are scaled matmuls (NOTE [Scaled matmuls in the pipelines]).
at::Tensor matmul_reduce_scatter_pipeline(pipeline::Env& env, const at::Tensor& A,
                                          const at::Tensor& B, ReduceOp reduce_op,
                                          int64_t scatter_dim, Outcome& outcome,
                                          const ScaledMatmul* scaled = nullptr);
// The ring reduce-scatter in `steps` steps over the workspace (NOTE [Ring reduce-scatter]).
at::Tensor matmul_reduce_scatter_ring(pipeline::Env& env, const at::Tensor& A, const at::Tensor& B,
                                      ReduceOp reduce_op, int64_t scatter_dim, int64_t steps,
                                      Outcome& outcome, const ScaledMatmul* scaled = nullptr);
// The same ring over `backend`'s send/recv.
at::Tensor matmul_reduce_scatter_send_recv(c10d::Backend& backend, const at::Tensor& A,
                                           const at::Tensor& B, ReduceOp reduce_op,
                                           int64_t scatter_dim, int64_t steps,
                                           const ScaledMatmul* scaled = nullptr);

}  // namespace cuda_p2p::ops
