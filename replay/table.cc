#include "replay/table.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "replay/selectors/fifo.h"
#include "replay/selectors/prioritized.h"
#include "replay/selectors/uniform.h"

namespace troupe::replay {
namespace {

std::unique_ptr<Selector> MakeSelector(const config::ReplayTableConfig& config) {
  switch (config.selector()) {
    case config::ReplayTableConfig::prioritized:
      return std::make_unique<PrioritizedSelector>(config.max_size(), config.priority_exponent());
    case config::ReplayTableConfig::fifo: return std::make_unique<FifoSelector>(config.max_size());
    case config::ReplayTableConfig::uniform: break;
  }
  return std::make_unique<UniformSelector>(config.max_size());
}

// Waits on `cond` under `mu` for `timeout`; true if it holds.
bool WaitFor(absl::Mutex& mu, const absl::Condition& cond, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    mu.Await(cond);
    return true;
  }
  return mu.AwaitWithTimeout(cond, timeout);
}

}  // namespace

absl::Status ValidateTableConfig(const config::ReplayTableConfig& config, absl::string_view prefix) {
  auto bad = [&](absl::string_view field, auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, field, parts...));
  };
  if (config.name().empty()) return bad("name", ": a table needs a name");
  if (config.name().size() > 256) return bad("name", ": longer than 256 characters");
  if (config.max_size() < 1 || config.max_size() > kMaxTableSize) {
    return bad("max_size ", config.max_size(), ": must be in [1, ", kMaxTableSize, "]");
  }
  RETURN_IF_ERROR(CheckFitsInMemory(absl::StrCat(prefix, "max_size ", config.max_size()),
                                    static_cast<double>(config.max_size()) * kTableBytesPerSlot));
  if (!config::ReplayTableConfig::Selector_IsValid(config.selector())) {
    return bad("selector ", static_cast<int>(config.selector()), ": unknown; expected uniform, prioritized or fifo");
  }
  // !(x >= 0) also refuses NaN.
  if (!(config.priority_exponent() >= 0) || std::isinf(config.priority_exponent())) {
    return bad("priority_exponent ", config.priority_exponent(), ": must be finite and >= 0");
  }
  if (!(config.importance_exponent() >= 0) || std::isinf(config.importance_exponent())) {
    return bad("importance_exponent ", config.importance_exponent(), ": must be finite and >= 0");
  }
  const config::RateLimiterConfig& limiter = config.rate_limiter();
  if (limiter.min_size_to_sample() < 1) {
    return bad("rate_limiter.min_size_to_sample ", limiter.min_size_to_sample(), ": must be >= 1");
  }
  if (!(limiter.samples_per_insert() >= 0) || std::isinf(limiter.samples_per_insert())) {
    return bad("rate_limiter.samples_per_insert ", limiter.samples_per_insert(), ": must be finite and >= 0");
  }
  if (std::isnan(limiter.error_buffer()) || std::isinf(limiter.error_buffer())) {
    return bad("rate_limiter.error_buffer ", limiter.error_buffer(), ": must be finite");
  }
  if (limiter.insert_timeout_ms() < 0) {
    return bad("rate_limiter.insert_timeout_ms ", limiter.insert_timeout_ms(), ": must be >= 0 (0 = forever)");
  }
  RETURN_IF_ERROR(RateLimiter::Validate(limiter, config.name()));
  // Fields: sizes bounded so that no product overflows.
  if (config.fields_size() == 0) return bad("fields", ": a table needs at least one field");
  for (int i = 0; i < config.fields_size(); ++i) {
    const config::ReplayFieldConfig& field = config.fields(i);
    const std::string at = absl::StrCat("fields[", i, "].");
    if (field.name().empty()) return bad(at, "name: a field needs a name");
    if (field.shape_size() > 8) return bad(at, "shape: ", field.shape_size(), " dimensions, at most 8");
    int64_t elements = 1;
    for (int d = 0; d < field.shape_size(); ++d) {
      const int64_t size = field.shape(d);
      if (size < 1 || size > kMaxFieldBytes || elements > kMaxFieldBytes / size) {
        return bad(at, "shape[", d, "] ", size, ": dimensions must be >= 1 and a field at most ", kMaxFieldBytes,
                   " elements");
      }
      elements *= size;
    }
    if (field.frames() < 0 || field.frames() > kMaxFieldFrames) {
      return bad(at, "frames ", field.frames(), ": must be in [0, ", kMaxFieldFrames, "]");
    }
    if (elements * 8 > kMaxFieldBytes) return bad(at, "shape: more than ", kMaxFieldBytes, " bytes");
  }
  return Signature::FromConfig(config).status();
}

