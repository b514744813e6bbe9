// The shared part of test_collectives (tests/cpp/test_collectives.cpp and the files of this
// folder, one binary): the dtypes and reduce ops, guarded outputs and the workspace fixture (the
// inputs and the plain-ATen reference: tests/cpp/reduce_reference.hpp).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <exception>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "ops/collective_detail.hpp"
#include "ops/collectives.hpp"
#include "ops/reduction.hpp"
#include "ops/reduction_kernel.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"
#include "tests/cpp/reduce_reference.hpp"

namespace cuda_p2p::test::collectives {

using ops::AllGatherAlgo;
using ops::AllReduceAlgo;
using ops::ReduceOp;
using ops::ReduceScatterAlgo;

inline constexpr int64_t kBuffer = 8192;  // a small buffer: rounds start at a few KiB
inline constexpr int kChannel = 1;
inline constexpr int64_t kMargin = 16;  // guard elements before and after every output
inline constexpr double kGuard = 77;

inline const std::vector<at::ScalarType> kAllDtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                                       at::kBFloat16, at::kChar,   at::kByte,
                                                       at::kShort,    at::kInt,    at::kLong};

inline std::vector<ReduceOp> ops_for(at::ScalarType t) {
  if (at::isFloatingType(t)) {
    return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  }
  return {ReduceOp::kSum,  ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
}

// The dtypes and reduce ops of the collectives' matrices: every one on the synchronous host. With
// CUDA's semantics, the same protocols once more with their ops queued (the arithmetic is the same
// code, checked by the synchronous entries): a dtype of each element size and each kind of
// arithmetic, with a plain and a special reduce op each (a divisor, a bitwise op).
inline std::vector<at::ScalarType> matrix_dtypes() {
  if (!cuda_semantics()) return kAllDtypes;
  return {at::kFloat, at::kBFloat16, at::kDouble, at::kChar};
}
inline std::vector<ReduceOp> matrix_ops(at::ScalarType t) {
  if (!cuda_semantics()) return ops_for(t);
  if (at::isFloatingType(t)) return {ReduceOp::kSum, ReduceOp::kAvg};
  return {ReduceOp::kMax, ReduceOp::kBxor};
}

// A tensor of n elements in the middle of a larger one filled with kGuard.
struct Guarded {
  at::Tensor whole;
  at::Tensor inner;
  Guarded(int64_t n, at::ScalarType dtype) {
    whole = at::full({n + 2 * kMargin}, kGuard, at::TensorOptions().dtype(dtype));
    inner = whole.narrow(0, kMargin, n);
  }
  // Whether the margins still hold kGuard.
  bool margins_intact() const {
    const auto g = at::full({kMargin}, kGuard, at::TensorOptions().dtype(whole.scalar_type()));
    return whole.narrow(0, 0, kMargin).equal(g) &&
           whole.narrow(0, whole.numel() - kMargin, kMargin).equal(g);
  }
};

// The context of one op call. With CUDA's semantics (cuda_semantics()) an op returns with its work
// queued: the call's context synchronizes the stream at the end of the statement that made it,
// before the outputs are read (and while that statement's named inputs are alive: a call passes
// no temporary the op reads). A statement that throws has nothing queued to wait for.
struct Call {
  ops::CollectiveContext ctx;
  ~Call() noexcept(false) {
    if (std::uncaught_exceptions() == 0) ctx.ws.device().synchronize(ctx.stream);
  }
  operator const ops::CollectiveContext&() const { return ctx; }  // NOLINT: implicit by design
};

struct Fixture {
  std::unique_ptr<SymmetricWorkspace> ws;
  std::shared_ptr<Stream> stream;
  ops::CollectiveState state;
  ops::CollectiveConfig config;

  // cross_memory_reads: off by default, so that the staged paths keep their coverage here.
  explicit Fixture(int64_t buffer = kBuffer, Millis timeout = std::chrono::seconds(60),
                   bool cross_memory_reads = false) {
    WorkspaceOptions o;
    o.buffer_size = buffer;
    o.timeout = timeout;
    o.cross_memory_reads = cross_memory_reads;
    ws = std::make_unique<SymmetricWorkspace>(test_store(), world().rank, world().size,
                                              test_host_device(world().size), o);
    stream = ws->device().current_stream();
    config.chunk_bytes = 0;  // rounds of a whole half-buffer unless a test says otherwise
  }
  Call ctx() { return Call{{*ws, *stream, kChannel, state, config}}; }
};

inline std::string describe(const char* what, const char* algo, at::ScalarType dtype, int64_t n,
                            std::optional<ReduceOp> op = {}) {
  std::ostringstream os;
  os << what << " algo=" << algo << " dtype=" << dtype << " n=" << n;
  if (op) os << " op=" << ops::to_string(*op);
  os << " W=" << world().size << " rank=" << world().rank;
  return os.str();
}

// Element counts that hit the round boundaries of a collective staging `unit_bytes` per element
// in regions of `round` bytes: 0, 1, odd, exactly one round, one round +- 1, several rounds.
inline std::vector<int64_t> sizes_for(int64_t round_elems) {
  std::vector<int64_t> s = {0, 1, 7, round_elems, round_elems + 1, 3 * round_elems + 5};
  if (round_elems > 1) s.push_back(round_elems - 1);
  return s;
}

// Whether `t` holds the same bytes on every rank (through the store).
inline bool identical_on_every_rank(const at::Tensor& t, const std::string& key) {
  const auto bytes = t.contiguous().view(at::kByte);
  std::vector<uint8_t> mine(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
  auto store = world().store;
  store->set(key + "/" + std::to_string(world().rank), mine);
  bool same = true;
  for (int r = 0; r < world().size; ++r) {
    same = same && store->get(key + "/" + std::to_string(r)) == mine;
  }
  store_barrier(key);
  return same;
}

}  // namespace cuda_p2p::test::collectives
