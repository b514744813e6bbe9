// ProcessGroupCudaP2P: the c10d backend registered as "cuda_p2p".
//
// A router over engines, each owning its state and its lock:
//   WrappedBackends       the wrapped Gloo (CPU tensors) and NCCL (CUDA tensors) backends, the
//                         routing of a call to one of them, coalescing (wrapped_backends.*)
//   WorkspaceCollectives  the collectives on the P2P workspace (workspace_collectives.*; each
//                         op's body in its slice, collectives/<op>.cpp)
//   SymmetricMemory       the symmetric heap and its MemPool allocator (symmetric_memory.*,
//                         symmetric_allocator.*)
//   SendRecv              send/recv through the host mailboxes (send_recv.*)
//   Hierarchy             a group spanning hosts (hierarchical.*)
//   Counters              which path every call took, the debug lines (counters.*)
// and the fused pipelines' state (ops::pipeline::State), used by the dispatcher ops
// (dispatcher_fused_ops.cpp). Each c10d override (collectives/<op>.cpp, one file per op) describes
// its call and hands it to one entry sequence (NOTE [The entry sequence] in entry_sequence.hpp):
// all_reduce, all_gather, all_gather_into_tensor, reduce_scatter(_tensor), broadcast, barrier,
// the all-to-alls, gather, scatter and reduce run on the workspace when it is available and the
// tensors are on its device; everything else, and every case the workspace does not support, goes
// to the wrapped backend for the tensors' device, whose Works are handed back unchanged.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backend/abort_hooks.hpp"
#include "backend/config.hpp"
#include "backend/counters.hpp"
#include "backend/hierarchical.hpp"
#include "backend/send_recv.hpp"
#include "backend/symmetric_memory.hpp"
#include "backend/workspace_collectives.hpp"
#include "backend/wrapped_backends.hpp"
#include "ops/collectives.hpp"
#include "ops/failure_record.hpp"
#include "ops/pipeline_common.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

namespace detail {
struct Call;  // one call as the entry sequence takes it (entry_sequence.hpp)
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

