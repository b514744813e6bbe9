// The host device's captures and flag barriers (host_device_impl.hpp): NOTE [Host capture] and
// Device::graph_kernel's runs, as the kernel runs them (p2p_workspace/flag_barrier_body.hpp).
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>

#include "p2p_workspace/flag_barrier_body.hpp"
#include "p2p_workspace/host/futex_wait.hpp"
#include "p2p_workspace/host/host_device_impl.hpp"

namespace cuda_p2p::host {

namespace {

// NOTE [Graph flags] in p2p_workspace/graph_flags.hpp: "0x2a5f..." for the errors.
std::string tag_text(uint32_t tag) {
  char out[16];
  std::snprintf(out, sizeof(out), "0x%08x", tag);
  return out;
}

}  // namespace

std::string foreign_tag(int peer, uint32_t seen, uint32_t tag) {
  return "rank " + std::to_string(peer) + " is at another captured op (its tag " + tag_text(seen) +
         ", this rank's " + tag_text(tag) +
         "): the ranks replayed different graphs, or one replayed a graph more or fewer times "
         "than its peers (NOTE [Graph flags])";
}

namespace {

// The flag barrier's policy (p2p_workspace/flag_barrier_body.hpp) on the host: a flag's sleeper
// bit (NOTE [Sleeper bit]) is not its value, a store wakes the peer's sleeping thread, and the
// failures are the device's GraphEnds::check (which raises a peer's failure itself).
struct HostFlags {
  const GraphEnds* ends;
  uint32_t load_acquire(const uint32_t* p) const {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire) &
           0x7fffffffu;
  }
  // An exchange: its release publishes what this rank did before, the clears of its earlier
  // slots included.
  void store_release(uint32_t* p, uint32_t v) const { futex_store_and_wake(p, v); }
  void clear(uint32_t* p) const {
    std::atomic_ref<uint32_t>(*p).store(0, std::memory_order_relaxed);
  }
  void zero(uint32_t* p) const { clear(p); }
  uint32_t busy_cas(uint32_t* p, uint32_t expected, uint32_t desired) const {
    std::atomic_ref<uint32_t>(*p).compare_exchange_strong(expected, desired,
                                                          std::memory_order_acq_rel);
    return expected;  // the value found
  }
  bool peer_failed() const { return false; }
  // Asked once per pass over the flags (the first unset flag asks).
  bool ended() const {
    if (ended_ < 0) ended_ = ends->check() ? 1 : 0;
    return ended_ == 1;
  }
  mutable int ended_ = -1;
};

// NOTE [Graph flags]: one run of Device::graph_kernel on the host, as the kernel runs it, with the
// kernel's own stores, polls and decisions (p2p_workspace/flag_barrier_body.hpp): per barrier,
// store the tag into every peer's slot of every block, poll every flag still unset once per
// advance (a flag with this op's tag is consumed, another tag raises), then run the body's step
// on every block. advance() goes as far as the flags allow; it is copied with the task that holds
// it, so that every replay of a captured run starts afresh.
class GraphRun {
 public:
  GraphRun(const GraphLaunch& g, std::shared_ptr<const std::function<void(int, int)>> body,
           Millis timeout)
      : g_(g), body_(std::move(body)), timeout_(timeout) {}

  // True when the run is over (every barrier passed and the body ran, or it ended quietly).
  bool advance(const GraphEnds& ends) {
    if (!entered_) {
      // NOTE [One captured op at a time]: the kernel's entry.
      if (graph_take(g_, HostFlags{&ends}) != 0) return ends.busy();
      entered_ = true;
    }
    while (step_ < g_.barriers) {
      const HostFlags f{&ends};
      if (!stored_) store(f);
      const auto now = std::chrono::steady_clock::now();
      if (!deadline_) deadline_ = now + timeout_;
      const bool past_deadline = now >= *deadline_;
      size_t kept = 0;
      bool ended = false;
      for (size_t k = 0; k < waits_.size(); ++k) {
        uint32_t seen = 0;
        switch (flag_poll(g_, blocks_[k], step_, waits_[k].peer, past_deadline, f, &seen)) {
          case FlagPoll::kPassed:
            continue;
          case FlagPoll::kForeign:
            leave(f);
            ends.foreign(waits_[k].peer, seen);
            return true;  // not reached: foreign throws
          case FlagPoll::kTimedOut: {
            // Those not yet polled, and those kept: every flag still unset.
            std::vector<SignalWait> unset(waits_.begin(), waits_.begin() + kept);
            unset.insert(unset.end(), waits_.begin() + k, waits_.end());
            leave(f);
            ends.timed_out(unset);
            return true;  // not reached: timed_out throws
          }
          case FlagPoll::kEnded:
            ended = true;
            break;
          case FlagPoll::kWaiting:
          case FlagPoll::kPeerFailed:  // HostFlags: GraphEnds::check raised it
            break;
        }
        waits_[kept] = waits_[k];
        blocks_[kept] = blocks_[k];
        ++kept;
      }
      waits_.resize(kept);
      blocks_.resize(kept);
      if (ended) return leave(f);
      if (!waits_.empty()) return false;
      if (body_ && *body_) {
        for (int b = 0; b < g_.blocks; ++b) (*body_)(step_, b);
      }
      ++step_;
      stored_ = false;
    }
    return leave(HostFlags{&ends});
  }
  // The flags the current barrier still waits for.
  const std::vector<SignalWait>& waits() const { return waits_; }

