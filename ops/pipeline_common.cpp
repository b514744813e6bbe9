#include "ops/pipeline_common.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <exception>

#include "ops/channels.hpp"
#include "ops/coalesced_work.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "ops/cuda/sleep_kernel.cuh"
#endif

namespace cuda_p2p::ops {

const char* to_string(AllGatherAlgorithm a) {
  return a == AllGatherAlgorithm::kPullAhead ? "pull_ahead" : "pipeline";
}
const char* to_string(ReduceScatterAlgorithm a) {
  return a == ReduceScatterAlgorithm::kRing ? "ring" : "pipeline";
}

}  // namespace cuda_p2p::ops

namespace cuda_p2p::ops::pipeline {

void Trace::begin(int stream, std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  open_[stream] = static_cast<int64_t>(events_.size());
  events_.push_back({stream, std::move(what), now_us(), -1.0});
}

void Trace::end(int stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_[stream] >= 0) events_[open_[stream]].end_us = now_us();
  open_[stream] = -1;
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

void Env::run(int i, std::function<void()> fn, std::string what) const {
  if (!trace) {
    device().launch(stream(i), [fn = std::move(fn), tls = &tls] {
      at::ThreadLocalStateGuard guard(*tls);
      fn();
    });
    return;
  }
  device().launch(stream(i), [fn = std::move(fn), tls = &tls, trace = trace, i, what] {
    at::ThreadLocalStateGuard guard(*tls);
    if (trace) trace->begin(i, what);
    fn();
    if (trace) trace->end(i);
  });
}

void Env::span(int i, const std::string& what, const std::function<void()>& enqueue) const {
  if (!trace) return enqueue();
  device().host_task(stream(i), [trace = trace, i, what] { trace->begin(i, what); });
  enqueue();
  device().host_task(stream(i), [trace = trace, i] { trace->end(i); });
}

void Env::on_caller(const char* what, const std::function<void()>& fn) const {
  if (trace) trace->begin(2, what);
  fn();
  if (trace) trace->end(2);
}

void Env::run_compute(int i, std::function<void()> fn, std::string what) const {
  if (host()) {
    // Executor threads start with ATen's default intra-op thread count; each GEMM adopts the
    // one the process chose (torch.set_num_threads, which may change between ops).
    fn = [fn = std::move(fn)] {
      at::init_num_threads();
      fn();
    };
  }
  run(i, std::move(fn), std::move(what));
}

void Env::wait_stream(int i, int j) const {
  device().wait_event(stream(i), *device().record(stream(j)));
}

std::array<std::shared_ptr<Stream>, 2> acquire_streams(Device& device, State& state) {
  // NOTE [Group streams] in p2p_workspace/cuda/cuda_device.cpp: the group's own two, on every
  // device, made on first use - never under capture (NOTE [Replay-safe signals]: nothing is made
  // while a graph is captured).
  if (!state.streams[0] || !state.streams[1]) {
    TORCH_CHECK(device.capture_id(*device.current_stream()) == 0,
                "cuda_p2p fused op: the group's pipeline streams do not exist yet, and a graph "
                "capture cannot create them: run a fused op of this group once eagerly before "
                "capturing");
  }
  for (int i = 0; i < 2; ++i) {
    if (!state.streams[i]) state.streams[i] = device.new_stream(/*high_priority=*/i == 1);
  }
  return state.streams;
}

Env make_env(Group& group) {
  group.failure.check("fused op");
  State& state = group.state;
  TORCH_INTERNAL_ASSERT(group.workspace != nullptr,
                        "cuda_p2p fused op: the group has no workspace");
  auto& ws = *group.workspace;
  auto& dev = ws.device();
  check_signature_record(state.signature, "fused op", &dev);
  Env env(ws, dev.current_stream(), acquire_streams(dev, state),
          {kPipelineChannels[0], kPipelineChannels[1]}, group.max_buffer_size);
  if (state.tracing) env.trace = std::make_shared<Trace>();
  // The exchange is read by the host: NOTE [Synchronous host devices] in p2p_workspace/device.hpp.
  const bool synchronous = dev.host_synchronous();
  const ZeroCopyAgreement zc = resolve_agreement(group.zero_copy_agreement, synchronous);
  env.signature_agreement = zc == ZeroCopyAgreement::kSignature;
  if ((synchronous && zc == ZeroCopyAgreement::kExchange) || env.signature_agreement) {
    env.heap = group.heap;
  }
  // NOTE [Zero-copy all-gather→matmul]: ranks that agree differently run different barriers.
  if (group.heap != nullptr) {
    env.agreement_text = agreement_text(group.zero_copy_agreement, synchronous);
    if (!env.agreement_text.empty()) env.agreement_text += "; ";
  }
  // Before anything is enqueued: a failed device (NOTE [Device failure]) or a capture it cannot
  // replay.
  dev.check_healthy("fused op");
  env.captured = dev.capture_id(*env.caller) != 0;  // before begin_op flags the group
  if (env.captured) {
    // NOTE [Replay-safe signals]. The host pipelines' closures refer to the call's locals, which
    // a replay would find gone; on a GPU the closures only enqueue kernels, when they are called.
    TORCH_CHECK(!env.host(),
                "cuda_p2p fused op: cannot be captured on a host workspace (its "
                "stream closures refer to the call's locals); the host captures collectives only");
    env.heap = nullptr;  // zero-copy agreements carry host-issued values
  }
  ws.begin_op(*env.caller);  // NOTE [One order per group]
  return env;
}

void agree(Env& env, State& state, const OpSignature& sig) {
  if (env.world_size() == 1) return;
  if (env.captured) {
    // NOTE [Replay-safe signals]: no signature to compare; the op's open (NOTE [Graph flags])
    // opens the buffer (every peer has ended its earlier ops) as the handshake does, and checks
    // the signature's hash, its tag, at every flag barrier of the op.
    env.on_caller("barrier", [&] {
      env.ws.graph_open(
          *env.caller, env.channels[0], graph_tag(sig),
          std::string(name(sig.kind)) + " on channel " + std::to_string(env.channels[0]));
    });
    env.opened = true;
    return;
  }
  env.on_caller("handshake", [&] {
    const std::string error = handshake(env.ws, *env.caller, env.channels[0], state.signature, sig);
    // The handshake is the whole op when it is a rejection or precedes the unfused pair: its end
    // is the group's last op until the pipeline's own (NOTE [One order per group]).
    env.ws.end_op(*env.caller);
    if (!error.empty()) throw SignatureMismatch(error);
  });
  env.opened = true;  // NOTE [The handshake opens the buffer]
}

void check_or_reject(Group& group, bool on_workspace, OpId kind, c10::function_ref<void()> checks) {
  ops::check_or_reject(group.failure, on_workspace && group.world_size > 1, checks,
                       [&](const std::string& reason) {
                         Env env = make_env(group);
                         run_or_mark_failed(group.failure, name(kind), [&] {
                           agree(env, group.state, OpSignature::rejected(kind, reason));
                           // Under capture nothing follows the rejection's open (NOTE [Graph
                           // flags]).
                           if (env.captured) env.ws.graph_abandon(*env.caller);
                         });
                       });
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

void begin(Env& env) {
  auto& dev = env.device();
  auto ready = dev.record(*env.caller);
  for (int i = 0; i < 2; ++i) dev.wait_event(env.stream(i), *ready);
}

void end(Env& env) {
  auto& dev = env.device();
  const bool inline_caller = inline_paths(dev, *env.caller) != nullptr;
  if (!inline_caller) {
    for (int i = 0; i < 2; ++i) dev.wait_event(*env.caller, *dev.record(env.stream(i)));
    // NOTE [Replay-safe signals]: every peer done with this rank's buffer before the next op.
    if (env.captured && env.world_size() > 1) {
      env.ws.graph_close(*env.caller, env.channels[0], "fused op");
    }
    env.ws.end_op(*env.caller);  // NOTE [One order per group]
    // NOTE [Host ops return complete]: on the host the streams' closures refer to the op's
    // locals, so the host waits for them below also when its caller's stream is its own.
    if (!env.host()) return;
  }
  // First the caller waits until both streams have drained (waiting on the caller's own stream
  // runs at once on the host and reports a stream's error without clearing it). Only then are
  // the errors collected, and thereby cleared: clearing one stream's error while the other may
  // still wait for it would let that one run on past it.
  std::exception_ptr error;
  for (int i : {1, 0}) {
    if (!inline_caller) break;  // its waits are enqueued above; synchronize below drains
    try {
      dev.wait_event(*env.caller, *dev.record(env.stream(i)));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  for (int i : {0, 1}) {
    try {
      dev.synchronize(env.stream(i));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  // NOTE [Host ops return complete]: a host device with CUDA's semantics raises its failure
  // before the released streams have run the rest of the op's closures; they refer to its locals.
  if (error && env.host() && !dev.host_synchronous()) (void)dev.drain(env.ws.timeout());
  if (error) std::rethrow_exception(error);
}

EndGuard::~EndGuard() {
  if (!active_) return;
  try {
    end(env_);
  } catch (...) {  // NOLINT(bugprone-empty-catch): the exception in flight is the one to report
  }
}

void delay_stream(Env& env, int i) {
#ifdef CUDA_P2P_WITH_CUDA
  if (env.host()) return;
  env.device().launch(env.stream(i), [] {
    // ~2 microseconds on current GPUs: nothing next to a GEMM, and enough that the other
    // stream's kernel reaches the GPU first.
    const cudaError_t err = cuda::launch_sleep(c10::cuda::getCurrentCUDAStream().stream(), 2000);
    TORCH_CHECK(err == cudaSuccess,
                "cuda_p2p: launching the sleep kernel failed: ", cudaGetErrorString(err));
  });
#else
  (void)env;
  (void)i;
#endif
}

int64_t plan_rounds(Env& env, int64_t rows, int64_t bytes_per_row, const char* op,
                    Outcome& outcome) {
  TORCH_CHECK(rows >= 0 && bytes_per_row >= 0, "cuda_p2p ", op, ": bad payload of ", rows,
              " rows of ", bytes_per_row, " bytes");
  outcome.rounds = 0;
  if (rows == 0) return 0;
  outcome.rounds = 1;
  if (bytes_per_row == 0) return 1;  // nothing to exchange, but the consumers still run
  const int64_t need = rows * bytes_per_row;
  if (need > env.ws.buffer_size()) {
    const int64_t target = std::min(need, std::max(env.max_buffer_size, env.ws.buffer_size()));
    TORCH_CHECK(!env.captured || target <= env.ws.buffer_size(), "cuda_p2p ", op,
                ": would grow the workspace to ", target, " bytes (it holds ", env.ws.buffer_size(),
                "), which a graph capture cannot do (NOTE [Replay-safe "
                "signals]): call ensure_min_buffer_size(",
                target, ") on the group, or run the op once eagerly, before capturing");
    if (target > env.ws.buffer_size()) {
      env.ws.grow_to(target);
      outcome.grew = true;
    }
  }
  const int64_t rows_per_round = env.ws.buffer_size() / bytes_per_row;
  TORCH_CHECK(rows_per_round > 0, "cuda_p2p ", op, ": one row of the payload needs ", bytes_per_row,
              " bytes of workspace, but the buffer holds ", env.ws.buffer_size(),
              " bytes and may grow to max_buffer_size = ", env.max_buffer_size,
              " bytes; raise ProcessGroupCudaP2P.Options.max_buffer_size");
  outcome.rounds = (rows + rows_per_round - 1) / rows_per_round;
  return outcome.rounds;
}

bool workspace_serves(const SymmetricWorkspace* ws, const at::Device& device) {
  if (ws == nullptr || !ws->available()) return false;
  const at::Device wd = ws->device().tensor_device();
  return wd.type() == device.type() && (device.is_cpu() || wd.index() == device.index());
}

c10::intrusive_ptr<c10d::Work> exchange(c10d::Backend& backend, at::Tensor send, int dst,
                                        at::Tensor recv, int src, int tag) {
  std::vector<at::Tensor> send_v, recv_v;
  if (send.defined()) send_v.push_back(std::move(send));
  if (recv.defined()) recv_v.push_back(std::move(recv));
  const bool coalesce = backend.supportsCoalescing() && !send_v.empty() && !recv_v.empty();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (coalesce) backend.startCoalescing();
  // Receive first: a backend that runs each operation as it is issued has the receive posted
  // before its own send can block on the peer's.
  if (!recv_v.empty()) works.push_back(backend.recv(recv_v, src, tag));
  if (!send_v.empty()) works.push_back(backend.send(send_v, dst, tag));
  if (coalesce) {
    auto work = backend.endCoalescing();
    if (work) return work;
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> live;
  for (auto& w : works) {
    if (w) live.push_back(std::move(w));
  }
  return c10::make_intrusive<CoalescedWork>(backend.getRank(), std::move(live));
}

bool reduce_scatter_runs_ring(const Group& group, const std::string& algorithm,
                              int64_t ring_steps) {
  return algorithm == "ring" ||
         (algorithm == "auto" &&
          (ring_steps != 0 || group.auto_reduce_scatter == ReduceScatterAlgorithm::kRing));
}

}  // namespace cuda_p2p::ops::pipeline
