// The kernels' matrix (issue 55, item 2), shared by their host instantiation's test
// (test_kernel_matrix.cpp, in CI) and the GPU's (test_cuda_kernel_matrix.cpp, on a GPU machine):
// the cases, their inputs, the reference (plain ATen computing the same arithmetic in the same
// order: rank or source order, in the accumulate type), and the comparison, bit for bit. A case
// runs through a Runner, so both tests run the very same cases and compare with the very same
// reference: results that match it on both match each other bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ops/graph_collective_body.hpp"
#include "ops/graph_layout.hpp"
#include "ops/kernel_body.hpp"
#include "ops/kernel_host.hpp"
#include "ops/reduce_op.hpp"
#include "tests/cpp/reduce_reference.hpp"

namespace cuda_p2p::test::kernel_matrix {

using ops::ReduceOp;
using ops::graph::Dtype;
using ops::graph::KernelArgs;
using ops::graph::Kind;
using ops::graph::Layout;

struct Type {
  at::ScalarType scalar;
  Dtype dtype;
};
inline const Type kTypes[] = {
    {at::kFloat, Dtype::kFloat},       {at::kDouble, Dtype::kDouble}, {at::kHalf, Dtype::kHalf},
    {at::kBFloat16, Dtype::kBFloat16}, {at::kChar, Dtype::kInt8},     {at::kByte, Dtype::kUInt8},
    {at::kShort, Dtype::kInt16},       {at::kInt, Dtype::kInt32},     {at::kLong, Dtype::kInt64}};

inline bool floating(at::ScalarType t) { return at::isFloatingType(t); }

inline std::vector<ReduceOp> ops_for(at::ScalarType t) {
  if (floating(t)) {
    return {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
  }
  return {ReduceOp::kSum,  ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
}

// A rank's input: normal values for floating types (one NaN for min and max), small integers
// otherwise, so that sums and products stay exact where they must and wrap where they may.
inline at::Tensor input(int64_t n, at::ScalarType t, int rank, ReduceOp op) {
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

// The reference: the op over `ins`, in rank order, in the accumulate type, rounded once (to the
// result type `t`, or not at all where `keep_acc`). A source may hold the accumulate type already.
inline at::Tensor reference(const std::vector<at::Tensor>& ins, ReduceOp op,
                            at::ScalarType t = at::ScalarType::Undefined, bool keep_acc = false) {
  if (t == at::ScalarType::Undefined) t = ins[0].scalar_type();
  const bool narrow = t == at::kHalf || t == at::kBFloat16;
  auto acc_of = [&](const at::Tensor& x) { return narrow ? x.to(at::kFloat) : x.clone(); };
  at::Tensor acc = acc_of(ins[0]);
  for (size_t q = 1; q < ins.size(); ++q) {
    const at::Tensor x = acc_of(ins[q]);
    acc = combine(op, acc, x);
    acc = acc.to(acc_of(ins[0]).scalar_type());  // integer ops stay in their type (they wrap)
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<double>(ins.size());
  return keep_acc ? acc : acc.to(t);
}

// Bit for bit, NaN in the same places.
inline bool same(const at::Tensor& got, const at::Tensor& want) {
  if (!floating(got.scalar_type())) return at::equal(got, want);
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return at::equal(g.isnan(), w.isnan()) &&
         at::equal(at::where(g.isnan(), 0.0, g), at::where(w.isnan(), 0.0, w));
}

// Memory of `bytes` on `device` whose data starts `skew` bytes past a 64-byte boundary (skew 0:
// aligned).
struct Buffer {
  Buffer(int64_t bytes, int64_t skew, at::Device device)
      : raw(at::zeros({bytes + 128}, at::TensorOptions().dtype(at::kByte).device(device))) {
    const auto base = reinterpret_cast<uintptr_t>(raw.data_ptr());
    data = reinterpret_cast<char*>((base + 63) / 64 * 64 + static_cast<uintptr_t>(skew));
  }
  at::Tensor view(int64_t n, at::ScalarType t) const { return at(data, n, t); }
  at::Tensor at(const void* p, int64_t n, at::ScalarType t) const {
    return at::from_blob(const_cast<void*>(p), {n},
                         at::TensorOptions().dtype(t).device(raw.device()));
  }
  at::Tensor raw;
  char* data;
};

// How a case runs the kernels' bodies: on their host instantiation (test_kernel_matrix.cpp) or
// on a GPU (test_cuda_kernel_matrix.cpp), the buffers on `device`.
struct Runner {
  at::Device device = at::kCPU;
  // Every rank's data steps of a captured collective, step s of every rank before step s + 1 of
  // any (what the flag barriers between the steps guarantee).
  std::function<void(const std::vector<KernelArgs>& args, int steps)> collective;
  // One eager reduction; `plan` (may be null) gets the launch's shape where the runner knows it.
  std::function<void(const ops::kernel::ReduceArgs& args, ops::kernel::ReducePlan* plan)> reduce;
};

// One op on W simulated ranks; returns a description of the first mismatch, or "".
inline std::string run_case(const Runner& run, Kind kind, int W, int64_t numel, const Type& type,
                            ReduceOp op, int64_t skew) {
  const at::Device dev = run.device;
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
  for (int q = 0; q < W; ++q) regions.emplace_back(base.region_bytes(), 0, dev);
  // Inputs: the whole tensor (all-reduce, all-gather: numel; reduce-scatter: W chunks).
  const int64_t in_numel = kind == Kind::kReduceScatter ? W * numel : numel;
  std::vector<Buffer> in_bufs, out_bufs;
  std::vector<at::Tensor> ins;
  for (int r = 0; r < W; ++r) {
    in_bufs.emplace_back(in_numel * es, skew * es, dev);
    at::Tensor x = in_bufs.back().view(in_numel, t);
    x.copy_(kind == Kind::kAllGather ? at::randint(0, 256, {in_numel}, at::kLong).to(t)
                                     : input(in_numel, t, r, op));
    ins.push_back(x.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    // Outputs: the tensor (all-reduce), W slots (all-gather), one chunk (reduce-scatter).
    const int64_t out_numel = kind == Kind::kAllGather ? W * numel : numel;
    out_bufs.emplace_back(out_numel * es, skew * es, dev);
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
  run.collective(args, base.barriers());
  for (int r = 0; r < W; ++r) {
    at::Tensor got, want;
    if (kind == Kind::kAllGather) {
      for (int q = 0; q < W; ++q) {
        got = out_bufs[r].at(args[r].outs[q], numel, t).cpu();
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
    got = out_bufs[r].view(numel, t).cpu();
    if (!same(got, want)) {
      const at::Tensor bad = (got.to(at::kDouble) != want.to(at::kDouble)).nonzero();
      return "rank " + std::to_string(r) + ": " + std::to_string(bad.size(0)) +
             " elements differ, the first at " +
             (bad.size(0) ? std::to_string(bad[0].item<int64_t>()) : std::string("?"));
    }
  }
  return "";
}

inline std::string kind_name(Kind k) {
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
inline constexpr int64_t kSizes[] = {1, 3, 8, 17, 33, 257, 4099, 20011};

// One eager reduction of `n_srcs` sources on `run`'s kernel; returns a description of the first
// mismatch, or "". Sources in `acc_srcs` (a bit each) and, where `dst_acc`, the
// destination hold the accumulate type; `also` adds a second destination; `in_place` makes the
// destination source 0 (and the second destination the last source); `skew` puts the first source
// (or every operand, skew > 1) off 16-byte alignment. `plan` gets the launch's shape.
inline std::string run_reduce(const Runner& run, const Type& type, ReduceOp op, int n_srcs,
                              int64_t numel, uint64_t acc_srcs, bool dst_acc, bool also,
                              bool in_place, int skew, ops::kernel::ReducePlan* plan = nullptr) {
  const at::Device dev = run.device;
  const at::ScalarType t = type.scalar;
  const at::ScalarType acc_t = (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
  std::vector<Buffer> bufs;
  bufs.reserve(n_srcs + 2);
  std::vector<at::Tensor> srcs;
  ops::kernel::ReduceArgs a;
  for (int q = 0; q < n_srcs; ++q) {
    const at::ScalarType st = (acc_srcs >> q) & 1u ? acc_t : t;
    const int64_t es = static_cast<int64_t>(c10::elementSize(st));
    bufs.emplace_back(numel * es, (skew > 1 || q == 0) ? skew * es : 0, dev);
    at::Tensor x = bufs.back().view(numel, st);
    x.copy_(input(numel, t, q, op).to(st));
    srcs.push_back(x.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    a.src[q] = x.data_ptr();
    if (st != t) a.src_acc |= uint64_t{1} << q;
  }
  a.count = n_srcs;
  const at::ScalarType dt = dst_acc ? acc_t : t;
  const int64_t des = static_cast<int64_t>(c10::elementSize(dt));
  // Results land on a pattern, not zeros: an element no thread writes shows.
  bufs.emplace_back(numel * des, skew > 1 ? skew * des : 0, dev);
  at::Tensor dst = bufs.back().view(numel, dt);
  if (in_place)
    dst = bufs.front().at(a.src[0], numel, dt);
  else
    dst.fill_(77);
  at::Tensor second;
  if (also) {
    const int64_t es = static_cast<int64_t>(c10::elementSize(t));
    bufs.emplace_back(numel * es, skew > 1 ? skew * es : 0, dev);
    second = bufs.back().view(numel, t);
    if (in_place && n_srcs > 1 && !((acc_srcs >> (n_srcs - 1)) & 1u)) {
      second = bufs.front().at(a.src[n_srcs - 1], numel, t);
    } else {
      second.fill_(77);
    }
    a.also = second.data_ptr();
  }
  a.dst = dst.data_ptr();
  a.dst_acc = dst_acc;
  a.numel = numel;
  a.dtype = type.dtype;
  a.op = op;
  a.divisor = n_srcs;
  run.reduce(a, plan);
  const at::Tensor want = reference(srcs, op, t, dst_acc);
  if (!same(dst.cpu(), want)) return "dst differs";
  if (also && !same(second.cpu(), dst_acc ? want.to(t) : want)) {
    return "the second destination differs";
  }
  return "";
}

// The matrix of issue 55, item 2 (every dtype the kernels take, every reduce op, W = 1..8, sizes
// from one element to past a block's range, odd tails, aligned and not): each case's mismatch
// ("" where none) to `check`, which returns whether to go on. Runs every `stride`-th case (a
// slow sanitizer's sample); returns the number run.
template <typename Check>
int collective_matrix(const Runner& run, Check&& check, int stride = 1) {
  int cases = 0, index = 0;
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
              if (index++ % stride != 0) continue;
              ++cases;
              std::ostringstream what;
              what << kind_name(kind) << " W=" << W << " " << type.scalar << " "
                   << ops::to_string(op) << " numel=" << numel
                   << (skew ? " misaligned" : " aligned");
              if (!check(run_case(run, kind, W, numel, type, op, skew), what.str())) return cases;
            }
          }
        }
      }
    }
  }
  return cases;
}

// The eager reduction's matrix: every dtype and op, 1 to 64 sources, a second destination, in
// place, a ring's partials in the accumulate type, off alignment. As collective_matrix.
template <typename Check>
int reduce_matrix(const Runner& run, Check&& check, int stride = 1) {
  int cases = 0, index = 0;
  for (const Type& type : kTypes) {
    for (ReduceOp op : ops_for(type.scalar)) {
      // The many sources and the sizes past a block for a sum only (they check the loops, not
      // the arithmetic).
      const bool sum = op == ReduceOp::kSum;
      for (int n_srcs : {1, 2, 3, 8, 64}) {
        if (n_srcs == 64 && !sum) continue;
        for (int64_t numel : {1, 8, 33, 1029}) {
          if (numel > 100 && !sum && n_srcs != 3) continue;
          for (int variant = 0; variant < 4; ++variant) {
            // 0: plain; 1: a second destination, in place; 2: a ring's partials (the accumulate
            // type in sources 0 and 2 and the destination, the element-wise path); 3: 2 with a
            // second destination.
            const bool acc = variant >= 2;
            for (int skew : {0, 1, 3}) {
              if (acc && skew != 1) continue;  // never packed: alignment changes nothing
              const uint64_t acc_srcs = !acc ? 0 : n_srcs == 1 ? 0b1 : 0b101;
              if (index++ % stride != 0) continue;
              ++cases;
              std::ostringstream what;
              what << type.scalar << " " << ops::to_string(op) << " sources=" << n_srcs
                   << " numel=" << numel << " skew=" << skew << " variant=" << variant;
              if (!check(run_reduce(run, type, op, n_srcs, numel, acc_srcs, acc, variant % 2 == 1,
                                    variant == 1, skew),
                         what.str())) {
                return cases;
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

}  // namespace cuda_p2p::test::kernel_matrix
