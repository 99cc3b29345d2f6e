#include "common/build_tree.h"
#include "launch/sweep_local.h"

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/generations.h"
#include "common/processes.h"
#include "common/run_layout.h"
#include "gan/fid.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/sweep_summary.h"
#include "launch/sweep_test_util.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using e2e::Read;
using testing::ReadCsv;
using testing::TempDir;
using testing::TinyGanConfig;
using testing::TinyRlSweep;
using testing::ToDouble;
using testing::Write;

TEST(RunSweepTest, AStoppedSweepEndsWhileRunsWereStillToStart) {
  TempDir dir;
  // RL, so that preparing trains nothing; runs that sleep until stopped.
  auto plan = PlanSweep(TinyRlSweep(dir.path(), /*seeds=*/2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->runs.size(), 4u);
  std::atomic<bool> stop{false};
  std::vector<std::string> lines;
  absl::Mutex mutex;
  auto sweep = std::async(std::launch::async, [&] {
    return RunSweep(*plan, /*parallel=*/1, {"/bin/sh", "-c", "exec sleep 60", "sh"}, &stop, [&](const std::string& l) {
      absl::MutexLock lock(&mutex);
      lines.push_back(l);
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  // Ends once its one running run has stopped, though three never started.
  ASSERT_EQ(sweep.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "the sweep did not end";
  const absl::Status status = sweep.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  absl::MutexLock lock(&mutex);
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("stopped " + plan->runs[0].name)));
  for (size_t i = 1; i < plan->runs.size(); ++i) {
    EXPECT_THAT(lines, ::testing::Not(::testing::Contains(HasSubstr(plan->runs[i].name + " (pid"))));
  }
}

// The real `troupe sweep` on a tiny GAN: 2 grid points x 2 seeds, killed
// mid-way, rerun; the summary against the runs' own eval.csv.
class SweepEndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    gan::FidClassifier::Options options;
    options.checkpoint = dir_->path() + "/classifier.ckpt";
    options.train.epochs = 1;
    options.train_images = 3000;
    auto classifier = gan::FidClassifier::LoadOrTrain(options);
    ASSERT_TRUE(classifier.ok()) << classifier.status();
  }
  static void TearDownTestSuite() { delete dir_; }

  // Starts the sweep in its own process group; output in `log`.
  static pid_t StartSweep(const std::string& sweep_dir, const std::string& log) {
    const std::string config = dir_->path() + "/tiny.textproto";
    Write(config, TinyGanConfig(dir_->path() + "/runs", dir_->path() + "/classifier.ckpt"));
    return e2e::Start(TROUPE_BINARY,
                      {"sweep", config, "--grid", "gan.batch_size=16,32", "--seeds", "2", "--parallel", "2",
                       "--cores", "2", "--dir", sweep_dir},
                      log);
  }
  static inline TempDir* dir_ = nullptr;
};

TEST_F(SweepEndToEndTest, ResumesAfterAKillAndSummarizesTheRunsOwnCsvs) {
  const std::string sweep_dir = dir_->path() + "/sweep";
  const std::string log1 = dir_->path() + "/sweep1.log", log2 = dir_->path() + "/sweep2.log";
  std::vector<std::string> runs;
  {
    SweepOptions options;
    options.config_path = dir_->path() + "/tiny.textproto";
    Write(options.config_path, TinyGanConfig(dir_->path() + "/runs", dir_->path() + "/classifier.ckpt"));
    options.grid = *ParseGrid({"gan.batch_size=16,32"});
    options.seeds = 2;
    options.sweep_dir = sweep_dir;
    auto plan = PlanSweep(options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const SweepRun& run : plan->runs) runs.push_back(run.run_dir);
  }
  ASSERT_EQ(runs.size(), 4u);

  // First attempt: killed (SIGKILL, sweep and runs alike) once a run is done
  // and another is past a checkpoint but not done.
  const pid_t first = StartSweep(sweep_dir, log1);
  auto done = [&](const std::string& run) { return fs::exists(run + "/done"); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool mid_way = false;
  while (!mid_way && std::chrono::steady_clock::now() < deadline) {
    int finished = 0, checkpointed = 0;
    for (const std::string& run : runs) {
      finished += done(run);
      checkpointed += !done(run) && !RunLayout(run).NewestCheckpoint(/*gan=*/true).empty();
    }
    mid_way = finished >= 1 && checkpointed >= 1;
    if (!mid_way) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-first, SIGKILL);
  int status = 0;
  waitpid(first, &status, 0);
  ASSERT_TRUE(mid_way) << Read(log1);
  std::map<std::string, std::string> finished_logs;
  std::vector<std::string> resumable;
  for (const std::string& run : runs) {
    if (done(run)) {
      finished_logs[run] = Read(run + "/log.txt") + Read(RunLayout(run).metrics_csv());
    } else if (!RunLayout(run).NewestCheckpoint(/*gan=*/true).empty()) {
      resumable.push_back(run);
    }
  }
  ASSERT_LT(finished_logs.size(), runs.size()) << "the sweep was not killed mid-way";
  ASSERT_FALSE(resumable.empty());

  // Second attempt: finishes; the runs done before are not rerun, the
  // checkpointed ones resume.
  const pid_t second = StartSweep(sweep_dir, log2);
  waitpid(second, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Read(log2);
  for (const std::string& run : runs) EXPECT_TRUE(done(run)) << run << "\n" << Read(run + "/log.txt");
  for (const auto& [run, before] : finished_logs) {
    EXPECT_EQ(Read(run + "/log.txt") + Read(RunLayout(run).metrics_csv()), before) << run << " was rerun";
    EXPECT_THAT(Read(log2), HasSubstr("skip " + fs::path(run).filename().string() + ": done"));
  }
  for (const std::string& run : resumable) {
    EXPECT_THAT(Read(run + "/log.txt"), HasSubstr("resuming from its checkpoint")) << run;
    const RunCurve curve = ReadRunCurve(run);
    ASSERT_FALSE(curve.x.empty());
    EXPECT_EQ(curve.x.back(), 6400) << run;
  }

  // The summary against each run's own eval.csv: per point the mean and
  // spread over its 2 seeds of the final and the best FID.
  const auto rows = ReadCsv(sweep_dir + "/summary.csv");
  ASSERT_EQ(rows.size(), 2u) << Read(sweep_dir + "/summary.csv");
  for (size_t p = 0; p < 2; ++p) {
    std::vector<double> finals, bests;
    for (int seed = 0; seed < 2; ++seed) {
      std::ifstream in(RunLayout(runs[2 * p + seed]).eval_csv());
      std::string line;
      std::getline(in, line);
      // Rows (images, FID); a resumed run's re-evaluated images: the later row.
      std::vector<std::pair<double, double>> rows;
      while (std::getline(in, line)) {
        const std::vector<std::string> cells = absl::StrSplit(line, ',');
        const double images = ToDouble(cells[0]);
        while (!rows.empty() && rows.back().first >= images) rows.pop_back();
        rows.emplace_back(images, ToDouble(cells[2]));
      }
      ASSERT_FALSE(rows.empty());
      double best = INFINITY;
      for (const auto& row : rows) best = std::min(best, row.second);
      finals.push_back(rows.back().second);
      bests.push_back(best);
    }
    const auto& row = rows[p];
    EXPECT_EQ(row.at("done"), "2");
    EXPECT_NEAR(ToDouble(row.at("classifier_fid_final_mean")), (finals[0] + finals[1]) / 2, 1e-3);
    EXPECT_NEAR(ToDouble(row.at("classifier_fid_final_std")), std::abs(finals[0] - finals[1]) / std::sqrt(2.0), 1e-3);
    EXPECT_NEAR(ToDouble(row.at("classifier_fid_best_mean")), (bests[0] + bests[1]) / 2, 1e-3);
    EXPECT_NEAR(ToDouble(row.at("classifier_fid_best_std")), std::abs(bests[0] - bests[1]) / std::sqrt(2.0), 1e-3);
  }
  EXPECT_EQ(rows[1].at("gan.batch_size"), "32");
  EXPECT_TRUE(fs::exists(sweep_dir + "/curves.png"));
  EXPECT_THAT(Read(sweep_dir + "/summary.md"), HasSubstr("| gan.batch_size=32 | 2/2 |"));
}

}  // namespace
}  // namespace troupe::launch
