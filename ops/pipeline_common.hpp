// What the fused GEMM pipelines (fused_all_gather_matmul.cpp, fused_matmul_reduce_scatter.cpp)
// share: what a group gives an op (Group), the two streams they schedule on, how work enters and
// leaves them, and how a payload is fitted into the workspace buffer.
//
// Everything here is written against the device interface (p2p_workspace/device.hpp), so the
// schedule a GPU runs is the one CI runs on the host.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/FunctionRef.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <utility>
#include <vector>

#include "ops/common.hpp"
#include "ops/failure_record.hpp"
#include "ops/op_signature.hpp"
#include "ops/outcome.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p::ops {

// NOTE [Pipeline buffer reuse]
//  - A pipeline's first write of its own buffer comes after a barrier (on its stream 1): other
//    users of the workspace may return while peers still read this rank's buffer (the workspace
//    collectives end without a barrier; a user of get_p2p_buffer may too).
//  - A pipeline ends only after its last read of any buffer is over everywhere (a closing
//    barrier, or in the ring the readers' acknowledgements), so whatever runs next may write its
//    own buffer at once.
//  - Within an op, a region is rewritten only after the barrier (or acknowledgement) that follows
//    the readers' copies of it: the all-gather payload once per round, each half of the
//    reduce-scatter double buffer once per step of the stream that owns it, each ring slot once
//    every second publication.
//
// NOTE [The handshake opens the buffer]
// The signature handshake (NOTE [Op signatures]) that a fused op runs on the caller's stream
// before begin() is itself a barrier of every rank: a peer reaches it only after everything it
// did before the op in its caller's stream order, its reads of this rank's buffer included. Both
// pipeline streams start after it (begin), so it already says what the opening barrier says, and
// an op that ran it (Env::opened) skips that barrier: one barrier less per op, which is most of
// a small op's fixed cost. The pipelines driven without a handshake (the C++ tests) keep it.

// The fused ops' algorithms (docs/pipelines.md). What a call's "auto" runs is its group's choice
// for the op's device (Group::auto_all_gather, Group::auto_reduce_scatter), which the backend
// takes from its knobs fused_all_gather_algo and fused_reduce_scatter_algo.
enum class AllGatherAlgorithm : uint8_t { kPipeline, kPullAhead };
enum class ReduceScatterAlgorithm : uint8_t { kPipeline, kRing };
const char* to_string(AllGatherAlgorithm a);
const char* to_string(ReduceScatterAlgorithm a);

namespace pipeline {

// One span of a traced pipeline: what ran on which stream, from when its stream reached it to
// when it finished (microseconds since the op began). Stream 2 is the caller.
struct TraceEvent {
  int stream;
  std::string what;
  double start_us;
  double end_us;
};

// The spans of one op, recorded on the host (on CUDA the enqueueing is timed, not the work).
class Trace {
 public:
  Trace() : t0_(std::chrono::steady_clock::now()) {}
  void begin(int stream, std::string what);
  void end(int stream);
  std::vector<TraceEvent> events() const;

