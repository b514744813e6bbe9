#include "p2p_workspace/host/core_probe.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "p2p_workspace/host/futex_wait.hpp"  // CUDA_P2P_CPU_RELAX

// NOTE [Core placement]
// A virtual machine's vCPUs run on whatever cores the host gives them, and the host moves them for
// seconds at a time. While two vCPUs sit in different core complexes (no shared L3) this probe's
// round trip is several times its usual value, and so is a hand-over of data between them. Every
// cross-rank transfer of the host path moves lines the other rank just wrote, so in that
// placement the host collectives slow down by as much while a local copy does not (the figures
// on this project's CI machines: docs/measurements/windows-cores-placement-2026-11-26.md). Nothing
// inside the guest can choose the placement; the bench samples it through a run and marks every
// cell with what it was while the cell ran (bench/README.md); the two-shot all-reduce adapts its
// rounds to it by timing (NOTE [Rounds chosen by rank 0] in ops/all_reduce.cpp).

namespace cuda_p2p::host {
namespace {

// Batches a probe times at the least (kMinRoundTripBatches), past its duration if need be: a
// thread that starts late (or is preempted) would otherwise leave one slow batch as the whole
// answer.
constexpr size_t kMinBatches = kMinRoundTripBatches;

void pin_to(std::thread& t, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int err = pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
  if (err != 0) {
    throw std::invalid_argument("core_round_trip: cannot run a thread on CPU " +
                                std::to_string(cpu) + " (pthread_setaffinity_np: error " +
                                std::to_string(err) + "); expected a CPU this process may use");
  }
}

// Spins on PAUSE for the first kSpinPolls polls of a wait, then yields the core at every poll
// (NOTE [Host waits on shared cores] in futex_wait.cpp): the other thread may share its CPU with a
// rank. Counted, not timed: a clock read per poll would add to the round trip it measures.
constexpr int kSpinPolls = 1024;
struct BackOff {
  int polls = 0;
  // Returns true once past the spinning polls (the caller then checks its deadline).
  bool operator()() {
    if (polls < kSpinPolls) {
      ++polls;
      CUDA_P2P_CPU_RELAX();
      return false;
    }
    std::this_thread::yield();
    return true;
  }
};

}  // namespace

CoreRoundTrip core_round_trip(int cpu_a, int cpu_b, std::chrono::microseconds duration) {
  const int ncpu = CPU_SETSIZE;
  if (cpu_a < 0 || cpu_b < 0 || cpu_a >= ncpu || cpu_b >= ncpu || cpu_a == cpu_b) {
    throw std::invalid_argument("core_round_trip: expected two different CPUs in [0, " +
                                std::to_string(ncpu) + "), got " + std::to_string(cpu_a) + " and " +
                                std::to_string(cpu_b));
  }
  if (duration.count() <= 0 || duration > std::chrono::seconds(1)) {
    throw std::invalid_argument("core_round_trip: expected a duration in (0, 1 s], got " +
                                std::to_string(duration.count()) + " us");
  }
  // The line bounced: odd values are pings, the next even value the pong. Its own cache line.
  alignas(64) std::atomic<int64_t> line{0};
  // 0: the threads wait to be pinned; 1: go; 2: cancelled (a CPU refused) or done.
  alignas(64) std::atomic<int> state{0};
  std::vector<double> batch_ns;
  bool busy = false;
  auto wait_for_go = [&state] {
    while (state.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    return state.load(std::memory_order_acquire) == 1;
  };

  std::thread pong([&] {
    if (!wait_for_go()) return;
    BackOff back_off;
    while (state.load(std::memory_order_relaxed) == 1) {
      const int64_t v = line.load(std::memory_order_acquire);
      if (v & 1) {
        line.store(v + 1, std::memory_order_release);
        back_off = BackOff{};
      } else {
        back_off();
      }
    }
  });
  std::thread ping;
  auto ping_body = [&] {
    if (!wait_for_go()) return;
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto give_up = start + duration + std::chrono::seconds(1);
    int64_t seq = 1;
    while (true) {
      const auto t0 = clock::now();
      if (t0 - start >= duration && batch_ns.size() >= kMinBatches) break;
      if (t0 > give_up) {  // a CPU was busy: report what completed, flagged
        busy = true;
        break;
      }
      bool answered = true;
      for (int i = 0; i < kRoundTripBatch && answered; ++i, seq += 2) {
        line.store(seq, std::memory_order_release);
        BackOff back_off;
        while (line.load(std::memory_order_acquire) != seq + 1) {
          if (back_off() && clock::now() > give_up) {
            answered = false;
            break;
          }
        }
      }
      if (answered) {
        batch_ns.push_back(std::chrono::duration<double, std::nano>(clock::now() - t0).count() /
                           kRoundTripBatch);
      }
    }
  };
  try {
    ping = std::thread(ping_body);
    pin_to(pong, cpu_b);
    pin_to(ping, cpu_a);
  } catch (...) {  // a CPU refused, or no thread: both threads return without probing
    state.store(2, std::memory_order_release);
    if (ping.joinable()) ping.join();
    pong.join();
    throw;
  }
  state.store(1, std::memory_order_release);
  ping.join();
  state.store(2, std::memory_order_release);
  pong.join();
  if (batch_ns.empty()) return CoreRoundTrip{0, 0, 0, true};
  std::sort(batch_ns.begin(), batch_ns.end());
  return CoreRoundTrip{batch_ns.front(), batch_ns[batch_ns.size() / 2],
                       static_cast<int64_t>(batch_ns.size()), busy};
}

}  // namespace cuda_p2p::host
