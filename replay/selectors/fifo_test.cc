#include "replay/selectors/fifo.h"

#include "gtest/gtest.h"

namespace troupe::replay {
namespace {

TEST(FifoSelectorTest, SelectsOldestAndAsksForRemovalOnSample) {
  FifoSelector selector(/*capacity=*/4);
  EXPECT_TRUE(selector.SampleOnce());
  std::mt19937_64 rng(/*seed=*/0);
  // Fill the ring twice over, removing what is selected, as the table does.
  int next_slot = 0;
  for (int i = 0; i < 3; ++i) selector.Insert(next_slot++ % 4, /*priority=*/1);
  for (int expected = 0; expected < 12; ++expected) {
    const Selector::Selection s = selector.Select(rng);
    EXPECT_EQ(s.slot, expected % 4);
    EXPECT_DOUBLE_EQ(s.probability, 1.0);
    selector.Remove(s.slot);
    selector.Insert(next_slot++ % 4, /*priority=*/1);
  }
  EXPECT_EQ(selector.size(), 3);
}

TEST(FifoSelectorTest, SkipsSlotsRemovedOutOfOrder) {
  FifoSelector selector(/*capacity=*/4);
  for (int slot = 0; slot < 4; ++slot) selector.Insert(slot, /*priority=*/1);
  selector.Remove(/*slot=*/1);
  std::mt19937_64 rng(/*seed=*/0);
  EXPECT_EQ(selector.Select(rng).slot, 0);
  selector.Remove(/*slot=*/0);
  EXPECT_EQ(selector.Select(rng).slot, 2);
  EXPECT_EQ(selector.size(), 2);
}

}  // namespace
}  // namespace troupe::replay
