// Groups made from a cuda_p2p group: shrink (the survivors of dead ranks), split (a subset of its
// ranks) and merge (ranks of several groups). NOTE [Child groups].
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/dispatcher_group.hpp"

namespace cuda_p2p {

// NOTE [Child groups]
// torch makes a group from another through the backend: ProcessGroup::splitGroup (dist.split_group,
// DeviceMesh on a group with a bound GPU) calls split() on every rank of the parent,
// dist.shrink_group calls shrink() on the survivors of dead ranks, merge_remote_group calls
// merge() on every rank that joins. None of them calls cuda_p2p's Python creator, so the child
// is made here, the way that creator makes a group: a cuda_p2p backend with a workspace of its
// own (its rendezvous under the child's store, among the child's ranks only), over wrapped
// backends made for the child from this group's:
//  - the wrapped backends under "gloo/" and "nccl/" of the child's store, as the creator puts
//    them. Gloo splits and merges (it builds a new Gloo group over the store, among the child's
//    ranks, without a word to its parent's peers) but cannot shrink: a shrink re-creates it over
//    the survivors through its split, which needs nothing of the dead ranks. NCCL splits (a
//    collective of every parent rank, so a rank outside the child takes part too) and shrinks
//    (ncclCommShrink, among the survivors); without ncclCommShrink a shrink of a group with a
//    CUDA backend fails, saying so.
//  - options: those torch passes (a copy of this group's, named and timed for the child), or the
//    caller's override (a cuda_p2p Options), else a copy of this group's;
//  - a group spanning hosts gets a hierarchy as its parent had (backend/hierarchical.hpp), its
//    intra-host and inter-host Gloo groups split from the parent's Gloo; a merged group runs
//    flat (its ranks' hosts are not known to any one parent).
// A shrink's store is this group's, under "cuda_p2p/shrink/<n>/without_<ranks>/": every survivor
// has shrunk the group n times before and names the same dead ranks, so the survivors meet there
// and nowhere else, and a shrink retried with other dead ranks does not meet a stale one.
namespace {

constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT

// A copy of the options of wrapped backend `b`, for its child: the child's timeout and name.
// Null when `b` has none (torch then uses its backend's defaults). Before torch had
// Options::clone, `b`'s own options (which its split only reads, but for the global ranks).
c10::intrusive_ptr<c10d::Backend::Options> wrapped_options(c10d::Backend& b, const Options& child) {
  c10::intrusive_ptr<c10d::Backend::Options> o;
  try {
    o = b.getBackendOptions();
  } catch (const c10::Error&) {
    return {};
  }
  if (!o) return {};
#ifdef CUDA_P2P_C10D_HAS_OPTIONS_CLONE
  o = o->clone();
  o->timeout = child.timeout;
  o->group_name = child.group_name;
#else
  (void)child;
#endif
  return o;
}

c10::intrusive_ptr<c10d::Store> prefixed(const std::string& prefix,
                                         const c10::intrusive_ptr<c10d::Store>& store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, store);
}

int index_of(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace

c10::intrusive_ptr<Options> ProcessGroupCudaP2P::child_options(
    const c10::intrusive_ptr<c10d::Backend::Options>& given, const char* what) const {
  const c10d::Backend::Options& source = given ? *given : *options_;
  // A copy: the caller's object, or this group's live options, stay as they are.
  if (const auto* typed = dynamic_cast<const Options*>(&source)) {
    return c10::make_intrusive<Options>(*typed);
  }
  // c10d's own options naming this backend (torch 2.11's getBackendOptions() gives those: the GPU
  // run of 2026-12-04 refused its split): this group's options with the c10d fields they set.
  TORCH_CHECK(source.backend == kBackendName, "cuda_p2p ", what,
              ": expected the options of a cuda_p2p group (cuda_p2p.ProcessGroupCudaP2P.Options), "
              "got options of backend '",
              source.backend, "'");
  auto merged = c10::make_intrusive<Options>(*options_);
  merged->timeout = source.timeout;
  merged->group_name = source.group_name;
  return merged;
}

c10::intrusive_ptr<ProcessGroupCudaP2P> ProcessGroupCudaP2P::make_child(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    c10::intrusive_ptr<Options> options, c10::intrusive_ptr<c10d::Backend> cpu,
    c10::intrusive_ptr<c10d::Backend> cuda) {
  const int me = index_of(ranks, getRank());
  const int size = static_cast<int>(ranks.size());
  TORCH_INTERNAL_ASSERT(me >= 0, "cuda_p2p: a child group must contain this rank");
  const auto& parent_global = options_->global_ranks_in_group;
  options->global_ranks_in_group.clear();
  for (int r : ranks) {
    options->global_ranks_in_group.push_back(parent_global.size() == static_cast<size_t>(getSize())
                                                 ? parent_global[r]
                                                 : static_cast<uint64_t>(r));
  }
  auto child = c10::make_intrusive<ProcessGroupCudaP2P>(store, me, size, options, std::move(cpu),
                                                        std::move(cuda), bound_cuda_device_);
  child->cuda_backend_factory_ = cuda_backend_factory_;
  if (!hierarchy_ || child->is_p2p_available() || size < 2) return child;

  // A hierarchy over the child's ranks, laid out on the hosts as they are in this group.
  const HostLayout& layout = hierarchy_->layout();
  std::vector<int64_t> host_of;
  for (int r : ranks) host_of.push_back(layout.host[r]);
  const HostLayout child_layout(host_of);
  if (child_layout.num_hosts() < 2) return child;  // one host whose workspace failed: flat
  const int host = child_layout.host[me];
  const int local = child_layout.local[me];
  std::vector<int> intra_ranks;  // this group's ranks of the child's ranks on this rank's host
  for (int c : child_layout.hosts[host]) intra_ranks.push_back(ranks[c]);
  c10d::Backend& gloo = *wrapped_.cpu();
  const std::string prefix = "cuda_p2p/hierarchy/";
  auto intra_store = prefixed(prefix + "intra/" + std::to_string(host) + "/", store);
  auto intra_options = c10::make_intrusive<Options>(*options);
  intra_options->group_name = options->group_name + "/host" + std::to_string(host);
  // The hierarchical collectives are for CPU tensors: a host workspace, as the Python layer does.
  intra_options->workspace_device = "cpu";
  intra_options->global_ranks_in_group.clear();
  for (int c : child_layout.hosts[host]) {
    intra_options->global_ranks_in_group.push_back(options->global_ranks_in_group[c]);
  }
  auto intra_gloo = gloo.split(prefixed("gloo/", intra_store), intra_ranks,
                               wrapped_options(gloo, *intra_options));
  auto intra = c10::make_intrusive<ProcessGroupCudaP2P>(
      intra_store, local, static_cast<int>(intra_ranks.size()), intra_options,
      std::move(intra_gloo), nullptr);
  c10::intrusive_ptr<c10d::Backend> inter;
  if (local < child_layout.min_host_size()) {
    std::vector<int> inter_ranks;  // this group's ranks of local index `local` on every host
    for (const auto& h : child_layout.hosts) inter_ranks.push_back(ranks[h[local]]);
    inter = gloo.split(prefixed(prefix + "inter/" + std::to_string(local) + "/", store),
                       inter_ranks, wrapped_options(gloo, *options));
  }
  child->set_hierarchy(host_of, std::move(intra), std::move(inter));
  return child;
}

#ifdef CUDA_P2P_C10D_HAS_GROUP_UID
void ProcessGroupCudaP2P::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  options_->group_name = pg_uid;
  // NOTE [The default group's name] in backend/dispatcher_group.cpp: torch names a shrunk
  // default group, which becomes the default group, after it is made.
  if (succeeds_default_group_) set_default_group_name(pg_uid);
}
#endif

void ProcessGroupCudaP2P::forget_peers(const std::vector<int>& ranks) {
  if (workspace_) workspace_->forget_peers(ranks);
  if (SymmetricWorkspace* heap = heap_.heap()) heap->forget_peers(ranks);
  if (!hierarchy_) return;
  // The ranks gone from this rank's host, as its intra-host group numbers them.
  const HostLayout& layout = hierarchy_->layout();
  std::vector<int> local;
  for (int r : ranks) {
    if (layout.host[r] == layout.host[getRank()]) local.push_back(layout.local[r]);
  }
  auto* intra = dynamic_cast<ProcessGroupCudaP2P*>(hierarchy_->intra().get());
  if (intra && !local.empty()) intra->forget_peers(local);
}

#ifdef CUDA_P2P_C10D_HAS_SHRINK
// NOTE [Shrinking past dead ranks]
// dist.shrink_group([dead]) on the survivors of a rank that died: shrink() gives them a group of
// the W - k survivors (NOTE [Child groups]), and torch then destroys this one. The survivors
// never wait for a dead rank on the way:
//  - this group's workspace and heap stop waiting for the dead ranks' "closed" keys (NOTE
//    [Block lifetime] in p2p_workspace/block_retirement.cpp), so their destruction - torch's
//    destroy_process_group right after - frees this rank's blocks once the survivors closed them;
//    and their device drops the dead ranks' failure areas (NOTE [Failure words] in
//    p2p_workspace/watchdog.hpp): this rank's failure, SHRINK_ABORT's included, is told to the
//    survivors only, and a dead rank's area is unmapped here, not when the group goes;
//  - the child's workspace is a new one, under a store prefix of its own, among the survivors;
//    its wrapped Gloo is a new one too (Gloo cannot shrink); NCCL shrinks.
// NOTE [Shrinking a CUDA backend never used]
// torch creates ProcessGroupNCCL lazily: its communicator is made at its first op. A cuda_p2p
// group whose CUDA ops all went through the workspace never gave its wrapped NCCL an op, so that
// NCCL has no communicator: ncclCommShrink has nothing to shrink (torch raises), and a split
// would first initialize the parent over all its ranks - the dead one included - and hang. So a
// shrink shrinks the wrapped NCCL only when something ran on it (WrappedBackends::cuda_used: an
// op, a barrier, the fused ops' send/recv, a split or merge); otherwise the child gets a fresh
// NCCL over the survivors, made lazily under the shrink's store prefix by the factory Python set
// (set_cuda_backend_factory), as the CPU side's Gloo is made anew. SHRINK_DEFAULT on a used NCCL
// follows NCCL's own rule: no NCCL op of this group may be outstanding.
// SHRINK_ABORT first aborts what is in flight on this group (the abort hooks run, the waits of
// the workspace and the mailboxes raise, the hierarchy aborts; NCCL aborts within its own
// shrink), as NCCL's ncclCommShrink with NCCL_SHRINK_ABORT does: a survivor blocked in an op
// with the dead rank returns with an error. The store must outlive the dead ranks: a rank
// hosting the TCPStore that dies takes the group's rendezvous with it (as for every backend).
c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts_override) {
  const int W = getSize(), me = getRank();
  TORCH_CHECK(shrink_flags == 0 || shrink_flags == kShrinkAbort,
              "cuda_p2p shrink: expected shrink_flags SHRINK_DEFAULT (0) or SHRINK_ABORT (1), got ",
              shrink_flags);
  TORCH_CHECK(!ranks_to_exclude.empty(),
              "cuda_p2p shrink: expected at least one rank to exclude, got none");
  std::vector<bool> gone(W, false);
  std::vector<int> excluded;
  for (int64_t r : ranks_to_exclude) {
    TORCH_CHECK(r >= 0 && r < W, "cuda_p2p shrink: ranks to exclude must be in [0, ", W, "), got ",
                r);
    TORCH_CHECK(r != me, "cuda_p2p shrink: rank ", me,
                " is in ranks_to_exclude; only the ranks that stay call shrink");
    TORCH_CHECK(!gone[r], "cuda_p2p shrink: rank ", r, " is excluded twice");
    gone[r] = true;
  }
  std::vector<int> survivors;
  for (int r = 0; r < W; ++r) (gone[r] ? excluded : survivors).push_back(r);
  auto options = child_options(opts_override, "shrink");

  forget_peers(excluded);
  if (shrink_flags & kShrinkAbort) {
    const std::string why =
        "the group was shrunk with SHRINK_ABORT (ranks " + c10::Join(", ", excluded) + " excluded)";
    abort_hooks_->run(why);  // NOTE [Abort hooks]
    retired_.store(true, std::memory_order_release);
    if (workspace_) workspace_->abort(why);
    send_recv_.fail(why);
    if (hierarchy_) hierarchy_->abort();
    wrapped_.cpu()->abort();  // the wrapped NCCL aborts within its shrink
  }

  std::string prefix = "cuda_p2p/shrink/" + std::to_string(shrinks_.fetch_add(1)) + "/without";
  for (int r : excluded) prefix += "_" + std::to_string(r);
  auto store = prefixed(prefix + "/", store_);

  c10d::Backend& gloo = *wrapped_.cpu();
  c10::intrusive_ptr<c10d::Backend> cpu;
  if (gloo.supportsShrinking()) {
    cpu = gloo.shrink(ranks_to_exclude, shrink_flags, nullptr);
  } else {
    TORCH_CHECK(gloo.supportsSplitting(), "cuda_p2p shrink: the wrapped CPU backend ",
                gloo.getBackendName(), " can neither shrink nor split");
    cpu = gloo.split(prefixed("gloo/", store), survivors, wrapped_options(gloo, *options));
  }
  c10::intrusive_ptr<c10d::Backend> cuda;
  if (const auto& nccl = wrapped_.cuda()) {
    if (wrapped_.cuda_used()) {
      TORCH_CHECK(nccl->supportsShrinking(), "cuda_p2p shrink: the wrapped CUDA backend ",
                  nccl->getBackendName(),
                  " cannot shrink (NCCL needs ncclCommShrink, NCCL 2.27 or later)");
      cuda = nccl->shrink(ranks_to_exclude, shrink_flags, nullptr);
    } else {
      // NOTE [Shrinking a CUDA backend never used]
      TORCH_CHECK(cuda_backend_factory_, "cuda_p2p shrink: the wrapped CUDA backend ",
                  nccl->getBackendName(),
                  " never ran anything, so it has no communicator to shrink, and this group has no "
                  "factory for a fresh one (ProcessGroupCudaP2P::set_cuda_backend_factory)");
      std::vector<uint64_t> global;
      const auto& parent_global = options_->global_ranks_in_group;
      for (int r : survivors) {
        global.push_back(parent_global.size() == static_cast<size_t>(W) ? parent_global[r]
                                                                        : static_cast<uint64_t>(r));
      }
      cuda = cuda_backend_factory_(prefixed("nccl/", store), index_of(survivors, me),
                                   static_cast<int>(survivors.size()), options->timeout, global);
    }
  }
  auto child = make_child(store, survivors, std::move(options), std::move(cpu), std::move(cuda));
  child->succeeds_default_group_ = is_default_group_name(options_->group_name);
  return child;
}
#endif

