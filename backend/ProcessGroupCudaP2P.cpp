#include "backend/ProcessGroupCudaP2P.hpp"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <numeric>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "backend/CoalescedWork.hpp"
#include "backend/CompletedWork.hpp"
#include "ops/reduction.hpp"
#include "p2p_workspace/cuda/cuda_device.hpp"
#include "p2p_workspace/host/host_device.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cuda_p2p {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

ProcessGroupCudaP2P::ProcessGroupCudaP2P(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                         c10::intrusive_ptr<Options> options,
                                         c10::intrusive_ptr<c10d::Backend> cpu_backend,
                                         c10::intrusive_ptr<c10d::Backend> cuda_backend)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      options_(options ? std::move(options) : c10::make_intrusive<Options>()),
      cpu_backend_(std::move(cpu_backend)),
      cuda_backend_(std::move(cuda_backend)) {
  TORCH_CHECK(store_, "cuda_p2p: a c10d Store is required, got None");
  TORCH_CHECK(size >= 1, "cuda_p2p: world size must be >= 1, got ", size);
  TORCH_CHECK(rank >= 0 && rank < size, "cuda_p2p: rank must be in [0, ", size, "), got ", rank);
  TORCH_CHECK(cpu_backend_, "cuda_p2p: a wrapped backend for CPU tensors (Gloo) is required");
  for (const auto* wrapped : {cpu_backend_.get(), cuda_backend_.get()}) {
    if (wrapped == nullptr) continue;
    TORCH_CHECK(wrapped->getRank() == rank && wrapped->getSize() == size,
                "cuda_p2p: wrapped backend ", wrapped->getBackendName(), " has rank ",
                wrapped->getRank(), " of ", wrapped->getSize(), ", expected rank ", rank, " of ",
                size);
  }
  config_ = resolve_config(*options_, size);

  // NOTE [CUDA collectives are opt-in]
  // A user who switches backend="nccl" to backend="cuda_p2p" must lose nothing: until the
  // workspace collectives have been validated on a GPU (scripts/gpu_check.sh), ordinary
  // collectives on CUDA tensors go to the wrapped NCCL backend unless the user opts in
  // (Options.cuda_workspace_collectives, else CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1:
  // Config::cuda_collectives). The counters say which path ran ("all_reduce.wrapped" vs
  // "all_reduce.one_shot", ...). A host workspace (CPU tensors) is not affected; the fused ops
  // use the workspace on either device.

  // The workspace lives on the GPU when this group drives one (a CUDA backend exists), else in
  // host shared memory. Every rank constructs the backend, so the rendezvous is collective.
  if (config_.workspace) {
    std::shared_ptr<Device> device;
#ifdef CUDA_P2P_WITH_CUDA
    if (cuda_backend_) device = make_cuda_device(c10::cuda::current_device());
#endif
    if (!device) device = make_host_device(size, config_.host_streams);
    workspace_ = std::make_unique<SymmetricWorkspace>(
        c10::make_intrusive<c10d::PrefixStore>("cuda_p2p/", store_), rank, size, std::move(device),
        config_.workspace_options);
  }
}

ProcessGroupCudaP2P::~ProcessGroupCudaP2P() = default;

std::string ProcessGroupCudaP2P::p2p_unavailable_reason() const {
  if (!workspace_) return config_.workspace_off_reason;
  return workspace_->unavailable_reason();
}

bool ProcessGroupCudaP2P::workspace_on_host() const {
  return workspace_ && workspace_->device().tensor_device().is_cpu();
}

std::string ProcessGroupCudaP2P::workspace_collectives_reason() const {
  if (!is_p2p_available()) return "the workspace is unavailable: " + p2p_unavailable_reason();
  if (!config_.collectives) {
    return "turned off (Options.workspace_collectives = False or "
           "CUDA_P2P_WORKSPACE_COLLECTIVES=0)";
  }
  if (!workspace_on_host() && !config_.cuda_collectives) {
    return "collectives on CUDA tensors go to NCCL by default; opt in with "
           "Options.cuda_workspace_collectives = True or CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1";
  }
  return "";
}

bool ProcessGroupCudaP2P::uses_cross_memory() const {
  return uses_workspace_collectives() && workspace_->private_reads();
}

