// FIFO selection for on-policy data: always the oldest present slot, and the
// table removes it once sampled, so each item is sampled exactly once, in
// insertion order.
#ifndef TROUPE_REPLAY_SELECTORS_FIFO_H_
#define TROUPE_REPLAY_SELECTORS_FIFO_H_

#include <vector>

#include "replay/selectors/interface.h"

namespace troupe::replay {

class FifoSelector : public Selector {
 public:
  explicit FifoSelector(int64_t capacity);
  void Insert(int64_t slot, double priority) override;
  void Update(int64_t slot, double priority) override {}
  // Removing a slot that is not the oldest marks it; it is skipped later.
  void Remove(int64_t slot) override;
  Selection Select(std::mt19937_64& rng) override;
  int64_t size() const override { return size_; }
  bool SampleOnce() const override { return true; }

 private:
  void SkipRemoved();

  std::vector<int64_t> ring_;   // slots in insertion order, ring of `capacity`
  std::vector<char> present_;   // slot -> present
  int64_t head_ = 0;            // index in ring_ of the oldest entry
  int64_t entries_ = 0;         // entries in ring_ (present or marked removed)
  int64_t size_ = 0;            // present slots
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SELECTORS_FIFO_H_
