// Kernel launches that report their own status (NOTE [Launch status]). Plain CUDA, host code
// only; every launcher of p2p_workspace/cuda/ and ops/cuda/ goes through it.
#pragma once

#include <cuda_runtime.h>

#include <tuple>
#include <type_traits>
#include <utility>

namespace cuda_p2p::cuda {

// NOTE [Launch status]
// A kernel launched with <<<...>>> reports its status only through cudaGetLastError, which also
// returns, and clears, an error some other code of the process left pending on the thread: a
// healthy launch of ours would then raise a stranger's error, and that code would never see it.
// launch_kernel returns the launch's own status (cudaLaunchKernel's) and leaves the thread's
// last error as it was when the launch succeeds.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  std::tuple<std::decay_t<Params>...> values(std::forward<Args>(args)...);
  return std::apply(
      [&](auto&... v) {
        void* argv[] = {static_cast<void*>(&v)..., nullptr};
        return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv, 0,
                                stream);
      },
      values);
}

}  // namespace cuda_p2p::cuda
