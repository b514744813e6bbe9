// The device interface (docs/design.md §2): what a device does for the algorithms of this project -
// share blocks, streams, copies, signals and waits, launches of device work, host tasks, events,
// failure - with one implementation per device kind (host/: shared memory and host streams;
// cuda/: CUDA IPC and CUDA streams; docs/design.md §2 has the table). An algorithm enqueues work
// on streams and never looks at which implementation it got, so the schedule CI runs on the host
// is the schedule a GPU runs; what only the host can do is one declared capability (NOTE [Host
// fast paths]). Creating a device is device-specific: host/host_device.hpp,
// cuda/cuda_device.hpp.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p {

using Millis = std::chrono::milliseconds;

// An ordered queue of work. Work enqueued on one stream runs in order; different streams run
// concurrently and are ordered only through events and signals.
class Stream {
 public:
  virtual ~Stream() = default;
};

// A point in a stream's queue that another stream (or the host) can wait for.
class Event {
 public:
  virtual ~Event() = default;
  // Recorded on a stream being captured into a graph: the event marks a point of the graph, not
  // of a stream's run (NOTE [Captured events]).
  virtual bool captured() const { return false; }
};

// NOTE [Captured events]
// An op enqueued while its stream is captured into a graph has not run when it returns, and its
// end event belongs to the graph: CUDA refuses a host query or synchronize of such an event
// (cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing
// stream", and the refused call invalidates the capture), while a stream may wait for it (the
// graph's dependency). So a Work of a captured op never asks whether it has run: wait() orders the
// caller's stream after it and returns (torch's synchronous collectives call wait() inside a
// capture: the GPU run of 2026-12-04 failed there, a captured dist.all_reduce at W = 2),
// and query or synchronize of a captured event raises this error on every device, the host's with
// CUDA's semantics too, instead of reaching the driver.
inline void check_event_not_captured(const Event& e, const char* what) {
  TORCH_CHECK(!e.captured(), "cuda_p2p ", what,
              ": the op was captured into a graph and has not run; its Work cannot be queried or "
              "synchronized (CUDA refuses it for an event recorded in a capture): wait() orders "
              "the stream after it, and a replay runs it (NOTE [Captured events] in "
              "p2p_workspace/device.hpp)");
}

// One rank's shared block, as mapped into this process. The mapping is released when the last
// reference (the workspace, or a tensor aliasing it) is dropped.
class Block {
 public:
  virtual ~Block() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Keeps the local block reachable by peers while a rendezvous is in progress.
class BlockExporter {
 public:
  virtual ~BlockExporter() = default;
  // The bytes a peer passes to Device::import_block (published through the c10d store).
  virtual std::vector<uint8_t> handle() const = 0;
};

// One signal word to wait for: *addr >= value, in wrap-around (sequence number) order. `peer` is
// the rank expected to write it, named in the timeout error.
struct SignalWait {
  const uint32_t* addr;
  uint32_t value;
  int peer;
};

// A wait whose value is read when the stream reaches it: *addr >= *counter + offset (NOTE
// [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp). `counter` is a word of this
// rank's own memory that only this rank's streams advance (Device::advance_counter).
struct CountedWait {
  const uint32_t* addr;
  const uint32_t* counter;
  uint32_t offset;
  int peer;
};

// The data a kernel op moves between its flag barriers (Device::graph_kernel, NOTE [Graph flags]
// in p2p_workspace/graph_flags.hpp), given for each kind of device: `host(step, block)` runs on the
// host device after barrier `step` has passed, for each block; `cuda(launch)` launches the whole
// kernel, barriers included, on the current CUDA stream (ops/cuda/). Empty: a kernel of barriers
// only, which the device runs itself.
struct GraphKernelBody {
  std::function<void(int step, int block)> host;
  std::function<void(const GraphLaunch& launch)> cuda;
};

// True when `word` has reached `value` in sequence-number order (wrap-around safe, the same rule
// as CU_STREAM_WAIT_VALUE_GEQ).
inline bool signal_reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

// Reads another process's private memory - not the shared blocks, but e.g. a tensor it passed to
// a collective - straight into this process's, on the host thread that calls it. A device offers
// one (HostPaths::cross_memory_reader) when its streams can read host memory of other processes
// in a host task (the host device: host/cross_memory.hpp). Whether the system allows it varies,
// so the workspace probes it at rendezvous (SymmetricWorkspace::cross_memory_reads()) before any
// algorithm relies on it.
class CrossMemoryReader {
 public:
  virtual ~CrossMemoryReader() = default;
  // Copies `n` bytes at `src` in process `pid` to `dst` in this process, now, in the calling
  // thread. Throws, naming the system's error, when the system refuses or `src` is not mapped.
  virtual void read(void* dst, int64_t pid, const void* src, size_t n) = 0;
};

// NOTE [Host fast paths]
// One protocol runs on every device: blocks, streams, copies, signals and waits, launches, host
// tasks, events and failure, the Device core below. A device whose blocks are host memory and
// whose streams are host threads (the host device, host/host_device.cpp) also declares what only
// it can do, in one optional capability, Device::host_paths(): null on CUDA, so code that asks
// `if (auto* h = dev.host_paths())` takes the host's shortcut there and the common protocol
// everywhere else - and CI, which runs on the host, runs both (a host device with CUDA's
// semantics answers synchronous() false, NOTE [Synchronous host devices]). Code never asks the
// device's kind for this; it asks the tensors' device only where torch or c10d needs it (pinned
// staging, a CPU kernel, a Work's future, which tensors go to the wrapped backend).
class HostPaths {
 public:
  virtual ~HostPaths() = default;

