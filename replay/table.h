// A replay table: a ring of at most max_size items (the oldest is removed
// when full: a FIFO remover), a selector that picks samples, and a rate
// limiter that blocks inserts and samples.
//
// Keys: the n-th item ever inserted gets key n (0, 1, ...); present keys are
// always the contiguous range [first_key, next_key) because items leave only
// from the old end (eviction, or FIFO sampling), and key k lives in slot
// k % max_size. So a key names an item for the priority updates that the
// learner sends back, and no hash map is needed.
//
// Locking: one absl::Mutex guards everything; Insert and Sample wait on it
// with absl conditions (released while waiting). Items handed out by Sample
// are immutable and shared, so batches are built after the lock is dropped.
#ifndef TROUPE_REPLAY_TABLE_H_
#define TROUPE_REPLAY_TABLE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/replay.pb.h"
#include "replay/item.h"
#include "replay/rate_limiter.h"
#include "replay/selectors/interface.h"

namespace troupe::replay {

struct SampledItem {
  std::shared_ptr<const Item> item;
  double probability = 0;
};

// A table's contents as a checkpoint holds them, oldest first.
struct TableSnapshot {
  std::vector<std::shared_ptr<const Item>> items;
  std::vector<double> priorities;
  int64_t inserts = 0, samples = 0, deletes = 0;
  uint64_t next_key = 0;
};

// The largest max_size a table may have: its slots and selector are
// allocated up front (~kTableBytesPerSlot bytes a slot).
inline constexpr int64_t kMaxTableSize = int64_t{1} << 28;
inline constexpr int64_t kTableBytesPerSlot = 64;
// The largest dense field or pixel frame a table accepts, and frames per
// pixel field.
inline constexpr int64_t kMaxFieldBytes = int64_t{1} << 30;
inline constexpr int kMaxFieldFrames = 64;

// Checks a table's config without allocating anything: name, max_size (in
// [1, kMaxTableSize], and its slots within this machine's memory),
// selector, exponents, rate limiter, fields (names, dtypes, shapes within
// kMaxFieldBytes, frames). InvalidArgument whose message starts with
// `prefix` and the field: "replay.tables[0].max_size 0: must be in [1, ...]"
// for prefix "replay.tables[0].".
absl::Status ValidateTableConfig(const config::ReplayTableConfig& config, absl::string_view prefix);

class Table {
 public:
  // Checks the config (name, max_size >= 1, selector name, exponents, rate
  // limiter, signature); InvalidArgument saying which field is wrong.
  static absl::StatusOr<std::unique_ptr<Table>> Create(const config::ReplayTableConfig& config);

  const std::string& name() const { return config_.name(); }
  const config::ReplayTableConfig& config() const { return config_; }
  const Signature& signature() const { return signature_; }
  // True for prioritized selectors (importance weights apply).
  bool prioritized() const { return prioritized_; }

  // Inserts `item` (which must follow the signature; the caller checked)
  // with `priority` (finite, >= 0), removing the oldest item if full, and
  // sets item->key. Waits up to `timeout` while the rate limiter forbids
  // the insert (absl::InfiniteDuration() = forever, absl::ZeroDuration() =
  // do not wait). DeadlineExceeded if still blocked, Cancelled once Close()d;
  // on error nothing was inserted.
  absl::Status Insert(const std::shared_ptr<Item>& item, double priority, absl::Duration timeout);

  // Appends sampled items to *out until it holds `batch_size`, each waiting
  // up to `timeout` for the rate limiter. DeadlineExceeded leaves the items
  // already taken in *out, so a caller may call again to complete the batch;
  // Cancelled once Close()d. *table_size gets the size at the last pick.
  // FIFO tables remove what they hand out. Does not allocate once *out has
  // capacity for batch_size.
  absl::Status Sample(int64_t batch_size, absl::Duration timeout, std::vector<SampledItem>* out,
                      int64_t* table_size);

  // Sets the priority of each present key; returns how many keys were not
  // present (evicted or never inserted). InvalidArgument for a negative or
  // non-finite priority or mismatched lengths (nothing changed then).
  absl::StatusOr<int64_t> MutatePriorities(std::span<const uint64_t> keys, std::span<const double> priorities);

  int64_t size() const;
  proto::TableInfo Info() const;

  // Wakes every waiter with Cancelled; later inserts and samples fail too.
  void Close();

  // From now on inserts no longer wait for the rate limiter (samples still
  // do), and those waiting go in: for the end of a run, when nothing samples
  // any more and writers deliver their last items.
  void StopLimitingInserts();

  // Copies the contents (item pointers, not bytes) for a checkpoint.
  TableSnapshot Snapshot() const;
  // Replaces the contents with `snapshot` (items oldest first, keys
  // increasing and < next_key, at most max_size of them). InvalidArgument
  // if it does not fit; the table is unchanged then.
  absl::Status Restore(TableSnapshot snapshot);

 private:
  explicit Table(config::ReplayTableConfig config, Signature signature);

  bool InsertAllowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || inserts_unlimited_ || limiter_.CanInsert();
  }
  bool SampleAllowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (limiter_.CanSample() && selector_->size() > 0);
  }
  // Removes the oldest item.
  void RemoveOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t size_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return static_cast<int64_t>(next_key_ - first_key_); }
  int64_t Slot(uint64_t key) const { return static_cast<int64_t>(key % static_cast<uint64_t>(max_size_)); }

  const config::ReplayTableConfig config_;
  const Signature signature_;
  const int64_t max_size_;
  bool prioritized_ = false;

  mutable absl::Mutex mu_;
  std::unique_ptr<Selector> selector_ ABSL_GUARDED_BY(mu_);
  RateLimiter limiter_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const Item>> items_ ABSL_GUARDED_BY(mu_);  // by slot
  std::vector<double> priorities_ ABSL_GUARDED_BY(mu_);                  // by slot
  uint64_t first_key_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  int64_t blocked_inserts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t blocked_samples_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool inserts_unlimited_ ABSL_GUARDED_BY(mu_) = false;  // StopLimitingInserts
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_TABLE_H_
