// all_gather(A_shard, gather_dim) @ B, with the gathering of shard i+1 hidden behind the GEMM of
// shard i (docs/design.md §5, docs/pipelines.md).
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "ops/fused_ops.hpp"

namespace cuda_p2p::ops {

namespace {

constexpr const char* kOp = "fused_all_gather_matmul";

// NOTE [All-gather→matmul schedule]
// The shard is a [rows, cols] matrix (the gather dim moved to the front and flattened, or, when
// the contraction dim is gathered, the leading dims flattened); slot r of the gathered stack
// [W, rows, cols] is rank r's shard. Per round (NOTE [Pipeline buffer reuse]):
//
//   stream 0: barrier | copy own -> own buffer | barrier | GEMM own | pull r+2 | GEMM r+2 | ...
//   stream 1:                                         (waits) | pull r+1 | GEMM r+1 | pull r+3 ...
//   stream 0:                                   ... (after both streams' last pulls) | barrier
//
// What each step says:
//  - the first barrier (first round only; none after a handshake: NOTE [The handshake opens the
//    buffer]): no peer still reads the own buffer, so the own shard may be copied into it;
//  - the second: every rank's shard is in its buffer; every pull comes after it;
//  - step k = 1..W-1 pulls rank (rank+k)'s shard from its buffer (a copy-engine copy on CUDA)
//    into slot rank+k and consumes it, odd steps on stream 1 and even ones on stream 0, so that
//    one stream's copy overlaps the other's GEMM;
//  - the closing barrier (stream 0) comes after both streams' last pulls, not their last GEMMs
//    (which read only local memory): no rank reads any buffer any more, and the next round's copy
//    and the next op may follow. All of stream 0's signals are on its channel; stream 1 sends
//    none.
// Why the barriers precede the local GEMM, on its stream: on stream 1, to hide their wait behind
// it, a barrier would wait for a thread to be woken while every core runs a GEMM; ahead of the
// GEMM the ranks meet while their threads run anyway
// (docs/measurements/pipelines-reference-figures.md).

// NOTE [Pull-ahead all-gather→matmul]
// algorithm="pull_ahead" (the host's default): the same barriers and copies, but after the
// publication stream 1 pulls every peer's shard in turn, as soon as it can, and stream 0 runs
// every GEMM, each after its shard's pull:
//
//   stream 0: barrier | copy own -> own buffer | barrier | GEMM own | GEMM r+1 | GEMM r+2 | ...
//   stream 1:                                  (waits) | pull r+1 | pull r+2 | ... | barrier
//
// A GPU wants the alternating schedule (two GEMMs at once fill the SMs; pulls use the copy
// engine). A CPU has no copy engine and its ranks share the cores: two GEMMs of one rank at once
// only compete for them. Here the GEMMs run back to back on one thread, and the thread that copies
// is mostly asleep. The closing barrier, on stream 1 after its last pull (its channel), is ready
// long before the GEMMs are done; the next round's publication on stream 0 waits for it.

// NOTE [Zero-copy all-gather→matmul]
// When the group has a symmetric heap and the op's handshake ran (NOTE [The handshake opens the
// buffer]: no peer reads this rank's buffer any more), the ranks agree, as the collectives do
// (NOTE [Zero-copy collectives] in ops/zero_copy.cpp), whether every rank's prepared shard is
// in its heap - A_shard from cuda_p2p.empty, gathered along its first or last dim, whose
// prepared shard is A_shard itself:
//
//  * exchange (the host's default): each rank writes the heap offset of its prepared shard, or
//    -1, into the head of its buffer and passes a barrier on the caller's stream (channel 0),
//    which publishes the offsets and the shards, final since the callers passed them; every rank
//    reads all W offsets and decides alike. If any is -1 the op runs staged, with its opening
//    barrier again (Env::opened cleared): a peer may still be reading this rank's offset when
//    the shard would overwrite it. That is one barrier more than staging alone, paid only by
//    groups that have a heap.
//  * signature (CUDA's; the host's on request): before the handshake, a rank whose A_shard is its
//    own prepared shard in its heap claims its offset in the op's signature (claim_shard), as
//    every rank's; the handshake compares the claims and, having followed every rank's entry,
//    publishes the shards. Equal signatures: every shard is at the claimed offset. No claim: the
//    op runs staged at no extra cost. Ranks that claim differently raise a signature mismatch
//    (CUDA: recorded, raised by the next op, after this one ran on the disagreement).
//
// If every shard is in its rank's heap, the schedule runs as one round without its publication:
// no copy into the buffer and no barrier after it; the pulls read the peers' shards in their
// heaps. The closing barrier, after every pull, keeps a rank from returning, and its caller from
// overwriting A_shard, while a peer may still read it.

// Signature agreement: this rank's claim (NOTE [Zero-copy all-gather→matmul]), recorded in env
// and returned as the text that starts its signature (a long signature keeps only its start
// readable: NOTE [Op signatures]), after the agreement when it is not the device's default (its
// peers, if they agree otherwise, would run other barriers).
std::string claim_shard(pipeline::Env& env, const at::Tensor& A_shard, int64_t gather_dim) {
  env.zero_copy_claim.reset();
  const std::string& mode = env.agreement_text;
  if (!env.signature_agreement || env.heap == nullptr || env.world_size() == 1) return mode;
  const int64_t bytes = A_shard.numel() * static_cast<int64_t>(A_shard.element_size());
  // Problem's prepared shard is A_shard itself exactly when this view is contiguous.
  const bool itself = gather_dim == A_shard.dim() - 1
                          ? A_shard.is_contiguous()
                          : A_shard.movedim(gather_dim, 0).is_contiguous();
  if (bytes == 0 || !itself) return mode;
  const int64_t offset = env.heap->own_offset(A_shard.data_ptr(), bytes);
  if (offset < 0) return mode;
  env.zero_copy_claim = offset;
  return mode + "zero-copy: A_shard at heap offset " + std::to_string(offset) + "; ";
}

// The peers' shards in their heaps (by rank), or nullopt: staged.
std::optional<std::vector<const char*>> heap_shards(pipeline::Env& env, const at::Tensor& shard) {
  const int W = env.world_size(), rank = env.rank();
  const int64_t bytes = shard.numel() * static_cast<int64_t>(shard.element_size());
  if (env.heap == nullptr || !env.opened || W == 1 || bytes == 0) return std::nullopt;
  const int64_t mine = env.heap->own_offset(shard.data_ptr(), bytes);
  std::vector<int64_t> offsets(static_cast<size_t>(W));
  if (env.signature_agreement) {
    // The handshake compared the claims and published the shards.
    if (!env.zero_copy_claim) return std::nullopt;
    TORCH_INTERNAL_ASSERT(mine == *env.zero_copy_claim, "cuda_p2p ", kOp,
                          ": the prepared shard is not the claimed A_shard");
    offsets.assign(offsets.size(), mine);
  } else {
    env.on_caller("zero-copy offsets", [&] {
      // The caller's stream runs inline on the host: each step is done when it returns.
      std::memcpy(env.ws.buffer(rank), &mine, sizeof mine);
      env.ws.barrier(*env.caller, env.channels[0]);
      for (int q = 0; q < W; ++q) std::memcpy(&offsets[q], env.ws.buffer(q), sizeof(int64_t));
    });
  }
  std::vector<const char*> shards(static_cast<size_t>(W));
  for (int q = 0; q < W; ++q) {
    if (offsets[q] < 0) {
      env.opened = false;
      return std::nullopt;
    }
    shards[q] = static_cast<const char*>(env.heap->buffer(q)) + offsets[q];
  }
  return shards;
}

using Consumer = GatherConsumer;

}  // namespace

void gather_and_consume(pipeline::Env& env, const at::Tensor& shard, const at::Tensor& stack,
                        const GatherConsumer& consume, bool fill_own_slot, bool pull_ahead,
                        Outcome& outcome, bool zero_copy) {
  auto& dev = env.device();
  auto& ws = env.ws;
  const int W = env.world_size(), rank = env.rank();
  const int64_t rows = shard.size(0);
  const int64_t row_bytes = shard.size(1) * static_cast<int64_t>(shard.element_size());
  // NOTE [Zero-copy all-gather→matmul]: one round, read in the heaps, when every shard is there.
  const auto heap = zero_copy ? heap_shards(env, shard) : std::nullopt;
  if (heap) outcome.rounds = 1;
  const int64_t rounds = heap ? 1 : pipeline::plan_rounds(env, rows, row_bytes, kOp, outcome);
  outcome.zero_copy = heap.has_value();
  const Consumer* consumer = &consume;
  // Where rank src's rows of a round are pulled from.
  const auto source = [&](int src, int64_t row0) -> const void* {
    return heap ? (*heap)[src] + row0 * row_bytes : ws.buffer(src);
  };

  pipeline::begin(env);
  pipeline::EndGuard guard(env);
  for (int64_t round = 0; round < rounds; ++round) {
    const auto [row0, row1] = split_range(rows, rounds, round);
    const int64_t len = row1 - row0;
    const size_t bytes = static_cast<size_t>(len * row_bytes);
    at::Tensor own = shard.narrow(0, row0, len);

    // NOTE [All-gather→matmul schedule]: publish the own shard between two barriers, then
    // consume it (zero-copy: the offsets' barrier published it).
    if (round == 0 && !env.opened) {
      // NOTE [Pipeline buffer reuse]: no peer reads the own buffer any more (NOTE [The handshake
      // opens the buffer]: after a handshake, it said so).
      env.span(0, "barrier", [&] { ws.barrier(env.stream(0), env.channels[0]); });
    }
    if (!heap) {
      env.span(0, "publish",
               [&] { dev.copy(env.stream(0), ws.buffer(rank), own.data_ptr(), bytes); });
      env.span(0, "barrier", [&] { ws.barrier(env.stream(0), env.channels[0]); });
    }
    auto all_published = dev.record(env.stream(0));
    env.run_compute(0, [=] { (*consumer)(rank, row0, own, 0); }, "gemm own");
    dev.wait_event(env.stream(1), *all_published);

    if (pull_ahead) {
      // NOTE [Pull-ahead all-gather→matmul]
      for (int k = 1; k < W; ++k) {
        const int src = (rank + k) % W;
        at::Tensor slot = stack[src].narrow(0, row0, len);
        env.span(1, "pull r+" + std::to_string(k),
                 [&] { dev.copy(env.stream(1), slot.data_ptr(), source(src, row0), bytes); });
        dev.wait_event(env.stream(0), *dev.record(env.stream(1)));
        env.run_compute(0, [=] { (*consumer)(src, row0, slot, 0); }, "gemm r+" + std::to_string(k));
      }
      if (fill_own_slot) {
        at::Tensor slot = stack[rank].narrow(0, row0, len);
        env.span(1, "fill A",
                 [&] { dev.copy(env.stream(1), slot.data_ptr(), own.data_ptr(), bytes); });
      }
      // After this rank's last pull; the next round's publication (stream 0) waits for it.
      env.span(1, "barrier", [&] { ws.barrier(env.stream(1), env.channels[1]); });
      dev.wait_event(env.stream(0), *dev.record(env.stream(1)));
      continue;
    }

    std::shared_ptr<Event> last_pull_on_1;
    for (int k = 1; k < W; ++k) {
      const int s = k % 2;
      const int src = (rank + k) % W;
      at::Tensor slot = stack[src].narrow(0, row0, len);
      env.span(s, "pull r+" + std::to_string(k),
               [&] { dev.copy(env.stream(s), slot.data_ptr(), source(src, row0), bytes); });
      if (s == 1) last_pull_on_1 = dev.record(env.stream(1));
      env.run_compute(s, [=] { (*consumer)(src, row0, slot, s); }, "gemm r+" + std::to_string(k));
    }
    if (fill_own_slot) {
      // On the stream whose last GEMM comes earlier: the copy hides behind the other's.
      const int s = W % 2 == 0 ? 0 : 1;
      at::Tensor slot = stack[rank].narrow(0, row0, len);
      env.span(s, "fill A",
               [&] { dev.copy(env.stream(s), slot.data_ptr(), own.data_ptr(), bytes); });
    }
    if (last_pull_on_1) dev.wait_event(env.stream(0), *last_pull_on_1);
    env.span(0, "barrier", [&] { ws.barrier(env.stream(0), env.channels[0]); });
  }
  guard.release();
  pipeline::end(env);
}

// The same over the wrapped backend: a ring (send to rank+1, receive from rank-1) that forwards
// at step k the shard it received at step k-1; each shard is consumed while the next transfer
// is in flight.
void gather_and_consume_send_recv(c10d::Backend& backend, const at::Tensor& shard,
                                  const at::Tensor& stack, const GatherConsumer& consume) {
  const int W = backend.getSize(), rank = backend.getRank();
  const int right = (rank + 1) % W, left = (rank + W - 1) % W;
  if (shard.size(0) == 0) return;
  stack[rank].copy_(shard);
  for (int k = 1; k < W; ++k) {
    const int have = (rank + W - k + 1) % W;  // received at step k-1 (k = 1: our own)
    const int next = (rank + W - k) % W;
    auto work = pipeline::exchange(backend, stack[have], right, stack[next], left,
                                   pipeline::kSendRecvTagBase + k);
    consume(have, 0, stack[have], 0);
    work->wait();
  }
  const int last = (rank + 1) % W;  // the one received at step W-1 (our own when W == 1)
  consume(last, 0, stack[last], 0);
}

namespace {

// The outputs are allocated with the shapes and strides of the unfused reference, found by
// running its own view ops on meta tensors: all_gather_into_tensor (contiguous [W * d0, ...]),
// .view(W, *shard.shape).movedim(gather_dim + 1, 1).flatten(0, 1) - a copy, or a view when the
// dims before gather_dim have size 1 or W == 1 - then torch.matmul(A, B).movedim(0, gather_dim)
// and A.movedim(0, gather_dim); or, when the contraction dim is gathered,
// torch.cat(chunks, -1) and its matmul.
struct Layout {
  bool contraction = false;  // gather_dim is the last dim
  std::optional<at::Tensor> A;
  std::vector<at::Tensor> outputs;
};

at::Tensor allocate_like(const at::Tensor& meta, const at::TensorOptions& options) {
  return at::empty_strided_symint(meta.sym_sizes(), meta.sym_strides(), options);
}

Layout make_layout(const at::Tensor& A_shard, at::TensorList Bs, int64_t gather_dim,
                   int64_t world_size, bool return_A) {
  Layout l;
  const int64_t nd = A_shard.dim();
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(A_shard.scalar_type());
  auto sizes = A_shard.sym_sizes().vec();
  auto gathered_sizes = sizes;
  gathered_sizes[0] = gathered_sizes[0] * world_size;
  at::Tensor gathered = at::empty_symint(gathered_sizes, meta);
  at::Tensor A;  // the reference's A before its dim 0 is moved back
  l.contraction = gather_dim == nd - 1;
  if (l.contraction) {
    A = at::cat(gathered.chunk(world_size), -1);
  } else {
    std::vector<c10::SymInt> split{c10::SymInt(world_size)};
    split.insert(split.end(), sizes.begin(), sizes.end());
    A = gathered.view_symint(split).movedim(gather_dim + 1, 1).flatten(0, 1);
  }
  const int64_t back = l.contraction ? 0 : gather_dim;
  if (return_A) l.A = allocate_like(A.movedim(0, back), A_shard.options());
  for (const auto& B : Bs) {
    at::Tensor b = at::empty_strided_symint(B.sym_sizes(), B.sym_strides(), meta);
    l.outputs.push_back(allocate_like(at::matmul(A, b).movedim(0, back), B.options()));
  }
  return l;
}

// A [W, rows, cols] view of `t` with the gather dim moved to the front, when its memory is laid
// out that way (the usual case); else an undefined tensor.
at::Tensor stacked_view(const at::Tensor& t, int64_t gather_dim, int64_t W, int64_t rows) {
  at::Tensor moved = t.movedim(gather_dim, 0);
  if (!moved.is_contiguous()) return {};
  return moved.view({W, rows, t.size(-1)});
}

// The problem as matrices, shared by both paths: the shard, the stack it is gathered into, and
// the consumer writing the products.
struct Problem {
  Layout layout;
  int64_t gather_dim;
  at::Tensor shard;  // [rows, cols], contiguous
  at::Tensor stack;  // [W, rows, cols], contiguous; aliases A when it can
  std::vector<at::Tensor> Bs;
  std::vector<at::Tensor> output_stacks;                // not contraction: [W, rows, n_b]
  std::vector<std::array<at::Tensor, 2>> accumulators;  // contraction: per B, per stream

