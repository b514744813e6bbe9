// ProcessGroupCudaP2P: the c10d backend registered as "cuda_p2p".
//
// It wraps one backend per device type (Gloo for CPU tensors, NCCL for CUDA tensors; both created
// by the Python layer, since torch's wheel ships no Gloo headers). all_reduce, all_gather,
// all_gather_into_tensor, reduce_scatter(_tensor), broadcast, barrier, all_gather_v, the
// all-to-alls (all_to_all_single, all_to_all, all_to_all_v), gather, scatter and reduce run on the
// P2P workspace (ops/collectives.hpp) when it is available and the tensors are on its device;
// everything else, and every case the workspace does not support, goes to the wrapped backend for
// the tensors' device. Every path bumps a counter ("all_reduce.one_shot", "all_reduce.wrapped",
// ...). Works returned by a wrapped backend are handed back unchanged, so completion, errors and
// futures are exactly the wrapped backend's.
//
// Its definitions are split by concern: ProcessGroupCudaP2P.cpp (the lifecycle: construction,
// the workspace's API, counters, abort/shutdown), workspace_collectives.cpp (the workspace
// collectives' entry), workspace_all_to_all.cpp and workspace_gather_scatter.cpp (the entries of
// the all-to-alls and of the rooted gather, scatter and reduce) and wrapped_routing.cpp (routing
// to the wrapped backends, coalescing).
#pragma once

#include <c10/util/FunctionRef.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backend/config.hpp"
#include "backend/counters.hpp"
#include "backend/hierarchical.hpp"
#include "backend/reduce_ops.hpp"
#include "ops/collectives.hpp"
#include "ops/failure_record.hpp"
#include "ops/pipeline_common.hpp"
#include "p2p_workspace/host/mailboxes.hpp"
#include "p2p_workspace/symmetric_heap.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

// The allocator type of torch.cuda.MemPool (c10/cuda/CUDACachingAllocator.h, CUDA builds only).
namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;
}  // namespace c10::cuda::CUDACachingAllocator

namespace cuda_p2p {

namespace detail {
class HeapSegments;  // backend/symmetric_allocator.hpp
}  // namespace detail

class ProcessGroupCudaP2P : public c10d::Backend {
 public:
  static constexpr const char* kBackendName = cuda_p2p::kBackendName;

  // Defined in backend/config.hpp, the one place where configuration is read.
  using Options = cuda_p2p::Options;