  // Raises what the constructor would of these options alone (a bad value, a workspace on a GPU
  // the group will not have), on this rank, before any rendezvous: torch's group creation calls
  // it before it makes the wrapped backends (python/cuda_p2p/_backend.py), so that no peer is left
  // in their rendezvous by a rank that raised.
  static void check_options(const Options& options, int size, bool wraps_cuda);

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  const c10::intrusive_ptr<Options>& options() const { return options_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // The wrapped backend for a device type, or null; TORCH_CHECKs for an unsupported type.
  c10::intrusive_ptr<c10d::Backend> wrapped_backend(c10::DeviceType type) const {
    return wrapped_.for_device(type);
  }

  // --- the P2P workspace (docs/design.md §4); its signal channels are in ops/channels.hpp -----
  bool is_p2p_available() const { return workspace_ && workspace_->available(); }
  // Why the workspace is unavailable ("" when it is available).
  std::string p2p_unavailable_reason() const { return workspace_unavailable_reason(group_); }
  // What the workspace's blocks are (Device::block_memory; "" without a workspace).
  std::string block_memory() const {
    return workspace_ ? workspace_->device().block_memory() : std::string();
  }
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

  // --- the symmetric heap (SymmetricMemory, backend/symmetric_memory.hpp; docs/zero_copy.md) --
  at::Device symmetric_device() const { return heap_.device(); }
  void ensure_symmetric_heap() { heap_.ensure(); }
  at::Tensor symmetric_empty(at::IntArrayRef sizes, at::ScalarType dtype,
                             std::optional<at::Device> device = std::nullopt) {
    return heap_.empty(sizes, dtype, device);
  }
  int64_t symmetric_offset(const at::Tensor& t) const { return heap_.offset(t); }
  // `t` (a tensor in this rank's heap) as rank `rank` holds it: a tensor of t's sizes, strides
  // and dtype aliasing `rank`'s heap at t's offset, on this rank's mapping of it. Meaningful when
  // the ranks allocated alike (equal offsets); it keeps the heap's mapping alive.
  at::Tensor symmetric_peer_tensor(const at::Tensor& t, int64_t rank) const {
    return heap_.peer_tensor(t, rank);
  }
  // {created, capacity, used_bytes, live_blocks, deferred_blocks, largest_free, segments,
  // segment_bytes} of the heap (zeros before it): blocks count cuda_p2p.empty tensors and MemPool
  // segments alike (deferred: freed on a CUDA heap, NOTE [Heap frees in stream order]), segments
  // those of the MemPool allocator (NOTE [Heap under a MemPool]).
  std::map<std::string, int64_t> symmetric_heap_info() const { return heap_.info(); }
  // CUDA: the allocator of a torch.cuda.MemPool whose segments are carved from this rank's heap
  // (NOTE [Heap under a MemPool] in backend/symmetric_allocator.cpp); collective the first time
  // (creates the heap), then the same allocator on every call. NotImplementedError on a host
  // heap (torch has no allocator hook for CPU tensors) and in a build without CUDA.
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> symmetric_allocator() {
    return heap_.allocator();
  }
  // The segments that allocator takes from the heap, on either device (collective the first
  // time): for the host tests, which exercise the functions the allocator calls.
  std::shared_ptr<detail::HeapSegments> heap_segments() { return heap_.segments(); }
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  // The group's configuration, resolved once from its Options and the environment.
  const Config& config() const { return config_; }
  // The workspace collectives' effective settings (Options, then environment, then defaults).
  const ops::CollectiveConfig& collective_config() const { return config_.collective; }
  // Whether the collectives run on the workspace (available, not turned off, and on a CUDA
  // workspace opted in: NOTE [CUDA collectives are opt-in]), and why not ("" when they do).
  bool uses_workspace_collectives() const { return collectives_.on(); }
  std::string workspace_collectives_reason() const { return collectives_.off_reason(); }
  // Whether the collectives may read peers' tensors with cross-memory reads (probed and agreed at
  // rendezvous), and why not ("" when they may).
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
  // Its own argument checks (the reduce op's name): where the workspace serves the call, a rank
  // whose checks fail tells its peers (NOTE [Op signatures] in ops/op_signature.cpp), which would
  // otherwise wait for it until the timeout; then its own error propagates.
  void check_all_reduce_in_place(const at::Tensor& tensor, c10::function_ref<void()> checks);

  // Counters of which path ran ("all_reduce.one_shot", "all_reduce.wrapped", ...), so tests and
  // users can see that the fast path ran and that no fallback was silent.
  std::map<std::string, int64_t> counters() const { return counters_.snapshot(); }
  void reset_counters() { counters_.reset(); }
  // The counters module itself, for the dispatcher ops that count their own paths.
  Counters& path_counters() { return counters_; }

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
  // this group, traces).
  ops::pipeline::State& pipeline_state() { return pipelines_; }
  // What a fused op on tensors of `device_type` is given of this group (ops/pipeline_common.hpp).
  ops::pipeline::Group pipeline_group(c10::DeviceType device_type);

  // The group's failure record (NOTE [Failed groups] in ops/failure_record.hpp): the first
  // failure of a collective or fused op midway ("" when none).
  std::string failure() const { return failure_.first(); }

  // --- c10d::Backend --------------------------------------------------------------------------
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

  // torch 2.14's canonical single-tensor entries (NOTE [Canonical entries] in
  // entry_sequence.hpp): the same ops as their older names above, counted alike.
#ifdef CUDA_P2P_C10D_HAS_SINGLE_ENTRIES
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& output_split_sizes,
                                                   std::vector<int64_t>& input_split_sizes,
                                                   const c10d::AllToAllOptions& opts) override;
#endif
  // gather into one tensor on the root: W chunks of the output, rank order.
#ifdef CUDA_P2P_C10D_HAS_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts) override;
#endif
#ifdef CUDA_P2P_C10D_HAS_GATHER_INTO_TENSOR
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts) override;
#endif

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override { wrapped_.start_coalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return wrapped_.end_coalescing(getRank());
  }

  void setSequenceNumberForGroup() override { wrapped_.set_sequence_number(); }
  uint64_t getSequenceNumberForGroup() override { return wrapped_.sequence_number(); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;
  void shutdown() override;
  // --- fault tolerance (backend/abort_hooks.*, backend/child_groups.cpp) ----------------------
  // NOTE [Abort hooks] and NOTE [Error kinds] in backend/abort_hooks.cpp.
#ifdef CUDA_P2P_C10D_HAS_ABORT_HOOKS
  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hook_id) override;