absl::StatusOr<std::unique_ptr<Table>> Table::Create(const config::ReplayTableConfig& config) {
  RETURN_IF_ERROR(ValidateTableConfig(config, absl::StrCat("replay table '", config.name(), "': ")));
  ASSIGN_OR_RETURN(Signature signature, Signature::FromConfig(config));
  return std::unique_ptr<Table>(new Table(config, std::move(signature)));
}

Table::Table(config::ReplayTableConfig config, Signature signature)
    : config_(std::move(config)),
      signature_(std::move(signature)),
      max_size_(config_.max_size()),
      selector_(MakeSelector(config_)),
      limiter_(config_.rate_limiter()),
      items_(max_size_),
      priorities_(max_size_, 0.0),
      rng_(config_.seed()) {
  prioritized_ = selector_->Prioritized();
}

absl::Status Table::Insert(const std::shared_ptr<Item>& item, double priority, absl::Duration timeout) {
  if (!std::isfinite(priority) || priority < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': priority ", priority, " must be finite and >= 0"));
  }
  absl::MutexLock lock(&mu_);
  // Wait for the rate limiter.
  if (!InsertAllowed()) {
    ++blocked_inserts_;
    const bool allowed = WaitFor(mu_, absl::Condition(this, &Table::InsertAllowed), timeout);
    --blocked_inserts_;
    if (!allowed) {
      return absl::DeadlineExceededError(absl::StrCat("table '", name(), "': insert blocked by the rate limiter for ",
                                                      absl::FormatDuration(timeout)));
    }
  }
  if (closed_) return absl::CancelledError(absl::StrCat("table '", name(), "' is closed"));
  // Make room, then place the item in its slot.
  if (next_key_ - first_key_ == static_cast<uint64_t>(max_size_)) RemoveOldest();
  item->key = next_key_++;
  const int64_t slot = Slot(item->key);
  items_[slot] = item;
  priorities_[slot] = priority;
  selector_->Insert(slot, priority);
  limiter_.OnInsert();
  return absl::OkStatus();
}

void Table::RemoveOldest() {
  TROUPE_CHECK(first_key_ < next_key_);
  const int64_t slot = Slot(first_key_++);
  selector_->Remove(slot);
  items_[slot].reset();
  limiter_.OnDelete();
}

absl::Status Table::Sample(int64_t batch_size, absl::Duration timeout, std::vector<SampledItem>* out,
                           int64_t* table_size) {
  absl::MutexLock lock(&mu_);
  while (static_cast<int64_t>(out->size()) < batch_size) {
    // Wait for the rate limiter (and for an item).
    if (!SampleAllowed() || closed_) {
      ++blocked_samples_;
      const bool allowed = WaitFor(mu_, absl::Condition(this, &Table::SampleAllowed), timeout);
      --blocked_samples_;
      if (!allowed) {
        // (Callers that wait in slices say for how long in all.)
        return absl::DeadlineExceededError(absl::StrCat("table '", name(), "': sample blocked by the rate limiter (size ",
                                                        size_locked(), ", min_size_to_sample ",
                                                        limiter_.min_size_to_sample(), ")"));
      }
      if (closed_) return absl::CancelledError(absl::StrCat("table '", name(), "' is closed"));
    }
    // Pick one item.
    const Selector::Selection selection = selector_->Select(rng_);
    out->push_back({items_[selection.slot], selection.probability});
    *table_size = selector_->size();
    limiter_.OnSample();
    // A FIFO queue hands each item out once (always the oldest).
    if (selector_->SampleOnce()) {
      TROUPE_CHECK(selection.slot == Slot(first_key_));
      RemoveOldest();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Table::MutatePriorities(std::span<const uint64_t> keys, std::span<const double> priorities) {
  if (keys.size() != priorities.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name(), "': ", keys.size(), " keys but ",
                                                   priorities.size(), " priorities"));
  }
  for (size_t i = 0; i < priorities.size(); ++i) {
    if (!std::isfinite(priorities[i]) || priorities[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("table '", name(), "': priority ", priorities[i], " of key ",
                                                     keys[i], " must be finite and >= 0"));
    }
  }
  absl::MutexLock lock(&mu_);
  int64_t missing = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] < first_key_ || keys[i] >= next_key_) {
      ++missing;
      continue;
    }
    const int64_t slot = Slot(keys[i]);
    priorities_[slot] = priorities[i];
    selector_->Update(slot, priorities[i]);
  }
  return missing;
}