  // cpu_backend is required; cuda_backend may be null (no GPU at construction).
  ProcessGroupCudaP2P(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                      c10::intrusive_ptr<Options> options,
                      c10::intrusive_ptr<c10d::Backend> cpu_backend,
                      c10::intrusive_ptr<c10d::Backend> cuda_backend,
                      std::optional<int64_t> bound_cuda_device = std::nullopt);
  ~ProcessGroupCudaP2P() override;

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  const c10::intrusive_ptr<Options>& options() const { return options_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // The wrapped backend for a device type, or null; TORCH_CHECKs for an unsupported type.
  c10::intrusive_ptr<c10d::Backend> wrapped_backend(c10::DeviceType type) const;

  // --- the P2P workspace (docs/design.md §4); its signal channels are in ops/channels.hpp -----
  bool is_p2p_available() const { return workspace_ && workspace_->available(); }
  // Why the workspace is unavailable ("" when it is available).
  std::string p2p_unavailable_reason() const;
  // Bytes of each rank's buffer; 0 when the workspace is unavailable.
  int64_t get_buffer_size() const;
  // A tensor aliasing `rank`'s buffer: a CPU tensor over shared memory, or a CUDA tensor over the
  // IPC mapping.
  at::Tensor get_p2p_buffer(int64_t rank, at::IntArrayRef sizes, at::ScalarType dtype,
                            int64_t storage_offset = 0) const;
  // Barrier through the workspace's signal pads among `ranks` (all when empty). On the host it
  // returns when all arrived; on CUDA it is enqueued on the current stream.
  void intra_node_barrier(const std::vector<int64_t>& ranks = {},
                          std::optional<Millis> timeout = {});
  // Collective: grows every rank's buffer to at least the largest `nbytes` requested.
  void ensure_min_buffer_size(int64_t nbytes);
  // The workspace, or null when it was disabled.
  SymmetricWorkspace* workspace() const { return workspace_.get(); }

  // --- the symmetric heap (backend/symmetric_memory.cpp, backend/symmetric_allocator.cpp;
  // docs/collectives.md, "Zero-copy symmetric tensors") ---
  // The device of the group's heap: its workspace's (the host, or the GPU the group was created
  // on). Raises when the workspace is unavailable.
  at::Device symmetric_device() const;
  // Collective, once: creates the group's heap (Config::symmetric_heap_size bytes per rank on
  // symmetric_device(), mapped into every peer). Later calls return at once. Raises when the
  // workspace is unavailable, and on every rank when a rank cannot allocate its heap (an
  // OutOfMemoryError when it ran out of memory); a later call tries again.
  void ensure_symmetric_heap();
  // Collective (ranks allocate in the same order to get the same offsets): a tensor of `sizes`
  // and `dtype` in this rank's heap, whose block is freed when its storage dies. `device`, when
  // given, must be symmetric_device() (a CUDA device without index: any index is taken as it).
  at::Tensor symmetric_empty(at::IntArrayRef sizes, at::ScalarType dtype,
                             std::optional<at::Device> device = std::nullopt);
  // The offset of `t`'s data (all its storage bytes from its data pointer on) in this rank's
  // heap, or -1 when it is not in it (another device, or no heap).
  int64_t symmetric_offset(const at::Tensor& t) const;
  // `t` (a tensor in this rank's heap) as rank `rank` holds it: a tensor of t's sizes, strides
  // and dtype aliasing `rank`'s heap at t's offset, on this rank's mapping of it. Meaningful when
  // the ranks allocated alike (equal offsets); it keeps the heap's mapping alive.
  at::Tensor symmetric_peer_tensor(const at::Tensor& t, int64_t rank) const;
  // {created, capacity, used_bytes, live_blocks, deferred_blocks, largest_free, segments,
  // segment_bytes} of the heap (zeros before it): blocks count cuda_p2p.empty tensors and MemPool
  // segments alike (deferred: freed on a CUDA heap, NOTE [Heap frees in stream order]), segments
  // those of the MemPool allocator (NOTE [Heap under a MemPool]).
  std::map<std::string, int64_t> symmetric_heap_info() const;
  // CUDA: the allocator of a torch.cuda.MemPool whose segments are carved from this rank's heap
  // (NOTE [Heap under a MemPool] in backend/symmetric_allocator.cpp); collective the first time
  // (creates the heap), then the same allocator on every call. NotImplementedError on a host
  // heap (torch has no allocator hook for CPU tensors) and in a build without CUDA.
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> symmetric_allocator();
  // The segments that allocator takes from the heap, on either device (collective the first
  // time): for the host tests, which exercise the functions the allocator calls.
  std::shared_ptr<detail::HeapSegments> heap_segments();
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  // The group's configuration, resolved once from its Options and the environment.
  const Config& config() const { return config_; }
  // The workspace collectives' effective settings (Options, then environment, then defaults).
  const ops::CollectiveConfig& collective_config() const { return config_.collective; }
  // Whether the collectives run on the workspace (available, not turned off, and on a CUDA
  // workspace opted in: NOTE [CUDA collectives are opt-in]).
  bool uses_workspace_collectives() const {
    return config_.collectives && is_p2p_available() &&
           (workspace_on_host() || config_.cuda_collectives);
  }
  // Why the collectives do not run on the workspace ("" when they do).
  std::string workspace_collectives_reason() const;
  // Whether the collectives may read peers' tensors copy-free (probed and agreed at rendezvous),
  // and why not ("" when they may).
  bool uses_cross_memory() const;
  std::string cross_memory_reason() const;

  // Collective: gathers a different number of rows (dim 0) from every rank: sizes[r] is rank r's
  // count (the same list on every rank), input has sizes[rank] rows, other dims equal on every
  // rank. Returns the rows of all ranks in rank order. Without the workspace: padding + the
  // wrapped backend's all_gather_into_tensor.
  at::Tensor all_gather_v(const at::Tensor& input, const std::vector<int64_t>& sizes);

  // Collective: sends input_splits[q] rows (dim 0) of `input` to rank q, in rank order (sizes >=
  // 0 summing to input's rows; other dims and dtype equal on every rank), without the receivers
  // knowing what they get. Returns the rows received from every rank, in rank order, and how
  // many came from each. Without the workspace: the sizes, then the rows, over the wrapped
  // backend's all_to_all_single.
  std::pair<at::Tensor, std::vector<int64_t>> all_to_all_v(
      const at::Tensor& input, const std::vector<int64_t>& input_splits);

  // The all-reduce of torch.ops.cuda_p2p.all_reduce_ (backend/dispatcher_all_reduce.cpp): in
  // place, with no Work. The workspace all-reduce that allreduce() runs, counted the same; where
  // the workspace cannot serve it, the wrapped backend's all-reduce, waited for.
  void all_reduce_in_place(at::Tensor& tensor, ops::ReduceOp op);

  // Counters of which path ran ("all_reduce.one_shot", "all_reduce.wrapped", ...), so tests and
  // users can see that the fast path ran and that no fallback was silent (backend/counters.hpp).
  std::map<std::string, int64_t> counters() const { return counters_->snapshot(); }
  void reset_counters() { counters_->reset(); }
  // The counters module itself, for the dispatcher ops that count their own paths.
  Counters& path_counters() { return *counters_; }

  // --- across hosts (backend/hierarchical.hpp) -------------------------------------------------
  // Called once, at construction, by the Python layer on a group whose ranks span hosts: from
  // then on its collectives on CPU tensors run hierarchically (counted "<op>.hierarchical").
  void set_hierarchy(const std::vector<int64_t>& host_of, c10::intrusive_ptr<c10d::Backend> intra,
                     c10::intrusive_ptr<c10d::Backend> inter);
  // Null on a group within one host.
  const Hierarchy* hierarchy() const { return hierarchy_.get(); }
  // Bench knob only (NOTE [Hierarchical agreement]): off skips the group-wide agreement.
  void set_hierarchical_agreement(bool on) {
    if (hierarchy_) hierarchy_->set_agreement(on);
  }

  // --- fused GEMM pipelines (ops/fused_*.cpp) -------------------------------------------------
  // The group's state of the pipelines (their host streams, the lock that serialises them on
  // this group, traces), created on first use.
  ops::pipeline::State& pipeline_state();
  // What a fused op on tensors of `device_type` is given of this group (ops/pipeline_common.hpp).
  ops::pipeline::Group pipeline_group(c10::DeviceType device_type);

  // The group's failure record (NOTE [Failed groups] in ops/failure_record.hpp): the first
  // failure of a collective or fused op midway ("" when none).
  std::string failure() const { return failure_.first(); }

  // --- delegated collectives ----------------------------------------------------------------
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Coalescing: NCCL groups its own operations; for the CPU backend (which has no coalescing of
  // its own) every operation runs at once and endCoalescing() returns one Work over all of them.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;
  void shutdown() override;
  // Whether the group was shut down or aborted (its dispatcher ops then resolve it anew: NOTE
  // [Group lookup cache] in backend/dispatcher_group.cpp).
  bool retired() const { return retired_.load(std::memory_order_acquire); }
  // Lives exactly as long as this backend (reset first thing in its destructor): what the group
  // lookup cache holds a weak reference to instead of the backend (NOTE [Group lookup cache]).
  const std::shared_ptr<const bool>& lifetime_token() const { return lifetime_token_; }

 private:
  // The wrapped backend for these tensors: all on one device type, with a backend for it.
  c10d::Backend& route(const std::vector<at::Tensor>& tensors, const char* op) const;
  c10d::Backend& route(const at::Tensor& tensor, const char* op) const;
  // The wrapped backend of a barrier the workspace does not run (NOTE [Barriers order the GPU]
  // in backend/wrapped_routing.cpp); names the group's GPU in `opts.device_ids` for a CUDA one.
  c10d::Backend& route_barrier(c10d::BarrierOptions& opts) const;
  // Records a CPU-side or workspace Work while coalescing; returns it unchanged.
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work);

  // --- workspace collectives ---
  // Why these tensors cannot take the workspace path (nullptr when they can): workspace
  // unavailable, a tensor not strided or not on the workspace's device. Depends only on what
  // every rank agrees on, so all ranks take the same path.
  const char* workspace_rejects(c10::ArrayRef<at::Tensor> tensors) const;
  // Runs fn(ctx) for one workspace collective (NOTE [Collectives of a group run one at a time])
  // and returns what it did, marked `graph` when enqueued under capture. A function_ref, not a
  // std::function: nothing to construct, copy or destroy on the small all-reduce's path (NOTE
  // [Inline one-shot] in ops/all_reduce.cpp).
  ops::Outcome run_collective(const char* what,
                              c10::function_ref<ops::Outcome(const ops::CollectiveContext&)> fn);
  // A completed Work over `outputs`, tracked while coalescing; none for the synchronous call
  // (`async_op` false: the options' asyncOp) that returns_no_work() allows.
  c10::intrusive_ptr<c10d::Work> completed(c10d::OpType type, std::vector<at::Tensor> outputs,
                                           bool async_op = true);
  // Whether a workspace collective called with `async_op` returns no Work
  // (NOTE [No Work for a synchronous call] in backend/workspace_collectives.cpp).
  bool returns_no_work(bool async_op);
  // The workspace all-reduce of `t` in place (allreduce() and all_reduce_in_place()); false,
  // having done nothing, where the workspace does not serve it (device, reduce op, dtype).
  bool all_reduce_on_workspace(at::Tensor& t, ops::ReduceOp op);
  // The all-gather / reduce-scatter on the workspace, once the tensors were checked.
  ops::Outcome all_gather_on_workspace(const at::Tensor& input,
                                       const std::vector<at::Tensor>& outputs);
  ops::Outcome reduce_scatter_on_workspace(const std::vector<at::Tensor>& inputs,
                                           const at::Tensor& output, ops::ReduceOp op);
  // The same for one flat output (input) holding the W chunks: all_gather_into_tensor and
  // reduce_scatter_tensor, single or coalesced. `what` names the call in argument errors.
  ops::Outcome all_gather_into_tensor_on_workspace(at::Tensor& output, const at::Tensor& input,
                                                   const std::string& what);
  ops::Outcome reduce_scatter_tensor_on_workspace(const at::Tensor& output, const at::Tensor& input,
                                                  ops::ReduceOp op, const std::string& what);
  // Runs `call` on the backend routed for `tensors` (CPU works are tracked for coalescing).
  template <typename Tensors, typename Call>
  c10::intrusive_ptr<c10d::Work> delegate(const Tensors& tensors, const char* op, Call&& call) {
    c10d::Backend& b = route(tensors, op);
    auto work = call(b);
    return &b == cpu_backend_.get() ? track(std::move(work)) : work;
  }

  // --- send/recv (backend/workspace_send_recv.cpp) ---
  // Why a send or receive of `tensors` goes to the wrapped backend (nullptr: the mailboxes take
  // it). Depends only on what both ranks of a pair agree on, so that both take the same path.
  const char* mailbox_rejects(const std::vector<at::Tensor>& tensors) const;
  // send (`type` SEND), recv (RECV) or recvAnysource (RECVANYSOURCE, `peer` -1) of `tensors`:
  // through the mailboxes, or `wrapped` on the routed backend, counted either way.
  c10::intrusive_ptr<c10d::Work> p2p(
      std::vector<at::Tensor>& tensors, c10d::OpType type, int peer, int tag,
      c10::function_ref<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)> wrapped);
  // The group's mailboxes (NOTE [Mailboxes] in p2p_workspace/host/mailboxes.cpp), made on the first
  // use.
  std::shared_ptr<host::Mailboxes> mailboxes();
  // A shutdown's flush of the mailboxes (NOTE [Shutdown flushes]): waits at most `limit` until
  // the receivers took every message this rank sent; warns naming those that did not.
  void flush_mailboxes(std::chrono::milliseconds limit);
  // Fails the mailboxes' pending and later ops with `why` (abort, shutdown).
  void fail_mailboxes(const std::string& why);
  std::mutex mailboxes_mutex_;
  std::shared_ptr<host::Mailboxes> mailboxes_;

