// The captured collectives' kernel body (ops/graph_collective_body.hpp: NOTE [One kernel source],
// the code the CUDA kernel runs) on its host instantiation, for W = 1..8 ranks simulated in one
// process, over the matrix issue 55 asks of it: every dtype the kernels take, every reduce op,
// sizes from one element to past a block's range and to the graph region's edge, odd tails, and
// inputs and outputs off 16-byte alignment (the element-wise path) - each result compared with
// plain ATen computing the same arithmetic in the same order (rank order, in the accumulate type:
// float32 for float16 / bfloat16), bit for bit. The ranks run step by step: every rank's block b
// runs step s only after every rank's block b ran step s - 1, which is what the flag barriers
// between the steps guarantee (NOTE [Graph flags]).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/graph_collective_host.hpp"
#include "ops/graph_layout.hpp"

namespace cuda_p2p::test {
namespace {

using ops::ReduceOp;
using ops::graph::Dtype;
using ops::graph::KernelArgs;
using ops::graph::Kind;
using ops::graph::Layout;

struct Type {
  at::ScalarType scalar;
  Dtype dtype;
};
const Type kTypes[] = {
    {at::kFloat, Dtype::kFloat},       {at::kDouble, Dtype::kDouble}, {at::kHalf, Dtype::kHalf},
    {at::kBFloat16, Dtype::kBFloat16}, {at::kChar, Dtype::kInt8},     {at::kByte, Dtype::kUInt8},
    {at::kShort, Dtype::kInt16},       {at::kInt, Dtype::kInt32},     {at::kLong, Dtype::kInt64}};

bool floating(at::ScalarType t) { return at::isFloatingType(t); }

std::vector<ReduceOp> ops_for(at::ScalarType t) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  if (floating(t)) {
    ops.push_back(ReduceOp::kAvg);
  } else {
    ops.insert(ops.end(), {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor});
  }
  return ops;
}

// A rank's input: normal values for floating types (one NaN for min and max), small integers
// otherwise, so that sums and products stay exact where they must and wrap where they may.
at::Tensor input(int64_t n, at::ScalarType t, int rank, ReduceOp op) {
  at::Tensor v;
  if (floating(t)) {
    v = at::randn({n}, at::kDouble);
    if (op == ReduceOp::kProduct) v = v.abs() + 0.5;
    if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && n > 2 && rank == 1) v[n / 2] = NAN;
  } else {
    v = at::randint(-3, 4, {n}, at::kLong);
    if (t == at::kByte) v = v.abs();
  }
  return v.to(t);
}

// The reference: the op over `ins`, in rank order, in the accumulate type, rounded once.
at::Tensor reference(const std::vector<at::Tensor>& ins, ReduceOp op) {
  const at::ScalarType t = ins[0].scalar_type();
  const bool narrow = t == at::kHalf || t == at::kBFloat16;
  auto acc_of = [&](const at::Tensor& x) { return narrow ? x.to(at::kFloat) : x.clone(); };
  at::Tensor acc = acc_of(ins[0]);
  for (size_t q = 1; q < ins.size(); ++q) {
    const at::Tensor x = acc_of(ins[q]);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = acc + x;
        break;
      case ReduceOp::kProduct:
        acc = acc * x;
        break;
      case ReduceOp::kMin:
        acc = at::minimum(acc, x);
        break;
      case ReduceOp::kMax:
        acc = at::maximum(acc, x);
        break;
      case ReduceOp::kBand:
        acc = at::bitwise_and(acc, x);
        break;
      case ReduceOp::kBor:
        acc = at::bitwise_or(acc, x);
        break;
      case ReduceOp::kBxor:
        acc = at::bitwise_xor(acc, x);
        break;
    }
    acc = acc.to(acc_of(ins[0]).scalar_type());  // integer ops stay in their type (they wrap)
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<double>(ins.size());
  return acc.to(t);
}

