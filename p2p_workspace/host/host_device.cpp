// The host device (host_device_impl.hpp): identity, blocks, streams, copies, signals, waits,
// events and failure on memfd blocks (../shared_block.cpp), host streams (host_stream.cpp), futex
// waits (futex_wait.cpp) and cross-memory reads (cross_memory.cpp); and host_device.hpp's entry
// points.
#include <c10/util/Exception.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "p2p_workspace/host/cross_memory.hpp"
#include "p2p_workspace/host/futex_wait.hpp"
#include "p2p_workspace/host/host_device_impl.hpp"
#include "p2p_workspace/signal_store_body.hpp"

namespace cuda_p2p::host {

HostStream& as_host(Stream& s) {
  auto* h = dynamic_cast<HostStream*>(&s);
  TORCH_CHECK(h, "cuda_p2p: a host device was given a stream of another device");
  return *h;
}

HostTask event_wait(HostStream& self, std::shared_ptr<HostStream> other, uint64_t seq) {
  if (self.mode() == HostStream::Mode::kCooperative) {
    return HostTask::when([other, seq] {
      if (other->done() < seq) return false;
      if (auto err = other->error()) std::rethrow_exception(err);
      return true;
    });
  }
  // Blocks (the inline stream of a cooperative device runs the streams meanwhile).
  return HostTask::blocking([other, seq] {
    other->wait_done(seq, /*rethrow=*/false);
    if (auto err = other->error()) std::rethrow_exception(err);
  });
}

namespace {

// CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

HostStreams resolve_mode(HostStreams mode) {
  return mode == HostStreams::kDefault ? HostStreams::kCooperative : mode;
}

uint32_t read_counter(const uint32_t* counter) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(counter)).load(std::memory_order_relaxed);
}

// The signal stores' policy on the host (p2p_workspace/signal_store_body.hpp). NOTE [Replay-safe
// signals] in p2p_workspace/symmetric_workspace.cpp: a counter is read and written only by the
// tasks of the streams of one channel, one at a time (relaxed atomics, ordered by the streams' own
// order); the words they produce are published by futex_store_and_wake's release exchange, which
// wakes a sleeping waiter (NOTE [Sleeper bit]).
struct HostStores {
  uint32_t load(const uint32_t* p) const { return read_counter(p); }
  void store(uint32_t* p, uint32_t v) const {
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_relaxed);
  }
  void publish(uint32_t* addr, uint32_t value) const { futex_store_and_wake(addr, value); }
};

}  // namespace

HostDevice::HostDevice(int processes, HostStreams mode, HostSemantics semantics)
    : processes_(processes),
      oversubscribed_(processes > usable_cpus()),
      cooperative_(resolve_mode(mode) == HostStreams::kCooperative),
      scheduler_(cooperative_ ? std::make_shared<CooperativeScheduler>(oversubscribed_.load())
                              : nullptr),
      inline_stream_(std::make_shared<HostStream>(HostStream::Mode::kInline, false, nullptr)) {
  failure_.mirror_to(&give_ups_->failed);  // NOTE [Counted waits end with the failure]
  if (semantics == HostSemantics::kCuda) use_cuda_semantics();
}

HostDevice::~HostDevice() {
  gone_->store(true, std::memory_order_release);  // CUDA-semantics waits still queued exit
  watchdog_.reset();
}

HostWords HostDevice::host_words(size_t n) {
  auto words = std::make_unique<uint32_t[]>(n);  // zeroed
  uint32_t* p = words.get();
  std::lock_guard<std::mutex> lock(streams_mu_);
  host_words_.push_back(std::move(words));
  return {p, p};
}

std::unique_ptr<BlockExporter> HostDevice::export_block(const std::shared_ptr<Block>& block,
                                                        int max_peers) {
  return export_shared_block(block, max_peers);
}

std::shared_ptr<Block> HostDevice::import_block(const std::vector<uint8_t>& handle, size_t bytes,
                                                Millis timeout) {
  return import_shared_block(handle, bytes, timeout);
}