  Problem(const at::Tensor& A_shard, at::TensorList Bs_, int64_t gather_dim_, int64_t W,
          bool return_A)
      : layout(make_layout(A_shard, Bs_, gather_dim_, W, return_A)),
        gather_dim(gather_dim_),
        Bs(Bs_.vec()) {
    // Rows: every dim but the last (the gather dim first, when it is not the last).
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < A_shard.dim(); ++d) rows *= A_shard.size(d);
    const int64_t cols = A_shard.size(-1);
    if (layout.contraction) {
      shard = A_shard.contiguous().view({rows, cols});
      stack = at::empty({W, rows, cols}, A_shard.options());
      const auto acc = A_shard.options().dtype(accumulate_type(A_shard.scalar_type()));
      for (const auto& B : Bs) {
        accumulators.push_back({at::zeros({rows, B.size(1)}, acc),
                                W > 1 ? at::zeros({rows, B.size(1)}, acc) : at::Tensor()});
      }
      return;
    }
    shard = A_shard.movedim(gather_dim, 0).contiguous().view({rows, cols});
    if (layout.A) stack = stacked_view(*layout.A, gather_dim, W, rows);
    if (!stack.defined()) stack = at::empty({W, rows, cols}, A_shard.options());
    for (size_t b = 0; b < Bs.size(); ++b) {
      at::Tensor view = stacked_view(layout.outputs[b], gather_dim, W, rows);
      output_stacks.push_back(
          view.defined() ? view : at::empty({W, rows, Bs[b].size(1)}, layout.outputs[b].options()));
    }
  }

