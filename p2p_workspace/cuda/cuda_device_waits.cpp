// The CUDA device's signals and waits (cuda_device_impl.hpp): stream memory operations (NOTE
// [CUDA signal ordering] in cuda_device.cpp), the wait kernels and the flag barriers' kernels
// (signal_kernels.cu), and the watchdog's view of a wait. Compiled only in builds with CUDA; runs
// only on a GPU (docs/status.md says where it has).
#include <optional>
#include <sstream>

#include "p2p_workspace/cuda/cuda_device_impl.hpp"

namespace cuda_p2p::cuda {

namespace {

// One wait_signals call as the watchdog sees it: an event before the waits (the stream reached
// them) and one after (it passed them), plus the give-up records of the wait kernels.
class CudaWatchedWait : public WatchedWait {
 public:
  CudaWatchedWait(WaitResources& res, std::vector<SignalWait> waits, cudaStream_t reader,
                  std::mutex& reader_mu, cudaStream_t stream, const AuxWriter& aux)
      : res_(res),
        waits_(std::move(waits)),
        reader_(reader),
        reader_mu_(reader_mu),
        stream_(stream),
        aux_(aux) {}
  ~CudaWatchedWait() override {
    if (before) res_.put(before);
    if (after) res_.put(after);
    if (probe_event) res_.put(probe_event);
    if (probe.first) res_.put(probe);
    for (auto& g : give_ups) res_.put(g);
  }

  // Queries from the watchdog thread never throw: an error counts as "not yet", so that a
  // broken context ends in the deadline's error.
  bool started() override { return done(before); }
  bool finished() override { return done(after); }
  std::vector<int> given_up() override {
    std::vector<int> peers;
    for (size_t k = 0; k < give_ups.size(); ++k) {
      const auto* g = give_ups[k].first;
      if (!load(g->gave_up)) continue;
      const size_t first = k * cuda::kMaxKernelWaits;
      const size_t last = std::min(waits_.size(), first + cuda::kMaxKernelWaits);
      const size_t named = peers.size();
      for (size_t w = first; w < last; ++w) {
        if (load(g->missing[w - first])) peers.push_back(waits_[w].peer);
      }
      if (peers.size() == named) {  // flagged without a name: blame every peer of that kernel
        for (size_t w = first; w < last; ++w) peers.push_back(waits_[w].peer);
      }
    }
    return peers;
  }
  // NOTE [Reading a blocked wait's words]
  // The waiting stream is blocked, so the words are read through the device's reader stream,
  // into pinned memory taken when the wait was enqueued (a copy into pageable memory, or an
  // allocation now, may wait for the whole device), and for at most kReadLimit: the watchdog
  // thread must never block here, since the release of every wait comes after this read:
  // otherwise a caller blocked in cudaDeviceSynchronize() behind the wait would block the
  // watchdog's read too, and the missed deadline would never be reported.
  // A word that could not be read in time names its peer as missing.
  static constexpr Millis kReadLimit{1000};
  std::vector<int> missing() override {
    std::vector<int> peers;
    std::lock_guard<std::mutex> lock(reader_mu_);
    for (size_t first = 0; first < waits_.size(); first += cuda::kMaxKernelWaits) {
      const size_t last = std::min(waits_.size(), first + cuda::kMaxKernelWaits);
      bool read = probe.first != nullptr && probe_event != nullptr;
      for (size_t w = first; read && w < last; ++w) {
        read = cudaMemcpyAsync(&probe.first->missing[w - first], waits_[w].addr, sizeof(uint32_t),
                               cudaMemcpyDeviceToHost, reader_) == cudaSuccess;
      }
      read = read && cudaEventRecord(probe_event, reader_) == cudaSuccess &&
             done_within(probe_event, kReadLimit);
      for (size_t w = first; w < last; ++w) {
        if (!read || !signal_reached(load(probe.first->missing[w - first]), waits_[w].value)) {
          peers.push_back(waits_[w].peer);
        }
      }
    }
    (void)cudaGetLastError();
    return peers;
  }
  // NOTE [Releasing blocked waits]: each word is the waiter's own pad, written here from the
  // auxiliary stream; the blocked stream (or wait kernel) sees the awaited value and passes.
  std::vector<SignalWait> awaited() const override { return waits_; }
  void release(uint32_t* word, uint32_t value) override { aux_.write(word, value); }
  const void* stream() const override { return stream_; }

  cudaEvent_t before = nullptr;
  cudaEvent_t after = nullptr;
  std::vector<std::pair<cuda::KernelGiveUp*, cuda::KernelGiveUp*>> give_ups;
  // NOTE [Reading a blocked wait's words]: pinned words for missing(), and its event.
  std::pair<cuda::KernelGiveUp*, cuda::KernelGiveUp*> probe{nullptr, nullptr};
  cudaEvent_t probe_event = nullptr;

 private:
  static bool done(cudaEvent_t e) {
    const cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();
    return q == cudaSuccess;
  }
  static uint32_t load(const uint32_t& word) {
    return *static_cast<const volatile uint32_t*>(&word);  // written by the GPU
  }
  static bool done_within(cudaEvent_t e, Millis limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto nap = std::chrono::microseconds(10);
    while (!done(e)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(10000));
    }
    return true;
  }

