// The host device: the device interface on memfd blocks (shared_block.cpp), host streams
// (host_stream.cpp), futex waits (futex_wait.cpp) and cross-memory reads (cross_memory.cpp).
#include "p2p_workspace/host/host_device.hpp"

#include <c10/util/Exception.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "p2p_workspace/host/cross_memory.hpp"
#include "p2p_workspace/host/futex_wait.hpp"
#include "p2p_workspace/host/host_stream.hpp"
#include "p2p_workspace/host/shared_block.hpp"
#include "p2p_workspace/watchdog.hpp"

namespace cuda_p2p::host {

namespace {

HostStream& as_host(Stream& s) {
  auto* h = dynamic_cast<HostStream*>(&s);
  TORCH_CHECK(h, "cuda_p2p: a host device was given a stream of another device");
  return *h;
}

// CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

HostStreams resolve_mode(HostStreams mode) {
  return mode == HostStreams::kDefault ? HostStreams::kCooperative : mode;
}

class HostDevice : public Device {
 public:
  // Until rendezvous says how many CPUs the ranks share (set_ranks_cpus), this process's own
  // affinity stands for all of them.
  HostDevice(int processes, HostStreams mode)
      : processes_(processes),
        oversubscribed_(processes > usable_cpus()),
        cooperative_(resolve_mode(mode) == HostStreams::kCooperative),
        scheduler_(cooperative_ ? std::make_shared<CooperativeScheduler>(oversubscribed_.load())
                                : nullptr),
        inline_stream_(std::make_shared<HostStream>(HostStream::Mode::kInline, false, nullptr)) {}

  std::string name() const override { return "cpu"; }
  at::Device tensor_device() const override { return at::Device(at::kCPU); }
  int device_index() const override { return -1; }
  bool blocks_outlive_owner() const override { return true; }

  std::shared_ptr<Block> allocate(size_t bytes) override { return allocate_shared_block(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& block,
                                              int max_peers) override {
    return export_shared_block(block, max_peers);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                      Millis timeout) override {
    return import_shared_block(handle, bytes, timeout);
  }
  std::shared_ptr<PrivateMemoryReader> private_memory_reader() override {
    return make_cross_memory_reader();  // host/cross_memory.cpp
  }

  // One inline stream per device object: it carries no state but its counters. A thread that
  // chose another (set_current_stream) gets that one.
  std::shared_ptr<Stream> current_stream() override {
    if (!any_callers_.load(std::memory_order_acquire)) return inline_stream_;
    std::lock_guard<std::mutex> lock(streams_mu_);
    const auto self = std::this_thread::get_id();
    for (const auto& [thread, stream] : callers_) {
      if (thread == self) return stream;
    }
    return inline_stream_;
  }
  std::shared_ptr<Stream> new_stream(bool high_priority) override {
    std::shared_ptr<HostStream> s;
    if (!cooperative_) {
      s = std::make_shared<HostStream>(HostStream::Mode::kThread, high_priority, nullptr);
    } else {
      s = std::make_shared<HostStream>(HostStream::Mode::kCooperative, high_priority, scheduler_);
      scheduler_->add(s);
    }
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::erase_if(streams_, [](const auto& w) { return w.expired(); });
    streams_.push_back(s);
    return s;
  }

  void set_current_stream(std::shared_ptr<Stream> stream) {
    TORCH_CHECK(!stream || stream == inline_stream_ || own(*stream),
                "cuda_p2p: set_current_stream needs a stream of this device (new_stream)");
    std::lock_guard<std::mutex> lock(streams_mu_);
    const auto self = std::this_thread::get_id();
    std::erase_if(callers_, [&](const auto& c) { return c.first == self; });
    if (stream && stream != inline_stream_) callers_.emplace_back(self, std::move(stream));
    any_callers_.store(!callers_.empty(), std::memory_order_release);
  }

  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    as_host(s).enqueue(HostTask::work([dst, src, n] { std::memcpy(dst, src, n); }));
  }

  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    as_host(s).enqueue(HostTask::work([addr, value] { futex_store_and_wake(addr, value); }));
  }

