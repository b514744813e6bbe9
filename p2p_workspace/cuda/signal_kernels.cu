#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/graph_barrier.cuh"
#include "p2p_workspace/cuda/launch_kernel.cuh"
#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/signal_store_body.hpp"
#include "p2p_workspace/signal_wait_body.hpp"
#include "p2p_workspace/wait_pacing_body.hpp"

namespace cuda_p2p::cuda {

namespace {

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

// The signal stores' policy (p2p_workspace/signal_store_body.hpp): the stream's own counters by
// plain loads and stores (its earlier kernels wrote them); a signal after a system-wide fence
// (what the stream wrote before is visible to the peers first), by a system-scope release store.
struct CudaStores {
  __device__ uint32_t load(const uint32_t* p) const { return *p; }
  __device__ void store(uint32_t* p, uint32_t v) const { *p = v; }
  __device__ void publish(uint32_t* addr, uint32_t value) const {
    __threadfence_system();
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(value) : "memory");
  }
};

__global__ void write_signal_kernel(uint32_t* addr, uint32_t value) {
  signal_write(addr, value, CudaStores{});
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* addr) {
  return *static_cast<const volatile uint32_t*>(addr);
}

// The waits' policy (p2p_workspace/signal_wait_body.hpp): system-scope acquire loads in 32-bit
// sequence order; the failure words of `ends`; for a counted wait also its device's give-up record.
struct CudaWaits {
  WaitEnds ends;
  const GraphGiveUp* counted;  // null for an eager wait
  __device__ bool reached(const uint32_t* addr, uint32_t value) const {
    return static_cast<int32_t>(load_acquire_sys(addr) - value) >= 0;
  }
  // NOTE [Failure words] (p2p_workspace/watchdog.hpp): a peer's failure has reached this rank.
  __device__ bool peer_failed() const {
    if (ends.peer_failed == nullptr) return false;
    const uint32_t v = load_volatile(ends.peer_failed);
    return v != 0 && v != static_cast<uint32_t>(ends.rank) + 1;
  }
  __device__ bool ended() const {
    if (ends.failed != nullptr && load_volatile(ends.failed) != 0) return true;
    return counted != nullptr &&
           (load_volatile(&counted->gave_up) != 0 || load_volatile(&counted->failed) != 0);
  }
};

struct EagerList {
  const KernelWaits& w;
  __device__ int count() const { return w.count; }
  __device__ const uint32_t* addr(int i) const { return w.addr[i]; }
  __device__ uint32_t value(int i) const { return w.value[i]; }
};

struct CountedList {
  const CountedKernelWaits& w;
  const uint32_t* values;  // resolved when the kernel starts
  __device__ int count() const { return w.count; }
  __device__ const uint32_t* addr(int i) const { return w.addr[i]; }
  __device__ uint32_t value(int i) const { return values[i]; }
};

// Polls until the waits hold or end, paced as NOTE [Wait pacing] says (the failure words and the
// deadline on some polls only); returns the decision.
template <typename W>
__device__ FlagPoll poll_until_decided(const W& list, const CudaWaits& f, uint64_t timeout_ns,
                                       int* next) {
  WaitPacing pace = wait_pacing_start(global_timer_ns());
  while (true) {
    const uint64_t now = global_timer_ns();
    const bool ask = wait_asks(pace, now);
    const FlagPoll p =
        signal_wait_poll(list, next, ask && wait_past(pace, now, timeout_ns), f, ask);
    if (p != FlagPoll::kWaiting) return p;
    const uint32_t sleep_ns = wait_sleep_ns(pace, now);
    if (sleep_ns != 0) __nanosleep(sleep_ns);
  }
}

// NOTE [Device failure] (p2p_workspace/watchdog.hpp): giving up must never look like success,
// so the kernel flags every wait still missing; the host raises for this op. A failure - the
// device's own or a peer's (NOTE [Failure words]) - ends it the same way at once, flagged
// kWaitEnded: the watchdog fails the device from the word itself, naming the rank that failed.
__global__ void wait_signals_kernel(KernelWaits waits, uint64_t timeout_ns, KernelGiveUp* give_up,
                                    WaitEnds ends) {
  const CudaWaits f{ends, nullptr};
  const EagerList list{waits};
  int next = 0;
  const FlagPoll p = poll_until_decided(list, f, timeout_ns, &next);
  if (eager_wait_outcome(p) == FlagOutcome::kPass) return;
  signal_wait_missing(list, next, f,
                      [&](int j) { *static_cast<volatile uint32_t*>(&give_up->missing[j]) = 1; });
  __threadfence_system();
  *static_cast<volatile uint32_t*>(&give_up->gave_up) = eager_wait_give_up(p);
  __threadfence_system();
  // NOTE [Eager give-ups reach the next call]: the device's word, after the record it points to.
  if (ends.eager_gave_up != nullptr) {
    *static_cast<volatile uint32_t*>(ends.eager_gave_up) = 1;
    __threadfence_system();
  }
}

__global__ void advance_counter_kernel(uint32_t* counter, uint32_t delta) {
  counter_advance(counter, delta, CudaStores{});
}

__global__ void write_counted_kernel(uint32_t* addr, const uint32_t* counter, uint32_t offset) {
  counted_write(addr, counter, offset, CudaStores{});
}

// NOTE [Counted waits end with the failure] (p2p_workspace/watchdog.hpp).
__global__ void wait_counted_kernel(CountedKernelWaits waits, uint64_t timeout_ns,
                                    GraphGiveUp* give_up, WaitEnds ends) {
  uint32_t value[kMaxKernelWaits];
  for (int i = 0; i < waits.count; ++i) value[i] = *waits.counter[i] + waits.offset[i];
  const CudaWaits f{ends, give_up};
  const CountedList list{waits, value};
  int next = 0;
  const FlagPoll p = poll_until_decided(list, f, timeout_ns, &next);
  // Passed, or an earlier give-up of this device or its own failure: its host knows; or a peer's
  // failure, which its host reads from the word (NOTE [Who traps]).
  if (counted_wait_outcome(p, ends.trap_on_peer_failure) != FlagOutcome::kFail) return;
  signal_wait_missing(list, next, f, [&](int j) {
    const int q = waits.peer[j];
    if (q >= 0 && q < 128) atomicOr_system(&give_up->peer_bits[q / 32], 1u << (q % 32));
  });
  __threadfence_system();
  if (p == FlagPoll::kTimedOut) atomicAdd_system(&give_up->gave_up, 1u);
  __threadfence_system();
  // A replay-only loop calls nothing of cuda_p2p's: the trap makes torch's next synchronize
  // raise, after the host-mapped record above says why.
  __trap();
}

// NOTE [Graph flags] (p2p_workspace/graph_flags.hpp): an open, a close, or a barrier alone.
// NOTE [One captured op at a time]: an open takes the busy word, a close gives it back, and an
// op's end with no barriers (SymmetricWorkspace::graph_abandon) only gives it back.
__global__ void graph_barriers_kernel(GraphLaunch g) {
  if (!graph_enter(g)) return;
  for (int i = 0; i < g.barriers; ++i) {
    if (!graph_barrier(g, i)) break;
  }
  graph_leave(g);
}

// One warp: a thread per peer (kMaxGraphRanks of them at most).
static_assert(kMaxGraphRanks <= 32, "graph_barriers_kernel runs one warp per block");

}  // namespace