  WaitResources& res_;
  std::vector<SignalWait> waits_;
  cudaStream_t reader_;
  std::mutex& reader_mu_;
  cudaStream_t stream_;
  AuxWriter aux_;
};

}  // namespace

void CudaDevice::write_signal(Stream& s, uint32_t* addr, uint32_t value) {
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

void CudaDevice::wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                              std::string context) {
  failure_.check(context.c_str());
  if (waits.empty()) return;
  c10::cuda::CUDAGuard guard(index_);
  auto stream = as_cuda(s).stream.stream();
  TORCH_CHECK(capture_id(s) == 0, "cuda_p2p ", context,
              ": a sequence-numbered wait on a stream being captured (NOTE [Replay-safe "
              "signals]); this op should have used a counted wait");
  auto watched =
      std::make_unique<CudaWatchedWait>(resources_, waits, aux_, aux_mu_, stream, aux_writer_);
  watched->before = resources_.event();
  watched->probe = take_record(context);
  watched->probe_event = resources_.event();
  CUDA_P2P_CUDA_CHECK(cudaEventRecord(watched->before, stream));
  if (wait_value_) {
    for (const auto& w : waits) {
      const CUresult r =
          wait_value_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(w.addr),
                      w.value, CU_STREAM_WAIT_VALUE_GEQ | wait_flags_);
      TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: cuStreamWaitValue32 failed with CUresult ", r);
    }
  } else {
    for (size_t i = 0; i < waits.size(); i += cuda::kMaxKernelWaits) {
      cuda::KernelWaits kw{};
      for (size_t j = i; j < waits.size() && j < i + cuda::kMaxKernelWaits; ++j) {
        kw.addr[kw.count] = waits[j].addr;
        kw.value[kw.count] = waits[j].value;
        ++kw.count;
      }
      watched->give_ups.push_back(take_record(context));
      CUDA_P2P_CUDA_CHECK(
          cuda::launch_wait_signals(kw, static_cast<uint64_t>(timeout.count()) * 1000000ull,
                                    watched->give_ups.back().second, ends(), stream));
    }
  }
  watched->after = resources_.event();
  CUDA_P2P_CUDA_CHECK(cudaEventRecord(watched->after, stream));
  // The kernel gives up at `timeout` after it starts; the watchdog's clock starts when it
  // first sees the stream at the waits, i.e. later, so for the kernel path the kernel's
  // give-up (which names the ranks exactly) normally comes first.
  watchdog_->track(std::move(watched), timeout, std::move(context));
}

uint64_t CudaDevice::capture_id(Stream& s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t err = cudaStreamGetCaptureInfo(as_cuda(s).stream.stream(), &status, &id);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, "cuda_p2p: cudaStreamGetCaptureInfo failed: ", cudaGetErrorString(err));
  }
  TORCH_CHECK(status != cudaStreamCaptureStatusInvalidated,
              "cuda_p2p: the stream's CUDA graph capture was invalidated (an earlier call broke "
              "it); end the capture and start again");
  return status == cudaStreamCaptureStatusActive ? (id == 0 ? 1 : id) : 0;
}

void CudaDevice::advance_counter(Stream& s, uint32_t* counter, uint32_t delta) {
  c10::cuda::CUDAGuard guard(index_);
  CUDA_P2P_CUDA_CHECK(cuda::launch_advance_counter(counter, delta, as_cuda(s).stream.stream()));
}

void CudaDevice::write_counted(Stream& s, uint32_t* addr, const uint32_t* counter,
                               uint32_t offset) {
  c10::cuda::CUDAGuard guard(index_);
  CUDA_P2P_CUDA_CHECK(
      cuda::launch_write_counted(addr, counter, offset, as_cuda(s).stream.stream()));
}

void CudaDevice::wait_counted(Stream& s, std::vector<CountedWait> waits, Millis timeout,
                              std::string context) {
  check_healthy(context.c_str());
  c10::cuda::CUDAGuard guard(index_);
  auto stream = as_cuda(s).stream.stream();
  for (size_t i = 0; i < waits.size(); i += cuda::kMaxKernelWaits) {
    cuda::CountedKernelWaits kw{};
    for (size_t j = i; j < waits.size() && j < i + cuda::kMaxKernelWaits; ++j) {
      kw.addr[kw.count] = waits[j].addr;
      kw.counter[kw.count] = waits[j].counter;
      kw.offset[kw.count] = waits[j].offset;
      kw.peer[kw.count] = waits[j].peer;
      ++kw.count;
    }
    CUDA_P2P_CUDA_CHECK(
        cuda::launch_wait_counted(kw, static_cast<uint64_t>(timeout.count()) * 1000000ull,
                                  graph_give_up_dev_, ends(), stream));
  }
  watchdog_->arm();  // NOTE [Counted waits end with the failure]
}