std::string ProcessGroupCudaP2P::cross_memory_reason() const {
  if (!is_p2p_available()) return "the workspace is unavailable: " + p2p_unavailable_reason();
  if (workspace_->private_reads()) return "";
  const std::string& why = workspace_->private_reads_reason();
  if (!config_.cross_memory_off_reason.empty() && why.rfind("turned off", 0) == 0) {
    return why + " (" + config_.cross_memory_off_reason + ")";
  }
  return why;
}

int64_t ProcessGroupCudaP2P::get_buffer_size() const {
  return is_p2p_available() ? workspace_->buffer_size() : 0;
}

at::Tensor ProcessGroupCudaP2P::get_p2p_buffer(int64_t rank, at::IntArrayRef sizes,
                                               at::ScalarType dtype, int64_t storage_offset) const {
  TORCH_CHECK(is_p2p_available(), "cuda_p2p get_p2p_buffer: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  TORCH_CHECK(rank >= 0 && rank < getSize(), "cuda_p2p get_p2p_buffer: rank must be in [0, ",
              getSize(), "), got ", rank);
  return workspace_->get_buffer(static_cast<int>(rank), sizes, dtype, storage_offset);
}

void ProcessGroupCudaP2P::intra_node_barrier(const std::vector<int64_t>& ranks,
                                             std::optional<Millis> timeout) {
  TORCH_CHECK(is_p2p_available(), "cuda_p2p intra_node_barrier: the P2P workspace is unavailable: ",
              p2p_unavailable_reason());
  std::vector<int> members;
  for (auto r : ranks) {
    TORCH_CHECK(r >= 0 && r < getSize(), "cuda_p2p intra_node_barrier: ranks must be in [0, ",
                getSize(), "), got ", r);
    members.push_back(static_cast<int>(r));
  }
  auto& device = workspace_->device();
  auto stream = device.current_stream();
  device.check_healthy("intra_node_barrier");
  device.check_not_capturing(*stream, "intra_node_barrier");
  workspace_->barrier(*stream, kApiChannel, timeout, members);
}

void ProcessGroupCudaP2P::bump_counter(const std::string& name, int64_t by) {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_[name] += by;
}

std::map<std::string, int64_t> ProcessGroupCudaP2P::counters() const {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  return counters_;
}

void ProcessGroupCudaP2P::reset_counters() {
  std::lock_guard<std::mutex> lock(counters_mutex_);
  counters_.clear();
}

void ProcessGroupCudaP2P::ensure_min_buffer_size(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "cuda_p2p ensure_min_buffer_size: nbytes must be >= 0, got ", nbytes);
  if (workspace_) workspace_->ensure_min_buffer_size(nbytes);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupCudaP2P::wrapped_backend(c10::DeviceType type) const {
  switch (type) {
    case c10::DeviceType::CPU:
      return cpu_backend_;
    case c10::DeviceType::CUDA:
      return cuda_backend_;
    default:
      TORCH_CHECK(false, "cuda_p2p: tensors must be on cpu or cuda, got ",
                  c10::DeviceTypeName(type));
  }
}

c10d::Backend& ProcessGroupCudaP2P::route(const std::vector<at::Tensor>& tensors,
                                          const char* op) const {
  TORCH_CHECK(!tensors.empty(), "cuda_p2p ", op, ": expected at least one tensor, got none");
  const auto type = tensors.front().device().type();
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), "cuda_p2p ", op, ": got an undefined tensor");
    TORCH_CHECK(t.device().type() == type, "cuda_p2p ", op,
                ": all tensors must be on one device type, got ", tensors.front().device(), " and ",
                t.device());
  }
  auto backend = wrapped_backend(type);
  TORCH_CHECK(backend, "cuda_p2p ", op, ": got ", c10::DeviceTypeName(type),
              " tensors, but this group has no backend for them (NCCL is created only when CUDA "
              "is available at init_process_group/new_group)");
  return *backend;
}

c10d::Backend& ProcessGroupCudaP2P::route(const at::Tensor& tensor, const char* op) const {
  return route(std::vector<at::Tensor>{tensor}, op);
}

c10d::Backend& ProcessGroupCudaP2P::route_barrier(const c10d::BarrierOptions& opts) const {
  // A barrier on a CUDA device goes to NCCL, so that it also orders that device's streams;
  // everything else is a process barrier on the CPU backend.
  if (opts.device.has_value() && opts.device->is_cuda() && cuda_backend_) return *cuda_backend_;
  return *cpu_backend_;
}

