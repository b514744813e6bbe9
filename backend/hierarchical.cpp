#include "backend/hierarchical.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>

#include "backend/counters.hpp"
#include "backend/reduce_ops.hpp"
#include "backend/tensor_args.hpp"
#include "ops/collectives.hpp"
#include "ops/common.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

namespace {

c10d::ReduceOp sum_op() { return c10d::ReduceOp(c10d::ReduceOp::SUM); }

// What the inter-host step (and the leaders' intra step) reduces with: an average is a sum
// there, divided once the sum is complete, since neither step sees every rank.
c10d::ReduceOp partial_op(const c10d::ReduceOp& op) { return is_avg(op) ? sum_op() : op; }

}  // namespace

HostLayout::HostLayout(const std::vector<int64_t>& host_of) {
  TORCH_CHECK(!host_of.empty(), "cuda_p2p hierarchy: expected the host of every rank, got none");
  std::map<int64_t, int> number;  // label -> host number, in order of the lowest rank
  for (size_t r = 0; r < host_of.size(); ++r) {
    auto [it, added] = number.emplace(host_of[r], static_cast<int>(hosts.size()));
    if (added) hosts.emplace_back();
    host.push_back(it->second);
    local.push_back(static_cast<int>(hosts[it->second].size()));
    hosts[it->second].push_back(static_cast<int>(r));
  }
}

bool HostLayout::even() const {
  return std::all_of(hosts.begin(), hosts.end(),
                     [&](const auto& h) { return h.size() == hosts.front().size(); });
}

int HostLayout::min_host_size() const {
  size_t m = hosts.front().size();
  for (const auto& h : hosts) m = std::min(m, h.size());
  return static_cast<int>(m);
}

Hierarchy::Hierarchy(int rank, HostLayout layout, c10::intrusive_ptr<c10d::Backend> intra,
                     c10::intrusive_ptr<c10d::Backend> inter, bool nccl)
    : rank_(rank),
      layout_(std::move(layout)),
      host_(layout_.host.at(rank)),
      local_(layout_.local.at(rank)),
      even_(layout_.even()),
      intra_(std::move(intra)),
      inter_(std::move(inter)),
      nccl_(nccl),
      agreement_(layout_, rank) {
  const int H = layout_.num_hosts();
  const int L = static_cast<int>(layout_.hosts[host_].size());
  TORCH_CHECK(H >= 2, "cuda_p2p hierarchy: expected ranks on at least 2 hosts, got ", H);
  TORCH_CHECK(
      intra_ && intra_->getRank() == local_ && intra_->getSize() == L,
      "cuda_p2p hierarchy: the intra-host backend must have rank ", local_, " of ", L, ", got ",
      intra_ ? std::to_string(intra_->getRank()) + " of " + std::to_string(intra_->getSize())
             : std::string("None"));
  if (local_ < layout_.min_host_size()) {
    TORCH_CHECK(inter_ && inter_->getRank() == host_ && inter_->getSize() == H,
                "cuda_p2p hierarchy: the inter-host backend of local index ", local_,
                " must have rank ", host_, " of ", H, ", got ",
                inter_
                    ? std::to_string(inter_->getRank()) + " of " + std::to_string(inter_->getSize())
                    : std::string("None"));
  } else {
    TORCH_CHECK(!inter_, "cuda_p2p hierarchy: local index ", local_,
                " does not exist on every host, so it has no inter-host backend; got one");
  }
  if (even_) {
    // NOTE [Block order]
    // An inter all-gather among the ranks of local index i, then an intra all-gather, leaves
    // block (i, h) - local index i on host h - at position i * H + h: order_ maps positions to
    // ranks. The even reduce-scatter arranges its input in the same order, so that the intra
    // step hands local index i the H blocks its inter step then scatters by host.
    std::vector<int64_t> order;
    for (int i = 0; i < L; ++i) {
      for (int h = 0; h < H; ++h) order.push_back(layout_.hosts[h][i]);
    }
    order_ = at::tensor(order, at::kLong);
  }
}

const char* Hierarchy::rejects(c10::ArrayRef<at::Tensor> tensors) {
  if (tensors.empty()) return reason::kNoTensors;
  for (const auto& t : tensors) {
    if (!t.defined() || t.layout() != at::kStrided || !t.is_cpu()) return reason::kDevice;
  }
  return nullptr;
}

