// CUDA implementation of the device interface (compiled when nvcc is found; runs only on a GPU).
//
// NOTE [CUDA signal ordering]
// write_signal is cuStreamWriteValue32 with the default flags, which puts a memory fence before
// the write: everything the stream did before (a cudaMemcpyAsync into a peer's buffer, a GEMM
// writing the own buffer) is visible to a peer that observes the new value. wait_signals is
// cuStreamWaitValue32(GEQ), which compares (int32_t)(*addr - value) >= 0 like the host side
// (signal_reached). Neither occupies an SM. Where the driver entry points are missing, one-thread
// kernels do the same with st.release.sys / ld.acquire.sys (signal_kernels.cu).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "p2p_workspace/cuda/signal_kernels.cuh"
#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

namespace {

#define CUDA_P2P_CUDA_CHECK(expr)                          \
  do {                                                     \
    cudaError_t err__ = (expr);                            \
    TORCH_CHECK(err__ == cudaSuccess, "cuda_p2p: ", #expr, \
                " failed: ", cudaGetErrorString(err__));   \
  } while (0)

using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

class CudaBlock : public Block {
 public:
  CudaBlock(void* ptr, size_t bytes, bool imported, int device)
      : imported_(imported), device_(device) {
    data_ = ptr;
    size_ = bytes;
  }
  ~CudaBlock() override {
    c10::cuda::CUDAGuard guard(device_);
    // Errors are ignored: this may run during process teardown, after the context is gone.
    if (imported_) {
      (void)cudaIpcCloseMemHandle(data_);
    } else {
      (void)cudaFree(data_);
    }
  }

 private:
  bool imported_;
  int device_;
};

class IpcExporter : public BlockExporter {
 public:
  explicit IpcExporter(void* ptr) { CUDA_P2P_CUDA_CHECK(cudaIpcGetMemHandle(&handle_, ptr)); }
  std::vector<uint8_t> handle() const override {
    const auto* p = reinterpret_cast<const uint8_t*>(&handle_);
    return {p, p + sizeof(handle_)};
  }

