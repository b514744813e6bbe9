// reduce_scatter(A @ B, scatter_dim), with the exchange of one partial product hidden behind the
// GEMM of the next (docs/design.md §5, docs/pipelines.md): a two-stream pipeline over the
// workspace, and a ring in S steps over the workspace or over the wrapped backend's send/recv.
#include <c10/util/Exception.h>

#include "ops/fused_ops.hpp"

namespace cuda_p2p::ops {

namespace {

constexpr const char* kOpName = "fused_matmul_reduce_scatter";

// NOTE [Matmul→reduce-scatter schedule]
// Rank r owns rows [r*rows, (r+1)*rows) of the product (scatter dim moved to the front and
// flattened), or, when the last dim is scattered, columns [r*cols, (r+1)*cols) of every row. A
// "partial for d" is this rank's A @ B restricted to d's part. Per round (row range):
//
//   stream 1 (half 0): produce for r+1 | barrier | pull from r-1 | barrier | produce for r+3 ...
//   stream 0 (half 1): [sleep] produce for r+2 | barrier | pull from r-2 | barrier | ...
//                      ... produce own part (last)
//
// What each step says:
//  - a barrier on stream 1 opens the op (or the handshake before it: NOTE [The handshake opens the
//    buffer]): no peer still reads the own buffer (stream 0's first write waits for it too);
//  - step k = 1..W-1 runs on stream k % 2: it produces the partial for rank+k into the stream's
//    half of the own buffer (a double buffer, one half per stream), barriers on the stream's
//    channel (every rank's step-k partial is in place), pulls the partial rank-k produced for
//    this rank from rank-k's same half into slot rank-k of a local stack [W, rows, cols], and
//    barriers again: no rank reads that half any more, so the stream's next step may overwrite
//    it (NOTE [Pipeline buffer reuse]);
//  - the own part is produced last, straight into its slot; after both streams, the stack is
//    summed over ranks in float32 (a mean divides the float32 sum) and rounded once to the
//    output dtype.

// NOTE [Launch order]
// The two streams' GEMMs are independent, so a GPU may start either first; if ranks disagree,
// every barrier waits for the slowest rank's other stream. A sleep kernel of a few microseconds
// ahead of stream 0's first GEMM makes every rank start stream 1's first, and once the first
// GEMMs are in order the barriers keep the rest in order. The host's executor threads need no
// such hint: both streams run at once.

// NOTE [Ring reduce-scatter]
// S = q * W steps: each rank's part is split into q sub-parts, and each sub-part's sum travels
// round the ring once. At ring step t = 0..W-1 of sub-part j, rank r produces its partial for
// part c = r - t - 1 (mod W), adds the running sum it received from rank r-1 (which worked on
// the same part at step t-1), and hands the sum to rank r+1; at t = W-1, c = r and the sum is
// complete. GEMMs run ahead on stream 0 (they depend on nothing); stream 1 does the exchange.
// Over the workspace, after an opening barrier (no peer still reads the own buffer), running sums
// (float32) go into two slots of the own buffer used in turn:
// publication p goes to slot p % 2 and is announced to r+1 on the data channel (channels[1]);
// the reader acknowledges on the ack channel (channels[0]) once it has added it, and slot p % 2
// is rewritten (publication p + 2) only after that acknowledgement. The data and the
// acknowledgements use two channels because with W = 2 the left and right neighbours are the
// same rank. At the end the op waits for every acknowledgement: no one reads its buffer any
// more. Over send/recv, step i's send and step i+1's receive are issued together, so the
// transfer of one running sum overlaps the next GEMM.

struct ScatterProblem {
  int64_t W = 1;
  ReduceOp reduce_op = ReduceOp::kSum;
  bool columns = false;  // the last dim is scattered
  int64_t rows = 0;      // rows of one rank's part
  int64_t cols = 0;      // columns of one rank's part
  at::Tensor A2;         // the flattened A: [W * rows, K] (rows scattered) or [rows, K]
  at::Tensor B;
  at::Tensor out;       // what the op returns (contiguous, like the reference)
  at::Tensor out_flat;  // [rows, cols]: out itself, or a contiguous staging copied to out_view
  at::Tensor out_view;  // out with the scatter dim moved to the front
  // NOTE [Scaled matmuls in the pipelines]: set for a scaled matmul; A_scale2 is A2's rowwise
  // scale [rows of A2, 1] or the tensorwise scale.
  std::optional<ScaledMatmul> scaled;
  at::Tensor A_scale2;