std::shared_ptr<CrossMemoryReader> HostDevice::cross_memory_reader(bool deny) {
  return make_cross_memory_reader(deny);  // host/cross_memory.cpp
}

std::shared_ptr<Stream> HostDevice::current_stream() {
  if (!cuda() && !any_callers_.load(std::memory_order_acquire)) return inline_stream_;
  std::lock_guard<std::mutex> lock(streams_mu_);
  const auto self = std::this_thread::get_id();
  for (const auto& [thread, stream] : callers_) {
    if (thread == self) return stream;
  }
  if (!cuda()) return inline_stream_;
  for (const auto& [thread, stream] : defaults_) {
    if (thread == self) return stream;
  }
  auto s = make_stream_locked(false);
  defaults_.emplace_back(self, s);
  return s;
}

std::shared_ptr<Stream> HostDevice::new_stream(bool high_priority) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  return make_stream_locked(high_priority);
}

void HostDevice::set_current_stream(std::shared_ptr<Stream> stream) {
  TORCH_CHECK(!stream || stream == inline_stream_ || own(*stream),
              "cuda_p2p: set_current_stream needs a stream of this device (new_stream)");
  std::lock_guard<std::mutex> lock(streams_mu_);
  const auto self = std::this_thread::get_id();
  std::erase_if(callers_, [&](const auto& c) { return c.first == self; });
  if (stream && stream != inline_stream_) callers_.emplace_back(self, std::move(stream));
  any_callers_.store(!callers_.empty(), std::memory_order_release);
}

std::shared_ptr<HostStream> HostDevice::make_stream_locked(bool high_priority) {
  std::shared_ptr<HostStream> s;
  if (!cooperative_) {
    s = std::make_shared<HostStream>(HostStream::Mode::kThread, high_priority, nullptr);
  } else {
    s = std::make_shared<HostStream>(HostStream::Mode::kCooperative, high_priority, scheduler_);
    scheduler_->add(s);
  }
  std::erase_if(streams_, [](const auto& w) { return w.expired(); });
  streams_.push_back(s);
  return s;
}

bool HostDevice::own(const Stream& s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (const auto& w : streams_) {
    if (w.lock().get() == &s) return true;
  }
  return false;
}

std::vector<std::shared_ptr<HostStream>> HostDevice::live_streams() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  std::vector<std::shared_ptr<HostStream>> live;
  for (const auto& w : streams_) {
    if (auto s = w.lock()) live.push_back(std::move(s));
  }
  return live;
}

void HostDevice::copy(Stream& s, void* dst, const void* src, size_t n) {
  enqueue(s, HostTask::work([dst, src, n] { std::memcpy(dst, src, n); }));
}

void HostDevice::write_signal(Stream& s, uint32_t* addr, uint32_t value) {
  check_not_captured(as_host(s), "write_signal (a sequence number; NOTE [Replay-safe signals])");
  enqueue(s, HostTask::work([addr, value] { signal_write(addr, value, HostStores{}); }));
}

void HostDevice::advance_counter(Stream& s, uint32_t* counter, uint32_t delta) {
  enqueue(s, HostTask::work([counter, delta] { counter_advance(counter, delta, HostStores{}); }));
}

void HostDevice::write_counted(Stream& s, uint32_t* addr, const uint32_t* counter,
                               uint32_t offset) {
  enqueue(s, HostTask::work(
                 [addr, counter, offset] { counted_write(addr, counter, offset, HostStores{}); }));
}