// NOTE [Collectives of a group run one at a time]
// A group's workspace collectives share its buffer halves, its phase counter and the signal
// counts of the collective channel, so they must run in one order on every rank and never
// overlap. On the host they run synchronously on the calling thread (the device's inline stream),
// under collective_mutex_, so threads that share a group cannot interleave them. On CUDA they are
// enqueued on the caller's current stream; each one first waits for an event recorded at the end
// of the previous one, so that collectives issued on different streams (FSDP's all-gather and
// reduce-scatter streams) still execute one after another, in issue order, as the signal counts
// assume.
void ProcessGroupCudaP2P::run_collective(
    const char* what, const std::function<void(const ops::CollectiveContext&)>& fn) {
  std::lock_guard<std::mutex> lock(collective_mutex_);
  check_not_failed(what);
  ops::check_signature_record(collective_state_.signature, what);
  Device& device = workspace_->device();
  const bool host = device.tensor_device().is_cpu();
  auto stream = device.current_stream();
  // Before anything is enqueued (NOTE [Device failure] in p2p_workspace/watchdog.hpp).
  device.check_healthy(what);
  device.check_not_capturing(*stream, what);
  if (!host && collective_state_.last) device.wait_event(*stream, *collective_state_.last);
  const ops::CollectiveContext ctx{*workspace_, *stream, kCollectiveChannel, collective_state_,
                                   config_.collective};
  try {
    fn(ctx);
  } catch (const ops::SignatureMismatch&) {
    // The op ran nowhere and the phases were settled: the group stays usable.
    if (!host) collective_state_.last = device.record(*stream);
    throw;
  } catch (const std::exception& e) {
    collective_state_.pending.reset();
    mark_failed(what, e);
    throw;
  }
  TORCH_INTERNAL_ASSERT(!collective_state_.pending, "cuda_p2p ", what,
                        ": the op's signature was never compared");
  if (!host) collective_state_.last = device.record(*stream);
}

void ProcessGroupCudaP2P::mark_failed(const char* what, const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failure_.empty()) failure_ = std::string(what) + ": " + text;
}

void ProcessGroupCudaP2P::check_not_failed(const char* what) const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  TORCH_CHECK(failure_.empty(), "cuda_p2p ", what,
              ": refused: an earlier workspace op of this group failed midway, so its ranks may "
              "no longer agree on the workspace's state; recreate the group (destroy it and "
              "create a new one). The failure was: ",
              failure_);
}

std::string ProcessGroupCudaP2P::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void ProcessGroupCudaP2P::check_or_reject(const char* what, ops::OpKind kind,
                                          const std::function<void()>& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    if (getSize() > 1 && failure().empty()) {
      try {
        run_collective(what, [&](const ops::CollectiveContext& ctx) {
          ops::reject(ctx, kind, e.what_without_backtrace());
        });
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the own error wins
      }
    }
    throw;
  }
}

const char* ProcessGroupCudaP2P::workspace_rejects(c10::ArrayRef<at::Tensor> tensors) const {
  if (!uses_workspace_collectives()) return "workspace unavailable or its collectives off";
  const at::Device device = workspace_->device().tensor_device();
  for (const auto& t : tensors) {
    if (!t.defined() || t.layout() != at::kStrided || t.device() != device) return "device";
  }
  return nullptr;
}

WorkPtr ProcessGroupCudaP2P::completed(c10d::OpType type, std::vector<at::Tensor> outputs) {
  // On a GPU the op is enqueued, not done: its Work waits for the event run_collective recorded
  // at its end (none on the host, where it has completed).
  std::shared_ptr<Device> device;
  std::shared_ptr<Event> end;
  if (workspace_ && !workspace_->device().tensor_device().is_cpu()) {
    std::lock_guard<std::mutex> lock(collective_mutex_);
    device = workspace_->device_ptr();
    end = collective_state_.last;
  }
  return track(c10::make_intrusive<CompletedWork>(getRank(), type, std::move(outputs),
                                                  std::move(device), std::move(end)));
}

std::optional<ops::ReduceOp> ProcessGroupCudaP2P::to_reduce_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ops::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ops::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ops::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ops::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ops::ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ops::ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ops::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ops::ReduceOp::kBxor;
    default:
      return std::nullopt;  // PREMUL_SUM: the wrapped backend decides
  }
}