cudaError_t launch_graph_barriers(const GraphLaunch& launch, cudaStream_t stream) {
  return launch_kernel(graph_barriers_kernel, launch.blocks, 32, stream, launch);
}

cudaError_t launch_advance_counter(uint32_t* counter, uint32_t delta, cudaStream_t stream) {
  return launch_kernel(advance_counter_kernel, 1, 1, stream, counter, delta);
}

cudaError_t launch_write_counted(uint32_t* addr, const uint32_t* counter, uint32_t offset,
                                 cudaStream_t stream) {
  return launch_kernel(write_counted_kernel, 1, 1, stream, addr, counter, offset);
}

cudaError_t launch_wait_counted(const CountedKernelWaits& waits, uint64_t timeout_ns,
                                GraphGiveUp* give_up, WaitEnds ends, cudaStream_t stream) {
  return launch_kernel(wait_counted_kernel, 1, 1, stream, waits, timeout_ns, give_up, ends);
}

cudaError_t launch_write_signal(uint32_t* addr, uint32_t value, cudaStream_t stream) {
  return launch_kernel(write_signal_kernel, 1, 1, stream, addr, value);
}

cudaError_t launch_wait_signals(const KernelWaits& waits, uint64_t timeout_ns,
                                KernelGiveUp* give_up, WaitEnds ends, cudaStream_t stream) {
  return launch_kernel(wait_signals_kernel, 1, 1, stream, waits, timeout_ns, give_up, ends);
}

cudaError_t load_kernels() {
  // cudaFuncGetAttributes loads a lazily loaded kernel (CUDA_MODULE_LOADING=LAZY).
  const void* kernels[] = {reinterpret_cast<const void*>(&write_signal_kernel),
                           reinterpret_cast<const void*>(&wait_signals_kernel),
                           reinterpret_cast<const void*>(&advance_counter_kernel),
                           reinterpret_cast<const void*>(&write_counted_kernel),
                           reinterpret_cast<const void*>(&wait_counted_kernel),
                           reinterpret_cast<const void*>(&graph_barriers_kernel)};
  for (const void* k : kernels) {
    cudaFuncAttributes attributes;
    const cudaError_t err = cudaFuncGetAttributes(&attributes, k);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cuda_p2p::cuda