void HostDevice::wait_counted(Stream& s, std::vector<CountedWait> counted, Millis timeout,
                              std::string context) {
  if (cuda()) {
    check_healthy(context.c_str());
  } else {
    failure_.check(context.c_str());
  }
  if (counted.empty()) return;
  auto& h = as_host(s);
  // The values are read when the stream reaches the wait, then it is an ordinary wait.
  auto resolve = [counted = std::move(counted)] {
    std::vector<SignalWait> waits;
    waits.reserve(counted.size());
    for (const auto& c : counted) {
      waits.push_back(SignalWait{c.addr, read_counter(c.counter) + c.offset, c.peer});
    }
    return waits;
  };
  if (cuda()) {
    enqueue_cuda_counted_wait(s, std::move(resolve), timeout, std::move(context));
    return;
  }
  if (h.mode() == HostStream::Mode::kCooperative) {
    // `late` is shared by the copies a replay enqueues of a captured task: they run one after
    // another on the stream, and only the one at its head fills or reads it.
    auto late = std::make_shared<std::vector<SignalWait>>();
    HostTask t = HostTask::when([resolve, late, timeout, context = std::move(context),
                                 deadline = std::optional<std::chrono::steady_clock::time_point>(),
                                 this]() mutable {
      if (!deadline) {
        *late = resolve();
        deadline = std::chrono::steady_clock::now() + timeout;
      }
      return check_waits(*late, *deadline, timeout, context, failure_);
    });
    t.late_waits = late;
    enqueue(s, std::move(t));
    return;
  }
  if (h.mode() == HostStream::Mode::kInline && cooperative_) {
    enqueue(s, HostTask::blocking([this, resolve, timeout, context = std::move(context)] {
              const auto waits = resolve();
              const auto deadline = std::chrono::steady_clock::now() + timeout;
              scheduler_->drive(
                  [&] { return check_waits(waits, deadline, timeout, context, failure_); }, waits);
            }));
    return;
  }
  enqueue(s, HostTask::blocking([resolve, timeout, context = std::move(context),
                                 oversubscribed = oversubscribed_.load(std::memory_order_relaxed),
                                 this] {
            block_on_waits(resolve(), timeout, context, oversubscribed, failure_);
          }));
}

void HostDevice::wait_signals(Stream& s, std::vector<SignalWait> waits, Millis timeout,
                              std::string context) {
  failure_.check(context.c_str());
  auto& h = as_host(s);
  check_not_captured(h, "wait_signals (a sequence number; NOTE [Replay-safe signals])");
  if (cuda()) {
    if (waits.empty()) return;
    enqueue_cuda_wait(h, std::move(waits), timeout, std::move(context));
    return;
  }
  if (h.mode() == HostStream::Mode::kCooperative) {
    // Tried by the scheduler until it holds; the timeout counts from the first try.
    std::optional<std::chrono::steady_clock::time_point> deadline;
    enqueue(s, HostTask::when(
                   [waits, timeout, context = std::move(context), deadline, this]() mutable {
                     if (!deadline) deadline = std::chrono::steady_clock::now() + timeout;
                     return check_waits(waits, *deadline, timeout, context, failure_);
                   },
                   waits));
    return;
  }
  if (h.mode() == HostStream::Mode::kInline && cooperative_) {
    // The caller waits, and runs the cooperative streams meanwhile.
    enqueue(s, HostTask::blocking([this, waits = std::move(waits), timeout,
                                   context = std::move(context)] {
              const auto deadline = std::chrono::steady_clock::now() + timeout;
              scheduler_->drive(
                  [&] { return check_waits(waits, deadline, timeout, context, failure_); }, waits);
            }));
    return;
  }
  enqueue(s, HostTask::blocking(
                 [waits = std::move(waits), timeout, context = std::move(context),
                  oversubscribed = oversubscribed_.load(std::memory_order_relaxed),
                  this] { block_on_waits(waits, timeout, context, oversubscribed, failure_); }));
}

void HostDevice::launch(Stream& s, std::function<void()> fn) {
  enqueue(s, HostTask::work(std::move(fn)));
}

void HostDevice::host_task(Stream& s, std::function<void()> fn) {
  enqueue(s, HostTask::work(std::move(fn)));
}

void HostDevice::record_stream(const at::Tensor& t, Stream& s) {
  if (!cuda() || runs_inline(s)) return;
  enqueue(s, HostTask::work([t] {}));
}

