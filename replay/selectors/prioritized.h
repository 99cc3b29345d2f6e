// Prioritized selection (Schaul et al. 2016, "Prioritized Experience
// Replay"): P(i) = p_i^alpha / sum_k p_k^alpha, from a sum tree over slots:
// O(log capacity) insert, update, remove and select. When every present
// priority is 0, selection falls back to uniform.
#ifndef TROUPE_REPLAY_SELECTORS_PRIORITIZED_H_
#define TROUPE_REPLAY_SELECTORS_PRIORITIZED_H_

#include <vector>

#include "replay/selectors/interface.h"
#include "replay/selectors/uniform.h"

namespace troupe::replay {

class PrioritizedSelector : public Selector {
 public:
  // priority_exponent: alpha above (0 = uniform, 1 = proportional).
  PrioritizedSelector(int64_t capacity, double priority_exponent);
  void Insert(int64_t slot, double priority) override;
  void Update(int64_t slot, double priority) override;
  void Remove(int64_t slot) override;
  Selection Select(std::mt19937_64& rng) override;
  int64_t size() const override { return present_.size(); }
  bool Prioritized() const override { return true; }

  // Sum of p^alpha over present slots.
  double total() const { return tree_[1]; }

 private:
  void Set(int64_t slot, double value);

  double exponent_;
  int64_t leaves_;             // capacity rounded up to a power of two
  std::vector<double> tree_;   // tree_[1] root; leaves at [leaves_, 2 leaves_)
  UniformSelector present_;    // present slots, for the all-zero fallback
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SELECTORS_PRIORITIZED_H_
