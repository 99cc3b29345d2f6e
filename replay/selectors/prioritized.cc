#include "replay/selectors/prioritized.h"

#include <cmath>

#include "common/status_macros.h"

namespace troupe::replay {
namespace {

int64_t NextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

PrioritizedSelector::PrioritizedSelector(int64_t capacity, double priority_exponent)
    : exponent_(priority_exponent),
      leaves_(NextPowerOfTwo(capacity)),
      tree_(2 * leaves_, 0.0),
      present_(capacity) {}

void PrioritizedSelector::Set(int64_t slot, double value) {
  // Write the leaf, then recompute each ancestor from its children (no drift).
  int64_t node = leaves_ + slot;
  tree_[node] = value;
  for (node /= 2; node >= 1; node /= 2) tree_[node] = tree_[2 * node] + tree_[2 * node + 1];
}

void PrioritizedSelector::Insert(int64_t slot, double priority) {
  present_.Insert(slot, priority);
  Set(slot, std::pow(priority, exponent_));
}

void PrioritizedSelector::Update(int64_t slot, double priority) { Set(slot, std::pow(priority, exponent_)); }

void PrioritizedSelector::Remove(int64_t slot) {
  present_.Remove(slot);
  Set(slot, 0.0);
}

Selector::Selection PrioritizedSelector::Select(std::mt19937_64& rng) {
  TROUPE_CHECK(size() > 0);
  const double total = tree_[1];
  if (!(total > 0)) return present_.Select(rng);
  // Descend from the root towards the leaf whose prefix sum interval holds u;
  // never enter an empty subtree, so rounding cannot land on a zero leaf.
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  int64_t node = 1;
  while (node < leaves_) {
    const double left = tree_[2 * node];
    const double right = tree_[2 * node + 1];
    if ((u < left && left > 0) || right <= 0) {
      node = 2 * node;
    } else {
      u -= left;
      node = 2 * node + 1;
    }
  }
  return {node - leaves_, tree_[node] / total};
}

}  // namespace troupe::replay
