// broadcast.
#include "backend/entry_sequence.hpp"
#include "backend/hierarchy_entry.hpp"
#include "backend/tensor_args.hpp"
#include "ops/common.hpp"

namespace cuda_p2p {

using ops::call;
using ops::OpId;

namespace {

// Why the workspace cannot take the call (nullptr: it can).
const char* broadcast_screen(const WorkspaceCollectives& collectives,
                             const std::vector<at::Tensor>& tensors,
                             const c10d::BroadcastOptions& opts) {
  if (const char* why = collectives.rejects(tensors)) return why;
  return tensors.size() != 1 || opts.rootTensor != 0 ? reason::kSeveralTensors : nullptr;
}

}  // namespace

ProcessGroupCudaP2P::WorkPtr ProcessGroupCudaP2P::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  return serve(
      call(OpId::kBroadcast), [&] { return hierarchy_->broadcast(tensors, opts); },
      {tensors, tensors, broadcast_screen(collectives_, tensors, opts), opts.asyncOp},
      [&] { return detail::root_text("from", opts.rootRank); },
      [&] { return collectives_.broadcast(tensors[0], opts.rootRank); },
      [&](c10d::Backend& b) { return b.broadcast(tensors, opts); }, [&] { return tensors; });
}

// --- the workspace's body (WorkspaceCollectives) -------------------------------------------------

ops::Outcome WorkspaceCollectives::broadcast(at::Tensor& t, int64_t root) {
  check_or_reject("broadcast", ops::OpId::kBroadcast,
                  [&] { detail::check_root("broadcast", root, size_); });
  at::Tensor work = detail::contiguous_input(t);
  return run("broadcast", [&](const ops::CollectiveContext& ctx) {
    keep({work});
    const ops::Outcome o = ops::broadcast(ctx, work, static_cast<int>(root));
    copy_back(t, work);
    return o;
  });
}

// --- on a group spanning hosts: the hierarchy's entry (NOTE [One hierarchical entry]) ------------

HierarchyOutcome Hierarchy::broadcast(std::vector<at::Tensor>& tensors,
                                      const c10d::BroadcastOptions& opts) {
  const int W = static_cast<int>(layout_.host.size());
  return enter(
      ops::OpId::kBroadcast, tensors, opts.timeout,
      [&] {
        const char* why = tensors.size() != 1 || opts.rootTensor != 0 ? reason::kSeveralTensors
                                                                      : rejects(tensors);
        detail::check_root("broadcast", opts.rootRank, W);
        return why;
      },
      [&] {
        return ops::describe_tensors(tensors) + " from root " + std::to_string(opts.rootRank);
      },
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

}  // namespace cuda_p2p