  void consume(int src, int64_t row0, const at::Tensor& rows, int stream) {
    const int64_t len = rows.size(0);
    for (size_t b = 0; b < Bs.size(); ++b) {
      if (!layout.contraction) {
        at::Tensor out = output_stacks[b][src].narrow(0, row0, len);
        at::mm_out(out, rows, Bs[b]);
        continue;
      }
      // Gathering the contraction dim: rank src's shard meets rows src*cols.. of B, and the
      // products are summed. Each stream sums into its own accumulator (no cross-stream
      // order needed); low-precision products are summed in float32.
      const int64_t cols = rows.size(1);
      at::Tensor b_rows = Bs[b].narrow(0, src * cols, cols);
      at::Tensor acc = accumulators[b][stream].narrow(0, row0, len);
      if (acc.scalar_type() == rows.scalar_type()) {
        acc.addmm_(rows, b_rows);
      } else {
        acc.add_(at::mm(rows, b_rows));
      }
    }
  }

  AllGatherMatmulResult finish(int64_t W) {
    AllGatherMatmulResult r;
    if (!layout.contraction) {
      // Where an output's layout could not be written in place (W == 1 with gather_dim > 0).
      auto unstack = [&](at::Tensor& out, const at::Tensor& st) {
        at::Tensor moved = out.movedim(gather_dim, 0);
        if (st.data_ptr() != moved.data_ptr()) moved.copy_(st.view(moved.sizes()));
      };
      if (layout.A) unstack(*layout.A, stack);
      for (size_t b = 0; b < Bs.size(); ++b) unstack(layout.outputs[b], output_stacks[b]);
    } else {
      for (size_t b = 0; b < Bs.size(); ++b) {
        at::Tensor out = layout.outputs[b].view({shard.size(0), Bs[b].size(1)});
        auto& acc = accumulators[b];
        if (acc[1].defined()) acc[0].add_(acc[1]);
        out.copy_(acc[0]);
      }
      if (layout.A) {
        // [rows, W * cols] from the [W, rows, cols] stack: torch.cat(chunks, dim=-1).
        layout.A->view({shard.size(0), W, shard.size(1)}).copy_(stack.permute({1, 0, 2}));
      }
    }
    r.A = layout.A;
    r.outputs = layout.outputs;
    return r;
  }
};

// Everything the ranks must agree on (NOTE [Op signatures]): the shapes decide the rounds and the
// buffer's growth; `path` is the algorithm, or "unfused" (agree_all_gather_matmul_unfused).
std::string signature_text(const at::Tensor& A_shard, at::TensorList Bs, int64_t dim, bool return_A,
                           const char* path) {
  std::string sig = "A_shard " + pipeline::shape_text(A_shard.sizes()) + " " +
                    dtype_name(A_shard.scalar_type()) + ", gather_dim " + std::to_string(dim) +
                    ", " + std::to_string(Bs.size()) + (Bs.size() == 1 ? " B" : " Bs");
  for (size_t i = 0; i < Bs.size(); ++i) {
    sig += (i ? ", " : " ") + pipeline::shape_text(Bs[i].sizes());
  }
  return sig + (return_A ? ", return_A" : "") + ", " + path;
}

}  // namespace

