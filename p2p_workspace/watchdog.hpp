// How a device fails and how a failure reaches the host: the sticky failure state every device
// keeps, and the watchdog that enforces wait deadlines where the host does not run the waits
// itself (CUDA). Device-independent, so that the host tests exercise it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

// NOTE [Device failure]
// How a device fails:
//  - abort() (ProcessGroupCudaP2P::abort(), from any thread, possibly while another thread is
//    blocked in a wait); retire() (shutdown(), after draining: NOTE [Shutdown flushes] in
//    backend/ProcessGroupCudaP2P.cpp); a signal wait that missed its deadline.
// What holds after:
//  - the first failure is kept and is sticky: every later op, wait, Work.wait() and synchronize()
//    raises it, except the Works of ops that ran to their end before a retire() that drained;
//  - nothing un-fails a device: the group must be recreated (after a missed deadline the ranks
//    no longer agree on the signal counts anyway).
// Who sees it:
//  - host: every wait runs in a host thread and checks the failure on every pass (at least every
//    10 ms): a rank blocked in a collective returns promptly after abort();
//  - CUDA: the waits run on GPU streams (cuStreamWaitValue32, or the wait kernel), which the host
//    cannot cancel. A Watchdog thread per device (one per group: no process-wide state) observes
//    each wait through events recorded before and after it, and records the failure when a
//    stream has been at a wait longer than its timeout, naming the op and the missing ranks;
//  - CUDA, the wait kernel (where stream memory operations are missing) gives up at its own
//    deadline and flags the peers it gave up on in host-mapped memory; the watchdog turns the
//    flag into the failure, so the stale data the stream then computes on is never returned
//    silently (Work.wait(), synchronize, the next op raise);
//  - a stream blocked at a wait is released (NOTE [Releasing blocked waits]); the watchdog says
//    the failure once on stderr, for a process whose next CUDA call is not one of cuda_p2p's.
//
// NOTE [Releasing blocked waits]
// Why: a GPU stream blocked in cuStreamWaitValue32 (or the wait kernel) cannot be cancelled, and
// the fused ops' handshake waits on the caller's stream, usually the user's compute stream: left
// alone, every later kernel, NCCL op, .item(), torch.cuda.synchronize() and the frees of
// destroy_process_group would hang behind it.
// How: every wait polls a word of the waiter's own pad (NOTE [Signal pad layout]), so whoever
// fails the device also releases every wait its stream has not passed: WatchedWait::release()
// writes a value into each polled word from a stream that is not blocked (CUDA: the device's
// auxiliary stream). The streams run on - on stale data, which no cuda_p2p call returns, since
// the failure is sticky - drain, and the process can raise, tear the group down (NOTE [Teardown
// drains]) and create a new one on the same GPU.
// Guarantees:
//  - every wait tracked before the streams drained is released, whenever it was tracked: the
//    failure is recorded before the waits are collected, and a wait tracked after it releases
//    everything pending itself;
//  - a word is written the highest value any pending wait polls it for (signal_reached's order:
//    the sequence numbers on one word are close together), never less than it was released with
//    before (Watchdog::released_), so that waits of one word on different streams all pass,
//    whatever order the streams reach them in;
//  - until every released wait has passed, the watchdog writes their words again every
//    max_poll: a peer that is slow, not dead, may still write a word back to an older value.
//
// NOTE [Counted waits end with the failure]
// Why: a counted wait (a replayed graph's: NOTE [Replay-safe signals]) runs where no watchdog can
// follow it (the graph's events are not ours) and gives up by itself at its deadline. Alone,
// each wait of a replay would wait its whole timeout for a rank that never replays (hours for a
// decode graph), and abort() could not shorten it.
// How: each polls, besides its own word, the device's give-up count, a copy of the device's
// failure (FailureState::mirror_to, written by the CPU through no stream) and the rank's failure
// word (NOTE [Failure words]); it ends at once when any is set. The first give-up thereby ends
// every later wait of the replay; the watchdog, polling the give-up count from the first counted
// wait on (Watchdog::arm), turns it into the device's failure within max_poll and publishes it to
// the peers, whose counted waits then end too.
// Who learns what (NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp):
//  - a wait that reaches its deadline traps after its record (as PyTorch's symmetric memory does
//    on a timed-out barrier): nobody else knows, torch's next synchronize raises, and the CUDA
//    context is lost;
//  - one that a peer's failure word ends returns quietly: every check and the watchdog turn the
//    word into this device's failure, and the next cuda_p2p call or cuda_p2p.check(group)
//    raises (trapping instead where the group asked for it);
//  - one that this device's own failure or give-up ends returns quietly: its host knows.
//  - the host device with CUDA's semantics models a trap as a lost context it records before it
//    raises the wait's error into its stream.
//
// NOTE [Failure words]
// Why: a released stream runs on through what its host queued ahead (NOTE [Releasing blocked
// waits]); its copies and signals land in the peers' pads and buffers, where a healthy peer's
// wait would take them for its op's and return a wrong result with no error. So before a rank
// releases anything it tells every peer, through a word in the peer's memory written from the
// CPU.
// Layout:
//  - each rank has a failure area, one page of host shared memory (a memfd, shared_block.cpp)
//    that every peer maps (SymmetricWorkspace makes and exchanges it at its first rendezvous;
//    made once per workspace, kept across growth, alive while any rank maps it);
//  - word 0 is the rank's failure word: 0 while no peer failed, else 1 + the rank whose failure
//    reached it first; beside it each peer has a slot for its reason (kReasonBytes from
//    kReasonOffset, the text written before a ready word, both before the failure word), so
//    that every rank's error says why the first one failed, not only who;
//  - host memory because a CPU reaches a GPU's pads only through a stream, which may queue behind
//    the very wait being released (a shared hardware queue: CUDA_DEVICE_MAX_CONNECTIONS, MPS);
//    the owner's GPU reads the word through a mapping (cudaHostRegister with
//    cudaHostRegisterMapped, as NCCL's shared-memory transport maps shared memory).
// Writers:
//  - a failing rank writes every peer's word (compare-and-swap from 0: the first origin stays;
//    FailureState::publish) before it releases its own waits (FailureState::fail publishes;
//    Watchdog releases only after publish()); a rank that learns of a peer's failure records it
//    as its own, naming that origin, and publishes it on;
//  - a retire() that drained publishes nothing: its ops ran to their end.
// Readers:
//  - every host wait, on every pass (FailureState::check), and check_healthy / check_work: the
//    peer published before its released stream wrote anything, so a rank whose stream consumed
//    a stale signal finds the word set when it looks after the stream ran;
//  - the wait kernels, eager and counted, and the flag barriers, which end at once and quietly
//    (NOTE [Who traps]);
//  - the watchdog on every scan: a stream memory operation waits for one word and cannot watch a
//    second, so the watchdog fails the device and releases it.
class FailureState {
 public:
  // NOTE [Failure words]: the layout of a failure area (word 0 at its start).
  static constexpr size_t kReasonOffset = 64;
  static constexpr size_t kReasonBytes = 256;  // a ready word, then NUL-terminated text
  static size_t area_bytes(int world_size) {
    return (kReasonOffset + kReasonBytes * static_cast<size_t>(world_size) + 4095) / 4096 * 4096;
  }