#endif
#ifdef CUDA_P2P_C10D_HAS_ERROR_TYPE
  c10d::ErrorType getError() override { return static_cast<c10d::ErrorType>(error_kind()); }
#endif
  // getError()'s answer on any torch: the kind of the group's first failure, else the wrapped
  // NCCL's, else its hierarchy's intra-host group's, else kSuccess.
  ErrorKind error_kind();
  // cuda_p2p.check(group) (NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp): raises the
  // group's failure - its own op's deadline or mismatch, a peer's failure whose word ended this
  // rank's kernels quietly - after its abort hooks ran, without synchronizing any stream; quiet
  // on a healthy group and on one this rank aborted or shut down itself.
  void check();
  // Why a kernel of the workspace's device gave up with an error that loses the CUDA context
  // (Device::lost_context; "" while none did, and without a workspace).
  std::string lost_context() const;
  // NOTE [Child groups] in backend/child_groups.cpp: a group made from this one - over the
  // survivors of a dead rank (shrink), a subset of its ranks (split) or ranks of several groups
  // (merge) - is a cuda_p2p group with a workspace of its own.
  // Makes a fresh CUDA backend (NCCL) for rank `rank` of `size`, rendezvousing under `store`,
  // with `timeout` and the child's global ranks: what a shrink gives its child when the wrapped
  // CUDA backend never ran anything (NOTE [Shrinking a CUDA backend never used]). Set from Python
  // (python/cuda_p2p/_backend.py, which creates the wrapped NCCL); child groups inherit it.
  using CudaBackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout, const std::vector<uint64_t>& global_ranks)>;
  void set_cuda_backend_factory(CudaBackendFactory factory) {
    cuda_backend_factory_ = std::move(factory);
  }
#ifdef CUDA_P2P_C10D_HAS_SHRINK
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts_override = nullptr) override;
#endif
#ifdef CUDA_P2P_C10D_HAS_SPLIT
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
#endif
  // torch names a group after making it (ProcessGroup::setGroupName): the name goes into the
  // options too, and to the record of the default group's name for a shrunk default group.
#ifdef CUDA_P2P_C10D_HAS_GROUP_UID
  void setGroupUid(const std::string& pg_uid) override;
#endif
#ifdef CUDA_P2P_C10D_HAS_MERGE
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts,
                                          const int& rank, const int& size) override;
#endif

  // Whether the group was shut down or aborted (its dispatcher ops then resolve it anew: NOTE
  // [Group lookup cache] in backend/dispatcher_group.cpp).
  bool retired() const { return retired_.load(std::memory_order_acquire); }
  // Lives exactly as long as this backend (reset first thing in its destructor): what the group
  // lookup cache holds a weak reference to instead of the backend (NOTE [Group lookup cache]).
  const std::shared_ptr<const bool>& lifetime_token() const { return lifetime_token_; }

#ifdef CUDA_P2P_WITH_WINDOWS
  // --- one-sided windows (backend/windows.hpp, docs/windows.md) -------------------------------
  // A group whose workspace is available holds its windows in its symmetric heap.
  bool supportsWindow() const override;
  // Collective: a window on this group's symmetric heap (WorkspaceWindow); `tensor`, when given,
  // is registered (tensor_register, NOTE [Window registration] in backend/windows.cpp).
  c10::intrusive_ptr<c10d::Window> new_window(
      const std::optional<at::Tensor>& tensor = std::nullopt) override;