std::shared_ptr<Event> HostDevice::record(Stream& s) {
  auto& h = as_host(s);
  if (capturing_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(capture_mu_);
    if (capture_ && capture_->counts.count(&h)) {  // NOTE [Host capture]
      return std::make_shared<HostEvent>(h.shared_from_this(), capture_->counts[&h], capture_->id);
    }
  }
  // The event keeps the stream alive for whoever waits on it.
  return std::make_shared<HostEvent>(h.shared_from_this(), h.enqueued());
}

void HostDevice::wait_event(Stream& s, const Event& e) {
  const auto* ev = dynamic_cast<const HostEvent*>(&e);
  TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
  auto& self = as_host(s);
  if (ev->stream.get() == &self) return;
  if (ev->capture != 0 || capturing_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(capture_mu_);
    const bool active = capture_ && capture_->id == ev->capture;
    if (active) {  // NOTE [Host capture]: `s` joins the capture, the wait is recorded
      capture_->counts.try_emplace(&self, 0);
      capture_->keep.insert(self.shared_from_this());
      capture_->entries.push_back(
          CaptureEntry{&self, HostTask{}, ev->stream.get(), ev->seq, /*is_wait=*/true});
      ++capture_->counts[&self];
      return;
    }
    TORCH_CHECK(ev->capture == 0, "cuda_p2p: a host stream waits for an event recorded in ",
                "a capture that has ended; wait for work after its replay instead");
    TORCH_CHECK(!capture_ || !capture_->counts.count(&self),
                "cuda_p2p: a stream being captured waits for an event recorded outside the ",
                "capture (a replay could not depend on it; NOTE [Host capture])");
  }
  self.enqueue(event_wait(self, ev->stream, ev->seq));
}

void HostDevice::synchronize(Stream& s) {
  auto& h = as_host(s);
  check_not_captured(h, "synchronize");
  if (cuda()) await_stream(h, h.enqueued(), "synchronize");
  h.wait_done(h.enqueued(), /*rethrow=*/true);
}

void HostDevice::synchronize(const Event& e) {
  const auto* ev = dynamic_cast<const HostEvent*>(&e);
  TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
  check_event_not_captured(e, "synchronize");  // as CUDA refuses it
  if (cuda()) await_stream(*ev->stream, ev->seq, "synchronize");
  ev->stream->wait_done(ev->seq, /*rethrow=*/false);
  if (auto err = ev->stream->error()) std::rethrow_exception(err);
  failure_.check("synchronize");
}

bool HostDevice::query(const Event& e) {
  check_event_not_captured(e, "Work.is_completed");  // as CUDA refuses it
  if (!cuda()) return true;
  const auto* ev = dynamic_cast<const HostEvent*>(&e);
  TORCH_CHECK(ev, "cuda_p2p: a host device was given an event of another device");
  if (ev->stream->mode() == HostStream::Mode::kCooperative && ev->stream->done() < ev->seq) {
    bool once = false;
    scheduler_->drive([&] { return std::exchange(once, true); });
  }
  return ev->stream->done() >= ev->seq;
}