  void wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                    std::string context) override {
    failure_.check(context.c_str());
    auto& h = as_host(s);
    if (h.mode() == HostStream::Mode::kCooperative) {
      // Tried by the scheduler until it holds; the timeout counts from the first try.
      std::optional<std::chrono::steady_clock::time_point> deadline;
      h.enqueue(HostTask::when(
          [waits, timeout, context = std::move(context), deadline, this]() mutable {
            if (!deadline) deadline = std::chrono::steady_clock::now() + timeout;
            return check_waits(waits, *deadline, timeout, context, failure_);
          },
          waits));
      return;
    }
    if (h.mode() == HostStream::Mode::kInline && cooperative_) {
      // The caller waits, and runs the cooperative streams meanwhile.
      h.enqueue(HostTask::blocking(
          [this, waits = std::move(waits), timeout, context = std::move(context)] {
            const auto deadline = std::chrono::steady_clock::now() + timeout;
            scheduler_->drive(
                [&] { return check_waits(waits, deadline, timeout, context, failure_); }, waits);
          }));
      return;
    }
    h.enqueue(HostTask::blocking(
        [waits = std::move(waits), timeout, context = std::move(context),
         oversubscribed = oversubscribed_.load(std::memory_order_relaxed),
         this] { block_on_waits(waits, timeout, context, oversubscribed, failure_); }));
  }

  // On the host, device work is host work: both run the closure in stream order.
  void launch(Stream& s, std::function<void()> fn) override {
    as_host(s).enqueue(HostTask::work(std::move(fn)));
  }
  void host_task(Stream& s, std::function<void()> fn) override {
    as_host(s).enqueue(HostTask::work(std::move(fn)));
  }

  std::shared_ptr<Event> record(Stream& s) override {
    auto& h = as_host(s);
    // The event keeps the stream alive for whoever waits on it.
    return std::make_shared<HostEvent>(h.shared_from_this(), h.enqueued());
  }

  void wait_event(Stream& s, const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    HostStream* other = ev->stream.get();
    const uint64_t seq = ev->seq;
    auto& self = as_host(s);
    if (other == &self) return;
    if (self.mode() == HostStream::Mode::kCooperative) {
      self.enqueue(HostTask::when([other, seq] {
        if (other->done() < seq) return false;
        if (auto err = other->error()) std::rethrow_exception(err);
        return true;
      }));
      return;
    }
    // Blocks (the inline stream of a cooperative device runs the streams meanwhile).
    self.enqueue(HostTask::blocking([other, seq] {
      other->wait_done(seq, /*rethrow=*/false);
      if (auto err = other->error()) std::rethrow_exception(err);
    }));
  }

  void synchronize(Stream& s) override {
    auto& h = as_host(s);
    h.wait_done(h.enqueued(), /*rethrow=*/true);
  }

  void synchronize(const Event& e) override {
    const auto* ev = dynamic_cast<const HostEvent*>(&e);
    TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
    ev->stream->wait_done(ev->seq, /*rethrow=*/false);
    if (auto err = ev->stream->error()) std::rethrow_exception(err);
    failure_.check("synchronize");
  }

  // An op on the inline stream drains its streams before it returns (pipeline::end), so nothing
  // is in flight; one on a stream of set_current_stream may be, as on a GPU.
  void quiesce() override {
    if (!any_callers_.load(std::memory_order_acquire)) return;
    for (auto& s : live_streams()) {
      if (s->mode() == HostStream::Mode::kCooperative) {
        const uint64_t target = s->enqueued();
        scheduler_->drive([&] { return s->done() >= target; });
      } else {
        s->wait_done(s->enqueued(), /*rethrow=*/false);
      }
    }
  }

