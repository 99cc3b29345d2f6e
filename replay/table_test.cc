#include "replay/table.h"

#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace troupe::replay {
namespace {

std::unique_ptr<Table> MakeTable(const std::string& text) {
  config::ReplayTableConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c));
  auto table = Table::Create(c);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(*table) : nullptr;
}

std::shared_ptr<Item> MakeItem(float value) {
  auto item = std::make_shared<Item>();
  item->dense.resize(sizeof(float));
  std::memcpy(item->dense.data(), &value, sizeof(float));
  return item;
}

float ValueOf(const Item& item) {
  float v;
  std::memcpy(&v, item.dense.data(), sizeof(float));
  return v;
}

TEST(TableTest, CreateRejectsBadConfigSayingWhichField) {
  config::ReplayTableConfig c;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "t" max_size: 0 fields { name: "x" shape: 1 })pb", &c));
  auto table = Table::Create(c);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.status().message(), "replay table 't': max_size 0: must be in [1, 268435456]");
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "t" fields { name: "obs" dtype: float32 shape: 84 shape: 84 shape: 3 frames: 3 })pb", &c));
  table = Table::Create(c);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(table.status().message().find("field 'obs': a pixel field (frames > 0) must be uint8"), std::string::npos)
      << table.status().message();
}

TEST(TableTest, EvictsOldestWhenFullAndKeysStayContiguous) {
  auto table = MakeTable(R"pb(name: "t" max_size: 3 fields { name: "x" shape: 1 })pb");
  for (int i = 0; i < 5; ++i) {
    auto item = MakeItem(static_cast<float>(i));
    ASSERT_TRUE(table->Insert(item, /*priority=*/1, absl::ZeroDuration()).ok());
    EXPECT_EQ(item->key, static_cast<uint64_t>(i));
  }
  EXPECT_EQ(table->size(), 3);
  const TableSnapshot snapshot = table->Snapshot();
  ASSERT_EQ(snapshot.items.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(snapshot.items[i]->key, static_cast<uint64_t>(i + 2));
    EXPECT_EQ(ValueOf(*snapshot.items[i]), i + 2.0f);
  }
  EXPECT_EQ(snapshot.deletes, 2);
  EXPECT_EQ(snapshot.next_key, 5u);
}

TEST(TableTest, FifoTableYieldsEachItemExactlyOnceInOrder) {
  auto table = MakeTable(R"pb(name: "q" max_size: 100 selector: fifo fields { name: "x" shape: 1 })pb");
  std::vector<float> seen;
  int inserted = 0;
  // Interleave inserts and samples; every item must come out once, in order.
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(table->Insert(MakeItem(inserted++), 1, absl::ZeroDuration()).ok());
    std::vector<SampledItem> out;
    int64_t size = 0;
    ASSERT_TRUE(table->Sample(/*batch_size=*/5, absl::ZeroDuration(), &out, &size).ok());
    for (const auto& s : out) seen.push_back(ValueOf(*s.item));
  }
  std::vector<SampledItem> rest;
  int64_t size = 0;
  ASSERT_TRUE(table->Sample(/*batch_size=*/20, absl::ZeroDuration(), &rest, &size).ok());
  for (const auto& s : rest) seen.push_back(ValueOf(*s.item));
  ASSERT_EQ(seen.size(), 70u);
  for (int i = 0; i < 70; ++i) EXPECT_EQ(seen[i], static_cast<float>(i)) << "position " << i;
  EXPECT_EQ(table->size(), 0);
  std::vector<SampledItem> none;
  EXPECT_EQ(table->Sample(1, absl::Milliseconds(5), &none, &size).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(TableTest, MutatePrioritiesSkipsEvictedKeysAndRejectsBadValues) {
  auto table = MakeTable(
      R"pb(name: "p" max_size: 4 selector: prioritized priority_exponent: 1 fields { name: "x" shape: 1 })pb");
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(table->Insert(MakeItem(i), 1, absl::ZeroDuration()).ok());
  // Keys 0 and 1 were evicted; 9 never existed.
  const std::vector<uint64_t> keys = {0, 1, 2, 5, 9};
  const std::vector<double> priorities = {5, 5, 0, 7, 1};
  auto missing = table->MutatePriorities(keys, priorities);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(*missing, 3);
  const TableSnapshot snapshot = table->Snapshot();
  EXPECT_EQ(snapshot.priorities, (std::vector<double>{0, 1, 1, 7}));
  // Key 2 now has priority 0: never sampled; key 5 has 7/9.
  std::vector<SampledItem> out;
  int64_t size = 0;
  ASSERT_TRUE(table->Sample(/*batch_size=*/2000, absl::ZeroDuration(), &out, &size).ok());
  int key5 = 0;
  for (const auto& s : out) {
    EXPECT_NE(s.item->key, 2u);
    if (s.item->key == 5) {
      ++key5;
      EXPECT_DOUBLE_EQ(s.probability, 7.0 / 9.0);
    }
  }
  EXPECT_NEAR(key5 / 2000.0, 7.0 / 9.0, 0.04);
  const std::vector<double> bad = {-1};
  const std::vector<uint64_t> one = {3};
  EXPECT_EQ(table->MutatePriorities(one, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::replay