 private:
  // The kernel's end, however it ends: the busy word back where the run gives it back.
  bool leave(const HostFlags& f) {
    if (entered_ && !left_) graph_release(g_, f);
    left_ = true;
    return true;
  }
  void store(const HostFlags& f) {
    waits_.clear();
    blocks_.clear();
    for (int b = 0; b < g_.blocks; ++b) {
      flag_open(g_, b, step_, 0, 1, f);
      for (int q = 0; q < g_.world_size; ++q) {
        if (q == g_.rank) continue;
        flag_arrive(g_, b, step_, q, f);
        waits_.push_back(SignalWait{g_.mine(b, step_, q), 1, q});  // set: a tag is >= 1
        blocks_.push_back(b);
      }
    }
    stored_ = true;
    deadline_.reset();
  }

  GraphLaunch g_;
  std::shared_ptr<const std::function<void(int, int)>> body_;
  Millis timeout_;
  int step_ = 0;
  bool stored_ = false;
  bool entered_ = false, left_ = false;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  std::vector<SignalWait> waits_;  // the flags still unset, and their blocks
  std::vector<int> blocks_;
};

// NOTE [Host capture]
// The host device's stand-in for CUDA graph capture, so that CI runs what a replayed graph runs
// (NOTE [Replay-safe signals] in p2p_workspace/symmetric_workspace.cpp). Between begin_capture
// and end_capture, work enqueued on the captured stream - and on every stream that waits for an
// event recorded in the capture, which joins it, as on CUDA - is recorded instead of run:
// each task as it was built, with the values and addresses it was given then. A replay
// enqueues the recorded tasks again, in the recorded order, each on its own stream; a recorded
// wait for a captured event becomes a wait for the same position of that stream's replayed
// tasks. Like a CUDA graph, a replay is ordered after the work already queued on those streams,
// and a capture may not depend on work outside it (waiting for an outside event raises) nor
// synchronize a captured stream. The inline stream cannot be captured: its work runs at once.

class HostGraphImpl : public HostGraph {
 public:
  HostGraphImpl(std::vector<CaptureEntry> entries, std::set<std::shared_ptr<HostStream>> keep)
      : entries_(std::move(entries)), keep_(std::move(keep)) {}
  void replay() override {
    std::map<HostStream*, uint64_t> base;
    for (const auto& s : keep_) base[s.get()] = s->enqueued();
    for (const auto& e : entries_) {
      e.stream->enqueue(
          e.is_wait ? event_wait(*e.stream, e.other->shared_from_this(), base[e.other] + e.seq)
                    : e.task);
    }
  }
  size_t tasks() const override { return entries_.size(); }

 private:
  std::vector<CaptureEntry> entries_;
  std::set<std::shared_ptr<HostStream>> keep_;  // every stream the capture recorded tasks of
};

}  // namespace

uint64_t HostDevice::capture_id(Stream& s) {
  if (!capturing_.load(std::memory_order_acquire)) return 0;
  auto& h = as_host(s);
  std::lock_guard<std::mutex> lock(capture_mu_);
  return capture_ && capture_->counts.count(&h) ? capture_->id : 0;
}

void HostDevice::begin_capture(const std::shared_ptr<Stream>& stream) {
  TORCH_CHECK(stream && own(*stream),
              "cuda_p2p begin_capture: needs a stream of this device made by new_stream (the "
              "inline stream runs its work at once and cannot be captured)");
  auto h = std::dynamic_pointer_cast<HostStream>(stream);
  std::lock_guard<std::mutex> lock(capture_mu_);
  TORCH_CHECK(!capture_,
              "cuda_p2p begin_capture: a capture is already in progress on this "
              "device (end it first)");
  capture_.emplace();
  capture_->id = ++captures_;
  capture_->counts[h.get()] = 0;
  capture_->keep.insert(h);
  capturing_.store(true, std::memory_order_release);
}