#endif

 private:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;

  // NOTE [The entry sequence] in entry_sequence.hpp, where these templates are defined; the ops'
  // rows: ops/op_spec.hpp.
  // on_workspace: the route's handshake and the fallback's counter when the call has a reason to
  // go to the wrapped backend (false), else the workspace body, counted (true). serve: that, then
  // the wrapped backend's Work or the workspace's; for an op the hierarchy takes
  // (ops::OpSpec::hierarchy), first its hierarchy step on a group spanning hosts: `hierarchical`
  // runs the Hierarchy's entry (or is a detail::HierarchyStep naming its Work's outputs too).
  template <typename Detail, typename Body>
  bool on_workspace(const ops::OpCall& entry, const detail::Call& call, Detail&& detail,
                    Body&& body);
  template <typename Detail, typename Body, typename Wrapped, typename Outputs>
  WorkPtr serve(const ops::OpCall& entry, const detail::Call& call, Detail&& detail, Body&& body,
                Wrapped&& wrapped, Outputs&& outputs);
  template <typename Hierarchical, typename Detail, typename Body, typename Wrapped,
            typename Outputs>
  WorkPtr serve(const ops::OpCall& entry, Hierarchical&& hierarchical, const detail::Call& call,
                Detail&& detail, Body&& body, Wrapped&& wrapped, Outputs&& outputs);
  // A call the workspace never runs: counted "<op>.wrapped", run on the wrapped backend.
  template <typename Wrapped>
  WorkPtr wrapped_only(const ops::OpCall& entry, const char* why, c10::ArrayRef<at::Tensor> tensors,
                       Wrapped&& wrapped);
  // The bodies of the ops c10d reaches by two names (NOTE [Canonical entries]).
  WorkPtr all_gather_into_tensor_entry(at::Tensor& output, at::Tensor& input,
                                       const c10d::AllgatherOptions& opts);
  WorkPtr all_gather_into_tensor_coalesced_entry(std::vector<at::Tensor>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts);
  WorkPtr reduce_scatter_tensor_entry(at::Tensor& output, at::Tensor& input,
                                      const c10d::ReduceScatterOptions& opts);
  WorkPtr reduce_scatter_tensor_coalesced_entry(std::vector<at::Tensor>& outputs,
                                                std::vector<at::Tensor>& inputs,
                                                const c10d::ReduceScatterOptions& opts);
  WorkPtr all_to_all_single_entry(at::Tensor& output, at::Tensor& input,
                                  std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes,
                                  const c10d::AllToAllOptions& opts);
  WorkPtr gather_into_tensor_entry(at::Tensor& output, at::Tensor& input,
                                   const c10d::GatherOptions& opts);
  // gather and gather_single's entry sequence (backend/collectives/gather.cpp).
  WorkPtr gather_to_root(const ops::OpCall& entry, std::vector<std::vector<at::Tensor>>& outputs,
                         std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts,
                         const std::optional<at::Tensor>& whole);
  // The coalesced calls' workspace bodies: one op per pair, in order, each counted.
  void all_gather_pairs(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs);
  void reduce_scatter_pairs(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                            ops::ReduceOp op);
  // The barrier's reason to go to the wrapped backend (nullptr: the workspace runs it), and that
  // route (NOTE [Barriers order the GPU] in backend/wrapped_backends.cpp).
  const char* barrier_rejects(const c10d::BarrierOptions& opts) const;
  WorkPtr wrapped_barrier(const c10d::BarrierOptions& opts, const char* why);
  // NOTE [Child groups] in backend/child_groups.cpp: the group of `ranks` (this group's ranks, in
  // their new order; this rank among them) over `store`, with `options` and the wrapped backends
  // made for it, and a hierarchy when this group has one.
  c10::intrusive_ptr<ProcessGroupCudaP2P> make_child(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     c10::intrusive_ptr<Options> options,
                                                     c10::intrusive_ptr<c10d::Backend> cpu,
                                                     c10::intrusive_ptr<c10d::Backend> cuda);
  // The options of a child: `given` (torch's copy of ours, or the caller's; a cuda_p2p
  // Options), else a copy of this group's.
  c10::intrusive_ptr<Options> child_options(const c10::intrusive_ptr<c10d::Backend::Options>& given,
                                            const char* what) const;
  // The ranks in `ranks` are gone (a shrink excluded them): the workspace, the heap and the
  // hierarchy's intra-host group wait for them no more (NOTE [Shrinking past dead ranks]).
  void forget_peers(const std::vector<int>& ranks);
  // After a workspace op raised: runs the abort hooks when the workspace's device has failed.
  void hooks_on_device_failure() noexcept;

  // The hierarchical step: counts what the hierarchy did; true when it ran the op.
  bool ran_hierarchically(const ops::OpCall& entry, const HierarchyOutcome& outcome);
  // The Work of a hierarchical collective (done on return), tracked while coalescing.
  WorkPtr hierarchical_done(const ops::OpCall& entry, std::vector<at::Tensor> outputs);
  // The Work of a workspace collective, tracked while coalescing, over the tensors `outputs()`
  // returns; none for the synchronous call that returns_no_work() allows.
  template <typename Outputs>
  WorkPtr completed(c10d::OpType type, Outputs&& outputs, bool async_op);
  WorkPtr event_work(c10d::OpType type, std::vector<at::Tensor> outputs);
  // Whether a workspace collective called with `async_op` returns no Work
  // (NOTE [No Work for a synchronous call] in ProcessGroupCudaP2P.cpp).
  bool returns_no_work(bool async_op) const;
  // NOTE [CPU outputs without a Work]: a host device with CUDA's semantics runs the caller's
  // stream before a call without a Work hands it CPU outputs.
  void settle_cpu_outputs(const char* what);
  // send, recv and recvAnysource (`peer` -1): through the mailboxes, or `wrapped`, counted.
  template <typename Wrapped>
  WorkPtr send_or_recv(std::vector<at::Tensor>& tensors, c10d::OpType type, int peer, int tag,
                       Wrapped&& wrapped);

  // Declared in the order they are made: each engine is given what it needs of those above.
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  WrappedBackends wrapped_;
  Config config_;
  std::unique_ptr<SymmetricWorkspace> workspace_;  // null when disabled
  EngineContext group_;                            // what the engines know of the group
  ops::FailureRecord failure_;                     // NOTE [Failed groups]
  Counters counters_;
  WorkspaceCollectives collectives_;
  SymmetricMemory heap_;
  SendRecv send_recv_;
  ops::pipeline::State pipelines_;
  std::unique_ptr<Hierarchy> hierarchy_;  // set once, by set_hierarchy
  // NOTE [Abort hooks]; shared with the Works of ops still queued, which run them when they find
  // the device failed (NOTE [Errors of queued ops] in backend/works.cpp).
  std::shared_ptr<AbortHooks> abort_hooks_ = std::make_shared<AbortHooks>();
  // The GPU of init_process_group(device_id=...), for the workspace of a child group.
  std::optional<int64_t> bound_cuda_device_;
  std::atomic<int> shrinks_{0};              // this group's shrinks so far: each one's store prefix
  CudaBackendFactory cuda_backend_factory_;  // see set_cuda_backend_factory
  // A shrink of the default group: its name, once torch sets it, is the default group's.
  bool succeeds_default_group_ = false;
  std::atomic<bool> retired_{false};  // see retired()
  std::shared_ptr<const bool> lifetime_token_ = std::make_shared<const bool>(true);
};

}  // namespace cuda_p2p