 private:
  cudaIpcMemHandle_t handle_;
};

struct PendingWait {
  SignalWait wait;
  Millis timeout;
  std::string context;
};

class CudaStreamImpl : public Stream {
 public:
  explicit CudaStreamImpl(c10::cuda::CUDAStream s) : stream(s) {}
  c10::cuda::CUDAStream stream;
  std::mutex mu;
  std::vector<PendingWait> pending;  // waits enqueued since the last synchronize
};

class CudaEventImpl : public Event {
 public:
  explicit CudaEventImpl(int device) : device_(device) {
    c10::cuda::CUDAGuard guard(device_);
    CUDA_P2P_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  ~CudaEventImpl() override {
    c10::cuda::CUDAGuard guard(device_);
    (void)cudaEventDestroy(event);
  }
  cudaEvent_t event;

 private:
  int device_;
};

CudaStreamImpl& as_cuda(Stream& s) {
  auto* c = dynamic_cast<CudaStreamImpl*>(&s);
  TORCH_CHECK(c, "cuda_p2p: a CUDA device was given a stream of another device");
  return *c;
}

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    c10::cuda::CUDAGuard guard(index_);
    cudaDriverEntryPointQueryResult q1{}, q2{};
    void* write = nullptr;
    void* wait = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 12000, cudaEnableDefault,
                                         &q1) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 12000, cudaEnableDefault,
                                         &q2) == cudaSuccess &&
        q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess) {
      write_value_ = reinterpret_cast<WriteValueFn>(write);
      wait_value_ = reinterpret_cast<WaitValueFn>(wait);
    }
    (void)cudaGetLastError();
    CUDA_P2P_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&timed_out_peer_), sizeof(int),
                                      cudaHostAllocMapped));
    *timed_out_peer_ = 0;
  }
  ~CudaDevice() override { (void)cudaFreeHost(timed_out_peer_); }

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  at::Device tensor_device() const override {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index_));
  }
  int device_index() const override { return index_; }

  std::shared_ptr<Block> allocate(size_t bytes) override {
    c10::cuda::CUDAGuard guard(index_);
    void* ptr = nullptr;
    // A plain cudaMalloc block (not the caching allocator): IPC handles cover whole allocations.
    CUDA_P2P_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    auto block = std::make_shared<CudaBlock>(ptr, bytes, /*imported=*/false, index_);
    CUDA_P2P_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
    CUDA_P2P_CUDA_CHECK(cudaDeviceSynchronize());
    return block;
  }

  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block, int) override {
    c10::cuda::CUDAGuard guard(index_);
    return std::make_unique<IpcExporter>(block->data());
  }

  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis) override {
    TORCH_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), "cuda_p2p: a CUDA IPC handle has ",
                sizeof(cudaIpcMemHandle_t), " bytes, got ", handle.size());
    c10::cuda::CUDAGuard guard(index_);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* ptr = nullptr;
    CUDA_P2P_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
    return std::make_shared<CudaBlock>(ptr, bytes, /*imported=*/true, index_);
  }

  std::shared_ptr<void> upload_pointer_table(const std::vector<void*>& ptrs) override {
    c10::cuda::CUDAGuard guard(index_);
    void* table = nullptr;
    const size_t bytes = ptrs.size() * sizeof(void*);
    CUDA_P2P_CUDA_CHECK(cudaMalloc(&table, bytes));
    std::shared_ptr<void> owner(table, [dev = index_](void* p) {
      c10::cuda::CUDAGuard guard(dev);
      (void)cudaFree(p);
    });
    CUDA_P2P_CUDA_CHECK(cudaMemcpy(table, ptrs.data(), bytes, cudaMemcpyHostToDevice));
    return owner;
  }

  std::shared_ptr<Stream> current_stream() override {
    return std::make_shared<CudaStreamImpl>(
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
  }

  std::shared_ptr<Stream> new_stream(bool high_priority) override {
    return std::make_shared<CudaStreamImpl>(
        c10::cuda::getStreamFromPool(high_priority, static_cast<c10::DeviceIndex>(index_)));
  }

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    c10::cuda::CUDAGuard guard(index_);
    // Device-to-device through the copy engine: no SM is used.
    CUDA_P2P_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, as_cuda(s).stream.stream()));
  }

  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    c10::cuda::CUDAGuard guard(index_);
    auto stream = as_cuda(s).stream.stream();
    if (write_value_) {
      // See NOTE [CUDA signal ordering].
      const CUresult r = write_value_(reinterpret_cast<CUstream>(stream),
                                      reinterpret_cast<CUdeviceptr>(addr), value, 0);
      TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: cuStreamWriteValue32 failed with CUresult ", r);
    } else {
      CUDA_P2P_CUDA_CHECK(cuda::launch_write_signal(addr, value, stream));
    }
  }

  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    c10::cuda::CUDAGuard guard(index_);
    auto& cs = as_cuda(s);
    auto stream = cs.stream.stream();
    if (wait_value_) {
      for (const auto& w : waits) {
        const CUresult r =
            wait_value_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(w.addr),
                        w.value, CU_STREAM_WAIT_VALUE_GEQ);
        TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: cuStreamWaitValue32 failed with CUresult ", r);
      }
    } else {
      for (size_t i = 0; i < waits.size(); i += cuda::kMaxKernelWaits) {
        cuda::KernelWaits kw{};
        for (size_t j = i; j < waits.size() && j < i + cuda::kMaxKernelWaits; ++j) {
          kw.addr[kw.count] = waits[j].addr;
          kw.value[kw.count] = waits[j].value;
          kw.peer[kw.count] = waits[j].peer;
          ++kw.count;
        }
        CUDA_P2P_CUDA_CHECK(
            cuda::launch_wait_signals(kw, static_cast<uint64_t>(timeout.count()) * 1000000ull,
                                      device_timed_out_peer(), stream));
      }
    }
    std::lock_guard<std::mutex> lock(cs.mu);
    for (const auto& w : waits) cs.pending.push_back({w, timeout, context});
  }

  void run(Stream& s, std::function<void()> fn) override {
    c10::cuda::CUDAStreamGuard guard(as_cuda(s).stream);
    fn();
  }

  std::shared_ptr<Event> record(Stream& s) override {
    auto e = std::make_shared<CudaEventImpl>(index_);
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(cudaEventRecord(e->event, as_cuda(s).stream.stream()));
    return e;
  }

  void wait_event(Stream& s, const Event& e) override {
    const auto* ce = dynamic_cast<const CudaEventImpl*>(&e);
    TORCH_CHECK(ce, "cuda_p2p: a CUDA device was given an event of another device");
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(s).stream.stream(), ce->event, 0));
  }

  // Polls with back-off so that a wait that never completes becomes an error naming the peers
  // (the stream itself cannot be cancelled: the process should tear the group down).
  void synchronize(Stream& s) override {
    c10::cuda::CUDAGuard guard(index_);
    auto& cs = as_cuda(s);
    std::vector<PendingWait> pending;
    {
      std::lock_guard<std::mutex> lock(cs.mu);
      pending.swap(cs.pending);
    }
    Millis limit{0};
    for (const auto& p : pending) limit = std::max(limit, p.timeout);
    const auto start = std::chrono::steady_clock::now();
    auto nap = std::chrono::microseconds(1);
    while (true) {
      const cudaError_t q = cudaStreamQuery(cs.stream.stream());
      if (q == cudaSuccess) break;
      TORCH_CHECK(q == cudaErrorNotReady, "cuda_p2p: stream failed: ", cudaGetErrorString(q));
      if (!pending.empty() && std::chrono::steady_clock::now() - start > limit) {
        report_timeout(pending);
      }
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
    }
    if (const int peer = *timed_out_peer_; peer != 0) {
      *timed_out_peer_ = 0;
      for (const auto& p : pending) {
        if (p.wait.peer == peer - 1) {
          TORCH_CHECK(false, "cuda_p2p: ", p.context, " timed out after ", p.timeout.count(),
                      " ms: rank ", peer - 1, " never arrived");
        }
      }
      TORCH_CHECK(false, "cuda_p2p: a signal wait timed out: rank ", peer - 1, " never arrived");
    }
  }

  void quiesce() override {
    c10::cuda::CUDAGuard guard(index_);
    CUDA_P2P_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  int* device_timed_out_peer() {
    int* dev = nullptr;
    CUDA_P2P_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), timed_out_peer_, 0));
    return dev;
  }

  [[noreturn]] void report_timeout(const std::vector<PendingWait>& pending) {
    // Read the signal words from a separate stream (the waiting one is blocked).
    std::ostringstream missing;
    int count = 0;
    cudaStream_t side;
    CUDA_P2P_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (const auto& p : pending) {
      uint32_t word = 0;
      if (cudaMemcpyAsync(&word, p.wait.addr, sizeof(word), cudaMemcpyDeviceToHost, side) ==
              cudaSuccess &&
          cudaStreamSynchronize(side) == cudaSuccess && !signal_reached(word, p.wait.value)) {
        missing << (count++ ? ", " : "") << p.wait.peer;
      }
    }
    (void)cudaStreamDestroy(side);
    TORCH_CHECK(false, "cuda_p2p: ", pending.front().context, " timed out after ",
                pending.front().timeout.count(), " ms: rank", count > 1 ? "s " : " ",
                count ? missing.str() : std::string("?"), " never arrived");
  }

  int index_;
  WriteValueFn write_value_ = nullptr;
  WaitValueFn wait_value_ = nullptr;
  int* timed_out_peer_ = nullptr;  // pinned, mapped: written by the wait kernel on timeout
};

}  // namespace

std::shared_ptr<Device> make_cuda_device(int device_index) {
  return std::make_shared<CudaDevice>(device_index);
}

}  // namespace cuda_p2p