const char* Hierarchy::rejects_reduction(const c10d::ReduceOp& op, at::ScalarType dtype,
                                         const char* what) {
  const auto mapped = to_reduce_op(op);
  if (!mapped) return reason::kReduceOp;
  // Gloo, the inter-host backend, reduces no int16; the flat path reports it.
  if (!ops::is_reducible_dtype(dtype) || dtype == at::kShort) return reason::kDtype;
  ops::check_reduce_op(*mapped, dtype, what);
  return nullptr;
}

// --- agreement ----------------------------------------------------------------------------------

namespace {

std::string describe(c10::ArrayRef<at::Tensor> tensors) { return ops::describe_tensors(tensors); }

// What a rank's own argument checks raised: its message (the invalid signature's text) and the
// error itself, thrown again once the group has agreed.
struct Checked {
  std::string error;
  std::exception_ptr thrown;
  void rethrow() const {
    if (thrown) std::rethrow_exception(thrown);
  }
};

template <typename F>
Checked run_checks(F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    return {e.what_without_backtrace(), std::current_exception()};
  }
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace

bool Hierarchy::on_nccl(c10::ArrayRef<at::Tensor> tensors) const {
  if (!nccl_ || tensors.empty()) return false;
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const at::Tensor& t) { return t.defined() && t.is_cuda(); });
}

ops::OpSignature Hierarchy::signature(ops::OpId kind, std::string text, const char* why,
                                      const std::string& error) {
  if (!error.empty()) return ops::OpSignature::rejected(kind, error);
  if (why) text += std::string(" (flat: ") + why + ")";
  return ops::OpSignature::of(kind, std::move(text));
}

bool Hierarchy::agree(const ops::OpSignature& mine, std::chrono::milliseconds timeout,
                      const at::Tensor& payload, const c10d::ReduceOp& op) {
  if (!agreement_on_) return false;  // the bench knob
  const AgreementSteps steps{
      .intra_all_gather = [this](const auto& out, const auto& in) { intra_all_gather(out, in); },
      .inter_all_gather = [this, timeout](const auto& out,
                                          const auto& in) { inter_all_gather(out, in, timeout); },
      .intra_broadcast = [this](const auto& t, int root) { intra_broadcast(t, root); },
  };
  return agreement_.agree(mine, steps, payload, op);
}

