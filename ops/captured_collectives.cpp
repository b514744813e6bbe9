// Captured collectives run as one kernel each: the small all-reduce (one-shot, two-shot),
// all-gather and reduce-scatter enqueued under graph capture. The kernel's body is one source for
// the GPU and the host (ops/graph_collective_body.hpp); here, what the op hands each device.
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <string>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/graph_layout.hpp"
#include "ops/kernel_host.hpp"
#include "ops/reduction.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "ops/cuda/graph_collectives.cuh"
#endif

namespace cuda_p2p::ops {

// NOTE [Captured collectives in one kernel]
// Why: every dependent node of a graph costs its launch at every replay, and on the copy-engine
// path every signal under capture is a node of its own (NOTE [Replay-safe signals]): a small
// collective's cost would be its nodes, not its bytes.
// Which ops: under capture, an all-reduce (one-shot or two-shot, as the configuration picks), an
// all-gather or a reduce-scatter of 2 to kMaxGraphRanks ranks whose staged bytes fit the graph
// region (WorkspaceOptions::graph_region_bytes, 2 MiB per rank by default; Layout::region_bytes)
// runs as one kernel: one graph node on CUDA (GraphKernelBody::cuda), one task of the stream on
// the host (SymmetricWorkspace::graph_kernel, Device::graph_kernel). Larger ops, more ranks, the
// other collectives and the fused pipelines keep the copy engine, between an open and a close.
// Steps:
//   barrier 0 - the op's open (NOTE [Graph flags]): every peer has ended its earlier ops (a kernel
//               starts only after its stream's earlier work), so none still reads this rank's
//               region from an earlier kernel op;
//   stage     - this rank copies what its peers read into its region: the one-shot and the
//               all-gather their whole input, the two-shot and the reduce-scatter the chunks the
//               peers reduce;
//   barrier 1 - every rank's part is staged;
//   read      - the one-shot and the reduce-scatter reduce from every rank's region in rank
//               order, in one pass, in the accumulate type (float32 for float16 / bfloat16), as
//               the eager algorithms do (the same bits); the all-gather copies every region out;
//               the two-shot reduces its own chunk into the output and its region, passes
//               barrier 2 (every reduced chunk is there) and copies the peers' chunks out.
// Invariants:
//  - the region is these kernels' only: neither eager ops nor copy-engine captured ops guard
//    against them, nor they against those;
//  - a kernel runs on G blocks (graph::blocks_for, from the op's sizes: the same on every rank);
//    block b of every rank stages and reads the same ranges (ops/graph_layout.hpp), so block b's
//    barriers order what it touches;
//  - every barrier checks the op's tag, a hash of its signature, which nothing else compares
//    under capture.

namespace {

struct KernelOp {
  graph::Layout l;
  at::ScalarType dtype = at::kFloat;
  ReduceOp op = ReduceOp::kSum;
  const char* in = nullptr;
  char* out = nullptr;
  c10::SmallVector<const char*, 8> ins;  // reduce-scatter: by chunk
  c10::SmallVector<char*, 8> outs;       // all-gather: by rank
  c10::SmallVector<char*, 8> region;     // by rank
};

// Whether `l` may run as one kernel on this capture.
bool fits(const CollectiveContext& ctx, const graph::Layout& l) {
  return ctx.ws.graph_flags() && ctx.ws.capturing(ctx.stream) && l.numel > 0 &&
         l.region_bytes() <= ctx.ws.graph_region_bytes();
}

// The kernel's arguments (ops/graph_collective_body.hpp; NOTE [One kernel source] in
// ops/kernel_body.hpp).
graph::KernelArgs kernel_args(const KernelOp& k) {
  graph::KernelArgs a;
  a.layout = k.l;
  a.dtype =
      k.l.kind == graph::Kind::kAllGather ? graph::Dtype::kUInt8 : detail::kernel_dtype(k.dtype);
  a.op = k.op;
  a.divisor = k.l.world_size;
  a.in = k.in;
  a.out = k.out;
  for (size_t q = 0; q < k.ins.size(); ++q) a.ins[q] = k.ins[q];
  for (size_t q = 0; q < k.outs.size(); ++q) a.outs[q] = k.outs[q];
  for (size_t q = 0; q < k.region.size(); ++q) a.region[q] = k.region[q];
  a.packed = graph::all_aligned(a);
  return a;
}

#ifdef CUDA_P2P_WITH_CUDA
void cuda_launch(const graph::KernelArgs& a, const GraphLaunch& g) {
  const cudaError_t err =
      cuda::launch_graph_collective(a, g, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "cuda_p2p: launching a captured collective's kernel failed: ",
              cudaGetErrorString(err));
}
#endif

// Enqueues `k` as one kernel op.
void run(const CollectiveContext& ctx, KernelOp k, const OpSignature& sig) {
  k.l.blocks = graph::blocks_for(k.l.staged());
  for (int q = 0; q < k.l.world_size; ++q) k.region.push_back(ctx.ws.graph_region(q));
  GraphKernelBody body;
  const graph::KernelArgs a = kernel_args(k);
  if (ctx.ws.device().host_paths() != nullptr) {  // NOTE [Host fast paths]
    // The kernel's body, instantiated for the host (NOTE [One kernel source]).
    body.host = [a](int step, int b) { graph::host_collective_step(a, step, b); };
  } else {
#ifdef CUDA_P2P_WITH_CUDA
    body.cuda = [a](const GraphLaunch& g) { cuda_launch(a, g); };
#else
    TORCH_CHECK(false, "cuda_p2p: a captured collective on a ", ctx.ws.device().name(),
                " device needs a build with CUDA");
#endif
  }
  ctx.ws.graph_kernel(
      ctx.stream, ctx.channel, graph_tag(sig, "kernel"), k.l.barriers(), k.l.blocks,
      std::move(body),
      std::string(name(sig.kind)) + " kernel (rank " + std::to_string(ctx.ws.rank()) + ", graph)");
}

graph::Layout layout(const CollectiveContext& ctx, graph::Kind kind, int64_t numel, int64_t esize) {
  graph::Layout l;
  l.kind = kind;
  l.world_size = ctx.ws.world_size();
  l.rank = ctx.ws.rank();
  l.numel = numel;
  l.esize = esize;
  return l;
}

}  // namespace

namespace detail {

bool all_reduce_kernel(const CollectiveContext& ctx, const char* in, char* out, int64_t numel,
                       at::ScalarType dtype, ReduceOp op, AllReduceAlgo algo,
                       const OpSignature& sig) {
  KernelOp k;
  k.l = layout(ctx, algo == AllReduceAlgo::kTwoShot ? graph::Kind::kTwoShot : graph::Kind::kOneShot,
               numel, static_cast<int64_t>(c10::elementSize(dtype)));
  if (!fits(ctx, k.l)) return false;
  k.dtype = dtype;
  k.op = op;
  k.in = in;
  k.out = out;
  run(ctx, std::move(k), sig);
  return true;
}

bool all_gather_kernel(const CollectiveContext& ctx, const char* in, int64_t bytes,
                       c10::ArrayRef<char*> out, const OpSignature& sig) {
  KernelOp k;
  k.l = layout(ctx, graph::Kind::kAllGather, bytes, 1);  // moved as bytes
  if (!fits(ctx, k.l)) return false;
  k.in = in;
  k.outs.assign(out.begin(), out.end());
  run(ctx, std::move(k), sig);
  return true;
}

bool reduce_scatter_kernel(const CollectiveContext& ctx, c10::ArrayRef<char*> in, char* out,
                           int64_t numel, at::ScalarType dtype, ReduceOp op,
                           const OpSignature& sig) {
  KernelOp k;
  k.l = layout(ctx, graph::Kind::kReduceScatter, numel,
               static_cast<int64_t>(c10::elementSize(dtype)));
  if (!fits(ctx, k.l)) return false;
  k.dtype = dtype;
  k.op = op;
  k.ins.assign(in.begin(), in.end());
  k.out = out;
  run(ctx, std::move(k), sig);
  return true;
}

}  // namespace detail
}  // namespace cuda_p2p::ops