std::shared_ptr<HostGraph> HostDevice::end_capture() {
  std::lock_guard<std::mutex> lock(capture_mu_);
  TORCH_CHECK(capture_, "cuda_p2p end_capture: no capture is in progress on this device");
  auto graph =
      std::make_shared<HostGraphImpl>(std::move(capture_->entries), std::move(capture_->keep));
  capture_.reset();
  capturing_.store(false, std::memory_order_release);
  return graph;
}

void HostDevice::enqueue(Stream& s, HostTask task) {
  auto& h = as_host(s);
  if (capturing_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(capture_mu_);
    if (capture_ && capture_->counts.count(&h)) {
      capture_->entries.push_back(CaptureEntry{&h, std::move(task), nullptr, 0, false});
      ++capture_->counts[&h];
      return;
    }
  }
  h.enqueue(std::move(task));
}

void HostDevice::check_not_captured(HostStream& h, const char* what) {
  if (!capturing_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(capture_mu_);
  TORCH_CHECK(!capture_ || !capture_->counts.count(&h), "cuda_p2p ", what,
              ": the stream is being captured (NOTE [Host capture]): its work runs at replay");
}

void HostDevice::graph_kernel(Stream& s, const GraphLaunch& launch, GraphKernelBody body,
                              Millis timeout, std::string context) {
  if (cuda()) {
    check_healthy(context.c_str());
  } else {
    failure_.check(context.c_str());
  }
  auto& h = as_host(s);
  GraphRun run(launch,
               body.host
                   ? std::make_shared<const std::function<void(int, int)>>(std::move(body.host))
                   : nullptr,
               timeout);
  const GraphEnds ends = cuda() ? cuda_graph_ends(launch.tag, timeout, std::move(context))
                                : graph_ends(launch.tag, timeout, std::move(context));
  if (h.mode() == HostStream::Mode::kCooperative) {
    // `late` is shared by the copies a replay enqueues: they run one after another on the
    // stream, and only the one at its head fills or reads it (as in wait_counted).
    auto late = std::make_shared<std::vector<SignalWait>>();
    HostTask t = HostTask::when([run, ends, late]() mutable {
      if (run.advance(ends)) return true;
      *late = run.waits();
      return false;
    });
    t.late_waits = late;
    enqueue(s, std::move(t));
    return;
  }
  if (h.mode() == HostStream::Mode::kInline && cooperative_) {
    enqueue(s, HostTask::blocking([this, run, ends]() mutable {
              scheduler_->drive([&] { return run.advance(ends); });
            }));
    return;
  }
  enqueue(s, HostTask::blocking(
                 [run, ends,
                  oversubscribed = oversubscribed_.load(std::memory_order_relaxed)]() mutable {
                   while (!run.advance(ends)) {
                     if (poll_briefly(run.waits(), oversubscribed)) continue;
                     const auto until = std::chrono::steady_clock::now() + kMaxSleep;
                     for (const auto& w : run.waits()) {
                       if (!futex_sleep_until(w.addr, w.value, until)) break;
                     }
                   }
                 }));
}

GraphEnds HostDevice::graph_ends(uint32_t tag, Millis timeout, std::string context) {
  auto why = std::make_shared<const std::string>(std::move(context));
  GraphEnds e;
  e.check = [this, why] {
    failure_.check(why->c_str());
    return false;
  };
  e.timed_out = [this, why, timeout](const std::vector<SignalWait>& waits) {
    std::vector<int> missing;
    for (const auto& w : waits) {
      if (!arrived(w)) missing.push_back(w.peer);
    }
    const std::string what = *why + " timed out after " + std::to_string(timeout.count()) +
                             " ms: " + describe_ranks(missing) + " never arrived";
    failure_.fail(what);
    TORCH_CHECK(false, "cuda_p2p ", what);
  };
  e.foreign = [this, why, tag](int peer, uint32_t seen) {
    const std::string what = *why + ": " + foreign_tag(peer, seen, tag);
    failure_.fail(what);
    TORCH_CHECK(false, "cuda_p2p ", what);
  };
  e.busy = [this, why, tag]() -> bool {
    const std::string what = *why + ": " + graph_busy_text(tag, "graph");
    failure_.fail(what);
    TORCH_CHECK(false, "cuda_p2p ", what);
  };
  return e;
}

}  // namespace cuda_p2p::host