HierarchyOutcome Hierarchy::barrier(const c10d::BarrierOptions& opts) {
  if (nccl_ && opts.device.has_value() && opts.device->is_cuda()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  const bool was = agreement_on_;
  agreement_on_ = true;  // the exchange is the barrier: never skipped
  try {
    agree(ops::OpSignature::of(ops::OpId::kBarrier, ""), opts.timeout);
  } catch (...) {
    agreement_on_ = was;
    throw;
  }
  agreement_on_ = was;
  return {.ran = true, .path = "hierarchical", .runs = 1};  // the same exchange on any hosts
}

void Hierarchy::agree_flat(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                           const std::function<void()>& checks,
                           const std::function<std::string()>& text,
                           std::chrono::milliseconds timeout) {
  if (on_nccl(tensors)) {
    checks();
    return;
  }
  const Checked checked = run_checks(checks);
  std::lock_guard<std::mutex> lock(mutex_);
  agree(signature(kind, checked.thrown ? std::string() : text(), nullptr, checked.error), timeout);
  checked.rethrow();
}

// --- entry points -------------------------------------------------------------------------------

// NOTE [One hierarchical entry]
// Every hierarchical collective takes the same steps, in this order, on every rank:
//  1. CUDA tensors on a group that wraps NCCL decline (reason::kDevice) without communicating (NOTE
//     [Hierarchical agreement]: not agreed).
//  2. `screen` says why the call cannot take the hierarchical path (nullptr: it can); its
//     TORCH_CHECKs are the rank's own argument checks, caught, making its signature invalid.
//  3. Under mutex_ the group agrees on the signature: kind, `text` (asked only of a rank whose
//     checks passed), the route. An all-reduce that fits rides in it (`inline_op`).
//  4. The checks' error, if any, is raised; a call with a reason declines with it (the caller runs
//     it flat); else `run` runs the algorithm, still under mutex_, and says what ran.
// The entries below state only what differs: the kind, the tensors, the screen, the text, the run.
template <typename Screen, typename Text, typename Run>
HierarchyOutcome Hierarchy::enter(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                                  std::chrono::milliseconds timeout, Screen&& screen, Text&& text,
                                  Run&& run, const c10d::ReduceOp* inline_op) {
  constexpr bool kRides = std::is_invocable_v<Run&, at::Tensor&, bool>;
  TORCH_INTERNAL_ASSERT(kRides == (inline_op != nullptr));
  if (on_nccl(tensors)) return decline(reason::kDevice);
  const char* why = nullptr;
  const Checked checked = run_checks([&] { why = screen(); });
  // Small enough, an all-reduce rides in the agreement itself (NOTE [Hierarchical agreement]).
  at::Tensor carried;
  if (inline_op && !why && !checked.thrown && HierarchyAgreement::fits_inline(tensors[0])) {
    carried = tensors[0].contiguous();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const bool in_agreement =
      agree(signature(kind, checked.thrown ? std::string() : text(), why, checked.error), timeout,
            carried.defined() ? carried.view(-1) : at::Tensor(),
            inline_op ? *inline_op : c10d::ReduceOp());
  checked.rethrow();
  if (why) return decline(why);
  if constexpr (kRides) {
    return run(carried, in_agreement);
  } else {
    return run();
  }
}

HierarchyOutcome Hierarchy::all_reduce(std::vector<at::Tensor>& tensors,
                                       const c10d::AllreduceOptions& opts) {
  return enter(
      ops::OpId::kAllReduce, tensors, opts.timeout,
      [&]() -> const char* {
        if (tensors.size() != 1) return reason::kSeveralTensors;
        if (const char* why = rejects(tensors)) return why;
        return rejects_reduction(opts.reduceOp, tensors[0].scalar_type(), "all_reduce");
      },
      [&] { return describe(tensors) + " " + reduce_op_text(opts.reduceOp); },
      [&](at::Tensor& work, bool in_agreement) {
        at::Tensor& t = tensors[0];
        if (!work.defined()) work = t.contiguous();
        if (!in_agreement) all_reduce_two_level(work.view(-1), opts.reduceOp, opts.timeout);
        if (!work.is_same(t)) t.copy_(work);
        HierarchyOutcome outcome = ran();
        outcome.in_agreement = in_agreement;
        return outcome;
      },
      &opts.reduceOp);
}

HierarchyOutcome Hierarchy::all_gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) {
  return enter(
      ops::OpId::kAllGather, {input, output}, opts.timeout,
      [&] { return all_gather_rejects(output, input); }, [&] { return describe(input); },
      [&] {
        run_all_gather_into_tensor(output, input, opts.timeout);
        return ran();
      });
}

HierarchyOutcome Hierarchy::all_gather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  return enter(
      ops::OpId::kAllGather, inputs, opts.timeout,
      [&] {
        check_pairs(outputs, inputs, "all_gather_into_tensor");
        const char* why = nullptr;
        for (size_t i = 0; i < inputs.size() && !why; ++i) {
          why = all_gather_rejects(outputs[i], inputs[i]);
        }
        return why;
      },
      [&] { return "coalesced " + describe(inputs); },
      [&] {
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_all_gather_into_tensor(outputs[i], inputs[i], opts.timeout);
        }
        return ran(static_cast<int>(inputs.size()));
      });
}

HierarchyOutcome Hierarchy::all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) {
  const size_t W = layout_.host.size();
  return enter(
      ops::OpId::kAllGather, inputs, opts.timeout,
      [&]() -> const char* {
        if (inputs.size() != 1 || outputs.size() != 1 || outputs[0].size() != W) {
          return reason::kSeveralTensors;
        }
        if (const char* why = rejects(inputs)) return why;
        if (const char* why = rejects(outputs[0])) return why;
        for (const auto& o : outputs[0]) {
          TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                      "cuda_p2p all_gather: every output must have the input's ", inputs[0].numel(),
                      " elements of ", inputs[0].scalar_type(), ", got ", o.numel(), " of ",
                      o.scalar_type());
        }
        return nullptr;
      },
      [&] { return describe(inputs); },
      [&] {
        const at::Tensor& input = inputs[0];
        const int64_t n = input.numel();
        at::Tensor out = at::empty({n * static_cast<int64_t>(W)}, input.options());
        all_gather_two_level(input.contiguous().view(-1), out, opts.timeout);
        for (size_t r = 0; r < W; ++r) {
          outputs[0][r].copy_(
              out.narrow(0, static_cast<int64_t>(r) * n, n).view(outputs[0][r].sizes()));
        }
        return ran();
      });
}