// Bit for bit, NaN in the same places.
bool same(const at::Tensor& got, const at::Tensor& want) {
  if (!floating(got.scalar_type())) return at::equal(got, want);
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return at::equal(g.isnan(), w.isnan()) &&
         at::equal(at::where(g.isnan(), 0.0, g), at::where(w.isnan(), 0.0, w));
}

// Memory of `bytes` whose data starts `skew` bytes past a 64-byte boundary (skew 0: aligned).
struct Buffer {
  Buffer(int64_t bytes, int64_t skew) : raw(at::zeros({bytes + 128}, at::kByte)) {
    const auto base = reinterpret_cast<uintptr_t>(raw.data_ptr());
    data = reinterpret_cast<char*>((base + 63) / 64 * 64 + static_cast<uintptr_t>(skew));
  }
  at::Tensor view(int64_t n, at::ScalarType t) const {
    return at::from_blob(data, {n}, at::TensorOptions().dtype(t));
  }
  at::Tensor raw;
  char* data;
};

// One op on W simulated ranks; returns a description of the first mismatch, or "".
std::string run_case(Kind kind, int W, int64_t numel, const Type& type, ReduceOp op, int64_t skew) {
  const at::ScalarType t = kind == Kind::kAllGather ? at::kByte : type.scalar;
  const int64_t es = static_cast<int64_t>(c10::elementSize(t));
  Layout base;
  base.kind = kind;
  base.world_size = W;
  base.numel = numel;
  base.esize = es;
  base.blocks = ops::graph::blocks_for(base.staged());
  // Every rank's region, aligned as the workspace aligns it.
  std::vector<Buffer> regions;
  for (int q = 0; q < W; ++q) regions.emplace_back(base.region_bytes(), 0);
  // Inputs: the whole tensor (all-reduce, all-gather: numel; reduce-scatter: W chunks).
  const int64_t in_numel = kind == Kind::kReduceScatter ? W * numel : numel;
  std::vector<Buffer> in_bufs, out_bufs;
  std::vector<at::Tensor> ins;
  for (int r = 0; r < W; ++r) {
    in_bufs.emplace_back(in_numel * es, skew * es);
    at::Tensor x = in_bufs.back().view(in_numel, t);
    x.copy_(kind == Kind::kAllGather ? at::randint(0, 256, {in_numel}, at::kLong).to(t)
                                     : input(in_numel, t, r, op));
    ins.push_back(x);
    // Outputs: the tensor (all-reduce), W slots (all-gather), one chunk (reduce-scatter).
    const int64_t out_numel = kind == Kind::kAllGather ? W * numel : numel;
    out_bufs.emplace_back(out_numel * es, skew * es);
  }
  std::vector<KernelArgs> args(W);
  for (int r = 0; r < W; ++r) {
    KernelArgs& a = args[r];
    a.layout = base;
    a.layout.rank = r;
    a.dtype = kind == Kind::kAllGather ? Dtype::kUInt8 : type.dtype;
    a.op = op;
    a.divisor = W;
    a.in = in_bufs[r].data;
    a.out = out_bufs[r].data;
    for (int q = 0; q < W; ++q) {
      a.region[q] = regions[q].data;
      a.ins[q] = in_bufs[r].data + q * numel * es;  // reduce-scatter: chunk q of this rank's
      a.outs[q] = out_bufs[r].data + q * numel * es;
    }
    if (kind == Kind::kAllGather && r % 2 == 1) a.outs[r] = const_cast<char*>(a.in);  // in place
    a.packed = ops::graph::all_aligned(a);
  }
  for (int step = 0; step < base.barriers(); ++step) {
    for (int r = 0; r < W; ++r) {
      for (int b = 0; b < base.blocks; ++b) ops::graph::host_collective_step(args[r], step, b);
    }
  }
  for (int r = 0; r < W; ++r) {
    at::Tensor got, want;
    if (kind == Kind::kAllGather) {
      for (int q = 0; q < W; ++q) {
        got = at::from_blob(args[r].outs[q], {numel}, at::TensorOptions().dtype(t));
        if (!at::equal(got, ins[q]))
          return "rank " + std::to_string(r) + " slot " + std::to_string(q);
      }
      continue;
    }
    if (kind == Kind::kReduceScatter) {
      std::vector<at::Tensor> chunks;
      for (int q = 0; q < W; ++q) chunks.push_back(ins[q].narrow(0, r * numel, numel));
      want = reference(chunks, op);
    } else {
      want = reference(ins, op);
    }
    got = out_bufs[r].view(numel, t);
    if (!same(got, want)) {
      const at::Tensor bad = (got.to(at::kDouble) != want.to(at::kDouble)).nonzero();
      return "rank " + std::to_string(r) + ": " + std::to_string(bad.size(0)) +
             " elements differ, the first at " +
             (bad.size(0) ? std::to_string(bad[0].item<int64_t>()) : std::string("?"));
    }
  }
  return "";
}

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::kOneShot:
      return "one-shot";
    case Kind::kTwoShot:
      return "two-shot";
    case Kind::kAllGather:
      return "all-gather";
    case Kind::kReduceScatter:
      return "reduce-scatter";
  }
  return "?";
}

