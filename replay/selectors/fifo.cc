#include "replay/selectors/fifo.h"

#include "common/status_macros.h"

namespace troupe::replay {

FifoSelector::FifoSelector(int64_t capacity) : ring_(capacity), present_(capacity, 0) {}

void FifoSelector::Insert(int64_t slot, double priority) {
  SkipRemoved();
  TROUPE_CHECK(!present_[slot] && entries_ < static_cast<int64_t>(ring_.size()));
  ring_[(head_ + entries_) % static_cast<int64_t>(ring_.size())] = slot;
  ++entries_;
  present_[slot] = 1;
  ++size_;
}

void FifoSelector::Remove(int64_t slot) {
  TROUPE_CHECK(present_[slot]);
  present_[slot] = 0;
  --size_;
  SkipRemoved();
}

void FifoSelector::SkipRemoved() {
  // Drop removed entries from the front so the ring never fills with holes.
  while (entries_ > 0 && !present_[ring_[head_]]) {
    head_ = (head_ + 1) % static_cast<int64_t>(ring_.size());
    --entries_;
  }
}

Selector::Selection FifoSelector::Select(std::mt19937_64& rng) {
  TROUPE_CHECK(size_ > 0);
  SkipRemoved();
  return {ring_[head_], 1.0};
}

}  // namespace troupe::replay