HierarchyOutcome Hierarchy::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  return enter(
      ops::OpId::kReduceScatter, {input, output}, opts.timeout,
      [&] { return reduce_scatter_rejects(output, input, opts.reduceOp); },
      [&] { return describe(output) + " " + reduce_op_text(opts.reduceOp); },
      [&] {
        run_reduce_scatter_tensor(output, input, opts.reduceOp, opts.timeout);
        return ran();
      });
}

HierarchyOutcome Hierarchy::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return enter(
      ops::OpId::kReduceScatter, inputs, opts.timeout,
      [&] {
        check_pairs(outputs, inputs, "reduce_scatter_tensor");
        const char* why = nullptr;
        for (size_t i = 0; i < inputs.size() && !why; ++i) {
          why = reduce_scatter_rejects(outputs[i], inputs[i], opts.reduceOp);
        }
        return why;
      },
      [&] { return "coalesced " + describe(outputs) + " " + reduce_op_text(opts.reduceOp); },
      [&] {
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_reduce_scatter_tensor(outputs[i], inputs[i], opts.reduceOp, opts.timeout);
        }
        return ran(static_cast<int>(inputs.size()));
      });
}

HierarchyOutcome Hierarchy::reduce_scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ReduceScatterOptions& opts) {
  const size_t W = layout_.host.size();
  return enter(
      ops::OpId::kReduceScatter, outputs, opts.timeout,
      [&]() -> const char* {
        if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].size() != W) {
          return reason::kSeveralTensors;
        }
        if (const char* why = rejects(outputs)) return why;
        if (const char* why = rejects(inputs[0])) return why;
        for (const auto& t : inputs[0]) {
          TORCH_CHECK(
              t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
              "cuda_p2p reduce_scatter: every input must have the output's ", outputs[0].numel(),
              " elements of ", outputs[0].scalar_type(), ", got ", t.numel(), " of ",
              t.scalar_type());
        }
        return rejects_reduction(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
      },
      [&] { return describe(outputs) + " " + reduce_op_text(opts.reduceOp); },
      [&] {
        at::Tensor& output = outputs[0];
        const int64_t n = output.numel();
        at::Tensor in = at::empty({n * static_cast<int64_t>(W)}, output.options());
        for (size_t r = 0; r < W; ++r) {
          in.narrow(0, static_cast<int64_t>(r) * n, n).copy_(inputs[0][r].reshape(-1));
        }
        at::Tensor out = detail::contiguous_output(output);
        reduce_scatter_two_level(in, out.view(-1), opts.reduceOp, opts.timeout);
        if (!out.is_same(output)) output.copy_(out);
        return ran();
      });
}

HierarchyOutcome Hierarchy::broadcast(std::vector<at::Tensor>& tensors,
                                      const c10d::BroadcastOptions& opts) {
  const int W = static_cast<int>(layout_.host.size());
  return enter(
      ops::OpId::kBroadcast, tensors, opts.timeout,
      [&] {
        const char* why = tensors.size() != 1 || opts.rootTensor != 0 ? reason::kSeveralTensors
                                                                      : rejects(tensors);
        TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < W,
                    "cuda_p2p broadcast: root must be a rank in [0, ", W, "), got ", opts.rootRank);
        return why;
      },
      [&] { return describe(tensors) + " from root " + std::to_string(opts.rootRank); },
      [&] {
        at::Tensor& t = tensors[0];
        at::Tensor work = t.contiguous();
        const int root = static_cast<int>(opts.rootRank);
        broadcast_two_level(work.view(-1), root, opts.timeout);
        if (!work.is_same(t)) t.copy_(work);
        // The root's local index exists on every host: the same scheme as on even hosts.
        const bool direct = layout_.local[root] < layout_.min_host_size();
        return HierarchyOutcome{
            .ran = true, .path = direct ? "hierarchical" : "hierarchical_leaders", .runs = 1};
      });
}