at::Tensor ProcessGroupCudaP2P::all_gather_v(const at::Tensor& input,
                                             const std::vector<int64_t>& sizes) {
  const int W = getSize(), me = getRank();
  auto checks = [&] {
    TORCH_CHECK(input.defined() && input.dim() >= 1,
                "cuda_p2p all_gather_v: expected a tensor with at least one dimension (rows), got ",
                input.defined() ? std::to_string(input.dim()) + " dimensions" : "None");
    TORCH_CHECK(static_cast<int>(sizes.size()) == W, "cuda_p2p all_gather_v: expected ", W,
                " sizes (rows of every rank), got ", sizes.size());
    for (int q = 0; q < W; ++q) {
      TORCH_CHECK(sizes[q] >= 0, "cuda_p2p all_gather_v: sizes must be >= 0, got ", sizes[q],
                  " for rank ", q);
    }
    TORCH_CHECK(input.size(0) == sizes[me], "cuda_p2p all_gather_v: rank ", me, " has ",
                input.size(0), " rows, but sizes[", me, "] is ", sizes[me]);
  };
  if (input.defined() && !workspace_rejects({input})) {
    check_or_reject("all_gather_v", ops::OpKind::kAllGatherV, checks);
  } else {
    checks();
  }
  std::vector<int64_t> out_sizes = input.sizes().vec();
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  out_sizes[0] = total;
  at::Tensor output =
      at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t row_elems = input.size(0) > 0 ? input.numel() / input.size(0)
                                              : c10::multiply_integers(input.sizes().slice(1));
  if (!workspace_rejects({input})) {
    const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
    std::vector<int64_t> bytes;
    std::vector<at::Tensor> outs;
    int64_t row = 0;
    for (int q = 0; q < W; ++q) {
      bytes.push_back(sizes[q] * row_elems * static_cast<int64_t>(input.element_size()));
      outs.push_back(output.narrow(0, row, sizes[q]));
      row += sizes[q];
    }
    run_collective("all_gather_v", [&](const ops::CollectiveContext& ctx) {
      ops::all_gather_v(ctx, in, bytes, outs);
    });
    bump_counter("all_gather_v.direct");
    return output;
  }
  // Without the workspace: pad every rank's rows to the largest count, gather, drop the padding.
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> padded_sizes = input.sizes().vec();
  padded_sizes[0] = largest;
  at::Tensor padded = at::zeros(padded_sizes, input.options());
  padded.narrow(0, 0, sizes[me]).copy_(input);
  std::vector<int64_t> gathered_sizes = padded_sizes;
  gathered_sizes[0] = largest * W;
  at::Tensor gathered = at::empty(gathered_sizes, input.options());
  route(input, "all_gather_v")._allgather_base(gathered, padded, c10d::AllgatherOptions())->wait();
  int64_t row = 0;
  for (int q = 0; q < W; ++q) {
    output.narrow(0, row, sizes[q]).copy_(gathered.narrow(0, q * largest, sizes[q]));
    row += sizes[q];
  }
  bump_counter("all_gather_v.wrapped");
  return output;
}

WorkPtr ProcessGroupCudaP2P::track(WorkPtr work) {
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  if (coalescing_ && work) coalesced_works_.push_back(work);
  return work;
}

WorkPtr ProcessGroupCudaP2P::broadcast(std::vector<at::Tensor>& tensors,
                                       const c10d::BroadcastOptions& opts) {
  const char* why = workspace_rejects(tensors);
  if (!why && (tensors.size() != 1 || opts.rootTensor != 0)) why = "several tensors";
  if (why) {
    bump_counter("broadcast.wrapped");
    return delegate(tensors, "broadcast",
                    [&](c10d::Backend& b) { return b.broadcast(tensors, opts); });
  }
  check_or_reject("broadcast", ops::OpKind::kBroadcast, [&] {
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(),
                "cuda_p2p broadcast: root must be a rank in [0, ", getSize(), "), got ",
                opts.rootRank);
  });
  at::Tensor& t = tensors[0];
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  bool read = false;
  run_collective("broadcast", [&](const ops::CollectiveContext& ctx) {
    ops::broadcast(ctx, work, static_cast<int>(opts.rootRank));
    read = ctx.state.last_private_reads;
    if (!work.is_same(t)) t.copy_(work);
  });
  bump_counter("broadcast.direct");
  if (read) bump_counter("broadcast.cross_memory");
  return completed(c10d::OpType::BROADCAST, tensors);
}

