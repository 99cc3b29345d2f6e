#include "learner/run_log.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/files.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace troupe::learner {
namespace {

namespace fs = std::filesystem;

// The agent's own metrics columns (D4PG's).
const std::vector<std::string> kAgentColumns = {"critic_loss", "actor_loss", "q_mean"};

class LearnerRunLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("learner_run_log_");
    config_.mutable_env()->set_task("cartpole.swingup");
    config_.set_tensorboard(false);
  }
  // A run that wrote metrics rows every 1000 frames to 4000 (10 s apart)
  // and evaluated at 2000 and 4000, each with its video.
  void WriteRun() {
    LearnerRunLog log(config_, dir_, kAgentColumns);
    for (int64_t frames = 1000; frames <= 4000; frames += 1000) {
      log.AppendMetrics({.seconds = frames / 100.0, .frames = frames, .updates = frames / 10});
    }
    fs::create_directories(log.layout().videos());
    for (int64_t frames : {2000, 4000}) {
      log.AppendEvaluation({.frames = frames, .updates = frames / 10, .eval_return = frames / 100.0});
      std::ofstream(log.layout().eval_video(frames)) << "mp4";
    }
  }
  config::ExperimentConfig config_;
  std::string dir_;
};

TEST_F(LearnerRunLogTest, WritesMetricsRowsAndEvaluationsWithTheCurve) {
  WriteRun();
  const RunLayout run(dir_);
  const absl::StatusOr<CsvTable> metrics = ReadCsvTable(run.metrics_csv());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->Column("frames"), (std::vector<double>{1000, 2000, 3000, 4000}));
  EXPECT_EQ(metrics->Column("updates"), (std::vector<double>{100, 200, 300, 400}));
  const std::string jsonl = ReadFile(run.metrics_jsonl()).value_or("");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 4);
  const absl::StatusOr<CsvTable> evals = ReadCsvTable(run.eval_csv());
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->header, (std::vector<std::string>{"frames", "updates", "eval_return", "actions_at_bound"}));
  EXPECT_EQ(evals->Column("eval_return"), (std::vector<double>{20, 40}));
  EXPECT_GT(fs::file_size(run.learning_curve()), 0u);
  // No event file without config `tensorboard`.
  LearnerRunLog quiet(config_, dir_, kAgentColumns);
  quiet.OpenEventFile(0);
  EXPECT_FALSE(quiet.has_event_file());
}

TEST_F(LearnerRunLogTest, ResumeCutsRowsAndVideosPastTheCheckpointAndKeepsTheCurveAndClock) {
  WriteRun();
  const RunLayout run(dir_);
  LearnerRunLog log(config_, dir_, kAgentColumns);
  const absl::StatusOr<LearnerRunLog::Resumed> resumed = log.Resume(3000);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->metrics_dropped, 1u);
  EXPECT_EQ(resumed->evaluations_dropped, 1u);
  EXPECT_EQ(resumed->last_eval_frames, 2000);
  EXPECT_EQ(resumed->last_eval_return, 20);
  EXPECT_TRUE(fs::exists(run.eval_video(2000)));
  EXPECT_FALSE(fs::exists(run.eval_video(4000))) << "its evaluation is made again";
  // The clock goes on from the last row written (40 s), the lost piece
  // after the checkpoint included.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - resumed->start).count();
  EXPECT_GE(seconds, 40.0);
  EXPECT_LT(seconds, 50.0);
  const absl::StatusOr<CsvTable> metrics = ReadCsvTable(run.metrics_csv());
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->Column("frames"), (std::vector<double>{1000, 2000, 3000}));
  const std::string jsonl = ReadFile(run.metrics_jsonl()).value_or("");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 3);
  // The curve goes on from the evaluations kept.
  log.AppendEvaluation({.frames = 4000, .updates = 400, .eval_return = 50});
  const absl::StatusOr<CsvTable> evals = ReadCsvTable(run.eval_csv());
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->Column("frames"), (std::vector<double>{2000, 4000}));
  EXPECT_EQ(evals->Column("eval_return"), (std::vector<double>{20, 50}));
}

TEST_F(LearnerRunLogTest, TheAgentsMetricsAreColumnsAfterThePlatformsOwn) {
  LearnerRunLog log(config_, dir_, {"policy_loss", "entropy"});
  log.AppendMetrics({.seconds = 1, .frames = 1000, .samples_per_insert = 1, .agent = {0.25, -1.5}, .eval_return = 7});
  log.AppendMetrics({.seconds = 2, .frames = 2000});  // no agent values yet: zeros
  const absl::StatusOr<CsvTable> metrics = ReadCsvTable(RunLayout(dir_).metrics_csv());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->header,
            (std::vector<std::string>{"seconds", "frames", "updates", "updates_per_s", "frames_per_s", "replay_size",
                                      "samples_per_insert", "policy_loss", "entropy", "eval_return",
                                      "parameter_version", "input_wait_ms", "frames_uploaded_per_update",
                                      "device_idle_ms"}));
  EXPECT_EQ(metrics->Column("policy_loss"), (std::vector<double>{0.25, 0}));
  EXPECT_EQ(metrics->Column("entropy"), (std::vector<double>{-1.5, 0}));
  EXPECT_EQ(metrics->Column("eval_return"), (std::vector<double>{7, -1}));
}

TEST_F(LearnerRunLogTest, AResumeOntoAnOlderMetricsFileKeepsItsRowsToItsHeader) {
  // A metrics.csv written before input_wait_ms and frames_uploaded_per_update.
  const RunLayout run(dir_);
  std::ofstream(run.metrics_csv())
      << "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,critic_loss,actor_loss,"
         "q_mean,eval_return,parameter_version\n"
      << "5.0,1000,100,10.00,100.0,1000,0.000,1.00000,1.00000,1.0000,-1.00,2\n"
      << "9.0,2000,200,10.00,100.0,2000,0.000,1.00000,1.00000,1.0000,-1.00,3\n";
  LearnerRunLog log(config_, dir_, kAgentColumns);
  const absl::StatusOr<LearnerRunLog::Resumed> resumed = log.Resume(1000);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->metrics_dropped, 1u);
  EXPECT_EQ(resumed->last_eval_return, -1) << "no evaluation yet";
  log.AppendMetrics({.seconds = 12, .frames = 2000, .updates = 200, .parameter_version = 4, .input_wait_ms = 3,
                     .frames_uploaded_per_update = 7});
  const absl::StatusOr<CsvTable> metrics = ReadCsvTable(run.metrics_csv());
  ASSERT_TRUE(metrics.ok());
  ASSERT_EQ(metrics->rows.size(), 2u);
  EXPECT_EQ(metrics->rows[1].size(), metrics->header.size()) << "a row of the header's 12 fields";
  EXPECT_EQ(metrics->Column("parameter_version"), (std::vector<double>{2, 4}));
}

}  // namespace
}  // namespace troupe::learner
