#include "ops/failure_record.hpp"

#include <c10/util/Exception.h>

namespace cuda_p2p::ops {

void FailureRecord::mark(const char* what, const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  std::string first;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) first = failure_ = std::string(what) + ": " + text;
    failed_.store(true, std::memory_order_release);
  }
  if (!first.empty() && on_first_) on_first_(first);
}

void FailureRecord::raise(const char* what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(failure_.empty(), "cuda_p2p ", what,
              ": refused: an earlier workspace op of this group failed midway, so its ranks may "
              "no longer agree on the workspace's state; recreate the group (destroy it and "
              "create a new one). The failure was: ",
              failure_);
}

std::string FailureRecord::first() const {
  if (!failed_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void check_or_reject(const FailureRecord& failure, bool tell_peers,
                     c10::function_ref<void()> checks,
                     c10::function_ref<void(const std::string&)> reject) {
  try {
    checks();
  } catch (const c10::Error& e) {
    if (tell_peers && failure.first().empty()) {
      try {
        reject(e.what_without_backtrace());
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the own error wins
      }
    }
    throw;
  }
}

}  // namespace cuda_p2p::ops