  // The hierarchical step: counts what the hierarchy did; true when it ran the op.
  bool ran_hierarchically(Counters::Op op, const HierarchyOutcome& outcome);
  // The Work of a hierarchical collective (done on return), tracked while coalescing.
  c10::intrusive_ptr<c10d::Work> hierarchical_done(c10d::OpType type,
                                                   std::vector<at::Tensor> outputs);
  std::unique_ptr<Hierarchy> hierarchy_;

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  c10::intrusive_ptr<c10d::Backend> cpu_backend_;
  c10::intrusive_ptr<c10d::Backend> cuda_backend_;
  std::unique_ptr<SymmetricWorkspace> workspace_;
  Config config_;
  bool workspace_on_host() const;
  // Guards collective_state_ and the collective channel's signal counts (host callers on several
  // threads); see NOTE [Collectives of a group run one at a time].
  std::mutex collective_mutex_;
  ops::CollectiveState collective_state_;
  // NOTE [Failed groups]
  ops::FailureRecord failure_;
  // A local argument check of a workspace collective: when `checks` throws, this rank takes part
  // in the op's handshake with an invalid signature (ops::reject) before its error propagates,
  // so that its peers raise at once instead of waiting for the timeout.
  void check_or_reject(const char* what, ops::OpKind kind, c10::function_ref<void()> checks);
  // A collective the workspace serves, routed to the wrapped backend on this rank (`why`): on a
  // host workspace, takes part in the op's handshake naming the route (NOTE [Routes agree]).
  void agree_on_route(const char* what, ops::OpKind kind, c10::ArrayRef<at::Tensor> tensors,
                      const std::string& detail, const char* why);

