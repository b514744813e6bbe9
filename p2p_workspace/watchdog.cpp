#include "p2p_workspace/watchdog.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string_view>

namespace cuda_p2p {

namespace {

// NOTE [Failure words]: the reason slot `src` writes in the area that starts at `word`.
char* reason_slot(const uint32_t* word, int src) {
  return const_cast<char*>(reinterpret_cast<const char*>(word)) + FailureState::kReasonOffset +
         FailureState::kReasonBytes * static_cast<size_t>(src);
}

// The text after the slot's ready word: printable, NUL-terminated, shortened to fit at a word's
// end with a marker (never "its results are n").
void write_reason(char* slot, const std::string& why) {
  constexpr size_t kText = FailureState::kReasonBytes - sizeof(uint32_t) - 1;
  static constexpr std::string_view kMarker = " ...";
  std::string text = why;
  if (text.size() > kText) {
    const size_t room = kText - kMarker.size();
    size_t cut = text.rfind(' ', room);
    if (cut == std::string::npos || cut < room / 2) cut = room;  // one long word: cut it
    text.resize(cut);
    text += kMarker;
  }
  for (auto& c : text) {
    if (c < 0x20 || c > 0x7e) c = ' ';
  }
  std::memcpy(slot + sizeof(uint32_t), text.c_str(), text.size() + 1);
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(slot)).store(1, std::memory_order_release);
}

std::string read_reason(const char* slot) {
  if (std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(const_cast<char*>(slot)))
          .load(std::memory_order_acquire) != 1) {
    return "";
  }
  const char* text = slot + sizeof(uint32_t);
  return std::string(text, strnlen(text, FailureState::kReasonBytes - sizeof(uint32_t)));
}

}  // namespace

bool FailureState::fail(const std::string& why, bool work_done, int origin) {
  return fail_telling(why, why, work_done, origin);
}

bool FailureState::fail_telling(const std::string& why, const std::string& told, bool work_done,
                                int origin) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    reason_ = why;
    told_ = told;
    origin_ = origin;
    work_done_.store(work_done, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
    if (mirror_) std::atomic_ref<uint32_t>(*mirror_).store(1, std::memory_order_release);
  }
  if (!work_done) publish();  // NOTE [Failure words]: before this caller releases anything
  return true;
}

void FailureState::set_words(int rank, const uint32_t* own, std::vector<uint32_t*> peers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (has_words_.load(std::memory_order_relaxed)) return;
    rank_ = rank;
    own_word_ = own;
    peer_words_ = std::move(peers);
    has_words_.store(true, std::memory_order_release);
  }
  // A failure recorded before the words existed (an abort while the rendezvous ran).
  if (failed() && !work_done_.load(std::memory_order_acquire)) publish();
}

void FailureState::forget_peers(const std::vector<int>& ranks) {
  // publish() writes the words under publish_mu_, and takes mu_ inside it: the same order here.
  std::lock_guard<std::mutex> publishing(publish_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  for (int r : ranks) {
    if (r >= 0 && static_cast<size_t>(r) < peer_words_.size()) peer_words_[r] = nullptr;
  }
}

int FailureState::peer_failure() const {
  if (!has_words()) return -1;
  const uint32_t v =
      std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(own_word_)).load(std::memory_order_acquire);
  if (v == 0) return -1;
  // Only the group's ranks write it; anything else still means a failure, of "some rank".
  return v - 1 < peer_words_.size() ? static_cast<int>(v - 1)
                                    : static_cast<int>(peer_words_.size());
}

bool FailureState::adopt_peer_failure() {
  if (failed()) return false;
  const int origin = peer_failure();
  if (origin < 0) return false;
  const int world_size = static_cast<int>(peer_words_.size());
  const bool known = origin < world_size;
  const std::string who = known ? "rank " + std::to_string(origin) : "a rank of this group";
  // The origin's own reason, else that of the peer that told this rank (it wrote its slot before
  // the word), which is the origin's as it read it.
  std::string why = known ? read_reason(reason_slot(own_word_, origin)) : "";
  for (int r = 0; r < world_size && why.empty(); ++r) why = read_reason(reason_slot(own_word_, r));
  return fail_telling(
      who + "'s device failed first, and its failure reached rank " + std::to_string(rank_) +
          " through this rank's failure word (NOTE [Failure words]): " +
          (why.empty() ? std::string("(its reason did not reach this rank)") : why) +
          "; the ops this group ran since may have taken its stale data, so none "
          "of them is valid",
      why, /*work_done=*/false, known ? origin : -1);
}

