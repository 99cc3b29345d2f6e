#include "bench/bench.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::bench {
namespace {

using ::testing::HasSubstr;

// A loop that spins `seconds_per_unit` of this thread's CPU time a unit and
// records where each call started.
struct SpinningLoop {
  double seconds_per_unit = 0.0001;
  std::vector<long> starts;
  long position = 0;
  Loop loop() {
    return [this](long n) {
      starts.push_back(position);
      const double until = ThreadCpuSeconds() + n * seconds_per_unit;
      while (ThreadCpuSeconds() < until) {
      }
      position += n;
      return absl::OkStatus();
    };
  }
};

// Each round runs the loop until its clock has advanced round.seconds, and
// the next round goes on where the last one stopped.
TEST(LoopSideTest, RunsARoundsSecondsAndGoesOnWhereTheLastRoundLeftOff) {
  SpinningLoop spin;
  const Side side = LoopSide(spin.loop(), Clock::kThreadCpu);
  const Round round{.index = 0, .warmup = false, .seconds = 0.02, .threads = 1};
  ASSERT_TRUE(side(round).ok());
  const long after_first = spin.position;
  EXPECT_GE(after_first, 150);  // 0.02 s of 0.1 ms units, less the loop's own time
  const size_t first_calls = spin.starts.size();
  ASSERT_TRUE(side(round).ok());
  ASSERT_GT(spin.starts.size(), first_calls);
  EXPECT_EQ(spin.starts[first_calls], after_first);
  // Chunks grew (doubling) to 1/50 of a round: fewer calls than units.
  EXPECT_LT(spin.starts.size(), size_t(spin.position / 2));
}

// The rate is units per second of the clock, times the scale (envs a batch).
TEST(LoopSideTest, TheRateIsUnitsPerClockSecondTimesTheScale) {
  SpinningLoop spin;
  spin.seconds_per_unit = 0.001;
  const Side side = LoopSide(spin.loop(), Clock::kThreadCpu, /*scale=*/4);
  auto rate = side(Round{.index = 0, .warmup = false, .seconds = 0.05, .threads = 1});
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_NEAR(*rate, 4 * 1000.0, 4 * 1000.0 * 0.25);
}

// A step that outlasts the round is still timed kMinStepsPerRound times (a
// peer's loop times at least as many): one slow step is not a round.
TEST(LoopSideTest, AStepLongerThanTheRoundIsTimedAtLeastTheProtocolsMinimumOfSteps) {
  SpinningLoop spin;
  spin.seconds_per_unit = 0.004;
  const Side side = LoopSide(spin.loop(), Clock::kThreadCpu);
  auto rate = side(Round{.index = 0, .warmup = false, .seconds = 0.001, .threads = 1});
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GE(spin.position, kMinStepsPerRound);
  EXPECT_NEAR(*rate, 250, 250 * 0.25);
}

TEST(MeasureRateTest, AStepLongerThanTheRoundIsTimedAtLeastTheProtocolsMinimumOfSteps) {
  std::vector<long> calls;
  const double rate = MeasureRate(0.001, [&](long n) {
    calls.push_back(n);
    std::this_thread::sleep_for(std::chrono::milliseconds(4 * n));  // MeasureRate reads the wall clock
  });
  ASSERT_FALSE(calls.empty());
  EXPECT_GE(calls.back(), kMinStepsPerRound) << "the rate came from a call of " << calls.back() << " steps";
  // A sleep never ends early but ends late on a loaded machine (6.2 ms for 4
  // ms with three more processes than cores): at most 250 steps/s, and not
  // so far below that a count of the wrong steps (a half, a double) passes.
  EXPECT_LE(rate, 250 * 1.02);
  EXPECT_GE(rate, 250 * 0.55);
}

TEST(LoopSideTest, ReturnsTheLoopsError) {
  int calls = 0;
  const Side side = LoopSide(
      [&](long) { return ++calls == 3 ? absl::InternalError("env 3 blew up") : absl::OkStatus(); }, Clock::kWall);
  auto rate = side(Round{.index = 0, .warmup = false, .seconds = 10, .threads = 1});
  EXPECT_EQ(rate.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(rate.status().message(), HasSubstr("env 3 blew up"));
  EXPECT_EQ(calls, 3);
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
  EXPECT_EQ(f.reference, "JAX, 3 alternated rounds of at least 2 s and 4 steps, median [min-max], both 2 threads unpinned");
  EXPECT_EQ(f.rounds, 3);
  EXPECT_EQ(f.value_min, 30);
  EXPECT_EQ(f.value_max, 32);
  EXPECT_EQ(f.reference_min, 10);
  EXPECT_EQ(f.reference_max, 12);
  // The build that measured it: the commit troupe --version names, and the
  // malloc it ran on (a test binary's is glibc's, or the sanitizer's: only
  // troupe's programs link tcmalloc).
  EXPECT_THAT(report.ToJson(), HasSubstr(absl::StrCat("{\"benchmark\": \"test\", \"build\": \"", BuildCommit(),
                                                      "\", \"allocator\": \"", Allocator(), "\", ")));
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(Allocator(), "glibc");
#endif
  EXPECT_THAT(report.ToJson(),
              HasSubstr("\"reference_value\": 11, \"ratio\": 2.81818, \"rounds\": 3, \"value_min\": 30, "
                        "\"value_max\": 32, \"reference_min\": 10, \"reference_max\": 12}"));
}

// A peer that cannot run here: the row keeps troupe's median and range over
// the same rounds, the reference says "missing", no ratio; troupe's own
// error is returned, never hidden as a missing peer.
TEST(AddComparisonTest, APeerThatCannotRunLeavesTroupesRoundsAndNoRatio) {
  int calls = 0;
  const Side troupe = [&](const Round& r) -> absl::StatusOr<double> {
    ++calls;
    return r.warmup ? 1000.0 : 40.0 + r.index;
  };
  const Side absent = [](const Round&) -> absl::StatusOr<double> {
    return absl::UnavailableError("cannot install torch (offline?)");
  };
  ProtocolOptions options;
  options.rounds = 3;
  options.warmup_rounds = 1;
  options.seconds_per_round = 0.01;
  Report report;
  auto median = AddComparison(report, "step", "samples/s", "PyTorch 2.5 eager", troupe, absent, options);
  ASSERT_TRUE(median.ok()) << median.status();
  EXPECT_EQ(*median, 41);
  ASSERT_EQ(report.figures.size(), 1u);
  const Figure& f = report.figures[0];
  EXPECT_FALSE(f.has_reference());
  EXPECT_TRUE(std::isnan(f.ratio));
  EXPECT_EQ(f.reference, "PyTorch 2.5 eager (missing)");
  EXPECT_EQ(f.value, 41);
  EXPECT_EQ(f.value_min, 40);
  EXPECT_EQ(f.value_max, 42);
  EXPECT_EQ(f.rounds, 3);
  // The protocol's first round (a warm-up) and then troupe's own: 1 + 1 + 3.
  EXPECT_EQ(calls, 5);
  EXPECT_THAT(report.ToJson(), HasSubstr("\"reference_value\": null, \"ratio\": null"));

  const Side broken = [](const Round&) -> absl::StatusOr<double> { return absl::InternalError("arena exhausted"); };
  auto failed = AddComparison(report, "step", "samples/s", "PyTorch 2.5 eager", broken, absent, options);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.status().message(), HasSubstr("the troupe side's warm-up round 1 of 1: arena exhausted"));
  EXPECT_EQ(report.figures.size(), 1u);
}

// The defaults a benchmark measures by: 5 rounds after a warm-up on the
// CPU (3 with --quick), 3 without a warm-up on a GPU (1 with --quick);
// --rounds overrides both.
TEST(AddComparisonTest, DefaultProtocolsAndRoundsOverride) {
  Options options;
  options.seconds_per_figure = 2;
  ProtocolOptions cpu = DefaultProtocol(options, 2);
  EXPECT_EQ(cpu.rounds, 5);
  EXPECT_EQ(cpu.warmup_rounds, 1);
  EXPECT_EQ(cpu.seconds_per_round, 2);
  EXPECT_EQ(cpu.threads.count, 2);
  EXPECT_EQ(GpuProtocol(options).rounds, 3);
  EXPECT_EQ(GpuProtocol(options).warmup_rounds, 0);
  options.quick = true;
  EXPECT_EQ(DefaultProtocol(options, 1).rounds, 3);
  EXPECT_EQ(GpuProtocol(options).rounds, 1);
  options.rounds = 7;
  EXPECT_EQ(DefaultProtocol(options, 1).rounds, 7);
  EXPECT_EQ(GpuProtocol(options).rounds, 7);
}

// A peer round is one run of the peer told the round's threads: a peer that
// cannot be had says why, and a thread count below 1 is refused.
TEST(AddComparisonTest, APeerRoundRefusesNoThreadsAndSaysWhyAPeerIsMissing) {
  EXPECT_EQ(RunPeerOnce(Peer::kPytorch, "torch_drq", 0, "", "samples_per_second").status().code(),
            absl::StatusCode::kInvalidArgument);
  setenv("TROUPE_PYTHON", "/nonexistent/python3", 1);
  auto gpu = RunPeerOnce(Peer::kGpuJax, "jax_drq", 1, "32 84 1 jit cuda float32", "samples_per_second");
  unsetenv("TROUPE_PYTHON");
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(gpu.status().message(), HasSubstr("cannot run the JAX peer on a GPU"));
}

// The JAX peers' device pjrt is told the plugin troupe's side loads by an
// absolute path in the environment they inherit; a path that is no file is
// refused before any peer runs.
TEST(AddComparisonTest, ThePeersPjrtPluginIsAnAbsolutePathToAFile) {
  const std::string dir = ::testing::TempDir();
  const std::string plugin = (std::filesystem::path(dir) / "bench_test_plugin.so").string();
  { std::ofstream(plugin) << "x"; }
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  const absl::Status set = SetPeersPjrtPlugin("bench_test_plugin.so");
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(set.ok()) << set;
  EXPECT_EQ(std::string(std::getenv("TROUPE_PJRT_PLUGIN")), std::filesystem::absolute(plugin).string());
  for (const std::string& bad : {std::string(), (std::filesystem::path(dir) / "no_such_plugin.so").string(), dir}) {
    const absl::Status refused = SetPeersPjrtPlugin(bad);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.message(), HasSubstr("'" + bad + "' is no file"));
  }
  unsetenv("TROUPE_PJRT_PLUGIN");
  std::filesystem::remove(plugin);
}

}  // namespace
}  // namespace troupe::bench