 private:
  double now_us() const;
  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  std::array<int64_t, 3> open_{-1, -1, -1};
};

// A group's state for its fused ops, kept by the backend (one per group, created on first use).
struct State {
  // Held for the whole of a fused op: two ops on one group must not interleave their signals on
  // the pipeline channels (NOTE [Signal sequence numbers]) nor their send/recv tags.
  std::mutex mutex;
  // The pipeline streams, the group's own (acquire_streams).
  std::array<std::shared_ptr<Stream>, 2> streams;
  // The handshakes comparing the ops' signatures across ranks, on the first pipeline channel
  // (NOTE [Op signatures] in ops/op_signature.cpp).
  SignatureState signature;
  // Diagnostics: when set, each op records a Trace, kept until the next op.
  bool tracing = false;
  std::vector<TraceEvent> last_trace;
};

// What a fused op is given by the group it runs on (the backend builds it for each call).
struct Group {
  // The group's workspace, or null when it has none; the op runs on it when it serves the
  // op's tensors (workspace_serves).
  SymmetricWorkspace* workspace;
  // The group's wrapped backend for the op's device (its send/recv carry the op when the
  // workspace cannot), or null.
  c10d::Backend* wrapped;
  // The group's pipeline state; the caller holds its mutex for the whole op.
  State& state;
  // The group's failure record, shared with its collectives (NOTE [Failed groups]).
  FailureRecord& failure;
  // Largest buffer an op may grow the workspace to (bytes).
  int64_t max_buffer_size;
  int world_size;
  // The group's symmetric heap once cuda_p2p.empty created it, else null, and how the ranks
  // agree on reading it (the collectives' setting): NOTE [Zero-copy all-gather→matmul] in
  // ops/fused_all_gather_matmul.cpp.
  SymmetricWorkspace* heap = nullptr;
  ZeroCopyAgreement zero_copy_agreement = ZeroCopyAgreement::kAuto;
  // What "auto" runs for tensors on the op's device (the group's knobs, by device).
  AllGatherAlgorithm auto_all_gather = AllGatherAlgorithm::kPipeline;
  ReduceScatterAlgorithm auto_reduce_scatter = ReduceScatterAlgorithm::kPipeline;
};

// Whether a matmul→reduce-scatter (plain or scaled) runs the ring: asked for by name, or "auto"
// with ring steps (which ask for it) or where the group's choice is the ring.
bool reduce_scatter_runs_ring(const Group& group, const std::string& algorithm, int64_t ring_steps);

// One pipelined op's view of the world: the workspace, the caller's stream and the pipeline's
// two streams, each with its own signal channel.
//
// NOTE [Pipeline streams]
// streams[0] ("the first stream") has normal priority; streams[1] ("the second stream") has high
// priority on CUDA and carries the communication of the alternate steps. Both start after
// everything the caller enqueued before the op (begin), and the caller continues only after
// both (end): in stream order (CUDA, or a host caller on a stream of its own), or, for the host's
// inline caller, by blocking, so an op returns with its results complete. Each stream signals only
// on its own channel (channels[i]), so barriers issued from the two streams never consume each
// other's signals.
//
// NOTE [Pipeline temporaries]
// A pipeline's temporaries (stacks, accumulators, contiguous copies of A, staging outputs) are
// allocated on the caller's stream and used on the pipeline streams, without recordStream: their
// reuse is stream-ordered. The CUDA caching allocator hands a freed block out again only to
// allocations on the stream it was allocated on (the caller's), and every temporary is dropped
// by the host only after end() - or EndGuard on an error - has made the caller's stream wait for
// both pipeline streams; so whatever reuses the block runs after the pipeline's last use of it.
// Tensors allocated inside a closure (run, run_compute) are allocated on that closure's stream
// and used there only. A temporary that outlives an op (kept in per-group state and used on
// different streams by different ops) is not covered by this and must be recorded with
// Device::record_stream instead (CollectiveState::scratch).
struct Env {
  Env(SymmetricWorkspace& ws, std::shared_ptr<Stream> caller,
      std::array<std::shared_ptr<Stream>, 2> streams, std::array<int, 2> channels,
      int64_t max_buffer_size)
      : ws(ws),
        caller(std::move(caller)),
        streams(std::move(streams)),
        channels(channels),
        max_buffer_size(max_buffer_size) {}

  SymmetricWorkspace& ws;
  std::shared_ptr<Stream> caller;
  std::array<std::shared_ptr<Stream>, 2> streams;
  std::array<int, 2> channels;
  // Largest buffer an op may grow the workspace to (bytes).
  int64_t max_buffer_size;
  // The caller's thread-local ATen state (grad mode, dispatch exclusions, ...), replayed around
  // every closure run on a stream: on the host those run on executor threads.
  at::ThreadLocalState tls;

  Device& device() const { return ws.device(); }

  int rank() const { return ws.rank(); }
  int world_size() const { return ws.world_size(); }
  Stream& stream(int i) const { return *streams[i]; }
  // Whether the streams are host threads running the closures (NOTE [Host fast paths]).
  bool host() const { return device().host_paths() != nullptr; }

