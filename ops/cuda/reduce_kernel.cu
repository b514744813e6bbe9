#include "ops/cuda/reduce_device.cuh"
#include "ops/cuda/reduce_kernel.cuh"
#include "ops/kernel_body.hpp"
#include "p2p_workspace/cuda/launch_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

using ops::graph::Dtype;
using namespace reduce;

// The shared body (NOTE [One kernel source] in ops/kernel_body.hpp): every thread of the grid
// strides over the packs, then the elements.
template <typename T, bool kSum>
__global__ void reduce_kernel(ReduceArgs a, bool packed) {
  ops::kernel::reduce_kernel_body<T, kSum>(a, packed, CudaGrid{});
}

template <typename T>
cudaError_t launch_reduce_typed(const ReduceArgs& a, cudaStream_t stream) {
  const ops::kernel::ReducePlan plan = ops::kernel::plan_reduce(a, Pack<T>::kCount);
  const auto blocks = static_cast<unsigned>(plan.blocks);
  return launch_kernel(ops::kernel::sums(a.op) ? reduce_kernel<T, true> : reduce_kernel<T, false>,
                       blocks, ops::kernel::kReduceThreads, stream, a, plan.packed);
}

template <typename T>
cudaError_t load_reduce_typed() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, reduce_kernel<T, true>);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, reduce_kernel<T, false>);
  return err;
}

// with_type's calls.
struct LaunchReduce {
  const ReduceArgs& args;
  cudaStream_t stream;
  template <typename T>
  cudaError_t operator()() const {
    return launch_reduce_typed<T>(args, stream);
  }
};
struct LoadReduce {
  template <typename T>
  cudaError_t operator()() const {
    return load_reduce_typed<T>();
  }
};

}  // namespace

cudaError_t launch_reduce(const ReduceArgs& args, cudaStream_t stream) {
  if (args.count < 1 || args.count > kMaxReduceSources) return cudaErrorInvalidValue;
  if (args.numel == 0) return cudaSuccess;
  return with_type(args.dtype, LaunchReduce{args, stream});
}

cudaError_t load_reduce_kernels() {
  for (Dtype d : {Dtype::kFloat, Dtype::kDouble, Dtype::kHalf, Dtype::kBFloat16, Dtype::kInt8,
                  Dtype::kUInt8, Dtype::kInt16, Dtype::kInt32, Dtype::kInt64}) {
    const cudaError_t err = with_type(d, LoadReduce{});
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cuda_p2p::cuda