WorkPtr ProcessGroupCudaP2P::allreduce(std::vector<at::Tensor>& tensors,
                                       const c10d::AllreduceOptions& opts) {
  const char* why = workspace_rejects(tensors);
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && tensors.size() != 1) why = "several tensors";
  if (!why && !op) why = "reduce op";
  if (!why && !ops::is_reducible_dtype(tensors[0].scalar_type())) why = "dtype";
  if (why) {
    bump_counter("all_reduce.wrapped");
    return delegate(tensors, "allreduce",
                    [&](c10d::Backend& b) { return b.allreduce(tensors, opts); });
  }
  at::Tensor& t = tensors[0];
  check_or_reject("all_reduce", ops::OpKind::kAllReduce,
                  [&] { ops::check_reduce_op(*op, t.scalar_type(), "all_reduce"); });
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  ops::AllReduceAlgo algo = ops::AllReduceAlgo::kAuto;
  run_collective("all_reduce", [&](const ops::CollectiveContext& ctx) {
    algo = ops::all_reduce(ctx, work, work, *op, ops::AllReduceAlgo::kAuto);
    if (!work.is_same(t)) t.copy_(work);
  });
  bump_counter(std::string("all_reduce.") + ops::to_string(algo));
  return completed(c10d::OpType::ALLREDUCE, tensors);
}

WorkPtr ProcessGroupCudaP2P::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                              const c10d::AllreduceOptions& opts) {
  return delegate(tensors, "allreduce_sparse",
                  [&](c10d::Backend& b) { return b.allreduce_sparse(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceCoalescedOptions& opts) {
  bump_counter("all_reduce.wrapped");
  return delegate(tensors, "allreduce_coalesced",
                  [&](c10d::Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

WorkPtr ProcessGroupCudaP2P::reduce(std::vector<at::Tensor>& tensors,
                                    const c10d::ReduceOptions& opts) {
  return delegate(tensors, "reduce", [&](c10d::Backend& b) { return b.reduce(tensors, opts); });
}

namespace {

// A contiguous tensor to compute into for `t`, and whether it must be copied back.
at::Tensor contiguous_output(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// Chunk i of W equal chunks of a contiguous tensor's elements.
at::Tensor flat_chunk(const at::Tensor& t, int64_t i, int64_t count) {
  return t.view({-1}).narrow(0, i * count, count);
}

}  // namespace

void ProcessGroupCudaP2P::all_gather_on_workspace(const at::Tensor& input,
                                                  const std::vector<at::Tensor>& outputs) {
  // Outputs are computed contiguously and copied back where the caller's are not.
  std::vector<at::Tensor> outs;
  for (const auto& o : outputs) outs.push_back(contiguous_output(o));
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  ops::AllGatherAlgo algo = ops::AllGatherAlgo::kAuto;
  bool read = false;
  run_collective("all_gather", [&](const ops::CollectiveContext& ctx) {
    algo = ops::all_gather(ctx, in, outs, ops::AllGatherAlgo::kAuto);
    read = ctx.state.last_private_reads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].is_same(outputs[i])) outputs[i].copy_(outs[i]);
    }
  });
  bump_counter(std::string("all_gather.") + ops::to_string(algo));
  if (read) bump_counter("all_gather.cross_memory");
}

WorkPtr ProcessGroupCudaP2P::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) {
  const char* why = workspace_rejects(inputs);
  if (!why && (inputs.size() != 1 || outputs.size() != 1 ||
               outputs[0].size() != static_cast<size_t>(getSize()))) {
    why = "several tensors";
  }
  if (!why) why = workspace_rejects(outputs[0]);
  if (!why) {
    for (const auto& o : outputs[0]) {
      if (o.numel() != inputs[0].numel() || o.scalar_type() != inputs[0].scalar_type()) {
        why = "shapes";  // the wrapped backend reports the mismatch
      }
    }
  }
  if (why) {
    bump_counter("all_gather.wrapped");
    return delegate(inputs, "allgather",
                    [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); });
  }
  all_gather_on_workspace(inputs[0], outputs[0]);
  return completed(c10d::OpType::ALLGATHER, outputs[0]);
}

WorkPtr ProcessGroupCudaP2P::_allgather_base(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) {
  const char* why = workspace_rejects({input, output});
  if (why) {
    bump_counter("all_gather.wrapped");
    return delegate(input, "all_gather_into_tensor",
                    [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); });
  }
  check_or_reject("all_gather_into_tensor", ops::OpKind::kAllGather, [&] {
    TORCH_CHECK(
        output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
        "cuda_p2p all_gather_into_tensor: the output must have world size (", getSize(),
        ") times the input's ", input.numel(), " elements of ", input.scalar_type(), ", got ",
        output.numel(), " of ", output.scalar_type());
  });
  at::Tensor out = contiguous_output(output);
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(out, q, input.numel()));
  all_gather_on_workspace(input, chunks);
  if (!out.is_same(output)) output.copy_(out);
  // The future holds what the wrapped backend's would: Gloo's the W chunks, NCCL's the output.
  if (output.is_cpu() && output.is_contiguous()) {
    std::vector<at::Tensor> views;
    for (int q = 0; q < getSize(); ++q) views.push_back(flat_chunk(output, q, input.numel()));
    return completed(c10d::OpType::_ALLGATHER_BASE, std::move(views));
  }
  return completed(c10d::OpType::_ALLGATHER_BASE, {output});
}

