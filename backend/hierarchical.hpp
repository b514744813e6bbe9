// Hierarchical collectives: a group whose ranks span hosts (docs/across_hosts.md).
//
// No workspace spans hosts, so such a group keeps one workspace per host and composes two kinds
// of collectives: intra-host ones on this host's workspace (a cuda_p2p backend over this host's
// ranks, "intra") and inter-host ones on the wrapped backend (a Gloo backend over this rank and
// its peers with the same local index on the other hosts, "inter"). Both are created by the
// Python layer at group construction (every rank takes part; torch's wheel ships no Gloo
// headers), and handed to the group's backend (ProcessGroupCudaP2P::set_hierarchy).
//
// Hosts with the same number of ranks ("even") split every payload among local indices, so that
// each rank moves 1/L of it over the slow link:
//   all-reduce      intra reduce-scatter -> inter all-reduce of the own chunk -> intra all-gather
//   all-gather      inter all-gather (same local index) -> intra all-gather
//   reduce-scatter  intra reduce-scatter -> inter reduce-scatter
//   broadcast       inter broadcast (the root's local index) -> intra broadcast
// Uneven hosts (3 + 1 ranks) have no common split: the first rank of each host (its "leader",
// local index 0) carries the host's whole payload over the slow link, and an intra broadcast
// hands the result to the others. Only CPU tensors take these paths: a group driving a GPU keeps
// NCCL (hierarchical by itself) for CUDA tensors.
//
// Before any of them moves data, the whole group agrees on the call (NOTE [Hierarchical
// agreement] in hierarchy_agreement.cpp): a mismatch is the same error on every rank, naming group
// ranks. Every entry takes the same steps (NOTE [One hierarchical entry] in
// hierarchy_entry.hpp); each op's entry is in its slice, backend/collectives/<op>.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "backend/hierarchy_agreement.hpp"
#include "ops/op_signature.hpp"

namespace cuda_p2p {

// Which host each rank of a group is on. Hosts are numbered by their lowest rank; a rank's local
// index is its position among its host's ranks (ascending).
struct HostLayout {
  // host_of[r]: the host of rank r (any labels; renumbered here).
  explicit HostLayout(const std::vector<int64_t>& host_of);

  int num_hosts() const { return static_cast<int>(hosts.size()); }
  // Whether every host has the same number of ranks.
  bool even() const;
  // The fewest ranks a host has: local indices below it exist on every host.
  int min_host_size() const;

  std::vector<int> host;                // by rank
  std::vector<int> local;               // by rank: its local index
  std::vector<std::vector<int>> hosts;  // by host: its ranks, ascending
};

// What a hierarchical entry did, for the group's counters (backend/counters.hpp).
struct HierarchyOutcome {
  // Ran hierarchically, done on return; else nothing was moved and the caller runs the op flat.
  bool ran = false;
  // When it ran: "hierarchical" (the payload split among local indices) or
  // "hierarchical_leaders" (each host's first rank carries it), once per op run (`runs`: the
  // coalesced forms run one per pair).
  const char* path = nullptr;
  int runs = 0;
  // An all-reduce that rode in the agreement (NOTE [Hierarchical agreement]).
  bool in_agreement = false;
  // When it did not run: why the call goes flat ("device", "dtype", "several_tensors", ...), or
  // null when it declined without a word (a CUDA barrier on a group with NCCL).
  const char* flat = nullptr;
};

class Hierarchy {
 public:
  // `intra`: a cuda_p2p backend over this host's ranks (rank = local index). `inter`: a backend
  // over the ranks with this rank's local index on every host (rank = host number), present when
  // that local index exists on every host (local index < min_host_size()), else null. `nccl`: the
  // group wraps NCCL, which keeps its CUDA tensors' collectives without an agreement (NOTE
  // [Hierarchical agreement]).
  Hierarchy(int rank, HostLayout layout, c10::intrusive_ptr<c10d::Backend> intra,
            c10::intrusive_ptr<c10d::Backend> inter, bool nccl = false);

  const HostLayout& layout() const { return layout_; }
  const c10::intrusive_ptr<c10d::Backend>& intra() const { return intra_; }
  const c10::intrusive_ptr<c10d::Backend>& inter() const { return inter_; }

