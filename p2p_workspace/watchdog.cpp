#include "p2p_workspace/watchdog.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace cuda_p2p {

bool FailureState::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return false;
  reason_ = why;
  failed_.store(true, std::memory_order_release);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || failure_.failed()) return;
  entries_.push_back(Entry{std::move(wait), timeout, std::move(context), std::nullopt});
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
  } else if (entries_.size() == 1) {
    cv_.notify_all();  // the thread sleeps until there is something to watch
  }
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void Watchdog::poll_now() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stop_) poll();
}

void Watchdog::stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    entries_.clear();
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  if (t.joinable()) t.detach();  // stop() from the watchdog thread itself: it returns next
}

bool Watchdog::poll() {
  // Called with mu_ held. Waits on different streams finish in any order: scan them all.
  const auto now = std::chrono::steady_clock::now();
  bool progress = false;
  bool blocked = false;  // the stream is still at the wait (not a kernel that gave up)
  std::string error;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = *it;
    if (e.wait->finished()) {
      if (auto peers = e.wait->given_up(); !peers.empty()) {
        error = e.context + " timed out after " + std::to_string(e.timeout.count()) +
                " ms: " + describe_ranks(peers) +
                " never arrived (the wait kernel gave up, so the data "
                "this op produced is stale)";
        break;
      }
      it = entries_.erase(it);
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
      break;
    }
    ++it;
  }
  if (!error.empty()) {
    const std::string why = error +
                            "; the stream's pending work cannot be cancelled: destroy the group "
                            "and end the process (NOTE [Device failure])";
    if (failure_.fail(why)) {
      try {  // poll_now() may run in a Python thread whose warnings are errors
        report_("cuda_p2p watchdog: this group's device failed: " + why + ". " +
                (blocked ? "Work queued behind the wait stays blocked: torch.cuda.synchronize() "
                           "and whatever else waits for that stream will not return."
                         : "The stream went on with stale data; cuda_p2p's calls on this group "
                           "raise this error."));
      } catch (...) {
      }
    }
    entries_.clear();
    stop_ = true;
  }
  return progress;
}

void Watchdog::loop() {
  if (thread_init_) thread_init_();
  std::unique_lock<std::mutex> lock(mu_);
  // Back-off: poll every millisecond while waits start and finish, up to max_poll_ when nothing
  // moves (a deadline is noticed at most max_poll_ late).
  Millis nap{1};
  while (!stop_) {
    if (entries_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !entries_.empty(); });
      nap = Millis(1);
      continue;
    }
    nap = poll() ? Millis(1) : std::min(nap * 2, max_poll_);
    if (stop_) break;
    cv_.wait_for(lock, nap);
  }
}

}  // namespace cuda_p2p