// --- the per-op parts ---------------------------------------------------------------------------

void Hierarchy::check_pairs(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const char* op) {
  TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "cuda_p2p ", op,
              " (coalesced): expected as many outputs as inputs (at least one), got ",
              outputs.size(), " and ", inputs.size());
}

const char* Hierarchy::all_gather_rejects(const at::Tensor& output, const at::Tensor& input) const {
  if (const char* why = rejects({input, output})) return why;
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  TORCH_CHECK(output.numel() == input.numel() * W && output.scalar_type() == input.scalar_type(),
              "cuda_p2p all_gather_into_tensor: the output must have world size (", W,
              ") times the input's ", input.numel(), " elements of ", input.scalar_type(), ", got ",
              output.numel(), " of ", output.scalar_type());
  return nullptr;
}

void Hierarchy::run_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                           std::chrono::milliseconds timeout) {
  at::Tensor out = detail::contiguous_output(output);
  all_gather_two_level(input.contiguous().view(-1), out.view(-1), timeout);
  if (!out.is_same(output)) output.copy_(out);
}

const char* Hierarchy::reduce_scatter_rejects(const at::Tensor& output, const at::Tensor& input,
                                              const c10d::ReduceOp& op) const {
  if (const char* why = rejects({input, output})) return why;
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  TORCH_CHECK(input.numel() == output.numel() * W && output.scalar_type() == input.scalar_type(),
              "cuda_p2p reduce_scatter_tensor: the input must have world size (", W,
              ") times the output's ", output.numel(), " elements of ", output.scalar_type(),
              ", got ", input.numel(), " of ", input.scalar_type());
  return rejects_reduction(op, output.scalar_type(), "reduce_scatter_tensor");
}

void Hierarchy::run_reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                          const c10d::ReduceOp& op,
                                          std::chrono::milliseconds timeout) {
  at::Tensor out = detail::contiguous_output(output);
  reduce_scatter_two_level(input.contiguous().view(-1), out.view(-1), op, timeout);
  if (!out.is_same(output)) output.copy_(out);
}

// --- algorithms ---------------------------------------------------------------------------------

void Hierarchy::all_reduce_two_level(const at::Tensor& t, const c10d::ReduceOp& op,
                                     std::chrono::milliseconds timeout) {
  const int64_t N = t.numel();
  if (N == 0) return;
  const int H = layout_.num_hosts();
  if (!even_) {
    // Leaders: the host's sum, reduced among the hosts' first ranks, handed to the rest.
    intra_all_reduce(t, partial_op(op));
    if (local_ == 0) {
      inter_all_reduce(t, partial_op(op), timeout);
      if (is_avg(op)) t.div_(static_cast<int64_t>(layout_.host.size()));
    }
    intra_broadcast(t, 0);
    return;
  }
  // Each local index reduces 1/L of the tensor across hosts; padded to a multiple of L (the
  // padding's values are reduced and dropped).
  const int64_t L = static_cast<int64_t>(layout_.hosts[host_].size());
  const int64_t chunk = (N + L - 1) / L;
  at::Tensor full = t;
  if (chunk * L != N) {
    full = at::empty({chunk * L}, t.options());
    full.narrow(0, 0, N).copy_(t);
    full.narrow(0, N, chunk * L - N).zero_();
  }
  at::Tensor part = at::empty({chunk}, t.options());
  intra_reduce_scatter(part, full, op);  // an intra AVG divides by L ...
  inter_all_reduce(part, partial_op(op), timeout);
  if (is_avg(op)) part.div_(H);  // ... and this by H
  intra_all_gather(full, part);
  if (!full.is_same(t)) t.copy_(full.narrow(0, 0, N));
}

