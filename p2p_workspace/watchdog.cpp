#include "p2p_workspace/watchdog.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <sstream>

namespace cuda_p2p {

bool FailureState::fail(const std::string& why, bool work_done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return false;
  reason_ = why;
  work_done_.store(work_done, std::memory_order_release);
  failed_.store(true, std::memory_order_release);
  if (mirror_) std::atomic_ref<uint32_t>(*mirror_).store(1, std::memory_order_release);
  return true;
}

std::string FailureState::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void FailureState::raise(const char* op) const {
  TORCH_CHECK(false, "cuda_p2p ", op,
              ": this group's device is unusable (NOTE [Device failure]): ", reason());
}

std::string describe_ranks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "rank ?";
  std::ostringstream os;
  os << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

Watchdog::Watchdog(FailureState& failure, std::function<void()> thread_init, Millis max_poll,
                   std::function<void(const std::string&)> report)
    : failure_(failure),
      thread_init_(std::move(thread_init)),
      max_poll_(max_poll),
      report_(std::move(report)) {
  if (!report_) {
    report_ = [](const std::string& message) { TORCH_WARN(message); };
  }
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::track(std::unique_ptr<WatchedWait> wait, Millis timeout, std::string context) {
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    if (stop_) return;  // the device's streams have drained: nothing to watch or release
    incoming_.push_back(Entry{std::move(wait), timeout, std::move(context), std::nullopt});
    // Read after the push: a failure recorded before it is seen here, and one recorded after it
    // collects the wait (adopt() takes in_mu_) before it releases.
    failed = failure_.failed();
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
    } else if (incoming_.size() + queued_ == 1) {
      cv_.notify_all();  // the thread sleeps until there is something to watch
    }
  }
  if (!failed) return;
  // Enqueued on its stream after the failure was recorded: NOTE [Releasing blocked waits]. Its
  // op's Work must raise, also after a shutdown that drained (NOTE [Shutdown flushes]).
  failure_.taint();
  std::lock_guard<std::mutex> scan(scan_mu_);
  adopt();
  release_pending();
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(in_mu_);
  return incoming_.size() + queued_;
}

void Watchdog::poll_now() {
  std::lock_guard<std::mutex> scan(scan_mu_);
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    if (stop_) return;
  }
  adopt();
  if (failure_.failed()) {
    release_pending();
  } else {
    poll();
  }
}

void Watchdog::fail(const std::string& why, bool work_done) {
  failure_.fail(why, work_done);
  std::lock_guard<std::mutex> scan(scan_mu_);
  adopt();  // after the failure was recorded: NOTE [Releasing blocked waits]
  if (release_pending() > 0) failure_.taint();  // NOTE [Shutdown flushes]
}

void Watchdog::stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    stop_ = true;
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  if (t.joinable()) t.detach();  // stop() from the watchdog thread itself: it returns next
  std::lock_guard<std::mutex> scan(scan_mu_);
  std::lock_guard<std::mutex> lock(in_mu_);
  incoming_.clear();
  fifos_.clear();
  queued_ = 0;
}

void Watchdog::adopt() {
  std::vector<Entry> in;
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    in.swap(incoming_);
    queued_ += in.size();
  }
  for (auto& e : in) {
    const void* key = e.wait->stream();
    auto it = std::find_if(fifos_.begin(), fifos_.end(), [&](auto& f) { return f.first == key; });
    if (it == fifos_.end()) {
      fifos_.emplace_back(key, std::deque<Entry>{});
      it = std::prev(fifos_.end());
    }
    it->second.push_back(std::move(e));
  }
}

