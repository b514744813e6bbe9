#include "ops/round_policy.hpp"

#include <algorithm>
#include <bit>

namespace cuda_p2p::ops {

namespace {
size_t size_class(int64_t bytes) {
  return bytes <= 1 ? 0 : 63 - static_cast<size_t>(std::countl_zero(static_cast<uint64_t>(bytes)));
}
constexpr int kChunked = static_cast<int>(RoundSize::kChunked);
constexpr int kLarge = static_cast<int>(RoundSize::kLarge);
}  // namespace

const char* to_string(RoundSize r) { return r == RoundSize::kLarge ? "large" : "chunked"; }

RoundSize RoundPolicy::choose(int64_t bytes, std::optional<RoundSize> running) const {
  const SizeClass& s = classes_[size_class(bytes)];
  if (s.last[kChunked] == 0) return RoundSize::kChunked;  // the default, measured first
  // The round size in use, and whether to try the other one now. A try already running is not
  // repeated: its time is not known yet.
  RoundSize in_use = RoundSize::kChunked;
  bool try_other = false;
  // Chunked rounds' time: the better of their last two ops (one slow op is noise).
  const double chunked =
      s.previous_chunked > 0 ? std::min(s.last[kChunked], s.previous_chunked) : s.last[kChunked];
  if (s.last[kLarge] == 0) {
    // Large rounds once, after kFirstTryAfter chunked ops: ranks that start in a placement where
    // large rounds win would otherwise never see chunked ones slow down.
    try_other = s.ops >= kFirstTryAfter;
  } else if (s.last[kLarge] < chunked) {
    // The placement that made chunked rounds slow may have ended: try them again now and then.
    in_use = RoundSize::kLarge;
    // Every 2, 4, ... kRetryAfter ops: at least one large op after the last chunked one.
    const uint64_t retry = std::min<uint64_t>(kRetryAfter, uint64_t{2} << s.confirmed);
    try_other = s.ops - s.at[kChunked] >= retry;
  } else {
    // Chunked rounds are faster: large ones are tried again after kRetryLost ops, or after
    // kRetryAfter once chunked ones have slowed down.
    const uint64_t since_large = s.ops - s.at[kLarge];
    const bool slowed_down = chunked > kSlowedDown * s.best_chunked;
    try_other = since_large >= kRetryLost || (slowed_down && since_large >= kRetryAfter);
  }
  const RoundSize other = in_use == RoundSize::kChunked ? RoundSize::kLarge : RoundSize::kChunked;
  return try_other && running != other ? other : in_use;
}

RoundSize RoundPolicy::agreed(int64_t bytes) const { return classes_[size_class(bytes)].agreed; }

void RoundPolicy::agree(int64_t bytes, RoundSize next) {
  classes_[size_class(bytes)].agreed = next;
}

void RoundPolicy::record(int64_t bytes, RoundSize rounds, double seconds) {
  if (bytes <= 0 || !(seconds > 0)) return;
  SizeClass& s = classes_[size_class(bytes)];
  const int i = static_cast<int>(rounds);
  const double ns_per_byte = seconds * 1e9 / static_cast<double>(bytes);
  if (rounds == RoundSize::kChunked) s.previous_chunked = s.last[i];
  s.last[i] = ns_per_byte;
  s.at[i] = s.ops;
  if (rounds == RoundSize::kChunked) {
    if (s.best_chunked == 0 || ns_per_byte < s.best_chunked) s.best_chunked = ns_per_byte;
    // A try: a chunked op right after a large one. It confirms large rounds when slower.
    const bool after_large = s.last[kLarge] > 0 && s.at[kLarge] + 1 == s.ops;
    const bool large_faster = s.last[kLarge] > 0 && s.last[kLarge] < ns_per_byte;
    s.confirmed = after_large && large_faster ? std::min(s.confirmed + 1, 4) : 0;
  }
  ++s.ops;
}

}  // namespace cuda_p2p::ops
