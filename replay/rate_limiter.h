// Keeps actors and learner from running away from each other (Reverb's
// SampleToInsertRatio):
//   - no sample until the table holds `min_size_to_sample` items;
//   - with samples_per_insert (spi) > 0, inserts * spi - samples stays in
//     [min_diff, max_diff] = spi * min_size -/+ error_buffer: an insert that
//     would pass max_diff waits for samples, a sample that would go under
//     min_diff waits for inserts. Inserts are always allowed while the
//     table is below min_size (so it can fill).
//
// The limiter is pure bookkeeping; the Table waits on its conditions under
// the table mutex (absl::Mutex::AwaitWithTimeout), so blocking, release and
// timeouts live in Table. Locking: none inside; the Table's mutex guards it.
#ifndef TROUPE_REPLAY_RATE_LIMITER_H_
#define TROUPE_REPLAY_RATE_LIMITER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace troupe::replay {

class RateLimiter {
 public:
  // InvalidArgument naming `table` when min_size_to_sample < 1, spi < 0, or
  // spi > 0 and error_buffer < max(1, spi) (one insert or sample must fit).
  static absl::Status Validate(const config::RateLimiterConfig& config, const std::string& table);

  explicit RateLimiter(const config::RateLimiterConfig& config);

  // True if one more insert may proceed now.
  bool CanInsert() const;
  // True if one more sample may proceed now.
  bool CanSample() const;

  void OnInsert() { ++inserts_; }
  void OnSample() { ++samples_; }
  void OnDelete() { ++deletes_; }

  // Restores counters (checkpoint).
  void SetCounters(int64_t inserts, int64_t samples, int64_t deletes);

  int64_t inserts() const { return inserts_; }
  int64_t samples() const { return samples_; }
  int64_t deletes() const { return deletes_; }
  int64_t size() const { return inserts_ - deletes_; }
  int64_t min_size_to_sample() const { return min_size_; }
  double samples_per_insert() const { return spi_; }
  double min_diff() const { return min_diff_; }
  double max_diff() const { return max_diff_; }

 private:
  int64_t min_size_;
  double spi_;
  double min_diff_;
  double max_diff_;
  int64_t inserts_ = 0;
  int64_t samples_ = 0;
  int64_t deletes_ = 0;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_RATE_LIMITER_H_