  // The partial for part `dst`, rows [row0, row0 + out.size(0)) of it, into out.
  void produce(int64_t dst, int64_t row0, at::Tensor out) const {
    const int64_t len = out.size(0);
    if (scaled) {
      produce_scaled(dst, row0, out);
      return;
    }
    if (columns) {
      at::mm_out(out, A2.narrow(0, row0, len), B.narrow(1, dst * cols, cols));
    } else {
      at::mm_out(out, A2.narrow(0, dst * rows + row0, len), B);
    }
  }

  // NOTE [Scaled matmuls in the pipelines]: the rows' own scales go with them; a rowwise B scale
  // [1, N] is narrowed with B's columns.
  void produce_scaled(int64_t dst, int64_t row0, at::Tensor out) const {
    const int64_t len = out.size(0);
    if (len == 0 || out.size(1) == 0) return;
    const int64_t first = columns ? row0 : dst * rows + row0;
    // One element: a tensorwise scale (or a rowwise one of a single row: the same product).
    at::Tensor sa = A_scale2.numel() == 1 ? A_scale2 : A_scale2.narrow(0, first, len);
    // cuBLAS's rowwise kernel wants 16-byte aligned scales; a slice may not be.
    if (sa.numel() > 1 && reinterpret_cast<uintptr_t>(sa.data_ptr()) % 16 != 0) sa = sa.clone();
    at::Tensor sb = scaled->B_scale;
    if (columns && sb.numel() != 1) sb = sb.narrow(1, dst * cols, cols);
    at::Tensor b = columns ? B.narrow(1, dst * cols, cols) : B;
    at::_scaled_mm_out(out, A2.narrow(0, first, len), b, sa, sb, std::nullopt, std::nullopt,
                       scaled->out_dtype, false);
  }

  // out_flat rows [row0, ...) = sum (float32) / W for a mean, rounded to the output dtype.
  void write(int64_t row0, at::Tensor sum) const {
    if (reduce_op == ReduceOp::kAvg) sum.div_(W);
    out_flat.narrow(0, row0, sum.size(0)).copy_(sum);
  }