void check_below_autograd(const char* op, at::TensorList tensors) {
  // NOTE [Fused ops below autograd]
  if (!at::GradMode::is_enabled() ||
      c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutogradFunctionality)) {
    return;
  }
  for (const auto& t : tensors) {
    TORCH_CHECK(!t.defined() || !t.requires_grad(), "cuda_p2p ", op,
                ": an input requires grad, but the op was called without its autograd formula "
                "(`import cuda_p2p` registers it); expected inputs that do not require grad, or "
                "a call through torch.ops.cuda_p2p after importing cuda_p2p");
  }
}

int64_t check_all_gather_matmul_args(const at::Tensor& A_shard, at::TensorList Bs,
                                     int64_t gather_dim, int64_t world_size) {
  TORCH_CHECK(A_shard.defined(), "cuda_p2p ", kOp, ": A_shard is undefined");
  TORCH_CHECK(A_shard.layout() == at::kStrided, "cuda_p2p ", kOp,
              ": expected a strided (dense) A_shard, got layout ", A_shard.layout());
  check_below_autograd(kOp, A_shard);
  check_below_autograd(kOp, Bs);
  const int64_t nd = A_shard.dim();
  TORCH_CHECK(nd >= 2, "cuda_p2p ", kOp, ": expected A_shard with at least 2 dims, got shape ",
              A_shard.sizes());
  TORCH_CHECK(gather_dim >= -nd && gather_dim < nd, "cuda_p2p ", kOp, ": gather_dim must be in [",
              -nd, ", ", nd, ") for a ", nd, "-D A_shard, got ", gather_dim);
  if (gather_dim < 0) gather_dim += nd;
  TORCH_CHECK(at::isFloatingType(A_shard.scalar_type()), "cuda_p2p ", kOp,
              ": expected a floating-point A_shard (float32, bfloat16, float16, float64), got ",
              A_shard.scalar_type());
  TORCH_CHECK(!Bs.empty(), "cuda_p2p ", kOp, ": expected at least one B, got none");
  const bool contraction = gather_dim == nd - 1;
  const int64_t k = contraction ? A_shard.size(-1) * world_size : A_shard.size(-1);
  for (size_t i = 0; i < Bs.size(); ++i) {
    const auto& B = Bs[i];
    TORCH_CHECK(B.defined(), "cuda_p2p ", kOp, ": Bs[", i, "] is undefined");
    TORCH_CHECK(B.layout() == at::kStrided, "cuda_p2p ", kOp,
                ": expected strided (dense) Bs, got Bs[", i, "] of layout ", B.layout());
    TORCH_CHECK(B.dim() == 2, "cuda_p2p ", kOp, ": expected every B to be a matrix, got Bs[", i,
                "] of shape ", B.sizes());
    TORCH_CHECK(B.scalar_type() == A_shard.scalar_type(), "cuda_p2p ", kOp,
                ": expected Bs of A_shard's dtype ", A_shard.scalar_type(), ", got Bs[", i, "] of ",
                B.scalar_type());
    TORCH_CHECK(B.device() == A_shard.device(), "cuda_p2p ", kOp, ": expected Bs on ",
                A_shard.device(), " like A_shard, got Bs[", i, "] on ", B.device());
    TORCH_CHECK(B.size(0) == k, "cuda_p2p ", kOp, ": Bs[", i, "] has ", B.size(0),
                " rows, but the gathered A has ", k, " columns",
                contraction ? " (gather_dim is the last dim: W * A_shard.size(-1))" : "");
  }
  return gather_dim;
}