  // Records `why` unless a failure was recorded already; returns whether this call recorded it.
  // `work_done`: every op enqueued before had run to its end normally (a shutdown that drained,
  // NOTE [Shutdown flushes] in backend/ProcessGroupCudaP2P.cpp), so their Works stay successful
  // (check_work) while every later op raises; nothing is published then. Otherwise the failure
  // is published to the peers (NOTE [Failure words]) before this returns. `origin`: the rank
  // whose failure this is (-1: this rank's own).
  bool fail(const std::string& why, bool work_done = false, int origin = -1);
  // Some op's wait was released after all (or enqueued after the failure): its Work must raise.
  void taint() { work_done_.store(false, std::memory_order_release); }
  // Also stores 1 into `word` (host memory device-side waits poll: NOTE [Counted waits end with
  // the failure]) when the failure is recorded. Set once, before the device's first wait.
  void mirror_to(uint32_t* word) { mirror_ = word; }

  // NOTE [Failure words]: this rank's word (the start of its own area) and each peer's (by rank;
  // null for this rank). Set once, before the device's first op; a later call is ignored (a
  // group's second workspace, its symmetric heap, shares its device and ranks).
  void set_words(int rank, const uint32_t* own, std::vector<uint32_t*> peers);
  // The ranks in `ranks` are gone for good (a shrink excluded them: NOTE [Shrinking past dead
  // ranks] in backend/child_groups.cpp): nothing is written to their words after this returns,
  // so that their areas may be unmapped. Ranks outside the group, or before set_words, are ignored.
  void forget_peers(const std::vector<int>& ranks);
  bool has_words() const { return has_words_.load(std::memory_order_acquire); }
  // The rank whose failure reached this rank's word (-1: none did).
  int peer_failure() const;
  // Records the failure a peer's word brought (fail, naming its origin) unless this device
  // failed already; returns whether it did.
  bool adopt_peer_failure();
  // Writes this device's failure into every peer's word, once (a no-op while healthy): before
  // any release of a wait (Watchdog::release_pending), whatever the failure.
  void publish();

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string reason() const;
  // Raises "cuda_p2p <op>: <reason>" once failed, or once a peer's failure reached this rank's
  // word, which it records first (the test inline: on every op's and every host wait's path).
  void check(const char* op) {
    if (!failed() && has_words() && peer_word_set()) adopt_peer_failure();
    if (failed()) raise(op);
  }
  // For the Work of an op enqueued before the failure: raises unless the failure came after
  // every such op had run normally (a peer's failure reaching a device that retired after a
  // drain changes nothing: its ops had ended).
  void check_work(const char* op) {
    if (!failed() && has_words() && peer_word_set()) adopt_peer_failure();
    if (failed() && !work_done_.load(std::memory_order_acquire)) raise(op);
  }