  void finish() const {
    if (out_flat.data_ptr() != out_view.data_ptr() || !out_view.is_contiguous()) {
      out_view.copy_(out_flat.view(out_view.sizes()));
    }
  }
};

at::Tensor make_output(const at::Tensor& A, const at::Tensor& B, int64_t scatter_dim, int64_t W,
                       at::ScalarType dtype) {
  auto sizes = A.sym_sizes().vec();
  sizes.back() = B.sym_size(1);
  sizes[scatter_dim] = sizes[scatter_dim] / W;
  return at::empty_symint(sizes, A.options().dtype(dtype).memory_format(std::nullopt));
}

ScatterProblem make_scatter_problem(const at::Tensor& A, const at::Tensor& B, ReduceOp reduce_op,
                                    int64_t scatter_dim, int64_t W,
                                    const ScaledMatmul* scaled = nullptr) {
  ScatterProblem p;
  p.W = W;
  p.reduce_op = reduce_op;
  p.B = B;
  p.out = make_output(A, B, scatter_dim, W, scaled ? scaled->out_dtype : A.scalar_type());
  const int64_t nd = A.dim();
  const int64_t K = A.size(-1);
  int64_t lead = 1;  // every dim of A but the last
  for (int64_t d = 0; d + 1 < nd; ++d) lead *= A.size(d);
  if (scatter_dim == nd - 1) {
    p.columns = true;
    p.rows = lead;
    p.cols = B.size(1) / W;
    p.A2 = A.contiguous().view({lead, K});
    p.out_view = p.out;
  } else {
    p.rows = lead / W;
    p.cols = B.size(1);
    p.A2 = A.movedim(scatter_dim, 0).contiguous().view({lead, K});
    p.out_view = p.out.movedim(scatter_dim, 0);
  }
  p.out_flat = p.out_view.is_contiguous() ? p.out_view.view({p.rows, p.cols})
                                          : at::empty({p.rows, p.cols}, p.out.options());
  if (scaled) {
    p.scaled = *scaled;
    const at::Tensor& s = scaled->A_scale;
    if (s.numel() == 1) {
      p.A_scale2 = s;  // tensorwise
    } else {
      // A fresh [lead, 1]: a size-1 dim of a "contiguous" tensor may have any stride, which
      // _scaled_mm refuses for a scale.
      const at::Tensor src = p.columns ? s : s.movedim(scatter_dim, 0);
      p.A_scale2 = at::empty({lead, 1}, s.options());
      p.A_scale2.view(src.sizes()).copy_(src);
    }
  }
  return p;
}

void reduce_stack(const ScatterProblem& p, const at::Tensor& stack) {
  if (p.rows == 0 || p.cols == 0) return;
  // One pass per partial into a float32 sum: the same additions as at::sum over dim 0 in float32,
  // which is slower on the CPU (docs/measurements/source-comment-figures.md).
  at::Tensor sum = stack[0].to(accumulate_type(stack.scalar_type()));
  if (sum.is_same(stack[0]) || sum.data_ptr() == stack[0].data_ptr()) sum = stack[0].clone();
  for (int64_t i = 1; i < stack.size(0); ++i) sum.add_(stack[i]);
  p.write(0, sum);
}

// NOTE [Matmul→reduce-scatter schedule]
void produce_and_exchange(pipeline::Env& env, const ScatterProblem& p, const at::Tensor& stack,
                          Outcome& outcome) {
  auto& dev = env.device();
  auto& ws = env.ws;
  const int W = env.world_size(), rank = env.rank();
  const auto dtype = stack.scalar_type();
  const int64_t elem = static_cast<int64_t>(stack.element_size());
  // Two halves of one round each.
  const int64_t rounds = pipeline::plan_rounds(env, p.rows, 2 * p.cols * elem, kOpName, outcome);
  if (rounds == 0) return;
  const int64_t half_elems = split_range(p.rows, rounds, 0).second * p.cols;

  pipeline::begin(env);
  pipeline::EndGuard guard(env);
  std::shared_ptr<Event> free;
  if (W > 1 && !env.opened) {
    // NOTE [Pipeline buffer reuse]: no peer reads the own buffer any more (NOTE [The handshake
    // opens the buffer]: after a handshake, it said so).
    env.span(1, "barrier", [&] { ws.barrier(env.stream(1), env.channels[1]); });
    free = dev.record(env.stream(1));
  }
  for (int64_t round = 0; round < rounds; ++round) {
    const auto [row0, row1] = split_range(p.rows, rounds, round);
    const int64_t len = row1 - row0;
    const size_t bytes = static_cast<size_t>(len * p.cols * elem);
    for (int k = 1; k < W; ++k) {
      const int s = k % 2;
      const int64_t offset = (s == 1 ? 0 : half_elems);  // stream 1: half 0, stream 0: half 1
      const int dst = (rank + k) % W, src = (rank + W - k) % W;
      std::vector<int> peers{rank, dst};
      if (src != dst) peers.push_back(src);
      if (k == 2 && round == 0 && free) dev.wait_event(env.stream(0), *free);
      if (k == 2) pipeline::delay_stream(env, 0);  // NOTE [Launch order]
      at::Tensor half = ws.get_buffer(rank, {len, p.cols}, dtype, offset);
      env.run_compute(
          s, [&p, dst, row0, half] { p.produce(dst, row0, half); },
          "gemm for r+" + std::to_string(k));
      env.span(s, "barrier", [&] { ws.barrier(env.stream(s), env.channels[s], {}, peers); });
      at::Tensor slot = stack[src].narrow(0, row0, len);
      env.span(s, "pull r-" + std::to_string(k), [&] {
        dev.copy(env.stream(s), slot.data_ptr(), static_cast<char*>(ws.buffer(src)) + offset * elem,
                 bytes);
      });
      env.span(s, "barrier", [&] { ws.barrier(env.stream(s), env.channels[s], {}, peers); });
    }
    if (W == 2) pipeline::delay_stream(env, 0);
    at::Tensor own = stack[rank].narrow(0, row0, len);
    env.run_compute(0, [&p, rank, row0, own] { p.produce(rank, row0, own); }, "gemm own");
  }
  guard.release();
  pipeline::end(env);
}

// NOTE [Ring reduce-scatter]: the part of ring step i, and which rows of it.
struct RingStep {
  int64_t t;     // position in the ring, 0..W-1
  int64_t part;  // whose part: (rank - t - 1) mod W
  int64_t row0;  // rows [row0, row0 + len) of that part
  int64_t len;
};

std::vector<RingStep> ring_schedule(int64_t W, int64_t rank, int64_t row_begin, int64_t row_end,
                                    int64_t q) {
  std::vector<RingStep> steps;
  for (int64_t j = 0; j < q; ++j) {
    const auto [a, b] = split_range(row_end - row_begin, q, j);
    for (int64_t t = 0; t < W; ++t) {
      steps.push_back({t, (rank - t - 1 + W) % W, row_begin + a, b - a});
    }
  }
  return steps;
}

void ring_over_workspace(pipeline::Env& env, const ScatterProblem& p, const at::Tensor& products,
                         int64_t q, Outcome& outcome) {
  auto& dev = env.device();
  auto& ws = env.ws;
  const int W = env.world_size(), rank = env.rank();
  const int left = (rank + W - 1) % W, right = (rank + 1) % W;
  const int data_channel = env.channels[1], ack_channel = env.channels[0];
  const auto acc = accumulate_type(products.scalar_type());
  const int64_t acc_elem = static_cast<int64_t>(c10::elementSize(acc));
  // One slot holds one sub-part; two slots per round.
  const int64_t sub_rows = (p.rows + q - 1) / q;
  const int64_t rounds =
      pipeline::plan_rounds(env, sub_rows, 2 * p.cols * acc_elem, kOpName, outcome);
  if (rounds == 0) return;
  const int64_t slot_elems = split_range(sub_rows, rounds, 0).second * p.cols;

  int64_t published = 0, consumed = 0, acks_waited = 0;
  pipeline::begin(env);
  pipeline::EndGuard guard(env);
  if (W > 1 && !env.opened) {
    // NOTE [Pipeline buffer reuse]: no peer reads the own buffer any more (NOTE [The handshake
    // opens the buffer]: after a handshake, it said so). Its signals share the data channel with
    // the left neighbour's announcements, in the same order on both sides.
    env.span(1, "barrier", [&] { ws.barrier(env.stream(1), data_channel); });
  }
  for (int64_t round = 0; round < rounds; ++round) {
    const auto [round_begin, round_end] = split_range(p.rows, rounds, round);
    for (const auto& st : ring_schedule(W, rank, round_begin, round_end, q)) {
      at::Tensor product = products[st.part].narrow(0, st.row0, st.len);
      env.run_compute(
          0, [&p, st, product] { p.produce(st.part, st.row0, product); },
          "gemm part r-" + std::to_string(st.t + 1));
      dev.wait_event(env.stream(1), *dev.record(env.stream(0)));
      at::Tensor incoming;
      if (st.t > 0) {
        env.span(1, "wait r-1", [&] { ws.wait_signal(env.stream(1), left, data_channel); });
        incoming = ws.get_buffer(left, {st.len, p.cols}, acc, (consumed++ % 2) * slot_elems);
      }
      if (st.t < W - 1) {
        if (published >= 2) {
          env.span(1, "wait ack", [&] { ws.wait_signal(env.stream(1), right, ack_channel); });
          ++acks_waited;
        }
        at::Tensor mine =
            ws.get_buffer(rank, {st.len, p.cols}, acc, (published++ % 2) * slot_elems);
        env.run(
            1,
            [mine, product, incoming]() mutable {
              if (incoming.defined()) {
                at::add_out(mine, incoming, product);
              } else {
                mine.copy_(product);
              }
            },
            "add, publish");
        ws.put_signal(env.stream(1), right, data_channel);
      } else {
        env.run(
            1,
            [&p, st, product, incoming, acc] {
              at::Tensor sum = product.to(acc);
              if (incoming.defined()) sum.add_(incoming);
              p.write(st.row0, sum);
            },
            "add, write");
      }
      if (st.t > 0) ws.put_signal(env.stream(1), left, ack_channel);
    }
  }
  for (; acks_waited < published; ++acks_waited) {
    ws.wait_signal(env.stream(1), right, ack_channel);
  }
  guard.release();
  pipeline::end(env);
}

void ring_over_send_recv(c10d::Backend& backend, const ScatterProblem& p,
                         const at::Tensor& products, int64_t q) {
  const int W = backend.getSize(), rank = backend.getRank();
  const int left = (rank + W - 1) % W, right = (rank + 1) % W;
  const auto acc = accumulate_type(products.scalar_type());
  if (p.rows == 0 || p.cols == 0) return;
  const auto steps = ring_schedule(W, rank, 0, p.rows, q);
  c10::intrusive_ptr<c10d::Work> in_flight;  // carries step i's send and step i+1's receive
  at::Tensor incoming, sent;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& st = steps[i];
    at::Tensor product = products[st.part].narrow(0, st.row0, st.len);
    p.produce(st.part, st.row0, product);
    if (in_flight) {
      in_flight->wait();
      in_flight.reset();
    }
    at::Tensor sum = product.to(acc);
    if (st.t > 0) sum.add_(incoming);
    at::Tensor send;
    if (st.t < W - 1) {
      send = sum;
    } else {
      p.write(st.row0, sum);
    }
    at::Tensor recv;
    if (i + 1 < steps.size() && steps[i + 1].t > 0) {
      recv = at::empty({steps[i + 1].len, p.cols}, products.options().dtype(acc));
    }
    if (send.defined() || recv.defined()) {
      in_flight = pipeline::exchange(backend, send, right, recv, left,
                                     pipeline::kSendRecvTagBase + static_cast<int>(i));
    }
    incoming = recv;
    sent = send;  // alive until the exchange that sends it has been waited for
  }
  if (in_flight) in_flight->wait();
}

// Everything the ranks must agree on (NOTE [Op signatures]): the shapes decide the rounds and the
// buffer's growth; `path` is the algorithm, or "unfused" (agree_matmul_reduce_scatter_unfused).
std::string signature_text(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t dim,
                           const std::string& path) {
  return "A " + pipeline::shape_text(A.sizes()) + " " + dtype_name(A.scalar_type()) + ", B " +
         pipeline::shape_text(B.sizes()) + " " + dtype_name(B.scalar_type()) + ", " +
         lower_name(op) + ", scatter_dim " + std::to_string(dim) + ", " + path;
}

}  // namespace

