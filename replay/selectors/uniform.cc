#include "replay/selectors/uniform.h"

#include "common/status_macros.h"

namespace troupe::replay {

UniformSelector::UniformSelector(int64_t capacity) : slots_(capacity), position_(capacity, -1) {}

void UniformSelector::Insert(int64_t slot, double priority) {
  TROUPE_CHECK(position_[slot] < 0);
  position_[slot] = size_;
  slots_[size_++] = slot;
}

void UniformSelector::Remove(int64_t slot) {
  // Move the last present slot into the hole.
  const int64_t index = position_[slot];
  TROUPE_CHECK(index >= 0);
  const int64_t last = slots_[--size_];
  slots_[index] = last;
  position_[last] = index;
  position_[slot] = -1;
}

Selector::Selection UniformSelector::Select(std::mt19937_64& rng) {
  TROUPE_CHECK(size_ > 0);
  std::uniform_int_distribution<int64_t> pick(0, size_ - 1);
  return {slots_[pick(rng)], 1.0 / static_cast<double>(size_)};
}

}  // namespace troupe::replay
