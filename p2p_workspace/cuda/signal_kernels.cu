#include "p2p_workspace/cuda/global_timer.cuh"
#include "p2p_workspace/cuda/signal_kernels.cuh"

namespace cuda_p2p::cuda {

namespace {

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__global__ void write_signal_kernel(uint32_t* addr, uint32_t value) {
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(value) : "memory");
}

__device__ __forceinline__ bool reached(const KernelWaits& waits, int i) {
  return static_cast<int32_t>(load_acquire_sys(waits.addr[i]) - waits.value[i]) >= 0;
}

// NOTE [Device failure] (p2p_workspace/watchdog.hpp): giving up must never look like success,
// so the kernel flags every wait still missing; the host raises for this op.
__global__ void wait_signals_kernel(KernelWaits waits, uint64_t timeout_ns, KernelGiveUp* give_up) {
  const uint64_t start = global_timer_ns();
  for (int i = 0; i < waits.count; ++i) {
    unsigned sleep_ns = 32;
    while (!reached(waits, i)) {
      if (global_timer_ns() - start > timeout_ns) {
        for (int j = i; j < waits.count; ++j) {
          if (!reached(waits, j)) *static_cast<volatile uint32_t*>(&give_up->missing[j]) = 1;
        }
        __threadfence_system();
        *static_cast<volatile uint32_t*>(&give_up->gave_up) = 1;
        __threadfence_system();
        return;
      }
      __nanosleep(sleep_ns);
      if (sleep_ns < 8192) sleep_ns *= 2;
    }
  }
}

}  // namespace

cudaError_t launch_write_signal(uint32_t* addr, uint32_t value, cudaStream_t stream) {
  write_signal_kernel<<<1, 1, 0, stream>>>(addr, value);
  return cudaGetLastError();
}

cudaError_t launch_wait_signals(const KernelWaits& waits, uint64_t timeout_ns,
                                KernelGiveUp* give_up, cudaStream_t stream) {
  wait_signals_kernel<<<1, 1, 0, stream>>>(waits, timeout_ns, give_up);
  return cudaGetLastError();
}

}  // namespace cuda_p2p::cuda