AllGatherAlgorithm parse_all_gather_algorithm(const std::string& algorithm,
                                              AllGatherAlgorithm auto_choice) {
  if (algorithm == "pipeline") return AllGatherAlgorithm::kPipeline;
  if (algorithm == "pull_ahead") return AllGatherAlgorithm::kPullAhead;
  TORCH_CHECK_VALUE(algorithm == "auto", "cuda_p2p ", kOp,
                    ": algorithm must be \"auto\", \"pipeline\" or \"pull_ahead\", got \"",
                    algorithm, "\"");
  return auto_choice;
}

AllGatherMatmulResult all_gather_matmul_pipeline(pipeline::Env& env, const at::Tensor& A_shard,
                                                 at::TensorList Bs, int64_t gather_dim,
                                                 bool return_A, Outcome& outcome,
                                                 AllGatherAlgorithm algorithm) {
  const int64_t W = env.world_size();
  gather_dim = check_all_gather_matmul_args(A_shard, Bs, gather_dim, W);
  Problem p(A_shard, Bs, gather_dim, W, return_A);
  // Only a returned A needs the own slot of the stack filled.
  gather_and_consume(
      env, p.shard, p.stack,
      [&p](int src, int64_t row0, const at::Tensor& rows, int stream) {
        p.consume(src, row0, rows, stream);
      },
      return_A, algorithm == AllGatherAlgorithm::kPullAhead, outcome);
  AllGatherMatmulResult r;
  env.on_caller("finish", [&] { r = p.finish(W); });
  return r;
}

