#include "bench/protocol.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A side that returns the same rate every round.
Side Steady(double rate) {
  return [rate](const Round&) -> absl::StatusOr<double> { return rate; };
}

ProtocolOptions Options(int rounds, int warmup_rounds = 1) {
  ProtocolOptions options;
  options.rounds = rounds;
  options.warmup_rounds = warmup_rounds;
  options.threads.count = 2;
  return options;
}

TEST(ProtocolTest, TwoSidesOfKnownRatesGiveTheirRatioExactly) {
  auto c = CompareAlternated(Steady(300), Steady(200), Options(5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ratio, 1.5);
  EXPECT_EQ(c->troupe.median, 300);
  EXPECT_EQ(c->peer.median, 200);
  EXPECT_THAT(c->troupe.rates, ElementsAre(300, 300, 300, 300, 300));
  EXPECT_EQ(c->peer.min, 200);
  EXPECT_EQ(c->peer.max, 200);
  EXPECT_EQ(c->rounds, 5);
}

// A timed loop whose units each spin `unit_seconds` of the thread's CPU:
// rounds of `round.seconds`, its rate timed on the thread's CPU clock (which
// a loaded machine does not stretch), so its true rate is 1 / unit_seconds.
Side SpinLoop(double unit_seconds) {
  return [unit_seconds](const Round& round) -> absl::StatusOr<double> {
    const double start = ThreadCpuSeconds();
    long units = 0;
    while (ThreadCpuSeconds() - start < round.seconds) {
      const double until = ThreadCpuSeconds() + unit_seconds;
      while (ThreadCpuSeconds() < until) {
      }
      ++units;
    }
    return units / (ThreadCpuSeconds() - start);
  };
}

TEST(ProtocolTest, TwoTimedLoopsOfKnownTrueRatioComeOutAtIt) {
  ProtocolOptions options = Options(3);
  options.seconds_per_round = 0.03;
  // 1 ms and 2 ms units: troupe's side twice as fast.
  auto c = CompareAlternated(SpinLoop(0.001), SpinLoop(0.002), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->ratio, 2.0, 0.2);
  EXPECT_NEAR(c->troupe.median, 1000, 100);
  EXPECT_NEAR(c->peer.median, 500, 50);
}

// A side whose rounds scatter +-20% around a true rate of 100 units/s, with
// every 7th round a 3x outlier in its favour (a moment with the machine to
// itself); deterministic (a golden-ratio sequence, not a random generator).
Side Noisy() {
  return [k = 0](const Round& round) mutable -> absl::StatusOr<double> {
    if (round.warmup) return 1e9;  // warm-ups are discarded, whatever they say
    const int i = k++;
    if (i % 7 == 6) return 300.0;
    return 100 * (0.8 + 0.4 * std::fmod(i * 0.6180339887498949, 1.0));
  };
}

TEST(ProtocolTest, ANoisySideDoesNotWinByBeingNoisy) {
  // Both sides' true rate is 100 units/s.
  auto c = CompareAlternated(Noisy(), Steady(100), Options(21));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->ratio, 1.0, 0.03);
  EXPECT_EQ(c->troupe.max, 300);
  EXPECT_EQ(c->troupe.min, 80);
  // A best-of of the same rounds would credit the noise: 3x.
  EXPECT_NEAR(c->troupe.max / c->peer.max, 3.0, 1e-9);
  // And so would the mean.
  double sum = 0;
  for (double r : c->troupe.rates) sum += r;
  EXPECT_GT(sum / c->troupe.rates.size() / c->peer.median, 1.2);
  // The same from the peer's side: a noisy peer does not win either.
  auto reversed = CompareAlternated(Steady(100), Noisy(), Options(21));
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_NEAR(reversed->ratio, 1.0, 0.03);
  EXPECT_NEAR(reversed->troupe.max / reversed->peer.max, 1.0 / 3, 1e-9);
}

