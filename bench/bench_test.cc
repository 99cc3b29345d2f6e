#include "bench/bench.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two loops that record the units they ran, in call order.
struct Recorder {
  std::vector<std::pair<char, long>> calls;
  long position_a = 0, position_b = 0;
  Loop a() {
    return [this](long n) {
      calls.push_back({'a', position_a});
      position_a += n;
      return absl::OkStatus();
    };
  }
  Loop b() {
    return [this](long n) {
      calls.push_back({'b', position_b});
      position_b += n;
      return absl::OkStatus();
    };
  }
};

TEST(BestOfAlternatedTest, AlternatesWindowsThatGoOnWhereEachLoopLeftOff) {
  Recorder r;
  auto rates = BestOfAlternated({r.a(), r.b()}, /*n=*/5, /*attempts=*/3, Clock::kWall);
  ASSERT_TRUE(rates.ok()) << rates.status();
  ASSERT_EQ(rates->size(), 2u);
  // a, b, a, b, a, b: window k of both starts at unit 5k.
  EXPECT_THAT(r.calls, ElementsAre(std::pair{'a', 0L}, std::pair{'b', 0L}, std::pair{'a', 5L}, std::pair{'b', 5L},
                                   std::pair{'a', 10L}, std::pair{'b', 10L}));
  EXPECT_GT((*rates)[0], 0);
  EXPECT_GT((*rates)[1], 0);
}

// Each window's rate is n / its time; the figure is the fastest window, so
// one slow window (a busy neighbour) does not lower it.
TEST(BestOfAlternatedTest, TakesTheFastestWindowOfEach) {
  int call = 0;
  const Loop sometimes_slow = [&](long n) {
    // Windows 0 and 2 spin for 20 ms, window 1 for 2 ms.
    const double until = ThreadCpuSeconds() + (call++ == 1 ? 0.002 : 0.020);
    while (ThreadCpuSeconds() < until) {
    }
    return absl::OkStatus();
  };
  const Loop steady = [&](long n) {
    const double until = ThreadCpuSeconds() + 0.010;
    while (ThreadCpuSeconds() < until) {
    }
    return absl::OkStatus();
  };
  auto rates = BestOfAlternated({sometimes_slow, steady}, /*n=*/100, /*attempts=*/3, Clock::kThreadCpu);
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_NEAR((*rates)[0], 100 / 0.002, 100 / 0.002 * 0.25);
  EXPECT_NEAR((*rates)[1], 100 / 0.010, 100 / 0.010 * 0.25);
}

TEST(BestOfAlternatedTest, StopsAtTheFirstErrorAndReturnsIt) {
  int calls = 0;
  const Loop failing = [&](long) {
    ++calls;
    return calls == 2 ? absl::InternalError("env 3 blew up") : absl::OkStatus();
  };
  Recorder r;
  auto rates = BestOfAlternated({failing, r.b()}, 1, 4, Clock::kWall);
  EXPECT_EQ(rates.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(rates.status().message(), HasSubstr("env 3 blew up"));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r.calls.size(), 1u);  // the reference ran once, between the two
  EXPECT_EQ(BestOfAlternated({r.a(), r.b()}, 0, 4, Clock::kWall).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReportTest, AMissingReferenceIsReportedMissingNeverAsRatioZero) {
  Report report;
  report.benchmark = "test";
  report.Add("measured", 30, "steps/s", "raw loop", 10);
  report.Add("peer absent", 30, "samples/s", "libtorch (not installed)", 0);
  ASSERT_EQ(report.figures.size(), 2u);
  EXPECT_DOUBLE_EQ(report.figures[0].ratio, 3.0);
  EXPECT_TRUE(report.figures[0].has_reference());
  EXPECT_FALSE(report.figures[1].has_reference());
  EXPECT_TRUE(std::isnan(report.figures[1].ratio));
  const std::string json = report.ToJson();
  EXPECT_THAT(json, HasSubstr("\"reference_value\": 10, \"ratio\": 3}"));
  EXPECT_THAT(json, HasSubstr("\"reference\": \"libtorch (not installed)\", \"reference_value\": null, \"ratio\": null}"));
}

// A row the protocol measured: the medians, their ratio, each side's range
// and the rounds, in the table and in the JSON after the fields every row has.
TEST(ReportTest, AProtocolRowCarriesTheMediansTheirRatioAndEachSidesRange) {
  int round = 0;
  const Side troupe = [&](const Round&) -> absl::StatusOr<double> { return 30 + round++; };
  const Side peer = [](const Round& r) -> absl::StatusOr<double> { return 10 + r.index; };
  ProtocolOptions options;
  options.rounds = 3;
  options.warmup_rounds = 0;
  options.threads.count = 2;
  auto comparison = CompareAlternated(troupe, peer, options);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  Report report;
  report.benchmark = "test";
  report.Add("measured", "samples/s", "JAX", *comparison);
  ASSERT_EQ(report.figures.size(), 1u);
  const Figure& f = report.figures[0];
  EXPECT_EQ(f.value, 31);
  EXPECT_EQ(f.reference_value, 11);
  EXPECT_DOUBLE_EQ(f.ratio, 31.0 / 11);
  EXPECT_EQ(f.reference, "JAX, 3 alternated rounds of 2 s, median [min-max], both 2 threads unpinned");
  EXPECT_EQ(f.rounds, 3);
  EXPECT_EQ(f.value_min, 30);
  EXPECT_EQ(f.value_max, 32);
  EXPECT_EQ(f.reference_min, 10);
  EXPECT_EQ(f.reference_max, 12);
  EXPECT_THAT(report.ToJson(),
              HasSubstr("\"reference_value\": 11, \"ratio\": 2.81818, \"rounds\": 3, \"value_min\": 30, "
                        "\"value_max\": 32, \"reference_min\": 10, \"reference_max\": 12}"));
}

}  // namespace
}  // namespace troupe::bench