// Sizes: one element, under and past one 16-byte pack, odd tails, several blocks' ranges.
const int64_t kSizes[] = {1, 3, 8, 17, 33, 257, 4099, 20011};

TEST(KernelMatrix, EveryDtypeOpSizeAndAlignmentMatchesATen) {
  at::manual_seed(55);
  int cases = 0;
  for (Kind kind : {Kind::kOneShot, Kind::kTwoShot, Kind::kReduceScatter, Kind::kAllGather}) {
    for (int W = 1; W <= 8; ++W) {
      for (const Type& type : kTypes) {
        if (kind == Kind::kAllGather && type.scalar != at::kFloat) continue;  // bytes
        for (ReduceOp op : ops_for(type.scalar)) {
          if (kind == Kind::kAllGather && op != ReduceOp::kSum) continue;
          for (int64_t numel : kSizes) {
            // The large sizes for one type and op per kind: they check the blocks, not the types.
            if (numel > 300 && !(type.scalar == at::kFloat && op == ReduceOp::kSum) &&
                !(numel == 4099 && W % 2 == 1)) {
              continue;
            }
            for (int64_t skew : {0, 1}) {
              const std::string err = run_case(kind, W, numel, type, op, skew);
              ++cases;
              ASSERT_EQ(err, "") << kind_name(kind) << " W=" << W << " " << type.scalar << " "
                                 << ops::to_string(op) << " numel=" << numel
                                 << (skew ? " misaligned" : " aligned");
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 3000);
}

// The graph region's edge: the largest one-shot and two-shot of float32 a 2 MiB region holds, on
// 3 and 8 ranks, with every block of the op busy (kMaxGraphBlocks).
TEST(KernelMatrix, AtTheRegionsEdge) {
  at::manual_seed(56);
  const Type f32 = kTypes[0];
  for (int W : {3, 8}) {
    for (Kind kind : {Kind::kOneShot, Kind::kTwoShot}) {
      Layout l;
      l.kind = kind;
      l.world_size = W;
      l.esize = 4;
      l.numel = (2 << 20) / 4;
      while (l.region_bytes() > (2 << 20)) l.numel -= 16;
      ASSERT_EQ(ops::graph::blocks_for(l.staged()), kMaxGraphBlocks);
      EXPECT_EQ(run_case(kind, W, l.numel - 5, f32, ReduceOp::kSum, 0), "")
          << kind_name(kind) << " W=" << W << " numel=" << l.numel - 5;
    }
  }
}

}  // namespace
}  // namespace cuda_p2p::test
