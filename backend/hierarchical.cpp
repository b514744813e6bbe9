#include "backend/hierarchical.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>

#include "backend/counters.hpp"
#include "backend/hierarchy_entry.hpp"
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

void Hierarchy::agree_flat(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                           const std::function<void()>& checks,
                           const std::function<std::string()>& text,
                           std::chrono::milliseconds timeout) {
  if (on_nccl(tensors)) {
    checks();
    return;
  }
  const hierarchy_detail::Checked checked = hierarchy_detail::run_checks(checks);
  std::lock_guard<std::mutex> lock(mutex_);
  agree(signature(kind, checked.thrown ? std::string() : text(), nullptr, checked.error), timeout);
  checked.rethrow();
}

// --- the per-op parts ---------------------------------------------------------------------------
// Each op's entry is in its slice (backend/collectives/<op>.cpp), beside its workspace route.

void Hierarchy::check_pairs(const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const char* op) {
  TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "cuda_p2p ", op,
              " (coalesced): expected as many outputs as inputs (at least one), got ",
              outputs.size(), " and ", inputs.size());
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