void HostDevice::quiesce() {
  if (cuda()) {
    for (auto& s : live_streams()) await_stream(*s, s->enqueued(), "quiesce");
    return;
  }
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

bool HostDevice::drain(Millis limit) noexcept {
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

void HostDevice::write_signal_now(uint32_t* addr, uint32_t value) {
  futex_store_and_wake(addr, value);
}

bool HostDevice::poll_signals_now(c10::ArrayRef<SignalWait> waits) {
  return poll_briefly(waits, oversubscribed_.load(std::memory_order_relaxed));
}

void HostDevice::abort(const std::string& why) {
  if (cuda()) {
    watchdog_->fail(why);
  } else {
    failure_.fail(why);
  }
}

bool HostDevice::retire(const std::string& why, Millis limit) {
  const bool drained = drain(limit);
  if (cuda()) {
    watchdog_->fail(why, drained);
  } else {
    failure_.fail(why, drained);
  }
  return drained;
}

void HostDevice::check_healthy(const char* op) {
  if (cuda()) check_graph_give_up();
  failure_.check(op);
}

void HostDevice::check_work(const char* op) {
  if (cuda()) check_graph_give_up();
  failure_.check_work(op);
}

std::string HostDevice::lost_context() const {
  std::lock_guard<std::mutex> lock(give_ups_->mu);
  return give_ups_->lost;
}

void HostDevice::set_failure_words(FailureWords words) {
  if (failure_.has_words()) return;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    areas_ = std::move(words.areas);
  }
  give_ups_->area = areas_.empty() ? nullptr : areas_.front();
  give_ups_->trap_on_peer_failure.store(words.trap_on_peer_failure, std::memory_order_release);
  give_ups_->rank.store(words.rank, std::memory_order_relaxed);
  give_ups_->peer_word.store(words.own, std::memory_order_release);
  failure_.set_words(words.rank, words.own, std::move(words.peers));
}

void HostDevice::add_failure_probe(std::function<std::string()> probe) {
  // With CUDA's semantics only: the synchronous host compares before its ops go on.
  if (cuda()) watchdog_->add_probe(std::move(probe));
}

void HostDevice::forget_failure_peers(const std::vector<int>& ranks) {
  failure_.forget_peers(ranks);              // first: no word of theirs is written once it returns
  std::vector<std::shared_ptr<Block>> gone;  // unmapped after the lock is released
  std::lock_guard<std::mutex> lock(streams_mu_);
  const int rank = give_ups_->rank.load(std::memory_order_relaxed);
  for (int r : ranks) {
    const size_t i = FailureWords::area_index(rank, r);
    if (r != rank && i < areas_.size() && areas_[i]) gone.push_back(std::move(areas_[i]));
  }
}

void HostDevice::set_timeout(Millis timeout) {
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
}

void HostDevice::set_ranks_cpus(int cpus) {
  ranks_cpus_.store(cpus, std::memory_order_relaxed);
  const bool over = processes_ > std::max(1, cpus);
  oversubscribed_.store(over, std::memory_order_relaxed);
  if (scheduler_) scheduler_->set_oversubscribed(over);
}

}  // namespace cuda_p2p::host

namespace cuda_p2p {
HostStreams parse_host_streams(const std::string& value, const std::string& what) {
  if (value == "auto") return HostStreams::kDefault;
  if (value == "cooperative") return HostStreams::kCooperative;
  if (value == "threads") return HostStreams::kThreads;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'cooperative' or 'threads', got '",
                    value, "'");
}

HostSemantics parse_host_semantics(const std::string& value, const std::string& what) {
  if (value == "auto" || value == "synchronous") return HostSemantics::kSynchronous;
  if (value == "cuda") return HostSemantics::kCuda;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'synchronous' or 'cuda', got '",
                    value, "'");
}

std::shared_ptr<Device> make_host_device(int processes, HostStreams streams,
                                         HostSemantics semantics) {
  return std::make_shared<host::HostDevice>(processes, streams, semantics);
}

void use_cuda_semantics(Device& device) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: use_cuda_semantics needs a host device, got ", device.name());
  host->use_cuda_semantics();
}

void set_current_stream(Device& device, std::shared_ptr<Stream> stream) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: set_current_stream needs a host device, got ", device.name());
  host->set_current_stream(std::move(stream));
}

void begin_capture(Device& device, const std::shared_ptr<Stream>& stream) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: begin_capture needs a host device, got ", device.name());
  host->begin_capture(stream);
}

std::shared_ptr<HostGraph> end_capture(Device& device) {
  auto* host = dynamic_cast<host::HostDevice*>(&device);
  TORCH_CHECK(host, "cuda_p2p: end_capture needs a host device, got ", device.name());
  return host->end_capture();
}
}  // namespace cuda_p2p
