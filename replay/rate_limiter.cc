#include "replay/rate_limiter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::replay {

absl::Status RateLimiter::Validate(const config::RateLimiterConfig& config, const std::string& table) {
  const std::string where = absl::StrCat("table '", table, "' rate_limiter: ");
  if (config.min_size_to_sample() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "min_size_to_sample is ", config.min_size_to_sample(), ", must be >= 1"));
  }
  if (config.samples_per_insert() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "samples_per_insert is ", config.samples_per_insert(), ", must be >= 0"));
  }
  if (config.samples_per_insert() > 0 && config.error_buffer() < std::max(1.0, config.samples_per_insert())) {
    return absl::InvalidArgumentError(absl::StrCat(where, "error_buffer ", config.error_buffer(),
                                                   " must be >= max(1, samples_per_insert = ",
                                                   config.samples_per_insert(), ") or nothing could ever proceed"));
  }
  if (config.insert_timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, "insert_timeout_ms must be >= 0"));
  }
  return absl::OkStatus();
}

RateLimiter::RateLimiter(const config::RateLimiterConfig& config)
    : min_size_(config.min_size_to_sample()),
      spi_(config.samples_per_insert()),
      min_diff_(spi_ * min_size_ - config.error_buffer()),
      max_diff_(spi_ * min_size_ + config.error_buffer()) {}

bool RateLimiter::CanInsert() const {
  // Filling up to min size is always allowed; without a ratio, always.
  if (spi_ <= 0 || size() + 1 <= min_size_) return true;
  return static_cast<double>(inserts_ + 1) * spi_ - static_cast<double>(samples_) <= max_diff_;
}

bool RateLimiter::CanSample() const {
  if (size() < min_size_) return false;
  if (spi_ <= 0) return true;
  return static_cast<double>(inserts_) * spi_ - static_cast<double>(samples_ + 1) >= min_diff_;
}

void RateLimiter::SetCounters(int64_t inserts, int64_t samples, int64_t deletes) {
  inserts_ = inserts;
  samples_ = samples;
  deletes_ = deletes;
}

}  // namespace troupe::replay