  // NOTE [Synchronous host devices]
  // Whether an op on this device has run to its end when it returns, so that the host may decide
  // from what the op's streams computed: compare the ranks' op signatures there and then (NOTE
  // [Op signatures] in ops/op_signature.cpp), read an exchange of heap offsets (NOTE [Zero-copy
  // collectives] in ops/zero_copy.cpp), return no Work for a synchronous call. The host device,
  // by default; not a host device with CUDA's semantics (HostSemantics::kCuda in
  // host/host_device.hpp), whose ops return enqueued as CUDA's do: the protocol code asks this
  // (Device::host_synchronous()), never the device's kind, so that CI runs the CUDA branches.
  virtual bool synchronous() const = 0;

  // How this device's streams read peers' private memory, or null when they cannot (without the
  // capability - CUDA - a peer's private device memory is not reachable; algorithms then stage
  // through the buffers). The reader runs on the host, in stream order through host_task().
  // `deny`: a reader whose every read fails as the system's refusal would (the workspace's
  // deny_cross_memory_reads test hook: one rank's probe fails).
  virtual std::shared_ptr<CrossMemoryReader> cross_memory_reader(bool deny) = 0;

  // How many CPUs the ranks of this host may run on together (the union of their affinities),
  // told at every rendezvous (NOTE [CPUs of the ranks] in p2p_workspace/workspace_records.cpp):
  // the host's waits poll by it. What it was told last (0: not yet), and whether this host's
  // ranks outnumber those CPUs (then its waits yield from the start).
  virtual void set_ranks_cpus(int cpus) = 0;
  virtual int ranks_cpus() const = 0;
  virtual bool oversubscribed() const = 0;