AllGatherMatmulResult all_gather_matmul_send_recv(c10d::Backend& backend, const at::Tensor& A_shard,
                                                  at::TensorList Bs, int64_t gather_dim,
                                                  bool return_A) {
  const int64_t W = backend.getSize();
  gather_dim = check_all_gather_matmul_args(A_shard, Bs, gather_dim, W);
  Problem p(A_shard, Bs, gather_dim, W, return_A);
  gather_and_consume_send_recv(backend, p.shard, p.stack,
                               [&p](int src, int64_t row0, const at::Tensor& rows, int stream) {
                                 p.consume(src, row0, rows, stream);
                               });
  return p.finish(W);
}

AllGatherMatmulResult fused_all_gather_matmul(pipeline::Group& group, const at::Tensor& A_shard,
                                              at::TensorList Bs, int64_t gather_dim, bool return_A,
                                              const std::string& algorithm) {
  pipeline::State& state = group.state;
  const bool on_workspace = pipeline::workspace_serves(group.workspace, A_shard.device());
  AllGatherAlgorithm algo = AllGatherAlgorithm::kPipeline;
  int64_t dim = gather_dim;
  // NOTE [Op signatures]: a rank whose own arguments are wrong tells its peers.
  pipeline::check_or_reject(group, on_workspace, OpId::kFusedAllGatherMatmul, [&] {
    algo = parse_all_gather_algorithm(algorithm, group.auto_all_gather);
    dim = check_all_gather_matmul_args(A_shard, Bs, gather_dim, group.world_size);
  });
  AllGatherMatmulResult r;
  if (on_workspace) {
    pipeline::Env env = pipeline::make_env(group);
    const char* name = to_string(algo);
    const std::string sig =
        claim_shard(env, A_shard, dim) + signature_text(A_shard, Bs, dim, return_A, name);
    Outcome outcome{.algorithm = name, .graph = env.captured};  // NOTE [Replay-safe signals]
    r = pipeline::run_or_mark_failed(group.failure, kOp, [&] {
      pipeline::agree(env, state, OpSignature::of(OpId::kFusedAllGatherMatmul, sig));
      return all_gather_matmul_pipeline(env, A_shard, Bs, gather_dim, return_A, outcome, algo);
    });
    r.outcome = outcome;
    if (env.trace) state.last_trace = env.trace->events();
  } else {
    TORCH_CHECK(group.wrapped, "cuda_p2p ", kOp, ": the workspace cannot serve ", A_shard.device(),
                " tensors and the group has no wrapped backend for them");
    r = all_gather_matmul_send_recv(*group.wrapped, A_shard, Bs, gather_dim, return_A);
    r.outcome = {.algorithm = "send_recv"};
  }
  return r;
}