 private:
  [[noreturn]] void raise(const char* op) const;
  // fail(), telling the peers `told` instead of `why`.
  bool fail_telling(const std::string& why, const std::string& told, bool work_done, int origin);
  bool peer_word_set() const {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(own_word_))
               .load(std::memory_order_acquire) != 0;
  }
  std::atomic<bool> failed_{false};
  std::atomic<bool> work_done_{false};
  uint32_t* mirror_ = nullptr;
  mutable std::mutex mu_;
  std::string reason_;
  int origin_ = -1;   // the rank whose failure this is (mu_)
  std::string told_;  // what publish() tells the peers: the first failure's own reason (mu_)
  // NOTE [Failure words]: written once by set_words before has_words_ is set.
  std::atomic<bool> has_words_{false};
  int rank_ = -1;
  const uint32_t* own_word_ = nullptr;
  std::vector<uint32_t*> peer_words_;
  std::mutex publish_mu_;
  bool published_ = false;  // publish_mu_
};

// What the watchdog observes of one wait a stream executes.
class WatchedWait {
 public:
  virtual ~WatchedWait() = default;
  // The stream has reached the wait (all its earlier work has run): the deadline starts.
  virtual bool started() = 0;
  // The stream has passed the wait.
  virtual bool finished() = 0;
  // Once finished(): the peers a wait kernel gave up on at its deadline (empty: every signal
  // arrived).
  virtual std::vector<int> given_up() = 0;
  // The peers whose signals have not arrived yet (asked once the deadline has passed).
  virtual std::vector<int> missing() = 0;
  // The words the wait polls and the values it waits for (NOTE [Releasing blocked waits]).
  virtual std::vector<SignalWait> awaited() const = 0;
  // Writes `value` into `word`, one of awaited()'s, from a stream that is not blocked, so that
  // the stream passes the wait (NOTE [Releasing blocked waits]). Called after the device failed,
  // possibly again for the same word, never concurrently with the other calls; must not throw.
  virtual void release(uint32_t* word, uint32_t value) = 0;
  // Identifies the stream the wait is on: the waits of one stream are reached, and finish, in the
  // order they were tracked, so only the oldest unfinished one can be at its deadline.
  virtual const void* stream() const = 0;
};

// "rank 3" / "ranks 1, 2" / "rank ?" (the words had all arrived by the time they were read).
std::string describe_ranks(const std::vector<int>& ranks);

// Why a kernel of a replayed graph (`what`: "CUDA graph", "graph") whose op has tag `tag` ran
// nothing: another captured op of the group held this rank's graph busy word (NOTE [One captured
// op at a time] in p2p_workspace/graph_flags.hpp).
std::string graph_busy_text(uint32_t tag, const char* what);