  // NOTE [Inline signals]
  // On a stream whose work runs at once on the calling thread (the host's inline stream), a
  // latency-bound algorithm may do each step itself instead of enqueueing a task per step (a
  // closure, a context string, a lock each), which would be most of a small all-reduce's CPU
  // time. It then writes signals with write_signal_now, copies with memcpy, and polls with
  // poll_signals_now; a wait that poll_signals_now did not see satisfied goes on through
  // Device::wait_signals, with its timeout, back-off, sleep and failure checks. The order is the
  // one enqueueing would give, since the stream runs everything in program order anyway.
  //
  // Whether work enqueued on `s` runs at once, on the calling thread.
  virtual bool runs_inline(const Stream& s) const = 0;
  // Device::write_signal(s, addr, value) for such a stream: done now, by the calling thread.
  virtual void write_signal_now(uint32_t* addr, uint32_t value) = 0;
  // Polls the waits now, with the back-off of the device's own waits, for a short while (up to
  // the spin budget of NOTE [Host waits on shared cores]); true when every wait is satisfied,
  // with the writers' earlier stores visible. Never sleeps and never throws: the caller goes on
  // with Device::wait_signals when it returns false.
  virtual bool poll_signals_now(c10::ArrayRef<SignalWait> waits) = 0;
};

// Words the host reads and the device's work writes (e.g. the record an op-signature comparison
// leaves, NOTE [Op signatures] in ops/op_signature.cpp): `host` for the host, `device` for the
// device's kernels and copies (the same memory; the same address on the host device).
struct HostWords {
  uint32_t* host = nullptr;
  uint32_t* device = nullptr;
};

// Where a rank's failure reaches its peers, and theirs reaches it (NOTE [Failure words] in
// p2p_workspace/watchdog.hpp): word 0 of each rank's failure area, host memory every peer maps.
struct FailureWords {
  int rank = -1;
  uint32_t* own = nullptr;       // this rank's word, in its own area
  std::vector<uint32_t*> peers;  // this rank's word in each peer's area, by rank (null: itself)
  // The areas' mappings (this rank's first): the device keeps them while it may use the words.
  std::vector<std::shared_ptr<Block>> areas;
  // The group's choice: kernels trap at a peer's failure (NOTE [Who traps] in
  // p2p_workspace/flag_barrier_body.hpp; WorkspaceOptions::trap_on_peer_failure).
  bool trap_on_peer_failure = false;
  // Where peer `peer`'s area is in `areas`: after this rank's, the peers in rank order.
  static size_t area_index(int rank, int peer) {
    return static_cast<size_t>(peer < rank ? peer + 1 : peer);
  }
};

// Every member is pure: what a device does not need (the synchronous host's query, a GPU's
// host_paths) is a one-line answer in its class (host/host_device_impl.hpp,
// cuda/cuda_device_impl.hpp), not a default the reader must find here.
class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:N"; the device of tensors aliasing this device's blocks.
  virtual std::string name() const = 0;
  virtual at::Device tensor_device() const = 0;
  // Distinguishes processes that may share a device: peers on the same physical device must agree.
  virtual int device_index() const = 0;
  // The physical device, published at rendezvous: a GPU's UUID ("GPU-..."), "host" on the host.
  virtual std::string device_uuid() const = 0;
  // Why this process cannot map blocks of a peer whose device_uuid() is `peer_uuid` ("" when it
  // can). Ranks on the same GPU always can (IPC within one GPU is valid); different GPUs need
  // peer access. Called for every peer before import_block, so that a wrong setup is reported
  // by name on every rank instead of failing inside the import.
  virtual std::string peer_access_problem(const std::string& peer_uuid) = 0;

