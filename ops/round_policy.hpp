// How rank 0 sizes the rounds of a large two-shot all-reduce on a host workspace (NOTE [Rounds
// chosen by rank 0] in ops/all_reduce.cpp): rounds of chunk_bytes, or the largest rounds the
// buffer holds, from the times of its recent ops of the same size class; and what every rank
// holds of rank 0's choice for the next op of each size class.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace cuda_p2p::ops {

enum class RoundSize : uint8_t { kChunked, kLarge };
const char* to_string(RoundSize r);  // "chunked", "large"

class RoundPolicy {
 public:
  // Rank 0: the rounds for the next op of `bytes` bytes. `running`: the rounds of an op of the
  // size class that is running and not recorded yet (the choice is made one op ahead), if any;
  // a try of the round size not in use is then never chosen twice in a row.
  RoundSize choose(int64_t bytes, std::optional<RoundSize> running = std::nullopt) const;
  // Rank 0: what an op of `bytes` bytes run with `rounds` took on this rank, from start to end.
  void record(int64_t bytes, RoundSize rounds, double seconds);

  // Every rank: the rounds the next op of `bytes` bytes runs in - what rank 0 chose for it
  // during the last op of its size class, chunked until then - and setting it from rank 0's word.
  RoundSize agreed(int64_t bytes) const;
  void agree(int64_t bytes, RoundSize next);

  // Chunked rounds count as slowed down when their last two ops took over this factor of their
  // best time (per byte); it lies between the spread of ordinary ops and the slowdown of the slow
  // placement (NOTE [Core placement] in p2p_workspace/host/core_probe.cpp;
  // docs/measurements/windows-cores-placement-2026-11-26.md).
  static constexpr double kSlowedDown = 2.5;
  // Ops of a size class between two tries of the round size not in use. Large rounds are first
  // tried after kFirstTryAfter chunked ops; once they lost, again after kRetryLost ops, or after
  // kRetryAfter if chunked ones have slowed down meanwhile. While large rounds win, chunked ones
  // are tried again 2 ops after the last chunked op (one large op between), then 4, 8, ... up to
  // kRetryAfter as each try finds large rounds still faster: two slow ops in a row in an ordinary
  // placement cost one op in large rounds, a slow placement lasting seconds a chunked op every
  // kRetryAfter, and an ordinary placement a large op every kRetryLost.
  static constexpr uint64_t kFirstTryAfter = 2;
  static constexpr uint64_t kRetryLost = 128;
  static constexpr uint64_t kRetryAfter = 32;

 private:
  struct SizeClass {
    double last[2] = {0, 0};      // ns per byte of the latest op with each round size; 0: none yet
    uint64_t at[2] = {0, 0};      // the op count when each was measured
    double previous_chunked = 0;  // ns per byte of the chunked op before the latest
    double best_chunked = 0;      // the fastest chunked op so far
    uint64_t ops = 0;             // ops recorded
    int confirmed = 0;  // chunked tries (each right after a large op) in a row that found large
                        // rounds faster (up to 4)
    RoundSize agreed = RoundSize::kChunked;  // every rank: rank 0's choice for the next op
  };
  std::array<SizeClass, 64> classes_{};  // by floor(log2(bytes))
};

}  // namespace cuda_p2p::ops