int64_t Table::size() const {
  absl::MutexLock lock(&mu_);
  return size_locked();
}

proto::TableInfo Table::Info() const {
  proto::TableInfo info;
  *info.mutable_config() = config_;
  info.set_max_size(max_size_);
  absl::MutexLock lock(&mu_);
  info.set_size(size_locked());
  proto::RateLimiterInfo* rl = info.mutable_rate_limiter();
  rl->set_inserts(limiter_.inserts());
  rl->set_samples(limiter_.samples());
  rl->set_deletes(limiter_.deletes());
  rl->set_min_size_to_sample(limiter_.min_size_to_sample());
  rl->set_samples_per_insert(limiter_.samples_per_insert());
  rl->set_min_diff(limiter_.min_diff());
  rl->set_max_diff(limiter_.max_diff());
  rl->set_blocked_inserts(blocked_inserts_);
  rl->set_blocked_samples(blocked_samples_);
  return info;
}

void Table::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void Table::StopLimitingInserts() {
  absl::MutexLock lock(&mu_);
  inserts_unlimited_ = true;  // waiters' InsertAllowed turns true as the lock is released
}

TableSnapshot Table::Snapshot() const {
  TableSnapshot snapshot;
  absl::MutexLock lock(&mu_);
  snapshot.items.reserve(next_key_ - first_key_);
  snapshot.priorities.reserve(next_key_ - first_key_);
  for (uint64_t key = first_key_; key < next_key_; ++key) {
    snapshot.items.push_back(items_[Slot(key)]);
    snapshot.priorities.push_back(priorities_[Slot(key)]);
  }
  snapshot.inserts = limiter_.inserts();
  snapshot.samples = limiter_.samples();
  snapshot.deletes = limiter_.deletes();
  snapshot.next_key = next_key_;
  return snapshot;
}

absl::Status Table::Restore(TableSnapshot snapshot) {
  // Check that the snapshot fits this table.
  const int64_t n = static_cast<int64_t>(snapshot.items.size());
  if (n > max_size_ || snapshot.priorities.size() != snapshot.items.size() ||
      snapshot.next_key < static_cast<uint64_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': checkpoint holds ", n, " items, max_size is ", max_size_));
  }
  const uint64_t first = snapshot.next_key - static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    if (snapshot.items[i] == nullptr || snapshot.items[i]->key != first + static_cast<uint64_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("table '", name(), "': checkpoint keys are not contiguous"));
    }
    if (!std::isfinite(snapshot.priorities[i]) || snapshot.priorities[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("table '", name(), "': checkpoint priority is invalid"));
    }
  }
  // Replace the contents.
  absl::MutexLock lock(&mu_);
  while (first_key_ < next_key_) RemoveOldest();
  selector_ = MakeSelector(config_);
  first_key_ = first;
  next_key_ = snapshot.next_key;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = Slot(first + i);
    items_[slot] = std::move(snapshot.items[i]);
    priorities_[slot] = snapshot.priorities[i];
    selector_->Insert(slot, priorities_[slot]);
  }
  limiter_.SetCounters(snapshot.inserts, snapshot.samples, snapshot.deletes);
  return absl::OkStatus();
}

}  // namespace troupe::replay