int64_t check_reduce_scatter_shapes(const char* op, const at::Tensor& A, const at::Tensor& B,
                                    int64_t scatter_dim) {
  const int64_t nd = A.dim();
  TORCH_CHECK(nd >= 2, "cuda_p2p ", op, ": expected A with at least 2 dims, got shape ", A.sizes());
  TORCH_CHECK(B.dim() == 2, "cuda_p2p ", op, ": expected B to be a matrix, got shape ", B.sizes());
  TORCH_CHECK(scatter_dim >= -nd && scatter_dim < nd, "cuda_p2p ", op, ": scatter_dim must be in [",
              -nd, ", ", nd, ") for a ", nd, "-D A, got ", scatter_dim);
  return scatter_dim < 0 ? scatter_dim + nd : scatter_dim;
}

void check_reduce_scatter_product(const char* op, const at::Tensor& A, const at::Tensor& B,
                                  int64_t scatter_dim, int64_t world_size) {
  TORCH_CHECK(B.size(0) == A.size(-1), "cuda_p2p ", op,
              ": A @ B needs B with A.size(-1) = ", A.size(-1), " rows, got B of shape ",
              B.sizes());
  const bool last = scatter_dim == A.dim() - 1;
  const int64_t scattered = last ? B.size(1) : A.size(scatter_dim);
  TORCH_CHECK(scattered % world_size == 0, "cuda_p2p ", op, ": the scattered dim (",
              last ? "B.size(1)" : "A.size(scatter_dim)", " = ", scattered,
              ", scatter_dim = ", scatter_dim, ") must be divisible by the group size ",
              world_size);
}