  // Each runs the collective hierarchically (`ran`, with the path it took: "hierarchical", or
  // "hierarchical_leaders" on uneven hosts), or returns without having communicated, with the
  // reason (`flat`), when these arguments cannot take the hierarchical path: the caller then runs
  // the op flat on the wrapped backend. Every rank decides alike from what its arguments agree
  // on (devices, dtypes, counts, reduce op), after the group agreed on them (an all-reduce may
  // ride in the agreement: `in_agreement`) (NOTE [Hierarchical agreement]): a mismatch throws
  // ops::SignatureMismatch on every rank, and a rank whose own arguments are invalid throws its
  // own error. Blocking: done on return.
  HierarchyOutcome all_reduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  HierarchyOutcome all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts);
  HierarchyOutcome all_gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                          const c10d::AllgatherOptions& opts);
  HierarchyOutcome reduce_scatter(std::vector<at::Tensor>& outputs,
                                  std::vector<std::vector<at::Tensor>>& inputs,
                                  const c10d::ReduceScatterOptions& opts);
  HierarchyOutcome reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                         const c10d::ReduceScatterOptions& opts);
  HierarchyOutcome broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts);
  // The coalesced forms (_coalescing_manager, FSDP): every pair in order (`runs`: one per pair),
  // or none when one pair cannot take the hierarchical path.
  HierarchyOutcome all_gather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts);
  HierarchyOutcome reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::ReduceScatterOptions& opts);

  // A barrier of the whole group: the agreement alone (path "hierarchical"); not run, without
  // communicating and without a reason, for a CUDA device's barrier on a group with NCCL.
  HierarchyOutcome barrier(const c10d::BarrierOptions& opts);
  // For a call that runs flat on the wrapped backend (all_gather_v): runs `checks` (a TORCH_CHECK
  // failure makes the signature invalid), agrees on `text` across the group, then rethrows the
  // checks' error if any. `tensors`: what the call passes (CUDA ones on a group with NCCL skip it).
  void agree_flat(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                  const std::function<void()>& checks, const std::function<std::string()>& text,
                  std::chrono::milliseconds timeout);
  // Bench knob (bench/bench_collectives.py --agreement-cost): off skips the agreement, to measure
  // what it costs. Mismatched arguments then crash or hang the group.
  void set_agreement(bool on) { agreement_on_ = on; }

  // Forwarded to the intra and inter backends.
  void set_timeout(std::chrono::milliseconds timeout);
  void abort();
  void shutdown();

 private:
  // Why `tensors` cannot take the hierarchical path (nullptr when they can).
  static const char* rejects(c10::ArrayRef<at::Tensor> tensors);
  // Why this reduce op and dtype cannot (nullptr when they can); TORCH_CHECKs combinations that
  // fail on every path (AVG on integers, bitwise ops on floats).
  static const char* rejects_reduction(const c10d::ReduceOp& op, at::ScalarType dtype,
                                       const char* what);
  // The entry every collective above takes (NOTE [One hierarchical entry]): `screen` returns why
  // the call goes flat (nullptr: it can run hierarchically) and may TORCH_CHECK the arguments;
  // `text` names them in the signature; `run` runs the algorithm and returns what ran. With an
  // `inline_op` (an all-reduce), `run` takes the tensor that rode in the agreement (undefined when
  // none did) and whether it did.
  template <typename Screen, typename Text, typename Run>
  HierarchyOutcome enter(ops::OpId kind, c10::ArrayRef<at::Tensor> tensors,
                         std::chrono::milliseconds timeout, Screen&& screen, Text&& text, Run&& run,
                         const c10d::ReduceOp* inline_op = nullptr);
  // TORCH_CHECKs a coalesced call's pairs: as many outputs as inputs, at least one.
  static void check_pairs(const std::vector<at::Tensor>& outputs,
                          const std::vector<at::Tensor>& inputs, const char* op);
  // Why one (output, input) pair of all_gather_into_tensor / reduce_scatter_tensor cannot take
  // the hierarchical path (nullptr when it can); TORCH_CHECKs their sizes and dtypes.
  const char* all_gather_rejects(const at::Tensor& output, const at::Tensor& input) const;
  const char* reduce_scatter_rejects(const at::Tensor& output, const at::Tensor& input,
                                     const c10d::ReduceOp& op) const;
  // One accepted pair, run (the caller holds mutex_).
  void run_all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                  std::chrono::milliseconds timeout);
  void run_reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                 const c10d::ReduceOp& op, std::chrono::milliseconds timeout);
  // Not run, going flat for `why`.
  static HierarchyOutcome decline(const char* why) { return {.flat = why}; }
  // Ran on the path of this group's hosts, `runs` times.
  HierarchyOutcome ran(int runs = 1) const { return {.ran = true, .path = path(), .runs = runs}; }
  // Whether this call skips the agreement: every tensor on CUDA and the group wraps NCCL.
  bool on_nccl(c10::ArrayRef<at::Tensor> tensors) const;
  // The agreement (HierarchyAgreement::agree) on this hierarchy's steps, unless the bench knob
  // turned it off (then false); the caller holds mutex_.
  bool agree(const ops::OpSignature& mine, std::chrono::milliseconds timeout,
             const at::Tensor& payload = at::Tensor(), const c10d::ReduceOp& op = c10d::ReduceOp());
  // The signature of a call of `kind` described by `text`: invalid with `error` when the rank's
  // own checks failed, marked with the flat route `why` when it goes to the wrapped backend.
  static ops::OpSignature signature(ops::OpId kind, std::string text, const char* why,
                                    const std::string& error);
  // Runs an intra- or inter-host step, naming the group's ranks in its error (the step's own
  // error names the sub-group's ranks).
  template <typename F>
  void intra_step(F&& step);
  template <typename F>
  void inter_step(F&& step);
  const char* path() const { return even_ ? "hierarchical" : "hierarchical_leaders"; }

  // The two-level algorithms, on contiguous 1-D tensors of one dtype.
  void all_reduce_two_level(const at::Tensor& t, const c10d::ReduceOp& op,
                            std::chrono::milliseconds timeout);
  void all_gather_two_level(const at::Tensor& input, const at::Tensor& output,
                            std::chrono::milliseconds timeout);
  void reduce_scatter_two_level(const at::Tensor& input, const at::Tensor& output,
                                const c10d::ReduceOp& op, std::chrono::milliseconds timeout);
  void broadcast_two_level(const at::Tensor& t, int root, std::chrono::milliseconds timeout);

  // Intra-host steps (on every rank of this host) and inter-host steps (on the ranks with this
  // local index), each blocking.
  void intra_all_reduce(const at::Tensor& t, c10d::ReduceOp op);
  void intra_reduce_scatter(const at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op);
  void intra_all_gather(const at::Tensor& out, const at::Tensor& in);
  void intra_broadcast(const at::Tensor& t, int local_root);
  void inter_all_reduce(const at::Tensor& t, c10d::ReduceOp op, std::chrono::milliseconds timeout);
  void inter_all_gather(const at::Tensor& out, const at::Tensor& in,
                        std::chrono::milliseconds timeout);
  void inter_reduce_scatter(const at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op,
                            std::chrono::milliseconds timeout);
  void inter_broadcast(const at::Tensor& t, int root_host, std::chrono::milliseconds timeout);

  const int rank_;
  const HostLayout layout_;
  const int host_;   // this rank's host
  const int local_;  // this rank's local index
  const bool even_;
  c10::intrusive_ptr<c10d::Backend> intra_;
  c10::intrusive_ptr<c10d::Backend> inter_;
  const bool nccl_;
  bool agreement_on_ = true;
  HierarchyAgreement agreement_;  // under mutex_
  // order_[i * H + h] = the rank with local index i on host h (even hosts): the position of each
  // rank's block after an inter all-gather followed by an intra all-gather (NOTE [Block order]).
  at::Tensor order_;
  // One hierarchical op at a time: its intra and inter steps must pair with the same op's steps
  // on the other ranks, also when several threads share the group.
  std::mutex mutex_;
};

}  // namespace cuda_p2p