TEST(ProtocolTest, RoundsAlternateTroupeFirstAfterTheWarmUpsWhichAreDiscarded) {
  std::vector<std::string> calls;
  const auto side = [&](const char* name, double warm, double measured) -> Side {
    return [&calls, name, warm, measured](const Round& round) -> absl::StatusOr<double> {
      calls.push_back(absl::StrCat(name, round.warmup ? " warm-up " : " ", round.index, " ", round.seconds, "s ",
                                   round.threads, "t"));
      return round.warmup ? warm : measured + round.index;
    };
  };
  ProtocolOptions options = Options(3, /*warmup_rounds=*/2);
  options.seconds_per_round = 1.5;
  // Warm-ups that would dominate any figure they entered.
  auto c = CompareAlternated(side("troupe", 1e9, 10), side("peer", 1e-9, 20), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(calls, ElementsAre("troupe warm-up 0 1.5s 2t", "peer warm-up 0 1.5s 2t", "troupe warm-up 1 1.5s 2t",
                                 "peer warm-up 1 1.5s 2t", "troupe 0 1.5s 2t", "peer 0 1.5s 2t", "troupe 1 1.5s 2t",
                                 "peer 1 1.5s 2t", "troupe 2 1.5s 2t", "peer 2 1.5s 2t"));
  EXPECT_THAT(c->troupe.rates, ElementsAre(10, 11, 12));
  EXPECT_THAT(c->peer.rates, ElementsAre(20, 21, 22));
  EXPECT_EQ(c->troupe.median, 11);
  EXPECT_EQ(c->peer.median, 21);
  EXPECT_DOUBLE_EQ(c->ratio, 11.0 / 21);
  EXPECT_EQ(c->warmup_rounds, 2);
}

TEST(ProtocolTest, BadArgumentsAreRefusedBeforeAnySideRuns) {
  int calls = 0;
  const Side counted = [&](const Round&) -> absl::StatusOr<double> {
    ++calls;
    return 1.0;
  };
  auto zero = CompareAlternated(counted, counted, Options(0));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("rounds (0) must be >= 1"));
  EXPECT_EQ(CompareAlternated(counted, counted, Options(5, -1)).status().code(), absl::StatusCode::kInvalidArgument);
  ProtocolOptions no_time = Options(5);
  no_time.seconds_per_round = 0;
  EXPECT_EQ(CompareAlternated(counted, counted, no_time).status().code(), absl::StatusCode::kInvalidArgument);
  ProtocolOptions no_threads = Options(5);
  no_threads.threads.count = 0;
  EXPECT_EQ(CompareAlternated(counted, counted, no_threads).status().code(), absl::StatusCode::kInvalidArgument);
  auto no_peer = CompareAlternated(counted, Side(), Options(5));
  EXPECT_EQ(no_peer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_peer.status().message(), HasSubstr("no peer side"));
  EXPECT_EQ(calls, 0);
}

TEST(ProtocolTest, ASideThatFailsStopsTheProtocolNamingTheSideAndRound) {
  int troupe_calls = 0;
  const Side troupe = [&](const Round&) -> absl::StatusOr<double> {
    ++troupe_calls;
    return 1.0;
  };
  const Side absent = [](const Round&) -> absl::StatusOr<double> {
    return absl::UnavailableError("jax not installed");
  };
  auto c = CompareAlternated(troupe, absent, Options(5));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("the peer side's warm-up round 1 of 1: jax not installed"));
  EXPECT_EQ(troupe_calls, 1);
  // A rate of 0 (or NaN) is no measurement.
  auto zero = CompareAlternated(troupe, Steady(0), Options(5, 0));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(zero.status().message(), HasSubstr("the peer side's round 1 of 5 measured a rate of 0"));
  EXPECT_EQ(CompareAlternated(Steady(std::nan("")), troupe, Options(5)).status().code(), absl::StatusCode::kInternal);
}

TEST(ProtocolTest, TheMedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  const SideRates s = Summarize({4, 1, 3, 2});
  EXPECT_THAT(s.rates, ElementsAre(4, 1, 3, 2));  // in the order they ran
  EXPECT_EQ(s.median, 2.5);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 4);
}

TEST(ProtocolTest, TheLabelStatesTheProtocolAndTheThreadsOfBoth) {
  auto c = CompareAlternated(Steady(3), Steady(2), Options(5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Describe(), "5 alternated rounds of at least 2 s and 4 steps after 1 warm-up, median [min-max], both 2 threads unpinned");
  ProtocolOptions pinned = Options(1, 0);
  pinned.seconds_per_round = 0.5;
  pinned.threads = {.count = 1, .pinned_cpus = "0"};
  c = CompareAlternated(Steady(3), Steady(2), pinned);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Describe(), "1 alternated round of at least 0.5 s and 4 steps, median [min-max], both 1 thread pinned to CPUs 0");
}

}  // namespace
}  // namespace troupe::bench