size_t Watchdog::release_pending() {
  // NOTE [Releasing blocked waits]: the highest value awaited per word, over every pending wait
  // and every earlier release.
  for (const auto& [stream, fifo] : fifos_) {
    for (const auto& e : fifo) {
      for (const auto& w : e.wait->awaited()) {
        auto [it, added] = released_.try_emplace(w.addr, w.value);
        if (!added && !signal_reached(it->second, w.value)) it->second = w.value;
      }
    }
  }
  size_t released = 0, retired = 0;
  for (auto& [stream, fifo] : fifos_) {
    for (auto& e : fifo) {
      if (e.wait->finished()) continue;
      ++released;
      for (const auto& w : e.wait->awaited()) {
        e.wait->release(const_cast<uint32_t*>(w.addr), released_.at(w.addr));
      }
    }
    retired += std::erase_if(fifo, [](Entry& e) { return e.wait->finished(); });
  }
  std::erase_if(fifos_, [](const auto& f) { return f.second.empty(); });
  std::lock_guard<std::mutex> lock(in_mu_);
  queued_ -= retired;
  return released;
}

bool Watchdog::poll() {
  // Only the head of each stream's FIFO can have been reached and not passed: two queries per
  // stream, not per pending wait.
  const auto now = std::chrono::steady_clock::now();
  bool progress = false;
  bool blocked = false;  // the stream is still at the wait (not a kernel that gave up)
  std::string error;
  size_t retired = 0;
  for (auto& [stream, fifo] : fifos_) {
    while (!fifo.empty() && error.empty()) {
      Entry& e = fifo.front();
      if (e.wait->finished()) {
        if (auto peers = e.wait->given_up(); !peers.empty()) {
          error = e.context + " timed out after " + std::to_string(e.timeout.count()) +
                  " ms: " + describe_ranks(peers) +
                  " never arrived (the wait kernel gave up, so the data this op produced is "
                  "stale)";
          break;
        }
        fifo.pop_front();
        ++retired;
        progress = true;
        continue;
      }
      if (!e.started && e.wait->started()) {
        e.started = now;
        progress = true;
      }
      if (e.started && now - *e.started > e.timeout) {
        error = e.context + " timed out after " + std::to_string(e.timeout.count()) +
                " ms: " + describe_ranks(e.wait->missing()) + " never arrived";
        blocked = true;
      }
      break;  // the later waits of this stream are not reached yet
    }
    if (!error.empty()) break;
  }
  std::erase_if(fifos_, [](const auto& f) { return f.second.empty(); });
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    queued_ -= retired;
  }
  if (!error.empty()) {
    const std::string why = error +
                            "; the group's pending waits were released, so its streams drain on "
                            "stale data: destroy the group (NOTE [Device failure])";
    if (failure_.fail(why)) {
      try {  // poll_now() may run in a Python thread whose warnings are errors
        report_("cuda_p2p watchdog: this group's device failed: " + why + ". " +
                (blocked ? "The waits were released; cuda_p2p's calls on this group raise this "
                           "error."
                         : "The stream went on with stale data; cuda_p2p's calls on this group "
                           "raise this error."));
      } catch (...) {
      }
    }
    adopt();  // what the host enqueued meanwhile: NOTE [Releasing blocked waits]
    release_pending();
  }
  return progress;
}

void Watchdog::loop() {
  if (thread_init_) thread_init_();
  // Back-off: poll every millisecond while waits start and finish, up to max_poll_ when nothing
  // moves (a deadline is noticed at most max_poll_ late).
  Millis nap{1};
  while (true) {
    {
      std::unique_lock<std::mutex> lock(in_mu_);
      if (stop_) break;
      if (incoming_.empty() && queued_ == 0) {
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
        nap = Millis(1);
        continue;
      }
    }
    bool progress = false;
    {
      std::lock_guard<std::mutex> scan(scan_mu_);
      adopt();
      if (failure_.failed()) {
        // The janitor (NOTE [Releasing blocked waits]): again until the streams passed them.
        release_pending();
        nap = max_poll_;
      } else {
        progress = poll();
      }
    }
    if (!failure_.failed()) nap = progress ? Millis(1) : std::min(nap * 2, max_poll_);
    std::unique_lock<std::mutex> lock(in_mu_);
    if (stop_) break;
    cv_.wait_for(lock, nap);
  }
}

}  // namespace cuda_p2p
