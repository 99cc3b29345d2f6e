#include "learner/evaluator_thread.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agents/policies.h"
#include "common/config.h"
#include "common/test_dir.h"
#include "envs/env.h"
#include "gtest/gtest.h"
#include "learner/run_log.h"

namespace troupe::learner {
namespace {

namespace fs = std::filesystem;

class EvaluatorThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("evaluator_thread_");
    // A short state task, one episode, no video: an evaluation takes well
    // under a second.
    ASSERT_TRUE(ParseTextConfig("env { task: \"cartpole.swingup\" observation: STATE action_repeat: 8 }\n"
                                "d4pg { hidden: [16, 16] }\n"
                                "evaluator { every_frames: 1000 episodes: 1 record_video: false }\n"
                                "tensorboard: false\n",
                                "test", &config_)
                    .ok());
    const absl::StatusOr<envs::EnvSpec> env = envs::DescribeEnv(config_.env());
    ASSERT_TRUE(env.ok()) << env.status();
    spec_ = agents::ObservationSpecOf(*env);
    action_size_ = env->action_size;
    absl::StatusOr<std::unique_ptr<agents::Policy>> policy = agents::CreatePolicy(config_, spec_, action_size_);
    ASSERT_TRUE(policy.ok()) << policy.status();
    parameters_ = (*policy)->DownloadParameters();
  }

  // An evaluator writing each result into `log`, and counting them.
  std::unique_ptr<EvaluatorThread> Make(LearnerRunLog* log) {
    absl::StatusOr<std::unique_ptr<EvaluatorThread>> evaluator = EvaluatorThread::Create(
        config_, spec_, action_size_, log->layout(), /*publisher=*/nullptr, nullptr,
        [this, log](int64_t frames, int64_t updates, const actors::Evaluation& evaluation) {
          log->AppendEvaluation({.frames = frames,
                                 .updates = updates,
                                 .eval_return = evaluation.mean_return,
                                 .actions_at_bound = evaluation.actions_at_bound});
          absl::MutexLock lock(&mutex_);
          ++results_;
        });
    EXPECT_TRUE(evaluator.ok()) << evaluator.status();
    return evaluator.ok() ? std::move(*evaluator) : nullptr;
  }
  int results() {
    absl::MutexLock lock(&mutex_);
    return results_;
  }

  std::string dir_;
  config::ExperimentConfig config_;
  agents::ObservationSpec spec_;
  int action_size_ = 0;
  std::vector<float> parameters_;
  absl::Mutex mutex_;
  int results_ = 0;
};

TEST_F(EvaluatorThreadTest, EvaluatesWhenDueAndWritesTheEvalRow) {
  LearnerRunLog log(config_, dir_, /*agent_columns=*/{});
  std::unique_ptr<EvaluatorThread> evaluator = Make(&log);
  ASSERT_NE(evaluator, nullptr);
  EXPECT_EQ(evaluator->next_due(), 1000);
  EXPECT_FALSE(evaluator->MaybeStart(999, 5, parameters_)) << "not due yet";
  EXPECT_TRUE(evaluator->MaybeStart(1200, 12, parameters_));
  evaluator->Wait();
  EXPECT_EQ(results(), 1);
  // The next one is due at the next multiple of every_frames.
  EXPECT_EQ(evaluator->next_due(), 2000);
  EXPECT_FALSE(evaluator->MaybeStart(1900, 19, parameters_));
  EXPECT_TRUE(evaluator->MaybeStart(1900, 19, parameters_, /*force=*/true));
  evaluator->Wait();
  const absl::StatusOr<CsvTable> evals = ReadCsvTable(log.layout().eval_csv());
  ASSERT_TRUE(evals.ok()) << evals.status();
  EXPECT_EQ(evals->Column("frames"), (std::vector<double>{1200, 1900}));
  EXPECT_EQ(evals->Column("updates"), (std::vector<double>{12, 19}));
  for (const double value : evals->Column("eval_return")) EXPECT_TRUE(std::isfinite(value));
  for (const double share : evals->Column("actions_at_bound")) {
    EXPECT_GE(share, 0);
    EXPECT_LE(share, 1);
  }
}

TEST_F(EvaluatorThreadTest, AResumedRunKeepsTheGridAndEveryFramesZeroNeverEvaluates) {
  LearnerRunLog log(config_, dir_, /*agent_columns=*/{});
  std::unique_ptr<EvaluatorThread> evaluator = Make(&log);
  ASSERT_NE(evaluator, nullptr);
  evaluator->ScheduleAfter(3500);  // the last evaluation kept was at 3500
  EXPECT_EQ(evaluator->next_due(), 4000);

  config_.mutable_evaluator()->set_every_frames(0);
  std::unique_ptr<EvaluatorThread> never = Make(&log);
  ASSERT_NE(never, nullptr);
  EXPECT_FALSE(never->MaybeStart(1'000'000, 5, parameters_));
  EXPECT_FALSE(never->MaybeStart(1'000'000, 5, parameters_, /*force=*/true));
  never->Wait();
  EXPECT_EQ(results(), 0);
}

TEST_F(EvaluatorThreadTest, ParametersOfAnotherPolicyAreSaidAndWriteNoRow) {
  LearnerRunLog log(config_, dir_, /*agent_columns=*/{});
  std::unique_ptr<EvaluatorThread> evaluator = Make(&log);
  ASSERT_NE(evaluator, nullptr);
  EXPECT_TRUE(evaluator->MaybeStart(1000, 1, std::vector<float>(3, 0.0f)));
  evaluator->Wait();
  EXPECT_EQ(results(), 0);
  EXPECT_FALSE(fs::exists(log.layout().eval_csv()));
}

}  // namespace
}  // namespace troupe::learner