void Hierarchy::all_gather_two_level(const at::Tensor& input, const at::Tensor& output,
                                     std::chrono::milliseconds timeout) {
  const int64_t n = input.numel();
  if (n == 0) return;
  const int H = layout_.num_hosts();
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  if (!even_) {
    // Leaders: the host's blocks (padded to the largest host) cross once per host; the leader
    // places every rank's block and broadcasts the whole output on its host.
    int64_t widest = 0;
    for (const auto& h : layout_.hosts) widest = std::max<int64_t>(widest, h.size());
    const int64_t L = static_cast<int64_t>(layout_.hosts[host_].size());
    at::Tensor host_blocks = at::empty({widest * n}, input.options());
    host_blocks.narrow(0, L * n, (widest - L) * n).zero_();
    intra_all_gather(host_blocks.narrow(0, 0, L * n), input);
    if (local_ == 0) {
      at::Tensor all = at::empty({H * widest * n}, input.options());
      inter_all_gather(all, host_blocks, timeout);
      for (int h = 0; h < H; ++h) {
        const auto& ranks = layout_.hosts[h];
        for (size_t k = 0; k < ranks.size(); ++k) {
          output.narrow(0, ranks[k] * n, n)
              .copy_(all.narrow(0, (h * widest + static_cast<int64_t>(k)) * n, n));
        }
      }
    }
    intra_broadcast(output, 0);
    return;
  }
  // Inter first: each rank receives (H - 1) blocks over the slow link - the least it can, since
  // every host must receive every other host's blocks once - and the intra all-gather
  // multiplies them on the fast one. The reverse order would send every host's L blocks to each
  // of its L ranks' peers: L times the inter-host bytes.
  at::Tensor gathered = at::empty({H * n}, input.options());
  inter_all_gather(gathered, input, timeout);
  at::Tensor blocks = at::empty({W * n}, input.options());
  intra_all_gather(blocks, gathered);
  output.view({W, n}).index_copy_(0, order_, blocks.view({W, n}));  // NOTE [Block order]
}

void Hierarchy::reduce_scatter_two_level(const at::Tensor& input, const at::Tensor& output,
                                         const c10d::ReduceOp& op,
                                         std::chrono::milliseconds timeout) {
  const int64_t n = output.numel();
  if (n == 0) return;
  const int H = layout_.num_hosts();
  const int64_t W = static_cast<int64_t>(layout_.host.size());
  if (!even_) {
    // Leaders: the whole input is reduced (host, then hosts) and handed to every rank, which
    // keeps its block.
    at::Tensor all = input.clone();
    intra_all_reduce(all, partial_op(op));
    if (local_ == 0) {
      inter_all_reduce(all, partial_op(op), timeout);
      if (is_avg(op)) all.div_(W);
    }
    intra_broadcast(all, 0);
    output.copy_(all.narrow(0, rank_ * n, n));
    return;
  }
  // NOTE [Block order]: local index i gets the host's sum of the blocks of local index i on
  // every host, and the inter step scatters them by host.
  at::Tensor arranged = input.view({W, n}).index_select(0, order_).view(-1);
  at::Tensor part = at::empty({H * n}, input.options());
  intra_reduce_scatter(part, arranged, op);
  inter_reduce_scatter(output, part, partial_op(op), timeout);
  if (is_avg(op)) output.div_(H);
}

void Hierarchy::broadcast_two_level(const at::Tensor& t, int root,
                                    std::chrono::milliseconds timeout) {
  if (t.numel() == 0) return;
  const int root_host = layout_.host[root];
  const int root_local = layout_.local[root];
  // The inter step runs among the ranks of the root's local index when it exists on every host,
  // else among the leaders, after an intra broadcast on the root's host got it to its leader.
  const int carrier = root_local < layout_.min_host_size() ? root_local : 0;
  if (carrier != root_local && host_ == root_host) intra_broadcast(t, root_local);
  if (local_ == carrier) inter_broadcast(t, root_host, timeout);
  if (carrier == root_local || host_ != root_host) intra_broadcast(t, carrier);
}

// --- steps --------------------------------------------------------------------------------------

// Errors of the steps name their sub-group's ranks (a host's local indices, an inter group's
// host numbers): these say which of the group's ranks those are.
template <typename F>
void Hierarchy::intra_step(F&& step) {
  try {
    step();
  } catch (const c10::Error& e) {
    const auto& ranks = layout_.hosts[host_];
    const std::string msg = "cuda_p2p hierarchical: the step on host " + std::to_string(host_) +
                            "'s workspace failed (its ranks 0-" + std::to_string(ranks.size() - 1) +
                            " are the group's ranks " + rank_list(ranks) +
                            "): " + e.what_without_backtrace();
    if (dynamic_cast<const c10::DistBackendError*>(&e)) C10_THROW_ERROR(DistBackendError, msg);
    C10_THROW_ERROR(Error, msg);
  }
}

