// Uniform selection: every present slot equally likely. O(1) insert, remove
// and select: a dense array of present slots with swap-remove.
#ifndef TROUPE_REPLAY_SELECTORS_UNIFORM_H_
#define TROUPE_REPLAY_SELECTORS_UNIFORM_H_

#include <vector>

#include "replay/selectors/interface.h"

namespace troupe::replay {

class UniformSelector : public Selector {
 public:
  explicit UniformSelector(int64_t capacity);
  void Insert(int64_t slot, double priority) override;
  void Update(int64_t slot, double priority) override {}
  void Remove(int64_t slot) override;
  Selection Select(std::mt19937_64& rng) override;
  int64_t size() const override { return size_; }

 private:
  std::vector<int64_t> slots_;     // present slots in [0, size_)
  std::vector<int64_t> position_;  // slot -> index in slots_, -1 if absent
  int64_t size_ = 0;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SELECTORS_UNIFORM_H_