WorkPtr ProcessGroupCudaP2P::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  bump_counter("all_gather.wrapped");
  return delegate(inputs, "allgather_coalesced",
                  [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  const char* why = workspace_rejects(inputs);
  if (!why) why = workspace_rejects(outputs);
  if (!why && outputs.size() != inputs.size()) why = "shapes";
  if (why) {
    bump_counter("all_gather.wrapped");
    return delegate(inputs, "allgather_into_tensor_coalesced", [&](c10d::Backend& b) {
      return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
    });
  }
  // One workspace all-gather per pair, in order.
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_or_reject("all_gather_into_tensor", ops::OpKind::kAllGather, [&] {
      TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize() &&
                      outputs[i].scalar_type() == inputs[i].scalar_type(),
                  "cuda_p2p all_gather_into_tensor (coalesced, tensor ", i,
                  "): the output must have world size (", getSize(), ") times the input's ",
                  inputs[i].numel(), " elements of ", inputs[i].scalar_type(), ", got ",
                  outputs[i].numel(), " of ", outputs[i].scalar_type());
    });
    at::Tensor out = contiguous_output(outputs[i]);
    std::vector<at::Tensor> chunks;
    for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(out, q, inputs[i].numel()));
    all_gather_on_workspace(inputs[i], chunks);
    if (!out.is_same(outputs[i])) outputs[i].copy_(out);
  }
  return completed(c10d::OpType::COALESCED, outputs);
}