template <typename F>
void Hierarchy::inter_step(F&& step) {
  TORCH_INTERNAL_ASSERT(inter_, "cuda_p2p hierarchy: local index ", local_, " has no inter step");
  try {
    step();
  } catch (const c10::Error& e) {
    std::vector<int> ranks;
    for (const auto& h : layout_.hosts) ranks.push_back(h[local_]);
    const std::string msg = "cuda_p2p hierarchical: the inter-host step among local index " +
                            std::to_string(local_) + " failed (its ranks 0-" +
                            std::to_string(ranks.size() - 1) + " are the group's ranks " +
                            rank_list(ranks) + "): " + e.what_without_backtrace();
    if (dynamic_cast<const c10::DistBackendError*>(&e)) C10_THROW_ERROR(DistBackendError, msg);
    C10_THROW_ERROR(Error, msg);
  }
}

// A host of one rank has no intra step to take (copies where the step has an output).

void Hierarchy::intra_all_reduce(const at::Tensor& t, c10d::ReduceOp op) {
  if (intra_->getSize() == 1) return;
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = std::move(op);
  intra_step([&] { intra_->allreduce(v, o)->wait(); });
}

void Hierarchy::intra_reduce_scatter(const at::Tensor& out, const at::Tensor& in,
                                     c10d::ReduceOp op) {
  if (intra_->getSize() == 1) {
    out.copy_(in);
    return;
  }
  at::Tensor o_ = out, i_ = in;
  c10d::ReduceScatterOptions o;
  o.reduceOp = std::move(op);
  intra_step([&] { intra_->_reduce_scatter_base(o_, i_, o)->wait(); });
}

void Hierarchy::intra_all_gather(const at::Tensor& out, const at::Tensor& in) {
  if (intra_->getSize() == 1) {
    out.copy_(in);
    return;
  }
  at::Tensor o_ = out, i_ = in;
  intra_step([&] { intra_->_allgather_base(o_, i_, c10d::AllgatherOptions())->wait(); });
}

void Hierarchy::intra_broadcast(const at::Tensor& t, int local_root) {
  if (intra_->getSize() == 1) return;
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = local_root;
  intra_step([&] { intra_->broadcast(v, o)->wait(); });
}

void Hierarchy::inter_all_reduce(const at::Tensor& t, c10d::ReduceOp op,
                                 std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = std::move(op);
  o.timeout = timeout;
  inter_step([&] { inter_->allreduce(v, o)->wait(); });
}

void Hierarchy::inter_all_gather(const at::Tensor& out, const at::Tensor& in,
                                 std::chrono::milliseconds timeout) {
  // As bytes: moving data needs no dtype, and Gloo moves no int16.
  at::Tensor o_ = out.view(at::kByte), i_ = in.view(at::kByte);
  c10d::AllgatherOptions o;
  o.timeout = timeout;
  inter_step([&] { inter_->_allgather_base(o_, i_, o)->wait(); });
}

void Hierarchy::inter_reduce_scatter(const at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op,
                                     std::chrono::milliseconds timeout) {
  at::Tensor o_ = out, i_ = in;
  c10d::ReduceScatterOptions o;
  o.reduceOp = std::move(op);
  o.timeout = timeout;
  inter_step([&] { inter_->_reduce_scatter_base(o_, i_, o)->wait(); });
}

void Hierarchy::inter_broadcast(const at::Tensor& t, int root_host,
                                std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> v{t.view(at::kByte)};  // as bytes (see inter_all_gather)
  c10d::BroadcastOptions o;
  o.rootRank = root_host;
  o.timeout = timeout;
  inter_step([&] { inter_->broadcast(v, o)->wait(); });
}

// --- lifecycle ----------------------------------------------------------------------------------

void Hierarchy::set_timeout(std::chrono::milliseconds timeout) {
  intra_->setTimeout(timeout);
  if (inter_) inter_->setTimeout(timeout);
}

void Hierarchy::abort() {
  intra_->abort();
  if (inter_) inter_->abort();
}

void Hierarchy::shutdown() {
  intra_->shutdown();
  if (inter_) inter_->shutdown();
}

}  // namespace cuda_p2p
