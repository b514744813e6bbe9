#include "ops/cuda/reduce_device.cuh"
#include "ops/cuda/reduce_kernel.cuh"

namespace cuda_p2p::cuda {

namespace {

using ops::graph::Dtype;
using namespace reduce;

constexpr int kReduceThreads = 256;
constexpr int kMaxReduceBlocks = 1024;

// A source or destination word: the result type, or its accumulate type.
template <typename T>
__device__ __forceinline__ typename Acc<T>::type load_as_acc(const void* p, bool acc, int64_t i) {
  using A = typename Acc<T>::type;
  if (acc) return load_one(static_cast<const A*>(p) + i);
  return to_acc<T>(load_one(static_cast<const T*>(p) + i));
}

template <typename T, bool kSum>
__global__ void reduce_kernel(ReduceArgs a, bool packed) {
  using A = typename Acc<T>::type;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (packed) {  // every operand of type T and 16-byte aligned
    constexpr int V = Pack<T>::kCount;
    const int64_t units = a.numel / V;
    for (int64_t u = first; u < units; u += stride) {
      const Pack<T> p0 = load_pack(static_cast<const T*>(a.src[0]) + u * V);
      A acc[V];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = to_acc<T>(p0.v[j]);
      for (int s = 1; s < a.count; ++s) {
        const Pack<T> p = load_pack(static_cast<const T*>(a.src[s]) + u * V);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = apply<kSum>(a.op, acc[j], to_acc<T>(p.v[j]));
      }
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(finish(a.op, acc[j], a.divisor));
      store_pack(static_cast<T*>(a.dst) + u * V, out);
      if (a.also != nullptr) store_pack(static_cast<T*>(a.also) + u * V, out);
    }
    done = units * V;
  }
  for (int64_t i = done + first; i < a.numel; i += stride) {
    A acc = load_as_acc<T>(a.src[0], a.src_acc & 1u, i);
    for (int s = 1; s < a.count; ++s) {
      acc = apply<kSum>(a.op, acc, load_as_acc<T>(a.src[s], (a.src_acc >> s) & 1u, i));
    }
    acc = finish(a.op, acc, a.divisor);
    if (a.dst_acc) {
      static_cast<A*>(a.dst)[i] = acc;
    } else {
      static_cast<T*>(a.dst)[i] = from_acc<T>(acc);
    }
    if (a.also != nullptr) static_cast<T*>(a.also)[i] = from_acc<T>(acc);
  }
}

bool reduce_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
cudaError_t launch_reduce_typed(const ReduceArgs& a, cudaStream_t stream) {
  bool packed = !a.dst_acc && a.src_acc == 0 && reduce_aligned(a.dst) &&
                (a.also == nullptr || reduce_aligned(a.also));
  for (int s = 0; s < a.count && packed; ++s) packed = reduce_aligned(a.src[s]);
  const int64_t per = packed ? Pack<T>::kCount : 1;
  const int64_t items = (a.numel + per - 1) / per;
  int64_t blocks = (items + kReduceThreads - 1) / kReduceThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxReduceBlocks) blocks = kMaxReduceBlocks;
  const bool sum = a.op == ops::ReduceOp::kSum || a.op == ops::ReduceOp::kAvg;
  if (sum) {
    reduce_kernel<T, true><<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(a, packed);
  } else {
    reduce_kernel<T, false>
        <<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(a, packed);
  }
  return cudaGetLastError();
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