void CudaDevice::graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body,
                              Millis timeout, std::string context) {
  check_healthy(context.c_str());
  GraphLaunch g = launch;
  g.timeout_ns = static_cast<uint64_t>(timeout.count()) * 1000000ull;
  g.give_up = graph_give_up_dev_;
  const cuda::WaitEnds e = ends();
  g.peer_failed = e.peer_failed;
  g.failed = e.failed;
  g.trap_on_peer_failure = e.trap_on_peer_failure;
  c10::cuda::CUDAStreamGuard guard(as_cuda(s).stream);
  if (body.cuda) {
    body.cuda(g);
  } else {
    CUDA_P2P_CUDA_CHECK(cuda::launch_graph_barriers(g, as_cuda(s).stream.stream()));
  }
  watchdog_->arm();  // NOTE [Counted waits end with the failure]
}

void CudaDevice::check_graph_give_up() {
  if (failure_.failed()) return;
  const auto* g = graph_give_up_;
  if (failure_.peer_failure() >= 0 ||
      (g != nullptr && *static_cast<const volatile uint32_t*>(&g->gave_up) != 0)) {
    watchdog_->check_memory_now();
    return;
  }
  // NOTE [Eager give-ups reach the next call]
  // A wait kernel (NOTE [Hardware queues]: one hardware queue, or a driver without stream
  // memory operations) that gives up at its deadline needs no release: its stream runs on with
  // stale data at once, and only the watchdog's next scan, up to its longest nap later, would
  // read its record and fail the device. So the kernel also sets one word of the device's, and
  // every check of the host (an op's entry, a Work's wait or synchronize) that finds it set
  // scans now. The GPU run of 2026-12-04 with CUDA_DEVICE_MAX_CONNECTIONS=1 found the
  // stream drained and the device still healthy right after a give-up.
  if (g != nullptr && *static_cast<const volatile uint32_t*>(&g->eager_gave_up) != 0) {
    watchdog_->poll_now();
  }
}

std::string CudaDevice::graph_give_up() const {
  const auto* g = graph_give_up_;
  if (g == nullptr || *static_cast<const volatile uint32_t*>(&g->gave_up) == 0) return "";
  auto ranks = [](const uint32_t* bits) {
    std::vector<int> peers;
    for (int r = 0; r < 128; ++r) {
      if (*static_cast<const volatile uint32_t*>(&bits[r / 32]) & (1u << (r % 32))) {
        peers.push_back(r);
      }
    }
    return peers;
  };
  // NOTE [Graph flags]: a foreign tag says more than the timeouts it caused elsewhere.
  const std::vector<int> foreign = ranks(g->foreign_bits);
  if (!foreign.empty()) {
    char tags[64];
    std::snprintf(tags, sizeof(tags), "(its tag 0x%08x, this rank's 0x%08x)",
                  *static_cast<const volatile uint32_t*>(&g->foreign_tag),
                  *static_cast<const volatile uint32_t*>(&g->own_tag));
    return "a flag barrier of a replayed CUDA graph met another op: " + describe_ranks(foreign) +
           (foreign.size() > 1 ? " were" : " was") + " at another captured op " + tags +
           ": the ranks replayed different graphs, or one replayed a graph more or fewer times "
           "than its peers (the kernel trapped and the CUDA context is lost; NOTE [Graph "
           "flags])";
  }
  // NOTE [One captured op at a time]: nothing ran, and the peers' waits it caused say less.
  if (*static_cast<const volatile uint32_t*>(&g->busy) != 0) {
    return graph_busy_text(*static_cast<const volatile uint32_t*>(&g->busy_tag), "CUDA graph");
  }
  const std::vector<int> peers = ranks(g->peer_bits);
  return "a wait of a replayed CUDA graph timed out: " + describe_ranks(peers) +
         " never arrived (the wait kernel trapped: the graph's kernels went on with stale data "
         "and the CUDA context is lost; NOTE [Counted waits end with the failure])";
}

cuda::WaitEnds CudaDevice::ends() const {
  return cuda::WaitEnds{failure_word_dev_.load(std::memory_order_acquire),
                        graph_give_up_dev_ ? &graph_give_up_dev_->failed : nullptr,
                        failure_rank_.load(std::memory_order_acquire),
                        trap_on_peer_failure_.load(std::memory_order_acquire),
                        graph_give_up_dev_ ? &graph_give_up_dev_->eager_gave_up : nullptr};
}

WaitResources::Record CudaDevice::take_record(const std::string& context) {
  if (auto r = resources_.give_up()) return *r;
  const Millis limit(timeout_ms_.load());
  const auto deadline = std::chrono::steady_clock::now() + limit + watchdog_->notice();
  auto nap = std::chrono::microseconds(10);
  while (true) {
    watchdog_->poll_now();  // retires the waits the streams passed, returning their records
    if (auto r = resources_.give_up()) return *r;
    check_healthy(context.c_str());
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "cuda_p2p ", context, " on ", name(),
                ": all ", WaitResources::kRecords,
                " records of this group's pending waits are in use (the host ran that many "
                "waits ahead of the GPU) and none was returned within the group's timeout of ",
                limit.count(), " ms (NOTE [Pinned pools])");
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace cuda_p2p::cuda
