#include "replay/selectors/prioritized.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace troupe::replay {
namespace {

// Draws `n` selections and returns counts per slot.
std::vector<int> Draw(PrioritizedSelector& selector, int slots, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> counts(slots, 0);
  for (int i = 0; i < n; ++i) ++counts[selector.Select(rng).slot];
  return counts;
}

TEST(PrioritizedSelectorTest, SamplesInProportionToPriority) {
  PrioritizedSelector selector(/*capacity=*/4, /*priority_exponent=*/1.0);
  for (int slot = 0; slot < 4; ++slot) selector.Insert(slot, /*priority=*/slot + 1.0);
  EXPECT_DOUBLE_EQ(selector.total(), 10.0);
  constexpr int kDraws = 100000;
  const std::vector<int> counts = Draw(selector, 4, kDraws, /*seed=*/7);
  // Chi-square with 3 degrees of freedom; 16.27 is the p = 0.001 critical value.
  double chi2 = 0;
  for (int slot = 0; slot < 4; ++slot) {
    const double expected = kDraws * (slot + 1) / 10.0;
    chi2 += (counts[slot] - expected) * (counts[slot] - expected) / expected;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(PrioritizedSelectorTest, ReportsProbabilityOfEachSelection) {
  PrioritizedSelector selector(/*capacity=*/3, /*priority_exponent=*/1.0);
  selector.Insert(/*slot=*/0, /*priority=*/1);
  selector.Insert(/*slot=*/1, /*priority=*/3);
  std::mt19937_64 rng(/*seed=*/3);
  for (int i = 0; i < 100; ++i) {
    const Selector::Selection s = selector.Select(rng);
    EXPECT_DOUBLE_EQ(s.probability, s.slot == 0 ? 0.25 : 0.75);
  }
}

TEST(PrioritizedSelectorTest, UpdatedPrioritiesChangeTheDistribution) {
  PrioritizedSelector selector(/*capacity=*/5, /*priority_exponent=*/1.0);
  for (int slot = 0; slot < 5; ++slot) selector.Insert(slot, /*priority=*/1);
  selector.Update(/*slot=*/2, /*priority=*/0);
  selector.Update(/*slot=*/4, /*priority=*/6);
  EXPECT_DOUBLE_EQ(selector.total(), 9.0);
  const std::vector<int> counts = Draw(selector, 5, /*n=*/30000, /*seed=*/11);
  EXPECT_EQ(counts[2], 0) << "a zero-priority slot was selected";
  EXPECT_NEAR(counts[4] / 30000.0, 6.0 / 9.0, 0.02);
  EXPECT_NEAR(counts[0] / 30000.0, 1.0 / 9.0, 0.01);
}

TEST(PrioritizedSelectorTest, AppliesPriorityExponent) {
  PrioritizedSelector selector(/*capacity=*/2, /*priority_exponent=*/0.5);
  selector.Insert(/*slot=*/0, /*priority=*/1);
  selector.Insert(/*slot=*/1, /*priority=*/9);
  // P = sqrt(p) / (1 + 3).
  std::mt19937_64 rng(/*seed=*/5);
  for (int i = 0; i < 50; ++i) {
    const Selector::Selection s = selector.Select(rng);
    EXPECT_DOUBLE_EQ(s.probability, s.slot == 0 ? 0.25 : 0.75);
  }
}

TEST(PrioritizedSelectorTest, RemovedSlotsAreNeverSelected) {
  PrioritizedSelector selector(/*capacity=*/6, /*priority_exponent=*/1.0);
  for (int slot = 0; slot < 6; ++slot) selector.Insert(slot, /*priority=*/10);
  selector.Remove(/*slot=*/5);
  selector.Remove(/*slot=*/0);
  EXPECT_EQ(selector.size(), 4);
  const std::vector<int> counts = Draw(selector, 6, /*n=*/4000, /*seed=*/2);
  EXPECT_EQ(counts[0] + counts[5], 0);
}

TEST(PrioritizedSelectorTest, AllZeroPrioritiesFallBackToUniform) {
  PrioritizedSelector selector(/*capacity=*/4, /*priority_exponent=*/1.0);
  for (int slot = 0; slot < 4; ++slot) selector.Insert(slot, /*priority=*/0);
  const std::vector<int> counts = Draw(selector, 4, /*n=*/8000, /*seed=*/9);
  for (int slot = 0; slot < 4; ++slot) EXPECT_NEAR(counts[slot], 2000, 250) << "slot " << slot;
}

}  // namespace
}  // namespace troupe::replay