  // Runs `fn` in order on stream i, with the caller's thread-local state; `what` names it in a
  // trace.
  void run(int i, std::function<void()> fn, std::string what = "run") const;
  // Runs a GEMM `fn` on stream i (on the host, with the process's intra-op thread count).
  void run_compute(int i, std::function<void()> fn, std::string what = "gemm") const;
  // Calls `enqueue` (which enqueues work on stream i: a copy, a barrier); in a trace, the span
  // covers that work.
  void span(int i, const std::string& what, const std::function<void()>& enqueue) const;
  // Runs `fn` on the calling thread now (stream 2 of a trace).
  void on_caller(const char* what, const std::function<void()>& fn) const;
  // Set to trace this op (State::tracing).
  std::shared_ptr<Trace> trace;
  // Set by agree() once its handshake ran: NOTE [The handshake opens the buffer].
  bool opened = false;
  // The caller's stream is being captured (NOTE [Replay-safe signals]).
  bool captured = false;
  // Group::heap where the op may read shards in it (exchange on the host, or signature), else
  // null ("off", or exchange on CUDA); whether the ranks agree by signature; and this rank's
  // claim - its A_shard's heap offset, which it put in the op's signature (NOTE [Zero-copy
  // all-gather→matmul]).
  SymmetricWorkspace* heap = nullptr;
  bool signature_agreement = false;
  std::optional<int64_t> zero_copy_claim;
  // "zero_copy_agreement <name>; " when the group has a heap and this rank's agreement is not its
  // device's default, else "": the head of the fused ops' signatures.
  std::string agreement_text;
  // Stream i waits for everything enqueued on stream j so far.
  void wait_stream(int i, int j) const;
};

// The pipeline streams of `device`, kept in `state` (created on first use; the second one has high
// priority): on the host executor threads, on CUDA streams of the group's own (NOTE [Group
// streams] in p2p_workspace/cuda/cuda_device.cpp).
std::array<std::shared_ptr<Stream>, 2> acquire_streams(Device& device, State& state);

// The Env of an op of `group` on its workspace: the caller's current stream, the pipeline
// streams, channels kPipelineChannels (ops/channels.hpp) and the group's max_buffer_size. Refuses
// a failed group (NOTE [Failed groups]) or device, and a stream being captured into a CUDA graph.
Env make_env(Group& group);

// Runs `fn()` (a pipeline over the workspace); an exception out of it marks the group failed
// (NOTE [Failed groups]: its collectives and fused ops then refuse to run) and propagates -
// except a disagreement of the ranks' signatures, after which the group is usable.
template <typename Fn>
auto run_or_mark_failed(FailureRecord& failure, const char* op, Fn&& fn) {
  try {
    return fn();
  } catch (const SignatureMismatch&) {
    throw;
  } catch (const std::exception& e) {
    failure.mark(op, e);
    throw;
  }
}

// Compares `sig` across the ranks (NOTE [Op signatures]) with a handshake on the caller's stream
// and the first pipeline channel, before the op enqueues anything on its streams: on the host a
// disagreement raises SignatureMismatch here, on every rank, with nothing else done.
void agree(Env& env, State& state, const OpSignature& sig);

// Runs an op's local argument checks; if they fail on this rank while the workspace serves the
// op, this rank first tells its peers through the op's handshake (ops::check_or_reject).
void check_or_reject(Group& group, bool on_workspace, OpId kind, c10::function_ref<void()> checks);

// "[4, 8]" for a signature.
std::string shape_text(at::IntArrayRef sizes);

// Both pipeline streams wait for the caller's stream.
void begin(Env& env);
// The caller's stream waits for both pipeline streams (on the host: blocks until both have run
// and rethrows the first error of either, leaving both usable for the next op).
void end(Env& env);

// NOTE [Host ops return complete]
// On the host an op's stream closures run later, in other threads, and refer to the op's locals
// (its consumers, its Env): so every host op has run when it returns, also when its caller's
// current stream is a stream of its own (host::set_current_stream), whose waits it still
// enqueues in stream order. On CUDA a closure runs when it is enqueued (Device::launch), and an
// op returns with its work queued.

// Runs end(env) when a pipeline is left by an exception half-way, so that no stream still uses
// the op's temporaries after they are freed. The error itself is the one already in flight.
class EndGuard {
 public:
  explicit EndGuard(Env& env) : env_(env) {}
  ~EndGuard();
  void release() { active_ = false; }

 private:
  Env& env_;
  bool active_ = true;
};

// On CUDA, a few microseconds of sleep on stream i so that the other stream's next kernel is
// scheduled first on every rank (NOTE [Launch order] in fused_matmul_reduce_scatter.cpp). No-op
// on the host.
void delay_stream(Env& env, int i);

// How many rounds a payload of `rows` rows of `bytes_per_row` bytes needs in the workspace.
// If it does not fit, the workspace grows (collectively: every rank asks for the same size,
// since the shapes are the same on every rank) up to env.max_buffer_size; what still does not
// fit is processed in rounds of as many rows as fit. Sets outcome.rounds, and outcome.grew when
// it grew the workspace.
int64_t plan_rounds(Env& env, int64_t rows, int64_t bytes_per_row, const char* op,
                    Outcome& outcome);

// Whether a workspace on `ws`'s device can drive tensors on `device`.
bool workspace_serves(const SymmetricWorkspace* ws, const at::Device& device);

// Tags for the wrapped backend's send/recv in the fallback paths, one per step; kept far from
// the small tags users pick.
inline constexpr int kSendRecvTagBase = 0x5f000000;

// One exchange with the ring neighbours over the wrapped backend: sends `send` to `dst` and
// receives `recv` from `src` (either may be undefined), issued together (coalesced where the
// backend supports it) so that neither direction waits for the other.
c10::intrusive_ptr<c10d::Work> exchange(c10d::Backend& backend, at::Tensor send, int dst,
                                        at::Tensor recv, int src, int tag);

}  // namespace pipeline
}  // namespace cuda_p2p::ops