void FailureState::publish() {
  if (!failed() || !has_words()) return;
  // Under a lock, not a flag: a second caller returns only once the words are written, since it
  // may release waits next.
  std::lock_guard<std::mutex> lock(publish_mu_);
  if (published_) return;
  published_ = true;
  int origin = 0;
  std::string told;
  {
    std::lock_guard<std::mutex> state(mu_);
    origin = origin_ >= 0 ? origin_ : rank_;
    told = told_;
  }
  const uint32_t value = static_cast<uint32_t>(origin) + 1;
  for (uint32_t* word : peer_words_) {
    if (word == nullptr) continue;
    write_reason(reason_slot(word, rank_), told);  // before the word, which releases it
    uint32_t expected = 0;                         // the first origin to reach a peer stays
    std::atomic_ref<uint32_t>(*word).compare_exchange_strong(expected, value,
                                                             std::memory_order_seq_cst);
  }
  // The stores before anything this thread enqueues next (the releases' stream writes). TSan
  // refuses fences (GCC's -Wtsan); the seq_cst exchanges above order the host's own releases
  // there, which are atomic stores too.
#ifndef __SANITIZE_THREAD__
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
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

std::string graph_busy_text(uint32_t tag, const char* what) {
  char tag_text[16];
  std::snprintf(tag_text, sizeof(tag_text), "0x%08x", tag);
  return std::string("another captured op of this group was running on this rank when the op ") +
         "tagged " + tag_text + " of a replayed " + what +
         " began: two graphs of one group were replayed at once (on two streams?); the op ran "
         "nothing and the group failed (replay one group's graphs one after another; NOTE [One "
         "captured op at a time])";
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

// NOTE [Waits for a stream outlast the waits on it]
// Why: a host-side wait for a stream (synchronize, a Work's wait) gives up at the group's
// timeout counted from its call, plus notice(), so that a wait on the stream that misses its own
// deadline - counted from when the stream reached it - comes first and names the ranks it
// awaited. A stream that reaches that wait late (a large op's earlier rounds, a long task before
// it) has its deadline after the caller's: the caller gave up first, with "the stream did not
// finish within the group's timeout", and the rank that never arrived went unnamed (seen in a
// fault test on a loaded machine: rank 0's synchronize raised 80 ms before its watchdog named
// rank 1).
// How: when its own deadline has passed, the caller asks pending_deadline() after a pass of the
// watchdog and, while a wait its device tracks is started and not past its deadline, waits on
// until that deadline plus notice(). Only waits extend it: a stream held by anything else (a
// long kernel, another library's wait) still gives up at the caller's deadline.
std::optional<std::chrono::steady_clock::time_point> Watchdog::pending_deadline() {
  std::lock_guard<std::mutex> scan(scan_mu_);
  std::optional<std::chrono::steady_clock::time_point> latest;
  for (const auto& [stream, fifo] : fifos_) {
    // Only the head of a stream's FIFO can have been reached and not passed.
    if (fifo.empty() || !fifo.front().started) continue;
    const auto due = *fifo.front().started + fifo.front().timeout;
    if (!latest || due > *latest) latest = due;
  }
  return latest;
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
  release_pending();
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
      if (released++ == 0) {
        failure_.publish();  // NOTE [Failure words]: before any release
        // A wait cut short: its op's Work raises, also after a shutdown that drained (NOTE
        // [Shutdown flushes]), whichever thread releases it - fail()'s caller or the watchdog's
        // own, which may see the failure first.
        failure_.taint();
      }
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

void Watchdog::check_memory_now() {
  std::lock_guard<std::mutex> scan(scan_mu_);
  {
    std::lock_guard<std::mutex> lock(in_mu_);
    if (stop_) return;
  }
  adopt();
  (void)check_memory();
}

void Watchdog::arm() {
  if (armed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(in_mu_);
  if (stop_) return;
  armed_.store(true, std::memory_order_release);
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
  } else {
    cv_.notify_all();
  }
}

void Watchdog::add_probe(std::function<std::string()> probe) {
  std::lock_guard<std::mutex> scan(scan_mu_);
  probes_.push_back(std::move(probe));
}

void Watchdog::report(const std::string& why, bool blocked) {
  try {  // poll_now() may run in a Python thread whose warnings are errors
    report_("cuda_p2p watchdog: this group's device failed: " + why + ". " +
            (blocked ? "The waits were released; cuda_p2p's calls on this group raise this error."
                     : "The stream went on with stale data; cuda_p2p's calls on this group "
                       "raise this error."));
  } catch (...) {
  }
}

bool Watchdog::check_memory() {
  bool recorded = failure_.adopt_peer_failure();
  for (const auto& probe : probes_) {
    if (failure_.failed()) break;
    const std::string why = probe();
    if (why.empty()) continue;
    // A peer's word read after the finding comes first: a stale op-signature record is one that
    // a released peer's stream wrote into, and that peer published its failure before its stream
    // wrote anything (NOTE [Failure words]; NOTE [A disagreement fails the device at once] in
    // ops/op_signature.cpp).
    recorded = failure_.adopt_peer_failure() || failure_.fail(why);
  }
  if (!failure_.failed()) return false;
  if (recorded) report(failure_.reason(), /*blocked=*/true);
  adopt();  // what the host enqueued meanwhile: NOTE [Releasing blocked waits]
  release_pending();
  return true;
}

bool Watchdog::poll() {
  // NOTE [Failure words]: a peer's failure, or the probe's, before any deadline.
  if (check_memory()) return true;
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
    if (failure_.fail(why)) report(why, blocked);
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
      // Armed (Watchdog::arm): scans go on every max_poll at most, waits or none, until the
      // device fails.
      const auto probing = [&] {
        return armed_.load(std::memory_order_acquire) && !failure_.failed();
      };
      if (incoming_.empty() && queued_ == 0 && !probing()) {
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty() || probing(); });
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