int64_t check_matmul_reduce_scatter_args(const at::Tensor& A, const at::Tensor& B,
                                         int64_t scatter_dim, int64_t world_size) {
  TORCH_CHECK(A.defined() && B.defined(), "cuda_p2p ", kOpName, ": A and B must be defined");
  TORCH_CHECK(A.layout() == at::kStrided && B.layout() == at::kStrided, "cuda_p2p ", kOpName,
              ": expected strided (dense) A and B, got layouts ", A.layout(), " and ", B.layout());
  check_below_autograd(kOpName, {A, B});  // NOTE [Fused ops below autograd]
  scatter_dim = check_reduce_scatter_shapes(kOpName, A, B, scatter_dim);
  TORCH_CHECK(at::isFloatingType(A.scalar_type()), "cuda_p2p ", kOpName,
              ": expected a floating-point A (float32, bfloat16, float16, float64), got ",
              A.scalar_type());
  TORCH_CHECK(B.scalar_type() == A.scalar_type(), "cuda_p2p ", kOpName,
              ": expected B of A's dtype ", A.scalar_type(), ", got ", B.scalar_type());
  TORCH_CHECK(B.device() == A.device(), "cuda_p2p ", kOpName, ": expected B on ", A.device(),
              " like A, got ", B.device());
  check_reduce_scatter_product(kOpName, A, B, scatter_dim, world_size);
  return scatter_dim;
}