WorkPtr ProcessGroupCudaP2P::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                    std::vector<at::Tensor>& inputs,
                                    const c10d::GatherOptions& opts) {
  return delegate(inputs, "gather",
                  [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::scatter(std::vector<at::Tensor>& outputs,
                                     std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ScatterOptions& opts) {
  return delegate(outputs, "scatter",
                  [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); });
}

void ProcessGroupCudaP2P::reduce_scatter_on_workspace(const std::vector<at::Tensor>& inputs,
                                                      const at::Tensor& output, ops::ReduceOp op) {
  check_or_reject("reduce_scatter", ops::OpKind::kReduceScatter,
                  [&] { ops::check_reduce_op(op, output.scalar_type(), "reduce_scatter"); });
  std::vector<at::Tensor> ins;
  for (const auto& t : inputs) ins.push_back(t.is_contiguous() ? t : t.contiguous());
  at::Tensor out = contiguous_output(output);
  ops::ReduceScatterAlgo algo = ops::ReduceScatterAlgo::kAuto;
  bool read = false;
  run_collective("reduce_scatter", [&](const ops::CollectiveContext& ctx) {
    algo = ops::reduce_scatter(ctx, ins, out, op, ops::ReduceScatterAlgo::kAuto);
    read = ctx.state.last_private_reads;
    if (!out.is_same(output)) output.copy_(out);
  });
  bump_counter(std::string("reduce_scatter.") + ops::to_string(algo));
  if (read) bump_counter("reduce_scatter.cross_memory");
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter(std::vector<at::Tensor>& outputs,
                                            std::vector<std::vector<at::Tensor>>& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
  const char* why = workspace_rejects(outputs);
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && (outputs.size() != 1 || inputs.size() != 1 ||
               inputs[0].size() != static_cast<size_t>(getSize()))) {
    why = "several tensors";
  }
  if (!why) why = workspace_rejects(inputs[0]);
  if (!why && !op) why = "reduce op";
  if (!why && !ops::is_reducible_dtype(outputs[0].scalar_type())) why = "dtype";
  if (!why) {
    for (const auto& t : inputs[0]) {
      if (t.numel() != outputs[0].numel() || t.scalar_type() != outputs[0].scalar_type()) {
        why = "shapes";
      }
    }
  }
  if (why) {
    bump_counter("reduce_scatter.wrapped");
    return delegate(outputs, "reduce_scatter",
                    [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); });
  }
  reduce_scatter_on_workspace(inputs[0], outputs[0], *op);
  return completed(c10d::OpType::REDUCE_SCATTER, outputs);
}

WorkPtr ProcessGroupCudaP2P::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  const char* why = workspace_rejects({input, output});
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && !op) why = "reduce op";
  if (!why && !ops::is_reducible_dtype(output.scalar_type())) why = "dtype";
  if (why) {
    bump_counter("reduce_scatter.wrapped");
    return delegate(input, "reduce_scatter_tensor",
                    [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); });
  }
  check_or_reject("reduce_scatter_tensor", ops::OpKind::kReduceScatter, [&] {
    TORCH_CHECK(
        input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
        "cuda_p2p reduce_scatter_tensor: the input must have world size (", getSize(),
        ") times the output's ", output.numel(), " elements of ", output.scalar_type(), ", got ",
        input.numel(), " of ", input.scalar_type());
  });
  const at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  std::vector<at::Tensor> chunks;
  for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(in, q, output.numel()));
  reduce_scatter_on_workspace(chunks, output, *op);
  return completed(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

WorkPtr ProcessGroupCudaP2P::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* why = workspace_rejects(inputs);
  if (!why) why = workspace_rejects(outputs);
  const auto op = to_reduce_op(opts.reduceOp);
  if (!why && outputs.size() != inputs.size()) why = "shapes";
  if (!why && !op) why = "reduce op";
  for (size_t i = 0; !why && i < outputs.size(); ++i) {
    if (!ops::is_reducible_dtype(outputs[i].scalar_type())) why = "dtype";
  }
  if (why) {
    bump_counter("reduce_scatter.wrapped");
    return delegate(inputs, "reduce_scatter_tensor_coalesced", [&](c10d::Backend& b) {
      return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    });
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_or_reject("reduce_scatter_tensor", ops::OpKind::kReduceScatter, [&] {
      TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize() &&
                      outputs[i].scalar_type() == inputs[i].scalar_type(),
                  "cuda_p2p reduce_scatter_tensor (coalesced, tensor ", i,
                  "): the input must have world size (", getSize(), ") times the output's ",
                  outputs[i].numel(), " elements of ", outputs[i].scalar_type(), ", got ",
                  inputs[i].numel(), " of ", inputs[i].scalar_type());
    });
    const at::Tensor in = inputs[i].is_contiguous() ? inputs[i] : inputs[i].contiguous();
    std::vector<at::Tensor> chunks;
    for (int q = 0; q < getSize(); ++q) chunks.push_back(flat_chunk(in, q, outputs[i].numel()));
    reduce_scatter_on_workspace(chunks, outputs[i], *op);
  }
  return completed(c10d::OpType::COALESCED, outputs);
}

WorkPtr ProcessGroupCudaP2P::alltoall_base(at::Tensor& output, at::Tensor& input,
                                           std::vector<int64_t>& output_split_sizes,
                                           std::vector<int64_t>& input_split_sizes,
                                           const c10d::AllToAllOptions& opts) {
  return delegate(input, "all_to_all_single", [&](c10d::Backend& b) {
    return b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
  });
}

WorkPtr ProcessGroupCudaP2P::alltoall(std::vector<at::Tensor>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const c10d::AllToAllOptions& opts) {
  return delegate(inputs, "all_to_all",
                  [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); });
}

