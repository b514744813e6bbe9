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

RoundSize RoundPolicy::choose(int64_t bytes) const {
  const SizeClass& s = classes_[size_class(bytes)];
  if (s.last[kChunked] == 0) return RoundSize::kChunked;  // the default, measured first
  if (s.last[kLarge] == 0) {
    // Large rounds once, after kFirstTryAfter chunked ops: ranks that start in a placement where
    // large rounds win would otherwise never see chunked ones slow down.
    return s.ops >= kFirstTryAfter ? RoundSize::kLarge : RoundSize::kChunked;
  }
  if (s.last[kLarge] < s.last[kChunked]) {
    // The placement that made chunked rounds slow may have ended: try them again now and then.
    const uint64_t retry = std::min<uint64_t>(kRetryAfter, uint64_t{1} << s.confirmed);
    return s.ops - s.at[kChunked] >= retry ? RoundSize::kChunked : RoundSize::kLarge;
  }
  // Chunked rounds are faster: large ones are tried again after kRetryLost ops, or after
  // kRetryAfter once chunked ones have slowed down.
  const uint64_t since_large = s.ops - s.at[kLarge];
  const bool slowed_down = s.last[kChunked] > kSlowedDown * s.best_chunked;
  if (since_large >= kRetryLost || (slowed_down && since_large >= kRetryAfter)) {
    return RoundSize::kLarge;
  }
  return RoundSize::kChunked;
}

void RoundPolicy::record(int64_t bytes, RoundSize rounds, double seconds) {
  if (bytes <= 0 || !(seconds > 0)) return;
  SizeClass& s = classes_[size_class(bytes)];
  const int i = static_cast<int>(rounds);
  const double ns_per_byte = seconds * 1e9 / static_cast<double>(bytes);
  s.last[i] = ns_per_byte;
  s.at[i] = s.ops;
  if (rounds == RoundSize::kChunked) {
    if (s.best_chunked == 0 || ns_per_byte < s.best_chunked) s.best_chunked = ns_per_byte;
    const bool large_faster = s.last[kLarge] > 0 && s.last[kLarge] < ns_per_byte;
    s.confirmed = large_faster ? std::min(s.confirmed + 1, 5) : 0;
  }
  ++s.ops;
}

}  // namespace cuda_p2p::ops