namespace {
int64_t check_args(const at::Tensor& A, const at::Tensor& B, int64_t scatter_dim, int64_t W,
                   const ScaledMatmul* scaled) {
  if (scaled == nullptr) return check_matmul_reduce_scatter_args(A, B, scatter_dim, W);
  return check_scaled_matmul_reduce_scatter_args(A, B, scaled->A_scale, scaled->B_scale,
                                                 scatter_dim, scaled->out_dtype, W);
}
}  // namespace

int64_t check_ring_steps(int64_t ring_steps, int64_t world_size) {
  if (ring_steps == 0) return world_size;
  TORCH_CHECK(ring_steps > 0 && ring_steps % world_size == 0, "cuda_p2p ", kOpName,
              ": ring_steps must be a positive multiple of the group size ", world_size,
              " (or 0 for the group size), got ", ring_steps);
  return ring_steps;
}

at::Tensor matmul_reduce_scatter_pipeline(pipeline::Env& env, const at::Tensor& A,
                                          const at::Tensor& B, ReduceOp reduce_op,
                                          int64_t scatter_dim, Outcome& outcome,
                                          const ScaledMatmul* scaled) {
  const int64_t W = env.world_size();
  scatter_dim = check_args(A, B, scatter_dim, W, scaled);
  ScatterProblem p = make_scatter_problem(A, B, reduce_op, scatter_dim, W, scaled);
  at::Tensor stack = at::empty({W, p.rows, p.cols}, p.out.options());
  produce_and_exchange(env, p, stack, outcome);
  env.on_caller("reduce", [&] {
    reduce_stack(p, stack);
    p.finish();
  });
  return p.out;
}

at::Tensor matmul_reduce_scatter_ring(pipeline::Env& env, const at::Tensor& A, const at::Tensor& B,
                                      ReduceOp reduce_op, int64_t scatter_dim, int64_t steps,
                                      Outcome& outcome, const ScaledMatmul* scaled) {
  const int64_t W = env.world_size();
  scatter_dim = check_args(A, B, scatter_dim, W, scaled);
  steps = check_ring_steps(steps, W);
  ScatterProblem p = make_scatter_problem(A, B, reduce_op, scatter_dim, W, scaled);
  at::Tensor products = at::empty({W, p.rows, p.cols}, p.out.options());
  ring_over_workspace(env, p, products, steps / W, outcome);
  p.finish();
  return p.out;
}

at::Tensor matmul_reduce_scatter_send_recv(c10d::Backend& backend, const at::Tensor& A,
                                           const at::Tensor& B, ReduceOp reduce_op,
                                           int64_t scatter_dim, int64_t steps,
                                           const ScaledMatmul* scaled) {
  const int64_t W = backend.getSize();
  scatter_dim = check_args(A, B, scatter_dim, W, scaled);
  steps = check_ring_steps(steps, W);
  ScatterProblem p = make_scatter_problem(A, B, reduce_op, scatter_dim, W, scaled);
  at::Tensor products = at::empty({W, p.rows, p.cols}, p.out.options());
  ring_over_send_recv(backend, p, products, steps / W);
  p.finish();
  return p.out;
}

