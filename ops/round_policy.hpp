// How rank 0 sizes the rounds of a large two-shot all-reduce on a host workspace (NOTE [Rounds
// chosen by rank 0] in ops/all_reduce.cpp): rounds of chunk_bytes, or the largest rounds the
// buffer holds, from the times of its recent ops of the same size class.
#pragma once

#include <array>
#include <cstdint>

namespace cuda_p2p::ops {

enum class RoundSize : uint8_t { kChunked, kLarge };

class RoundPolicy {
 public:
  // The rounds for the next op of `bytes` bytes.
  RoundSize choose(int64_t bytes) const;
  // What an op of `bytes` bytes run with `rounds` took on this rank, from start to end.
  void record(int64_t bytes, RoundSize rounds, double seconds);

  // Chunked rounds count as slowed down past this factor of their best time (per byte); the slow
  // placement of docs/collectives.md ("The windows are the cores' placement") is 5-6x, the
  // spread of ordinary ops about 1.5x.
  static constexpr double kSlowedDown = 2.5;
  // Ops of a size class between two tries of the round size not in use. Large rounds are first
  // tried after kFirstTryAfter chunked ops; once they lost, again after kRetryLost ops, or after
  // kRetryAfter if chunked ones have slowed down meanwhile. While large rounds win, chunked ones
  // are tried 1 op after the last chunked op, then 2, 4, ... up to kRetryAfter as each try finds
  // large rounds still faster: one slow op in an ordinary placement costs one op in large
  // rounds, a slow placement lasting seconds a chunked op every kRetryAfter, and an ordinary
  // placement a large op every kRetryLost.
  static constexpr uint64_t kFirstTryAfter = 2;
  static constexpr uint64_t kRetryLost = 128;
  static constexpr uint64_t kRetryAfter = 32;

 private:
  struct SizeClass {
    double last[2] = {0, 0};  // ns per byte of the latest op with each round size; 0: none yet
    uint64_t at[2] = {0, 0};  // the op count when each was measured
    double best_chunked = 0;  // the fastest chunked op so far
    uint64_t ops = 0;         // ops recorded
    int confirmed = 0;        // chunked tries in a row that found large rounds faster (up to 5)
  };
  std::array<SizeClass, 64> classes_{};  // by floor(log2(bytes))
};

}  // namespace cuda_p2p::ops
