#include "replay/selectors/uniform.h"

#include <vector>

#include "gtest/gtest.h"

namespace troupe::replay {
namespace {

TEST(UniformSelectorTest, SamplesEverySlotEquallyOften) {
  UniformSelector selector(/*capacity=*/10);
  for (int slot = 0; slot < 10; ++slot) selector.Insert(slot, /*priority=*/slot + 1.0);
  std::mt19937_64 rng(/*seed=*/42);
  std::vector<int> counts(10, 0);
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const Selector::Selection s = selector.Select(rng);
    ASSERT_GE(s.slot, 0);
    ASSERT_LT(s.slot, 10);
    EXPECT_DOUBLE_EQ(s.probability, 0.1);
    ++counts[s.slot];
  }
  // Chi-square with 9 degrees of freedom; 27.88 is the p = 0.001 critical value.
  double chi2 = 0;
  for (int c : counts) chi2 += (c - kDraws / 10.0) * (c - kDraws / 10.0) / (kDraws / 10.0);
  EXPECT_LT(chi2, 27.88) << "counts far from uniform";
}

TEST(UniformSelectorTest, NeverSelectsRemovedSlots) {
  UniformSelector selector(/*capacity=*/8);
  for (int slot = 0; slot < 8; ++slot) selector.Insert(slot, /*priority=*/1);
  selector.Remove(/*slot=*/3);
  selector.Remove(/*slot=*/7);
  selector.Remove(/*slot=*/0);
  EXPECT_EQ(selector.size(), 5);
  std::mt19937_64 rng(/*seed=*/1);
  std::vector<int> counts(8, 0);
  for (int i = 0; i < 5000; ++i) ++counts[selector.Select(rng).slot];
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(counts[7], 0);
  for (int slot : {1, 2, 4, 5, 6}) EXPECT_GT(counts[slot], 800) << "slot " << slot;
}

}  // namespace
}  // namespace troupe::replay