  // NOTE [Teardown drains] in p2p_workspace/symmetric_workspace.cpp.
  bool drain(Millis limit) noexcept override {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    try {
      for (auto& s : live_streams()) {
        const uint64_t target = s->enqueued();
        auto on_time = [&] {
          if (s->done() >= target) return true;
          if (std::chrono::steady_clock::now() >= deadline) throw std::runtime_error("late");
          return false;
        };
        if (s->mode() == HostStream::Mode::kCooperative) {
          scheduler_->drive(on_time);
        } else {
          while (!on_time()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    } catch (...) {
      return false;
    }
    return true;
  }

  // NOTE [Inline signals] in p2p_workspace/device.hpp. The inline stream counts no task for
  // these: an event recorded on it is complete whatever its count, as everything on it is.
  bool runs_inline(const Stream& s) const override { return &s == inline_stream_.get(); }
  void write_signal_now(uint32_t* addr, uint32_t value) override {
    futex_store_and_wake(addr, value);
  }
  bool poll_signals_now(c10::ArrayRef<SignalWait> waits) override {
    return poll_briefly(waits, oversubscribed_.load(std::memory_order_relaxed));
  }

  // NOTE [Device failure]: every wait loop of this device checks failure_ on each pass (at most
  // kMaxSleep apart) and raises.
  void abort(const std::string& why) override { failure_.fail(why); }
  void check_healthy(const char* op) override { failure_.check(op); }
  void set_ranks_cpus(int cpus) override {
    ranks_cpus_.store(cpus, std::memory_order_relaxed);
    const bool over = processes_ > std::max(1, cpus);
    oversubscribed_.store(over, std::memory_order_relaxed);
    if (scheduler_) scheduler_->set_oversubscribed(over);
  }
  int ranks_cpus() const override { return ranks_cpus_.load(std::memory_order_relaxed); }
  bool oversubscribed() const override { return oversubscribed_.load(std::memory_order_relaxed); }

 private:
  const int processes_;  // the ranks of this host
  // More ranks than the CPUs they share: NOTE [Host waits on shared cores] in
  // host/futex_wait.cpp; the CPUs are ranks_cpus_ once rendezvous told them.
  std::atomic<bool> oversubscribed_;
  std::atomic<int> ranks_cpus_{0};
  const bool cooperative_;  // NOTE [Cooperative host streams] in host/host_stream.cpp
  const std::shared_ptr<CooperativeScheduler> scheduler_;
  std::shared_ptr<HostStream> inline_stream_;
  FailureState failure_;  // NOTE [Device failure]
  // The streams new_stream made (kept alive by their users), and the threads' chosen current
  // streams (set_current_stream); any_callers_ spares current_stream() the lock while none is.
  std::mutex streams_mu_;
  std::vector<std::weak_ptr<HostStream>> streams_;
  std::vector<std::pair<std::thread::id, std::shared_ptr<Stream>>> callers_;
  std::atomic<bool> any_callers_{false};

  bool own(const Stream& s) {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (const auto& w : streams_) {
      if (w.lock().get() == &s) return true;
    }
    return false;
  }
  std::vector<std::shared_ptr<HostStream>> live_streams() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::vector<std::shared_ptr<HostStream>> live;
    for (const auto& w : streams_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    return live;
  }
};

}  // namespace

}  // namespace cuda_p2p::host

namespace cuda_p2p {
HostStreams parse_host_streams(const std::string& value, const std::string& what) {
  if (value == "auto") return HostStreams::kDefault;
  if (value == "cooperative") return HostStreams::kCooperative;
  if (value == "threads") return HostStreams::kThreads;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'cooperative' or 'threads', got '",
                    value, "'");
}

std::shared_ptr<Device> make_host_device(int processes, HostStreams streams) {
  return std::make_shared<host::HostDevice>(processes, streams);
}

void set_current_stream(Device& device, std::shared_ptr<Stream> stream) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: set_current_stream needs a host device, got ", device.name());
  host->set_current_stream(std::move(stream));
}
}  // namespace cuda_p2p