void agree_all_gather_matmul_unfused(pipeline::Group& group, const at::Tensor& A_shard,
                                     at::TensorList Bs, int64_t gather_dim, bool return_A) {
  if (group.world_size == 1) return;
  pipeline::Env env = pipeline::make_env(group);
  const std::string sig = signature_text(A_shard, Bs, gather_dim, return_A, "unfused");
  pipeline::run_or_mark_failed(group.failure, kOp, [&] {
    pipeline::agree(env, group.state, OpSignature::of(OpId::kFusedAllGatherMatmul, sig));
  });
}

AllGatherMatmulResult fused_all_gather_matmul_meta(const at::Tensor& A_shard, at::TensorList Bs,
                                                   int64_t gather_dim, int64_t W, bool return_A,
                                                   const std::string& algorithm) {
  parse_all_gather_algorithm(algorithm, AllGatherAlgorithm::kPipeline);  // its check only
  TORCH_CHECK(A_shard.dim() >= 2, "cuda_p2p ", kOp,
              ": expected A_shard with at least 2 dims, got shape ", A_shard.sym_sizes());
  bool concrete = !A_shard.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  for (const auto& B : Bs)
    concrete = concrete && !B.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  if (concrete) {
    gather_dim = check_all_gather_matmul_args(A_shard, Bs, gather_dim, W);
  } else {
    TORCH_CHECK(gather_dim >= -A_shard.dim() && gather_dim < A_shard.dim(), "cuda_p2p ", kOp,
                ": gather_dim must be in [", -A_shard.dim(), ", ", A_shard.dim(), "), got ",
                gather_dim);
    if (gather_dim < 0) gather_dim += A_shard.dim();
  }
  auto l = make_layout(A_shard, Bs, gather_dim, W, return_A);
  return {l.A, l.outputs};
}

}  // namespace cuda_p2p::ops