  // What workspace_rejects() says when the collectives do not run on the workspace at all.
  static constexpr const char* kWorkspaceOff = reason::kWorkspaceOff;
  // Made once the configuration is resolved (its debug flag).
  std::optional<Counters> counters_;

  // The symmetric heap, created by ensure_symmetric_heap under heap_mutex_; its allocator is
  // shared with the deleters of the tensors in it, which also keep its mapping alive.
  mutable std::mutex heap_mutex_;
  std::unique_ptr<SymmetricWorkspace> heap_;
  std::shared_ptr<HeapAllocator> heap_allocator_;
  // What the MemPool allocator's functions own (NOTE [Heap under a MemPool]); the allocator
  // itself is created on the first symmetric_allocator().
  std::shared_ptr<detail::HeapSegments> heap_segments_;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> symmetric_allocator_;
  int heap_attempts_ = 0;  // NOTE [Heap creation attempts] in backend/symmetric_memory.cpp

  std::mutex pipeline_state_mutex_;
  std::shared_ptr<ops::pipeline::State> pipeline_state_;  // see pipeline_state()

  std::atomic<bool> retired_{false};  // see retired()
  std::shared_ptr<const bool> lifetime_token_ = std::make_shared<const bool>(true);

  std::mutex coalescing_mutex_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_works_;
};

}  // namespace cuda_p2p