#ifdef CUDA_P2P_C10D_HAS_SPLIT
c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  const int W = getSize();
  std::vector<bool> seen(W, false);
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < W, "cuda_p2p split: ranks must be in [0, ", W, "), got ", r);
    TORCH_CHECK(!seen[r], "cuda_p2p split: rank ", r, " is listed twice");
    seen[r] = true;
  }
  auto options = child_options(opts, "split");
  // NCCL's split is a collective of every rank of this group: a rank outside the child takes
  // part too (ncclCommSplit without a color), then has no child.
  c10::intrusive_ptr<c10d::Backend> cuda;
  if (const auto& nccl = wrapped_.cuda()) {
    wrapped_.mark_cuda_used();  // the split initializes it
    cuda = nccl->split(prefixed("nccl/", store), ranks, wrapped_options(*nccl, *options));
  }
  if (index_of(ranks, getRank()) < 0) return nullptr;
  c10d::Backend& gloo = *wrapped_.cpu();
  TORCH_CHECK(gloo.supportsSplitting(), "cuda_p2p split: the wrapped CPU backend ",
              gloo.getBackendName(), " cannot split");
  auto cpu = gloo.split(prefixed("gloo/", store), ranks, wrapped_options(gloo, *options));
  return make_child(store, ranks, std::move(options), std::move(cpu), std::move(cuda));
}
#endif

#ifdef CUDA_P2P_C10D_HAS_MERGE
c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::merge(
    const c10::intrusive_ptr<c10d::Store>& store,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts, const int& rank, const int& size) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "cuda_p2p merge: rank must be in [0, ", size,
              "), got ", rank);
  auto options = child_options(opts, "merge");
  options->global_ranks_in_group.clear();  // the merged ranks' global ranks are not known here
  c10d::Backend& gloo = *wrapped_.cpu();
  auto cpu = gloo.merge(prefixed("gloo/", store), wrapped_options(gloo, *options), rank, size);
  c10::intrusive_ptr<c10d::Backend> cuda;
  if (const auto& nccl = wrapped_.cuda()) {
    wrapped_.mark_cuda_used();
    cuda = nccl->merge(prefixed("nccl/", store), wrapped_options(*nccl, *options), rank, size);
  }
  auto merged = c10::make_intrusive<ProcessGroupCudaP2P>(
      store, rank, size, std::move(options), std::move(cpu), std::move(cuda), bound_cuda_device_);
  merged->cuda_backend_factory_ = cuda_backend_factory_;
  return merged;
}
#endif

}  // namespace cuda_p2p