MatmulReduceScatterResult fused_matmul_reduce_scatter(
    pipeline::Group& group, const at::Tensor& A, const at::Tensor& B, const std::string& reduce_op,
    int64_t scatter_dim, const std::string& algorithm, int64_t ring_steps) {
  const int64_t W = group.world_size;
  pipeline::State& state = group.state;
  const bool on_workspace = pipeline::workspace_serves(group.workspace, A.device());
  ReduceOp op = ReduceOp::kSum;
  int64_t steps = W, dim = scatter_dim;
  // NOTE [Op signatures]: a rank whose own arguments are wrong tells its peers.
  pipeline::check_or_reject(group, on_workspace, OpId::kFusedMatmulReduceScatter, [&] {
    op = parse_reduce_op(reduce_op, {ReduceOp::kSum, ReduceOp::kAvg}, kOpName);
    TORCH_CHECK_VALUE(
        algorithm == "auto" || algorithm == "pipeline" || algorithm == "ring", "cuda_p2p ", kOpName,
        ": algorithm must be \"auto\", \"pipeline\" or \"ring\", got \"", algorithm, "\"");
    dim = check_matmul_reduce_scatter_args(A, B, scatter_dim, W);
    steps = check_ring_steps(ring_steps, W);
    TORCH_CHECK(ring_steps == 0 || algorithm != "pipeline", "cuda_p2p ", kOpName,
                ": ring_steps applies to the ring, got ring_steps=", ring_steps,
                " with algorithm=\"pipeline\"");
  });
  // NOTE [The fused ops' auto by device] in backend/config.hpp.
  const bool ring = pipeline::reduce_scatter_runs_ring(group, algorithm, ring_steps);
  if (on_workspace) {
    pipeline::Env env = pipeline::make_env(group);
    const std::string sig = signature_text(
        A, B, op, dim, ring ? "ring (" + std::to_string(steps) + " steps)" : "pipeline");
    MatmulReduceScatterResult r{.outcome = {.algorithm = ring ? "ring" : "pipeline",
                                            .graph = env.captured}};  // NOTE [Replay-safe signals]
    r.output = pipeline::run_or_mark_failed(group.failure, kOpName, [&] {
      pipeline::agree(env, state, OpSignature::of(OpId::kFusedMatmulReduceScatter, sig));
      return ring ? matmul_reduce_scatter_ring(env, A, B, op, scatter_dim, steps, r.outcome)
                  : matmul_reduce_scatter_pipeline(env, A, B, op, scatter_dim, r.outcome);
    });
    if (env.trace) state.last_trace = env.trace->events();
    return r;
  }
  TORCH_CHECK(group.wrapped, "cuda_p2p ", kOpName, ": the workspace cannot serve ", A.device(),
              " tensors and the group has no wrapped backend for them");
  return {matmul_reduce_scatter_send_recv(*group.wrapped, A, B, op, scatter_dim, steps),
          {.algorithm = "send_recv"}};
}

void agree_matmul_reduce_scatter_unfused(pipeline::Group& group, const at::Tensor& A,
                                         const at::Tensor& B, const std::string& reduce_op,
                                         int64_t scatter_dim) {
  if (group.world_size == 1) return;
  const ReduceOp op = parse_reduce_op(reduce_op, {ReduceOp::kSum, ReduceOp::kAvg}, kOpName);
  pipeline::Env env = pipeline::make_env(group);
  const std::string sig = signature_text(A, B, op, scatter_dim, "unfused");
  pipeline::run_or_mark_failed(group.failure, kOpName, [&] {
    pipeline::agree(env, group.state, OpSignature::of(OpId::kFusedMatmulReduceScatter, sig));
  });
}

at::Tensor fused_matmul_reduce_scatter_meta(const at::Tensor& A, const at::Tensor& B,
                                            const std::string& reduce_op, int64_t scatter_dim,
                                            int64_t W, const std::string& algorithm,
                                            int64_t ring_steps) {
  parse_reduce_op(reduce_op, {ReduceOp::kSum, ReduceOp::kAvg}, kOpName);
  TORCH_CHECK_VALUE(
      algorithm == "auto" || algorithm == "pipeline" || algorithm == "ring", "cuda_p2p ", kOpName,
      ": algorithm must be \"auto\", \"pipeline\" or \"ring\", got \"", algorithm, "\"");
  check_ring_steps(ring_steps, W);
  const bool concrete = !A.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                        !B.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  if (concrete) {
    scatter_dim = check_matmul_reduce_scatter_args(A, B, scatter_dim, W);
  } else {
    TORCH_CHECK(A.dim() >= 2 && scatter_dim >= -A.dim() && scatter_dim < A.dim(), "cuda_p2p ",
                kOpName, ": scatter_dim must be in [", -A.dim(), ", ", A.dim(), "), got ",
                scatter_dim);
    if (scatter_dim < 0) scatter_dim += A.dim();
  }
  return make_output(A, B, scatter_dim, W, A.scalar_type());
}

}  // namespace cuda_p2p::ops
