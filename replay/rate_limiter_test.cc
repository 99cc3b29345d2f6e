#include "replay/rate_limiter.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "replay/table.h"

namespace troupe::replay {
namespace {

config::RateLimiterConfig Limits(int64_t min_size, double spi, double error_buffer) {
  config::RateLimiterConfig c;
  c.set_min_size_to_sample(min_size);
  c.set_samples_per_insert(spi);
  c.set_error_buffer(error_buffer);
  return c;
}

std::unique_ptr<Table> MakeTable(const config::RateLimiterConfig& limits, int64_t max_size = 1000) {
  config::ReplayTableConfig c;
  c.set_name("t");
  c.set_max_size(max_size);
  auto* f = c.add_fields();
  f->set_name("x");
  f->add_shape(1);
  *c.mutable_rate_limiter() = limits;
  auto table = Table::Create(c);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(*table);
}

absl::Status InsertOne(Table& table, absl::Duration timeout) {
  auto item = std::make_shared<Item>();
  item->dense.resize(4);
  return table.Insert(item, /*priority=*/1, timeout);
}

absl::Status SampleOne(Table& table, absl::Duration timeout) {
  std::vector<SampledItem> out;
  int64_t size = 0;
  return table.Sample(/*batch_size=*/1, timeout, &out, &size);
}

TEST(RateLimiterTest, ValidateRejectsImpossibleSettings) {
  EXPECT_EQ(RateLimiter::Validate(Limits(/*min_size=*/0, 1, 10), "t").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RateLimiter::Validate(Limits(1, /*spi=*/-1, 10), "t").code(), absl::StatusCode::kInvalidArgument);
  const absl::Status small_buffer = RateLimiter::Validate(Limits(1, /*spi=*/4, /*error_buffer=*/2), "t");
  EXPECT_EQ(small_buffer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small_buffer.message().find("table 't' rate_limiter: error_buffer 2"), std::string::npos)
      << small_buffer.message();
  EXPECT_TRUE(RateLimiter::Validate(Limits(1, 4, 4), "t").ok());
}

TEST(RateLimiterTest, KeepsInsertsAndSamplesWithinTheErrorBuffer) {
  // spi 2, min size 2, buffer 3: diff = 2 inserts - samples in [1, 7].
  RateLimiter limiter(Limits(/*min_size=*/2, /*spi=*/2, /*error_buffer=*/3));
  EXPECT_DOUBLE_EQ(limiter.min_diff(), 1);
  EXPECT_DOUBLE_EQ(limiter.max_diff(), 7);
  EXPECT_FALSE(limiter.CanSample());
  limiter.OnInsert();
  EXPECT_FALSE(limiter.CanSample()) << "below min size";
  limiter.OnInsert();
  EXPECT_TRUE(limiter.CanInsert()) << "3 inserts: diff 6 <= 7";
  limiter.OnInsert();
  EXPECT_FALSE(limiter.CanInsert()) << "4 inserts: diff 8 > 7";
  // Samples allowed while 6 - (samples + 1) >= 1: five of them.
  int samples = 0;
  while (limiter.CanSample()) {
    limiter.OnSample();
    ++samples;
  }
  EXPECT_EQ(samples, 5);
  EXPECT_TRUE(limiter.CanInsert());
}

TEST(RateLimiterTest, BlocksSamplesUntilMinSize) {
  auto table = MakeTable(Limits(/*min_size=*/3, /*spi=*/0, /*error_buffer=*/1));
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  const absl::Status blocked = SampleOne(*table, absl::Milliseconds(20));
  EXPECT_EQ(blocked.code(), absl::StatusCode::kDeadlineExceeded) << blocked;
  EXPECT_NE(blocked.message().find("size 2, min_size_to_sample 3"), std::string::npos) << blocked.message();
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  EXPECT_TRUE(SampleOne(*table, absl::ZeroDuration()).ok());
}

TEST(RateLimiterTest, BlocksInsertsWhenTooFarAheadOfSamples) {
  // spi 1, min size 1, buffer 2: an insert may bring diff to at most 3.
  auto table = MakeTable(Limits(/*min_size=*/1, /*spi=*/1, /*error_buffer=*/2));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok()) << i;
  const absl::Status blocked = InsertOne(*table, absl::Milliseconds(20));
  EXPECT_EQ(blocked.code(), absl::StatusCode::kDeadlineExceeded) << blocked;
  EXPECT_EQ(table->size(), 3) << "a timed-out insert must insert nothing";
  ASSERT_TRUE(SampleOne(*table, absl::ZeroDuration()).ok());
  EXPECT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
}

TEST(RateLimiterTest, ReleasesBlockedSampleWhenInsertArrives) {
  auto table = MakeTable(Limits(/*min_size=*/1, /*spi=*/0, /*error_buffer=*/1));
  std::atomic<bool> sampled{false};
  absl::Status status;
  std::jthread sampler([&] {
    status = SampleOne(*table, absl::Seconds(30));
    sampled = true;
  });
  // Wait until the sampler is blocked, then release it with one insert.
  while (table->Info().rate_limiter().blocked_samples() == 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(sampled.load());
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  sampler.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(sampled.load());
}

TEST(RateLimiterTest, ReleasesBlockedInsertWhenSampleArrives) {
  auto table = MakeTable(Limits(/*min_size=*/1, /*spi=*/1, /*error_buffer=*/1));
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  absl::Status status = absl::UnknownError("not run");
  std::jthread inserter([&] { status = InsertOne(*table, absl::Seconds(30)); });
  while (table->Info().rate_limiter().blocked_inserts() == 0) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(SampleOne(*table, absl::ZeroDuration()).ok());
  inserter.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(table->size(), 3);
}

TEST(RateLimiterTest, CloseWakesBlockedCallersWithCancelled) {
  auto table = MakeTable(Limits(/*min_size=*/5, /*spi=*/0, /*error_buffer=*/1));
  absl::Status status;
  std::jthread sampler([&] { status = SampleOne(*table, absl::InfiniteDuration()); });
  while (table->Info().rate_limiter().blocked_samples() == 0) absl::SleepFor(absl::Milliseconds(1));
  table->Close();
  sampler.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
}

// The end of a run: nothing samples any more, and a blocked insert (and
// every later one) goes in rather than waiting for samples.
TEST(RateLimiterTest, StopLimitingInsertsReleasesBlockedAndLaterInserts) {
  auto table = MakeTable(Limits(/*min_size=*/1, /*spi=*/1, /*error_buffer=*/1));
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  ASSERT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  absl::Status status = absl::UnknownError("not run");
  std::jthread inserter([&] { status = InsertOne(*table, absl::InfiniteDuration()); });
  while (table->Info().rate_limiter().blocked_inserts() == 0) absl::SleepFor(absl::Milliseconds(1));
  table->StopLimitingInserts();
  inserter.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(InsertOne(*table, absl::ZeroDuration()).ok());
  EXPECT_EQ(table->size(), 4);
}

TEST(RateLimiterTest, ManyInsertersAndSamplersStayConsistent) {
  // spi 2, min 10, buffer 40: 2 * inserts - samples must stay in [-20, 60].
  auto table = MakeTable(Limits(/*min_size=*/10, /*spi=*/2, /*error_buffer=*/40), /*max_size=*/200);
  constexpr int kInserters = 4, kSamplers = 3, kPerInserter = 500;
  std::atomic<int> inserters_left{kInserters};
  std::atomic<int64_t> sampled{0};
  std::atomic<int> errors{0};
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kInserters; ++i) {
      threads.emplace_back([&] {
        for (int n = 0; n < kPerInserter; ++n) {
          if (!InsertOne(*table, absl::Seconds(60)).ok()) ++errors;
        }
        --inserters_left;
      });
    }
    for (int i = 0; i < kSamplers; ++i) {
      threads.emplace_back([&] {
        std::vector<SampledItem> out;
        int64_t size = 0;
        // Sample in slices until inserters are done and nothing more may be sampled.
        for (;;) {
          out.clear();
          const absl::Status s = table->Sample(/*batch_size=*/5, absl::Milliseconds(5), &out, &size);
          sampled += static_cast<int64_t>(out.size());
          if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) ++errors;
          if (!s.ok() && inserters_left.load() == 0) return;
        }
      });
    }
  }
  EXPECT_EQ(errors.load(), 0);
  const proto::RateLimiterInfo info = table->Info().rate_limiter();
  EXPECT_EQ(info.inserts(), kInserters * kPerInserter);
  EXPECT_EQ(info.samples(), sampled.load());
  EXPECT_EQ(info.deletes(), kInserters * kPerInserter - 200);
  const double diff = 2.0 * info.inserts() - info.samples();
  EXPECT_GE(diff, -20);
  EXPECT_LE(diff, 60);
  EXPECT_EQ(info.blocked_inserts() + info.blocked_samples(), 0);
}

}  // namespace
}  // namespace troupe::replay