  // --- blocks ---
  // A new zero-filled block of `bytes`, shareable with peers of the same host.
  virtual std::shared_ptr<Block> allocate(size_t bytes) = 0;
  // Starts exporting `block` to up to `max_peers` peers of the same user on this host.
  virtual std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                                      int max_peers) = 0;
  // Maps a peer's block from the handle its exporter published.
  virtual std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                              Millis timeout) = 0;
  // Whether a block stays valid for the peers that map it whatever its owner does with its own
  // reference (host: a memfd lives while any process maps it; CUDA: a cuMem allocation while any
  // process maps it, NOTE [Blocks that outlive their exporter] in cuda/vmm_blocks.cpp), so that a
  // block a peer never closed may still be freed (NOTE [Block lifetime]). Where it does not
  // (legacy CUDA IPC) freeing an exported allocation before every importer closed it is
  // undefined.
  virtual bool blocks_outlive_owner() const = 0;
  // What the blocks are, for reports (python -m cuda_p2p): "memfd", "cuMem (POSIX descriptors)",
  // "CUDA IPC (legacy: <why>)".
  virtual std::string block_memory() const = 0;

  // --- streams ---
  // The caller's stream: the current CUDA stream; on the host, the calling thread itself (work
  // enqueued there runs before the call returns).
  virtual std::shared_ptr<Stream> current_stream() = 0;
  virtual std::shared_ptr<Stream> new_stream(bool high_priority) = 0;

  // Copies `n` bytes; either side may be a peer's mapping.
  virtual void copy(Stream& s, void* dst, const void* src, size_t n) = 0;
  // Writes `value` to a signal word (usually in a peer's pad), after all earlier work on `s`.
  virtual void write_signal(Stream& s, uint32_t* addr, uint32_t value) = 0;
  // Makes `s` wait until every wait is satisfied. A wait that is not satisfied within `timeout`
  // fails the stream with an error naming `context` and every peer that never arrived.
  virtual void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                            std::string context) = 0;
  // Launches device work on `s`: `fn` enqueues it (ATen ops, kernels) with `s` as the current
  // stream. On CUDA `fn` is called now and the work it launched runs in stream order; on the host
  // `fn` itself runs when the stream reaches it (in whichever thread runs the stream's work). So
  // `fn` may only enqueue work: what it computes on the host is not yet ordered on a GPU.
  virtual void launch(Stream& s, std::function<void()> fn) = 0;
  // Runs `fn` on the host when `s` reaches it, after the work enqueued before it and before the
  // work enqueued after it (reading or writing host memory in stream order, e.g. through a
  // CrossMemoryReader). On CUDA it is a host function of the stream (cudaLaunchHostFunc), which
  // must not call CUDA APIs and stalls the stream while it runs; on the host it is a task of the
  // stream. An exception out of `fn` is raised by a later synchronize (host: of `s`, which skips
  // the rest of its queue; CUDA: the device's next one).
  virtual void host_task(Stream& s, std::function<void()> fn) = 0;

  virtual std::shared_ptr<Event> record(Stream& s) = 0;
  virtual void wait_event(Stream& s, const Event& e) = 0;
  // Blocks the host until everything enqueued on `s` has run; rethrows the first error of `s`.
  virtual void synchronize(Stream& s) = 0;
  // Blocks the host until the work recorded by `e` has run; rethrows the device's failure.
  virtual void synchronize(const Event& e) = 0;
  // Whether the work recorded by `e` has run, without blocking (Work.is_completed()). The
  // synchronous host's answer is true: an op there has run when it returns.
  virtual bool query(const Event& e) = 0;
  // Blocks the host until all work this device enqueued, on the streams it handed out, has run
  // (before blocks that work may still read are released: NOTE [Workspace growth]). A no-op on
  // the host, whose ops complete before they return.
  virtual void quiesce() = 0;

  // Blocks the host until the work enqueued on the device's own streams and on the callers'
  // streams its ops used since it last drained has run, or `limit` has passed (returns false
  // then). Unlike quiesce it raises nothing, also on a failed device, whose released waits let
  // the streams drain (NOTE [Teardown drains] in p2p_workspace/symmetric_workspace.cpp).
  virtual bool drain(Millis limit) noexcept = 0;
  // The group's timeout: how long a host-side wait for a stream (synchronize, quiesce) may take
  // before it raises instead of hanging (CUDA; the host's waits have their own deadlines).
  virtual void set_timeout(Millis timeout) = 0;

  // --- failure (NOTE [Device failure] in p2p_workspace/watchdog.hpp) ---
  // Fails this device for good: every pending and later wait raises an error naming `why`
  // (host: every wait loop returns within ~10 ms; CUDA: the watchdog records `why` and releases
  // every pending wait, NOTE [Releasing blocked waits]). Thread-safe, may be called while
  // another thread is blocked in a wait.
  virtual void abort(const std::string& why) = 0;
  // The graceful end (NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp): drains for at
  // most `limit`, then fails the device with `why`. Returns whether the work drained; if it did,
  // the Works of the ops enqueued before stay successful (check_work) and only later ops raise;
  // if not, this is an abort: the waits still pending are released and those Works raise.
  virtual bool retire(const std::string& why, Millis limit) = 0;
  // Raises the error that failed this device (an abort, or on CUDA a wait that missed its
  // deadline, naming the op and the ranks that never arrived); a no-op while it is healthy.
  virtual void check_healthy(const char* op) = 0;
  // check_healthy for the Work of an op enqueued earlier (Work.wait(), is_success()): no error
  // after a retire() that drained, since that op ran to its end normally.
  virtual void check_work(const char* op) = 0;
  // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp: why a kernel of this device gave up
  // with an error that loses the CUDA context ("" while none did): the give-ups a CUDA device's
  // kernels recorded before they trapped, the host with CUDA's semantics' model of a trap.
  virtual std::string lost_context() const = 0;
  // NOTE [Failure words]: whether the device has its words (a group's symmetric heap, a second
  // workspace on the group's device and ranks, finds them set and makes no area of its own),
  // and the words, handed over once, before the device's first op (a later call is ignored).
  // Every wait, watchdog and check of the device then treats a set word as the device's failure,
  // and the device's own failure is written into the peers' words before any wait is released.
  virtual bool has_failure_words() const = 0;
  virtual void set_failure_words(FailureWords words) = 0;
  // The peers in `ranks` are gone for good (a shrink excluded them: NOTE [Shrinking past dead
  // ranks] in backend/child_groups.cpp): this device's failure is written to their words no more,
  // and its mappings of their failure areas are dropped. Idempotent; thread-safe.
  virtual void forget_failure_peers(const std::vector<int>& ranks) = 0;
  // A failure an op records in memory of its own, in stream order (NOTE [A disagreement fails
  // the device at once] in ops/op_signature.cpp): `probe` returns why the device failed, or ""
  // while nothing is recorded. From now on the device's watchdog asks it at every scan and, once
  // it answers, fails the device with it and releases the pending waits. A device without a
  // watchdog (a host-synchronous one, whose ops compare before they go on) never asks it.
  // Thread-safe; `probe` must not throw.
  virtual void add_failure_probe(std::function<std::string()> probe) = 0;
  // --- capture (NOTE [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp) ---
  // Nonzero while `s` is being captured into a graph (CUDA: a CUDA graph; host: a host capture,
  // host/host_device.hpp): an id the same for every stream of one capture, different for the
  // next. Work enqueued then runs at each replay, with the values it was enqueued with, so an
  // op enqueues no host-issued sequence number and nothing that allocates or exchanges.
  virtual uint64_t capture_id(Stream& s) = 0;
  // At the stream's turn: *counter += delta (a word of this rank's own memory).
  virtual void advance_counter(Stream& s, uint32_t* counter, uint32_t delta) = 0;
  // At the stream's turn: writes *counter + offset to `addr` (usually a peer's pad), after all
  // earlier work on `s`, like write_signal.
  virtual void write_counted(Stream& s, uint32_t* addr, const uint32_t* counter,
                             uint32_t offset) = 0;
  // Makes `s` wait until every counted wait is satisfied, the values read when `s` reaches the
  // wait. A wait not satisfied within `timeout` fails the device naming `context` and the peers
  // missing; under capture the wait gives up by itself (CUDA: on the GPU's clock) and the error
  // is raised by the group's next call.
  virtual void wait_counted(Stream& s, std::vector<CountedWait> waits, Millis timeout,
                            std::string context) = 0;
  // NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: runs `launch`'s flag barriers on `s` with
  // `body` between them, as one unit of the stream (CUDA: one kernel; host: one task). Each wait
  // gives up after `timeout`, naming `context` and the peers missing, and a foreign tag is an
  // error naming its rank; either fails the device (CUDA: the kernel traps, as a counted wait
  // does; the host raises into the stream), so that no rank pairs two different ops. A peer's
  // failure word or this device's failure ends it as it ends a counted wait.
  virtual void graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body,
                            Millis timeout, std::string context) = 0;
  // Tells the caching allocator that `t` is used on `s`, so that its memory is not handed out
  // again before the work `s` has enqueued so far has run (c10 recordStream; for pinned host
  // memory, the caching host allocator's record_event). On a host device with CUDA's semantics a
  // task queued on `s` holds `t` (its closures read raw pointers); else a no-op.
  virtual void record_stream(const at::Tensor& t, Stream& s) = 0;

  // NOTE [Host fast paths]: the host's capability, null when the device has none (CUDA).
  virtual HostPaths* host_paths() const = 0;
  // Whether an op has run to its end when it returns (NOTE [Synchronous host devices]).
  bool host_synchronous() const {
    const HostPaths* h = host_paths();
    return h != nullptr && h->synchronous();
  }
  // `n` zeroed words the host reads and the device writes, for as long as the device lives.
  // They come from a pool the device reserves when it is created (CUDA: page-locked and mapped,
  // NOTE [Pinned pools] in p2p_workspace/cuda/cuda_device_impl.hpp; the host: ordinary memory), so
  // that asking for them never allocates pinned memory while a wait may be blocked; a request
  // past the pool raises, naming what is left. Thread-safe.
  virtual HostWords host_words(size_t n) = 0;
};

// The host's capability when work enqueued on `s` runs at once on the calling thread (NOTE
// [Inline signals]), else null.
inline HostPaths* inline_paths(const Device& device, const Stream& s) {
  HostPaths* h = device.host_paths();
  return h != nullptr && h->runs_inline(s) ? h : nullptr;
}

}  // namespace cuda_p2p