WorkPtr ProcessGroupCudaP2P::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  TORCH_CHECK(dst_rank >= 0 && dst_rank < getSize() && dst_rank != getRank(),
              "cuda_p2p send: destination must be another rank in [0, ", getSize(), "), got ",
              dst_rank, " on rank ", getRank());
  return delegate(tensors, "send",
                  [&](c10d::Backend& b) { return b.send(tensors, dst_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  TORCH_CHECK(src_rank >= 0 && src_rank < getSize() && src_rank != getRank(),
              "cuda_p2p recv: source must be another rank in [0, ", getSize(), "), got ", src_rank,
              " on rank ", getRank());
  return delegate(tensors, "recv",
                  [&](c10d::Backend& b) { return b.recv(tensors, src_rank, tag); });
}

WorkPtr ProcessGroupCudaP2P::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return delegate(tensors, "recv_anysource",
                  [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

WorkPtr ProcessGroupCudaP2P::barrier(const c10d::BarrierOptions& opts) {
  // A barrier for a CUDA device stays with NCCL unless the workspace itself is on CUDA.
  const bool device_ok = !opts.device.has_value() || !opts.device->is_cuda() ||
                         (is_p2p_available() && !workspace_->device().tensor_device().is_cpu());
  if (!uses_workspace_collectives() || !device_ok) {
    bump_counter("barrier.wrapped");
    c10d::Backend& b = route_barrier(opts);
    auto work = b.barrier(opts);
    return &b == cpu_backend_.get() ? track(std::move(work)) : work;
  }
  std::optional<Millis> timeout;
  if (opts.timeout > Millis(0)) timeout = opts.timeout;
  run_collective("barrier", [&](const ops::CollectiveContext& ctx) {
    ops::barrier(ctx, timeout);
    // A barrier blocks the caller, also when the workspace is on a GPU.
    workspace_->device().synchronize(ctx.stream);
  });
  bump_counter("barrier.workspace");
  return completed(c10d::OpType::BARRIER, {});
}

void ProcessGroupCudaP2P::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Only Gloo implements it; it reports which ranks failed to arrive.
  cpu_backend_->monitoredBarrier(opts, wait_all_ranks);
}

void ProcessGroupCudaP2P::startCoalescing() {
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(!coalescing_, "cuda_p2p: startCoalescing called twice without endCoalescing");
    coalescing_ = true;
    coalesced_works_.clear();
  }
  if (cuda_backend_) cuda_backend_->startCoalescing();
}

WorkPtr ProcessGroupCudaP2P::endCoalescing() {
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(coalescing_, "cuda_p2p: endCoalescing called without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_works_);
  }
  if (cuda_backend_) {
    if (auto cuda_work = cuda_backend_->endCoalescing()) works.push_back(std::move(cuda_work));
  }
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

void ProcessGroupCudaP2P::setSequenceNumberForGroup() {
  cpu_backend_->setSequenceNumberForGroup();
  if (cuda_backend_) cuda_backend_->setSequenceNumberForGroup();
}

uint64_t ProcessGroupCudaP2P::getSequenceNumberForGroup() {
  return cpu_backend_->getSequenceNumberForGroup();
}

void ProcessGroupCudaP2P::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  cpu_backend_->setTimeout(timeout);
  if (cuda_backend_) cuda_backend_->setTimeout(timeout);
}

// NOTE [Device failure] in p2p_workspace/watchdog.hpp: the workspace's device is failed first,
// so that a thread blocked in a workspace collective or barrier returns with an error.
void ProcessGroupCudaP2P::abort() {
  if (workspace_) workspace_->abort("the group was aborted (ProcessGroupCudaP2P.abort())");
  cpu_backend_->abort();
  if (cuda_backend_) cuda_backend_->abort();
}

void ProcessGroupCudaP2P::shutdown() {
  // Unblocks pending waits like abort(), but the workspace's blocks are still released through
  // the closing handshake (NOTE [Block lifetime]): peers shut down too.
  if (workspace_) {
    workspace_->device().abort("the group was shut down (ProcessGroupCudaP2P.shutdown())");
  }
  cpu_backend_->shutdown();
  if (cuda_backend_) cuda_backend_->shutdown();
}

}  // namespace cuda_p2p