class Watchdog {
 public:
  // The default bound on how late a missed deadline is noticed (max_poll).
  static constexpr Millis kDefaultMaxPoll{100};
  // `thread_init` runs first in the watchdog's thread (CUDA: select the device, relax the
  // thread's graph-capture mode). `max_poll` bounds how late a missed deadline is noticed.
  // `report` is told the failure once, when the watchdog records it (default: a warning on
  // stderr): a process blocked outside cuda_p2p (torch.cuda.synchronize(), .item()) behind the
  // stuck stream would otherwise hang without a word, since only cuda_p2p's own calls raise it.
  Watchdog(FailureState& failure, std::function<void()> thread_init,
           Millis max_poll = kDefaultMaxPoll,
           std::function<void(const std::string&)> report = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `wait`: if the stream stays at it longer than `timeout` (from the first poll that
  // sees started()), or a kernel gave up on it, the device fails with an error naming `context`
  // and the missing ranks, and every pending wait is released. Once the device failed, `wait` is
  // released at once instead (NOTE [Releasing blocked waits]).
  void track(std::unique_ptr<WatchedWait> wait, Millis timeout, std::string context);
  // Waits not yet retired (after the failure: released waits whose streams have not passed them).
  size_t pending() const;
  // How long after a wait's deadline the watchdog may notice it (two scans): a host-side wait for
  // a stream gives the device's own deadlines that much longer, so that they, naming the ranks,
  // come first.
  Millis notice() const { return 2 * max_poll_; }
  // NOTE [Waits for a stream outlast the waits on it]: the latest deadline of the waits whose
  // streams have reached them (as the last scan saw) and not passed them yet; none while there
  // is no such wait.
  std::optional<std::chrono::steady_clock::time_point> pending_deadline();
  // One pass now, in the calling thread: after a stream was seen idle, so that a wait kernel's
  // give-up on that stream becomes the device's failure before the caller returns.
  void poll_now();
  // Fails the device with `why` (unless it failed already) and releases every pending wait (NOTE
  // [Releasing blocked waits]); the watchdog goes on releasing them until they have passed.
  // Thread-safe. `work_done` (a shutdown that drained): the ops enqueued so far have run, so their
  // Works stay successful, unless a wait was still pending after all (FailureState::taint).
  void fail(const std::string& why, bool work_done = false);
  // Stops the thread and drops every pending wait without releasing it (the destructor, once
  // the device's streams are drained).
  void stop();
  // A failure found in memory the device or its ops keep (the give-up count of counted waits:
  // NOTE [Counted waits end with the failure]; an op-signature record: NOTE [A disagreement
  // fails the device at once] in ops/op_signature.cpp): `probe` returns why the device failed,
  // or "". Every probe is asked on every scan, in the order added, never concurrently with
  // itself, until the device failed; a peer's failure word set when a probe answers comes first.
  // Thread-safe; must not throw.
  void add_probe(std::function<std::string()> probe);
  // A failure found in memory (a peer's failure word, the probe's) now, in the calling thread:
  // recorded, said once and released as a scan would (check_healthy, when a cheap look found
  // one).
  void check_memory_now();
  // From now on the watchdog scans every max_poll even while no wait is tracked (a replayed
  // graph's waits are not: NOTE [Counted waits end with the failure]), until the device fails.
  // Cheap when already armed: every counted wait calls it.
  void arm();

 private:
  struct Entry {
    std::unique_ptr<WatchedWait> wait;
    Millis timeout;
    std::string context;
    std::optional<std::chrono::steady_clock::time_point> started;
  };
  void loop();
  // Moves what track() queued into the per-stream FIFOs. Called with scan_mu_ held.
  void adopt();
  // One pass over the FIFOs' heads; returns whether any wait retired or started. Called with
  // scan_mu_ held (never in_mu_: it queries the device).
  bool poll();
  // NOTE [Releasing blocked waits]: releases every pending wait the stream has not passed, oldest
  // first per stream, each word at the highest value awaited, and retires those passed; returns
  // how many it released. Publishes the failure first (NOTE [Failure words]). scan_mu_ held.
  size_t release_pending();
  // A failure found without a wait at its deadline: a peer's failure word or the probe's (NOTE
  // [Failure words]). Records it, says it once, releases. scan_mu_ held; returns whether it did.
  bool check_memory();
  void report(const std::string& why, bool blocked);

  FailureState& failure_;
  std::function<void()> thread_init_;
  const Millis max_poll_;
  std::function<void(const std::string&)> report_;
  std::vector<std::function<std::string()>> probes_;  // scan_mu_
  std::atomic<bool> armed_{false};
  // Lock order: scan_mu_ before in_mu_. track() (every wait_signals) takes only in_mu_, for a
  // push: the scans, which query the device, never hold it.
  mutable std::mutex scan_mu_;
  std::list<std::pair<const void*, std::deque<Entry>>> fifos_;  // one per stream, in use order
  // NOTE [Releasing blocked waits]: the value each word was last released with. scan_mu_.
  std::map<const uint32_t*, uint32_t> released_;
  mutable std::mutex in_mu_;
  std::condition_variable cv_;
  std::vector<Entry> incoming_;
  size_t queued_ = 0;  // entries in fifos_ (read by pending() under in_mu_)
  bool stop_ = false;
  std::thread thread_;  // started by the first track()
};

}  // namespace cuda_p2p
