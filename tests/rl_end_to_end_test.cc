// End to end: `troupe run` of a small D4PG experiment from state, with the
// learner (replay embedded) and 2 actor processes over real gRPC on
// loopback; an actor killed with SIGKILL; the learner killed and resumed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/build_tree.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "common/test_dir.h"
#include "common/video.h"
#include "common/processes.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace troupe::e2e;  // Wait, Read, Metrics and its columns

// A small, fast experiment written into `dir`; with `videos`, each
// evaluation's first episode is recorded (the default; the long tests turn it
// off to keep their two cores for training).
std::string WriteConfig(const std::string& dir, int64_t total_frames, bool videos = false,
                        const std::string& learner = "") {
  const std::string path = dir + "/small.textproto";
  std::ofstream(path) << R"(name: "e2e" mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: 4 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [64, 64] v_min: 0 v_max: 200 n_step: 3 actor_learning_rate: 1e-3 critic_learning_rate: 1e-3 }
learner { batch_size: 64 publish_every: 10 min_replay_size: 300 samples_per_insert: 32 checkpoint_every_s: 1 )"
                      << learner << R"( }
actors { count: 2 random_frames: 2000 }
evaluator { every_frames: 4000 episodes: 1 record_video: )"
                      << (videos ? "true" : "false") << " }\nruns_dir: \"" << dir << "/runs\"\ntotal_frames: " << total_frames
                      << "\n";
  return path;
}

// Starts `troupe ARGS...` with its output in `log`; returns its pid.
pid_t Start(const std::vector<std::string>& args, const std::string& log) {
  return e2e::Start(TROUPE_BINARY, args, log);
}

// The folder of a run's newest committed checkpoint generation ("" when none).
std::string NewestCheckpoint(const std::string& run) { return NewestCommittedGeneration(run + "/checkpoints"); }

// The updates a resume log says it restored ("resumed from PATH: N updates").
int64_t ResumedUpdates(const std::string& log) {
  const size_t at = log.find("resumed from ");
  if (at == std::string::npos) return -1;
  const size_t colon = log.find(": ", at);
  return colon == std::string::npos ? -1 : std::stoll(log.substr(colon + 2));
}

std::string OnlyRunDir(const std::string& dir) {
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(dir + "/runs")) runs.push_back(e.path());
  EXPECT_EQ(runs.size(), 1u);
  return runs.empty() ? "" : runs[0].string();
}

// Children of `pid` (the actor processes).
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t child;
  while (in >> child) out.push_back(child);
  return out;
}

// Evaluations (eval.csv rows) fall at the first frames past multiples of
// `every`, at most one per multiple, in order; the last is the final
// policy's, at or past the run's `end` (an extra one where the grid has
// none there).
void ExpectEvaluationsOnTheGrid(const std::vector<std::vector<double>>& evals, int64_t every, int64_t end) {
  ASSERT_GE(evals.size(), 2u);
  int64_t multiple = 0;
  for (size_t i = 0; i + 1 < evals.size(); ++i) {
    EXPECT_GT(int64_t(evals[i][0]) / every, multiple) << "evaluation at " << evals[i][0] << " frames";
    multiple = int64_t(evals[i][0]) / every;
  }
  EXPECT_GT(evals.back()[0], evals[evals.size() - 2][0]);
  EXPECT_GE(evals.back()[0], end);
}

class RlEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("rl_e2e_");
  }
  std::string dir_;
};

TEST_F(RlEndToEndTest, ParametersAdvanceReplayFillsAndTheCriticLossFalls) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/14000, /*videos=*/true);
  const int exit_code = Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/240);
  ASSERT_EQ(exit_code, 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_);
  const auto rows = Metrics(run);
  ASSERT_GE(rows.size(), 3u) << Read(dir_ + "/run.log");
  const auto& last = rows.back();
  EXPECT_GE(last[kFrames], 14000);
  EXPECT_GT(last[kUpdates], 100);
  EXPECT_GT(last[kReplaySize], 300);
  EXPECT_GT(last[kVersion], 10);
  // Critic loss: finite throughout, and lower at the end than early on.
  double first_loss = 0;
  for (const auto& row : rows) {
    ASSERT_TRUE(std::isfinite(row[kCriticLoss]));
    if (first_loss == 0 && row[kCriticLoss] > 0) first_loss = row[kCriticLoss];
  }
  EXPECT_LT(last[kCriticLoss], first_loss);
  // The actors followed the learner's parameter versions.
  for (int i = 0; i < 2; ++i) {
    const std::string log = Read(run + "/logs/actor-" + std::to_string(i) + ".log");
    EXPECT_THAT(log, ::testing::HasSubstr("episode")) << "actor " << i;
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("params v0 "))) << log;
  }
  EXPECT_TRUE(fs::exists(run + "/learning_curve.png"));
  EXPECT_TRUE(fs::exists(NewestCheckpoint(run) + "/agent.ckpt"));
  // Each evaluation's first episode as a video: 1000 control steps at action
  // repeat 4 are 250 agent steps, 251 frames with the reset state, 480x480.
  const auto evals = Metrics(run, kEvalCsvFile);
  ASSERT_FALSE(evals.empty());
  ExpectEvaluationsOnTheGrid(evals, /*every=*/4000, /*end=*/14000);
  for (const auto& eval : evals) {
    const std::string video = run + "/videos/eval-" + std::to_string(int64_t(eval[0])) + ".mp4";
    auto info = troupe::ReadVideoInfo(video);
    ASSERT_TRUE(info.ok()) << info.status() << "\n" << Read(dir_ + "/run.log");
    EXPECT_EQ(info->frames, 251) << video;
    EXPECT_EQ(info->width, 480);
    EXPECT_EQ(info->height, 480);
  }
}

TEST_F(RlEndToEndTest, AKilledActorIsRestartedAndTrainingGoesOn) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/60000);
  const pid_t launcher = Start({"run", config}, dir_ + "/run.log");
  // Wait for both actors, then SIGKILL one of them mid-stream.
  std::vector<pid_t> actors;
  for (int i = 0; i < 300 && actors.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    actors = Children(launcher);
  }
  ASSERT_EQ(actors.size(), 2u);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_EQ(kill(actors[0], SIGKILL), 0);
  const int exit_code = Wait(launcher, /*seconds=*/240);
  ASSERT_EQ(exit_code, 0) << Read(dir_ + "/run.log");
  EXPECT_THAT(Read(dir_ + "/run.log"), ::testing::HasSubstr("actor 0 killed by signal 9; restarted (restart 1 of 10)"));
  // Counters only ever grew, and the run finished its frames.
  const auto rows = Metrics(OnlyRunDir(dir_));
  ASSERT_FALSE(rows.empty());
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GE(rows[i][kFrames], rows[i - 1][kFrames]);
    EXPECT_GE(rows[i][kUpdates], rows[i - 1][kUpdates]);
  }
  EXPECT_GE(rows.back()[kFrames], 60000);
}

// The clean end of a run: its actors stop (their last inserts acknowledged)
// before replay and the learner's port go away, so no writer resumes its
// session or re-sends anything, none loses a transition, and the last
// metrics row and checkpoint count every transition the actors wrote.
// Actors that all fail past actors.max_restarts end the run with an error
// that says so, where the learner would otherwise wait for replay forever.
TEST_F(RlEndToEndTest, EveryActorGoneForGoodEndsTheRunWithAnError) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/10000000);
  // Replay never fills to its minimum: the learner is waiting for it (not
  // blocked in a sample) when the actors go, which must end the wait too.
  const pid_t pid = Start({"run", config, "--set", "actors.max_restarts=0", "--set", "learner.min_replay_size=100000"},
                          dir_ + "/run.log");
  std::vector<pid_t> actors;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (actors.size() < 2 && Clock::now() < deadline) {
    actors = Children(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(actors.size(), 2u) << Read(dir_ + "/run.log");
  for (pid_t actor : actors) kill(actor, SIGKILL);
  EXPECT_NE(Wait(pid, /*seconds=*/60), 0) << "the run ends, failed";
  EXPECT_THAT(Read(dir_ + "/run.log"), ::testing::HasSubstr("every actor failed with its restarts spent (actors.max_restarts 0)"))
      << Read(dir_ + "/run.log");
}

// A run that ended (`log`, its output) stopped its actors cleanly: none
// killed, no insert stream resumed, nothing re-sent or lost, and every
// transition the actors wrote counted in replay's frames (action_repeat 4)
// at the end and in the final checkpoint.
void ExpectTheActorsStoppedWithEveryTransitionCounted(const std::string& run, const std::string& log) {
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("resumed its session"))) << log;
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("re-sent"))) << log;
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("after its stop signal; killed"))) << log;
  int64_t written = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string actor_log = Read(run + "/logs/actor-" + std::to_string(i) + ".log");
    EXPECT_THAT(actor_log, ::testing::Not(::testing::HasSubstr("replay unavailable"))) << actor_log;
    // "actor I: ... N transitions written, M lost (...)", its last line.
    const size_t at = actor_log.rfind(" transitions written, ");
    ASSERT_NE(at, std::string::npos) << actor_log;
    written += std::stoll(actor_log.substr(actor_log.rfind(", ", at - 1) + 2));
    EXPECT_EQ(std::stoll(actor_log.substr(at + 22)), 0) << "transitions lost by actor " << i << ":\n" << actor_log;
  }
  // Replay's inserts, in frames (action_repeat 4), at the end and in the
  // final checkpoint.
  const auto rows = Metrics(run);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(int64_t(rows.back()[kFrames]), written * 4) << log;
  EXPECT_THAT(Read(NewestCheckpoint(run) + "/" + kCountersFile),
              ::testing::StartsWith("frames " + std::to_string(written * 4) + "\n"));
}

TEST_F(RlEndToEndTest, ACleanEndStopsTheActorsBeforeReplaySoNothingIsResumedOrLost) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/5000);
  ASSERT_EQ(Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/120), 0) << Read(dir_ + "/run.log");
  ExpectTheActorsStoppedWithEveryTransitionCounted(OnlyRunDir(dir_), Read(dir_ + "/run.log"));
}

// A stop request while the rate limiter holds the actors back and the
// learner is inside a long Train: at a million samples per insert, once
// replay has its 300 items each further insert waits for 15,625 updates
// (seconds), so an actor always has items waiting in its writer, and with
// 100,000 updates between publishes the learner sees the stop only a minute
// later. Replay lets the actors' items in at once at the stop, and they end
// well within their deadline, nothing killed or lost. (Before, they waited
// for the learner's samples and were killed at the deadline with those
// items unsent.)
TEST_F(RlEndToEndTest, AStopWhileTheRateLimiterHoldsTheActorsLetsTheirLastInsertsIn) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/1000000);
  const std::string log = dir_ + "/run.log";
  const pid_t pid = Start({"run", config, "--set", "learner.samples_per_insert=1000000", "--set",
                           "learner.publish_every=100000"}, log);
  // Replay at its 300 items (training under way: the status line's updates
  // show only at the end of a Train).
  ASSERT_NE(AwaitMatch(log, "replay (3[0-9][0-9]) ", 120), "") << Read(log);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto stopped = Clock::now();
  kill(pid, SIGINT);
  ASSERT_EQ(Wait(pid, /*seconds=*/120), 0) << Read(log);
  EXPECT_LT(Clock::now() - stopped, std::chrono::seconds(30)) << "the stop waited for the learner's Train";
  ExpectTheActorsStoppedWithEveryTransitionCounted(OnlyRunDir(dir_), Read(log));
}

// An agent written against agents/policy.h and agents/agent.h only (RANDOM,
// agents/random_agent.h) runs through every part: actors explore with it,
// replay fills and is sampled, the evaluator scores it, checkpoints commit
// and resume, and the viewer records its policy from the run's checkpoint.
TEST_F(RlEndToEndTest, TheRandomAgentRunsThroughActorsReplayEvaluatorCheckpointsAndTheViewer) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/6000);
  std::ofstream(config, std::ios::app) << "agent: RANDOM\n";
  ASSERT_EQ(Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/120), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_);
  const auto rows = Metrics(run);
  ASSERT_FALSE(rows.empty()) << Read(dir_ + "/run.log");
  EXPECT_GE(rows.back()[kFrames], 6000);
  EXPECT_GT(rows.back()[kUpdates], 10) << "the learner sampled replay";
  EXPECT_GT(rows.back()[kReplaySize], 300);
  // No metrics of its own: the platform's columns alone.
  const std::string header = Read(run + "/metrics.csv").substr(0, Read(run + "/metrics.csv").find('\n'));
  EXPECT_EQ(header, "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,eval_return,"
                    "parameter_version,input_wait_ms,frames_uploaded_per_update,device_idle_ms");
  // An episode's line says the actor's exploration (an actor that started
  // late under load may have finished none).
  const std::string actor_logs = Read(run + "/logs/actor-0.log") + Read(run + "/logs/actor-1.log");
  EXPECT_THAT(actor_logs, ::testing::HasSubstr("episode 1 return")) << actor_logs;
  EXPECT_THAT(actor_logs, ::testing::HasSubstr("uniform random")) << actor_logs;
  EXPECT_THAT(actor_logs, ::testing::Not(::testing::HasSubstr("noise"))) << actor_logs;
  const auto evals = Metrics(run, kEvalCsvFile);
  ASSERT_FALSE(evals.empty());
  ExpectEvaluationsOnTheGrid(evals, /*every=*/4000, /*end=*/6000);
  const std::string checkpoint = NewestCheckpoint(run);
  ASSERT_TRUE(fs::exists(checkpoint + "/agent.ckpt"));

  // Resumed: its updates restored, and on to more frames.
  ASSERT_EQ(Wait(Start({"run", "--resume", run, "--set", "total_frames=9000"}, dir_ + "/resume.log"), 120), 0)
      << Read(dir_ + "/resume.log");
  EXPECT_GE(ResumedUpdates(Read(dir_ + "/resume.log")), int64_t(rows.back()[kUpdates]) / 2)
      << Read(dir_ + "/resume.log");
  EXPECT_GE(Metrics(run).back()[kFrames], 9000);

  // The viewer's policy from the run's checkpoint (one that did not load
  // would stop it): one recorded episode.
  const std::string video = dir_ + "/random.mp4";
  ASSERT_EQ(Wait(Start({"view", run, "--record", video, "--episodes", "1"}, dir_ + "/view.log"), 120), 0)
      << Read(dir_ + "/view.log");
  auto info = ReadVideoInfo(video);
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << Read(dir_ + "/view.log");
  EXPECT_EQ(info->frames, 251) << "a whole episode: 1000 control steps at action repeat 4, and the reset";
}

// APPO over trajectories (agents/appo_agent.h): actors write trajectories
// with their behaviour's log-probabilities to the learner's FIFO queue, the
// learner runs PPO over V-trace advantages, and cartpole.balance is
// learned within 800k frames (measured on 4 seeds: 996-999 by 400-500k, 5 s
// on 2 cores; a random policy scores about 250);
// metrics.csv has APPO's columns; the run resumes from its checkpoint and
// the viewer plays its policy.
TEST_F(RlEndToEndTest, AppoLearnsCartpoleBalanceFromTrajectoriesAndResumes) {
  const std::string config = dir_ + "/appo.textproto";
  // target_kl: without it, 10 epochs a batch at this rate could collapse a
  // policy it had learned (approximate KL 0.03 -> 10, eval 999 -> 245 over
  // the last 40 updates; 2 of 12 runs side by side).
  std::ofstream(config) << R"(name: "appo" mode: RL agent: APPO
env { task: "cartpole.balance" observation: STATE action_repeat: 8 }
pool { num_envs: 4 num_threads: 1 }
appo { hidden: [64, 64] unroll_length: 32 learning_rate: 1e-3 epochs: 10 minibatches: 8 reward_scale: 0.01 target_kl: 0.03 }
learner { batch_size: 32 publish_every: 1 checkpoint_every_s: 5 }
actors { count: 2 }
evaluator { every_frames: 400000 episodes: 2 record_video: false }
total_frames: 800000
runs_dir: ")" << dir_ << "/runs\"\n";
  ASSERT_EQ(Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/300), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_);
  const std::string csv = Read(run + "/metrics.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,policy_loss,value_loss,"
            "entropy,approx_kl,clip_fraction,dropped_stale,policy_lag,epochs,explained_variance,eval_return,"
            "parameter_version,input_wait_ms,frames_uploaded_per_update,device_idle_ms");
  const auto evals = Metrics(run, kEvalCsvFile);
  ASSERT_FALSE(evals.empty()) << Read(dir_ + "/run.log");
  EXPECT_GE(evals.back()[0], 800000);
  EXPECT_GE(evals.back()[2], 800) << "cartpole.balance learned; eval.csv:\n"
                                  << Read(RunLayout(run).eval_csv()) << "metrics.csv:\n" << csv;
  // The value learned to predict its targets while the task was learned
  // (explained variance 0.7-0.85 by 200-450k frames; it falls once the
  // balanced pole's returns are all alike).
  double explained = -1;
  for (const std::vector<double>& row : Metrics(run)) explained = std::max(explained, row[15]);
  EXPECT_GT(explained, 0.5) << csv;
  EXPECT_LE(explained, 1.0) << csv;
  // Each trajectory is used once: samples per insert 1 (trajectories
  // sampled / inserted), and the actors' lines say their exploration.
  const std::vector<double> last = LastMetrics(run);
  EXPECT_GT(last[kUpdates], 50);
  EXPECT_NEAR(last[kSpi], 1.0, 0.05);
  // The learner's frames are the actors' (a trajectory counts its 32 steps).
  const std::string actors = Read(run + "/logs/actor-0.log") + Read(run + "/logs/actor-1.log");
  int64_t actor_frames = 0;
  for (size_t at = actors.find(" frames, "); at != std::string::npos; at = actors.find(" frames, ", at + 1)) {
    actor_frames += std::stoll(actors.substr(actors.rfind(": ", at) + 2));
  }
  EXPECT_LT(actor_frames, 1.3 * last[kFrames]) << actors;
  const std::string actor_log = Read(run + "/logs/actor-0.log");
  EXPECT_THAT(actor_log, ::testing::HasSubstr(" std ")) << actor_log;
  ASSERT_TRUE(fs::exists(NewestCheckpoint(run) + "/agent.ckpt"));

  ASSERT_EQ(Wait(Start({"run", "--resume", run, "--set", "total_frames=850000"}, dir_ + "/resume.log"), 120), 0)
      << Read(dir_ + "/resume.log");
  EXPECT_GT(ResumedUpdates(Read(dir_ + "/resume.log")), 0) << Read(dir_ + "/resume.log");
  EXPECT_GE(LastMetrics(run)[kFrames], 850000);
  const std::string video = dir_ + "/appo.mp4";
  ASSERT_EQ(Wait(Start({"view", run, "--record", video, "--episodes", "1"}, dir_ + "/view.log"), 120), 0)
      << Read(dir_ + "/view.log");
  auto info = ReadVideoInfo(video);
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << Read(dir_ + "/view.log");
  EXPECT_EQ(info->frames, 126) << "a whole episode: 1000 control steps at action repeat 8, and the reset";
}

// APPO from pixels, the whole path: what an actor's policy saw when it
// acted (its env's stacked frames) is what the learner decodes from the
// trajectory's frame references in replay, so with a policy that does not
// move (a learning rate of 1e-12) the learner's log-probability of every
// behaviour action is the actor's own: approximate KL zero to rounding
// (measured 4e-15), no ratio clipped. With each observation's frames taken
// one step late it reads 1.2e-6 (an untrained policy moves little with its
// input, but it does move), a thousand times the bound. 3 envs an actor step
// together, so trajectories of several envs interleave in the writer's
// frame window; trajectories acted on by older parameter versions
// (policy_lag > 0) are among them.
TEST_F(RlEndToEndTest, AppoFromPixelsTheLearnerReadsWhatTheActorsSaw) {
  const std::string config = dir_ + "/appo_pixels.textproto";
  std::ofstream(config) << R"(name: "appo_pixels" mode: RL agent: APPO
env { task: "cartpole.balance" observation: PIXELS render { width: 32 height: 32 } action_repeat: 8 frame_stack: 3 }
pool { num_envs: 3 num_threads: 1 }
appo { hidden: [32, 32] unroll_length: 16 learning_rate: 1e-12 epochs: 1 minibatches: 1 conv_channels: 8 encoder_features: 16 }
learner { batch_size: 6 publish_every: 1 checkpoint_every_s: 60 }
actors { count: 2 }
evaluator { every_frames: 0 episodes: 1 record_video: false }
total_frames: 24000
runs_dir: ")" << dir_ << "/runs\"\n";
  ASSERT_EQ(Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/240), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_);
  const std::string csv = Read(run + "/metrics.csv");
  // APPO's columns (AppoLearnsCartpoleBalanceFromTrajectoriesAndResumes
  // holds the header).
  constexpr int kEntropy = 9, kApproxKl = 10, kClipFraction = 11, kPolicyLag = 13;
  ASSERT_THAT(csv.substr(0, csv.find('\n')), ::testing::HasSubstr(",entropy,approx_kl,clip_fraction,dropped_stale,policy_lag,"));
  double lag = 0;
  int trained = 0;
  for (const std::vector<double>& row : Metrics(run)) {
    if (row[kUpdates] == 0) continue;
    ++trained;
    EXPECT_LT(row[kApproxKl], 1e-9) << "at " << row[kFrames] << " frames; metrics.csv:\n" << csv;
    EXPECT_EQ(row[kClipFraction], 0) << "at " << row[kFrames] << " frames";
    EXPECT_TRUE(std::isfinite(row[kEntropy]));
    lag = std::max(lag, row[kPolicyLag]);
  }
  EXPECT_GT(trained, 0) << csv;
  EXPECT_GT(lag, 0) << "no trajectory acted on by an older version\n" << csv;
}

TEST_F(RlEndToEndTest, AKilledLearnerResumesFromItsCheckpoint) {
  // Replay not checkpointed (APixelRunKilledResumesWithItsReplay has it).
  const std::string config = WriteConfig(dir_, /*total_frames=*/1000000, /*videos=*/false, "checkpoint_replay: false");
  const pid_t launcher = Start({"run", config}, dir_ + "/run.log");
  // Let it train and checkpoint (every second), then SIGKILL the learner.
  std::string run;
  int64_t updates_at_checkpoint = 0;
  for (int i = 0; i < 1200 && updates_at_checkpoint < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (run.empty() && fs::exists(dir_ + "/runs")) run = OnlyRunDir(dir_);
    // The newest checkpoint's own count (its counters hold the agent's
    // updates), once a metrics row was written before it (a row at no more
    // updates than it holds: the resume keeps that row).
    if (!run.empty() && !NewestCheckpoint(run).empty()) {
      const std::string counters = Read(NewestCheckpoint(run) + "/" + kCountersFile);
      const size_t at = counters.find("updates ");
      const auto rows = Metrics(run);
      if (at != std::string::npos && !rows.empty()) {
        const int64_t updates = std::stoll(counters.substr(at + 8));
        if (rows.front()[kUpdates] <= updates) updates_at_checkpoint = updates;
      }
    }
  }
  ASSERT_GE(updates_at_checkpoint, 100) << Read(dir_ + "/run.log");
  kill(launcher, SIGKILL);
  Wait(launcher, 10);
  const std::string counters = Read(NewestCheckpoint(run) + "/" + kCountersFile);
  ASSERT_THAT(counters, ::testing::HasSubstr("frames"));
  const size_t rows_before = Metrics(run).size();
  const double seconds_before_kill = LastRunSeconds(RunLayout(run).metrics_csv());

  // Resume: counters, parameters and optimizer state continue.
  const int exit_code = Wait(Start({"run", "--resume", run, "--set", "total_frames=" +
                                    std::to_string(std::stoll(counters.substr(7)) + 3000)},
                                   dir_ + "/resume.log"),
                             /*seconds=*/240);
  ASSERT_EQ(exit_code, 0) << Read(dir_ + "/resume.log");
  const auto rows = Metrics(run);
  // The learner restored the checkpoint's update count. The checkpoint, made
  // every second, may be behind the last metrics row (a second of updates
  // under load): the rows past it were dropped, and are made again.
  const std::string resume_log = Read(dir_ + "/resume.log");
  const int64_t restored = ResumedUpdates(resume_log);
  EXPECT_GT(restored, 0) << resume_log;
  EXPECT_THAT(resume_log, ::testing::HasSubstr("replay starts empty (learner.checkpoint_replay is off)"));
  const size_t dropped_at = resume_log.find("; ", resume_log.find("replay starts empty"));
  ASSERT_NE(dropped_at, std::string::npos) << resume_log;
  const size_t dropped = std::stoul(resume_log.substr(dropped_at + 2));
  ASSERT_LE(dropped, rows_before) << resume_log;
  const size_t kept = rows_before - dropped;
  ASSERT_GT(kept, 0u) << resume_log;
  ASSERT_GT(rows.size(), kept);
  EXPECT_LE(rows[kept - 1][kUpdates], restored) << resume_log;
  EXPECT_GE(rows[kept][kUpdates], restored) << resume_log;
  // No step back anywhere: frames and updates only grow, row after row, and
  // each evaluation is after the one before.
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GE(rows[i][kFrames], rows[i - 1][kFrames]) << "row " << i;
    EXPECT_GE(rows[i][kUpdates], rows[i - 1][kUpdates]) << "row " << i;
  }
  ExpectEvaluationsOnTheGrid(Metrics(run, kEvalCsvFile), /*every=*/4000, std::stoll(counters.substr(7)) + 3000);
  // Its clock goes on from the last row before the kill, lost piece included.
  EXPECT_GE(rows[kept][kSeconds], seconds_before_kill);
  EXPECT_GE(rows.back()[kFrames], std::stoll(counters.substr(7)) + 3000);
}

// A small pixel experiment (32x32 frames) written into `dir`, with `learner`
// fields added to its learner block.
std::string WritePixelConfig(const std::string& dir, int64_t total_frames, const std::string& learner = "") {
  const std::string path = dir + "/pixels.textproto";
  std::ofstream(path) << R"(name: "pixels" mode: RL
env { task: "cartpole.swingup" observation: PIXELS render { width: 32 height: 32 } action_repeat: 8 frame_stack: 2 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [32, 32] v_max: 800 conv_channels: 8 encoder_features: 16 augment_pad: 2 }
learner { batch_size: 16 publish_every: 5 min_replay_size: 100 samples_per_insert: 4 )"
                      << learner << R"( }
actors { count: 2 random_frames: 400 }
evaluator { every_frames: 2000 episodes: 1 }
runs_dir: ")" << dir << "/runs\"\ntotal_frames: " << total_frames << "\n";
  return path;
}

// A finished run whose last evaluation is not at its end (a run resumed
// before evaluations kept their grid) gets its final policy evaluated when
// it is resumed, and nothing else: no training, no other evaluation.
TEST_F(RlEndToEndTest, AFinishedRunResumedGetsItsMissingFinalEvaluation) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/6000);
  ASSERT_EQ(Wait(Start({"run", config}, dir_ + "/run.log"), /*seconds=*/240), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_);
  auto evals = Metrics(run, kEvalCsvFile);
  ASSERT_GE(evals.size(), 2u);
  const double final_frames = evals.back()[0];
  const int64_t updates = int64_t(LastMetrics(run)[kUpdates]);
  // Drop the final evaluation, as such a run never had it.
  std::string text = Read(RunLayout(run).eval_csv());
  text.erase(text.rfind('\n', text.size() - 2) + 1);
  std::ofstream(RunLayout(run).eval_csv(), std::ios::trunc) << text;
  ASSERT_EQ(Metrics(run, kEvalCsvFile).size(), evals.size() - 1);

  ASSERT_EQ(Wait(Start({"run", "--resume", run}, dir_ + "/resume.log"), /*seconds=*/120), 0)
      << Read(dir_ + "/resume.log");
  evals = Metrics(run, kEvalCsvFile);
  ASSERT_GE(evals.size(), 2u);
  EXPECT_GE(evals.back()[0], 6000);
  EXPECT_GE(evals.back()[0], final_frames);
  EXPECT_EQ(int64_t(evals.back()[1]), updates);  // the same policy: no update since
  EXPECT_EQ(int64_t(LastMetrics(run)[kUpdates]), updates);
}

// The pixel path end to end: frames sent once over gRPC, stacks rebuilt in
// replay, the encoder trained, the policy acting on stacked frames.
TEST_F(RlEndToEndTest, PixelRunTrainsOnStackedFramesFromReplay) {
  const std::string path = WritePixelConfig(dir_, /*total_frames=*/3000);
  const int exit_code = Wait(Start({"run", path}, dir_ + "/run.log"), /*seconds=*/240);
  ASSERT_EQ(exit_code, 0) << Read(dir_ + "/run.log");
  const auto rows = Metrics(OnlyRunDir(dir_));
  ASSERT_FALSE(rows.empty()) << Read(dir_ + "/run.log");
  EXPECT_GE(rows.back()[kFrames], 3000);
  EXPECT_GT(rows.back()[kUpdates], 20);
  EXPECT_TRUE(std::isfinite(rows.back()[kCriticLoss]));
  EXPECT_GT(rows.back()[kCriticLoss], 0);
}

// learner.checkpoint_replay (on by default): a pixel run killed after a
// checkpoint resumes with the transitions it had (its frames stored once,
// compressed), not an empty replay.
TEST_F(RlEndToEndTest, APixelRunKilledResumesWithItsReplay) {
  const std::string path = WritePixelConfig(dir_, /*total_frames=*/1000000, "checkpoint_every_s: 1");
  const pid_t launcher = Start({"run", path}, dir_ + "/run.log");
  std::string run;
  for (int i = 0; i < 1800; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (run.empty() && fs::exists(dir_ + "/runs")) run = OnlyRunDir(dir_);
    if (!run.empty() && !NewestCheckpoint(run).empty() &&
        std::stoll(Read(NewestCheckpoint(run) + "/" + kCountersFile).substr(7)) >= 2000) {
      break;
    }
  }
  ASSERT_FALSE(run.empty()) << Read(dir_ + "/run.log");
  kill(launcher, SIGKILL);
  Wait(launcher, 10);
  const std::string counters = Read(NewestCheckpoint(run) + "/" + kCountersFile);
  const int64_t frames = std::stoll(counters.substr(7));
  ASSERT_GE(frames, 2000) << Read(dir_ + "/run.log");
  // Each transition adds one 32x32x3 frame (3,072 bytes raw); the file holds
  // them compressed, with the items' other fields.
  const int64_t transitions = frames / 8;
  EXPECT_LT(fs::file_size(NewestCheckpoint(run) + "/replay.ckpt"), transitions * 3072);

  const int exit_code = Wait(Start({"run", "--resume", run, "--set", "total_frames=" + std::to_string(frames + 400)},
                                   dir_ + "/resume.log"),
                             /*seconds=*/240);
  ASSERT_EQ(exit_code, 0) << Read(dir_ + "/resume.log");
  const std::string resume_log = Read(dir_ + "/resume.log");
  const size_t at = resume_log.find("replay restored: ");
  ASSERT_NE(at, std::string::npos) << resume_log;
  const int64_t restored = std::stoll(resume_log.substr(at + 17));
  // The checkpoint may be a second behind the counters (replay is written
  // first): most of the transitions, and never more.
  EXPECT_GE(restored, transitions / 2) << resume_log;
  EXPECT_LE(restored, transitions + 2 * 2) << resume_log;
  // The rows after the resume start from that replay, not from empty.
  const auto rows = Metrics(run);
  ASSERT_FALSE(rows.empty());
  EXPECT_GE(rows.back()[kReplaySize], restored);
}

// The compiled step in a real run: D4PG from pixels with its learner on the
// XLA CPU plugin (TROUPE_PJRT_PLUGIN), 4 updates per execution, frames in the
// device frame table, replay and actors as usual. Each Train of 6 updates
// (publish_every) runs one execution of 4 and one of 2: two programs, each
// compiled once and replayed for every execution after. The checkpoint it
// leaves resumes in a CPU learner, which trains on from the restored replay.
TEST_F(RlEndToEndTest, APixelRunOnPjrtWithFourUpdatesPerExecutionTrainsAndResumesOnTheCpu) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !fs::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const std::string path = dir_ + "/pjrt.textproto";
  std::ofstream(path) << R"(name: "pjrt" mode: RL
env { task: "cartpole.swingup" observation: PIXELS render { width: 32 height: 32 } action_repeat: 8 frame_stack: 2 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [32, 32] v_max: 800 conv_channels: 8 encoder_features: 16 augment_pad: 2 }
learner { batch_size: 16 publish_every: 6 min_replay_size: 100 samples_per_insert: 4 updates_per_execution: 4
          device_frame_mib: 64 engine { device: PJRT pjrt_plugin: ")"
                      << plugin << R"(" } }
actors { count: 2 random_frames: 400 }
evaluator { every_frames: 100000 episodes: 1 }
runs_dir: ")" << dir_ << "/runs\"\ntotal_frames: 2400\n";
  ASSERT_EQ(Wait(Start({"run", path}, dir_ + "/run.log"), /*seconds=*/240), 0) << Read(dir_ + "/run.log");
  const std::string log = Read(dir_ + "/run.log");
  // "compiled a step (K kernels", or "loaded (from the on-disk cache) a
  // step (K kernels" where an earlier run compiled it: two programs, of 4
  // updates and of the 2 left of each 6, the one twice the other's kernels.
  const std::regex step_program("(compiled|loaded \\(from the on-disk cache\\)) a step \\((\\d+) kernels");
  std::vector<int64_t> kernels;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), step_program); it != std::sregex_iterator(); ++it) {
    kernels.push_back(std::stoll((*it)[2]));
  }
  std::sort(kernels.begin(), kernels.end());
  ASSERT_EQ(kernels.size(), 2u) << log;
  EXPECT_EQ(kernels[1], 2 * kernels[0]) << log;
  const std::string run = OnlyRunDir(dir_);
  const std::vector<double> last = LastMetrics(run);
  constexpr int kFramesUploadedPerUpdate = kVersion + 2;  // after input_wait_ms
  const int64_t updates = int64_t(last[kUpdates]);
  EXPECT_GE(updates, 24) << log;
  EXPECT_EQ(updates % 6, 0);
  EXPECT_TRUE(std::isfinite(last[kCriticLoss]));
  EXPECT_GT(last[kCriticLoss], 0);
  bool uploaded = false;
  for (const auto& row : Metrics(run)) {
    uploaded |= row.size() > kFramesUploadedPerUpdate && row[kFramesUploadedPerUpdate] > 0;
  }
  EXPECT_TRUE(uploaded) << "no frame went into the device frame table";

  // The same run resumed with its learner on the CPU, one update per
  // execution, for 8 updates more (its frames raised past those it has).
  ASSERT_EQ(Wait(Start({"run", "--resume", run, "--set", "learner.engine.device=CPU", "--set",
                        "learner.engine.pjrt_plugin=", "--set", "learner.updates_per_execution=1", "--set",
                        "total_frames=1000000", "--set", absl::StrCat("learner.max_updates=", updates + 8)},
                       dir_ + "/resume.log"),
                 /*seconds=*/120),
            0)
      << Read(dir_ + "/resume.log");
  const std::string resumed = Read(dir_ + "/resume.log");
  EXPECT_EQ(ResumedUpdates(resumed), updates) << resumed;
  EXPECT_THAT(resumed, ::testing::HasSubstr("replay restored: ")) << resumed;
  const std::vector<double> after = LastMetrics(run);
  EXPECT_GE(int64_t(after[kUpdates]), updates + 8) << resumed;
  EXPECT_TRUE(std::isfinite(after[kCriticLoss]));
}

TEST_F(RlEndToEndTest, BadConfigsFailBeforeAnythingStarts) {
  const std::string path = dir_ + "/bad.textproto";
  std::ofstream(path) << "mode: RL\nenv { task: \"cartpole.flip\" }\n";
  EXPECT_EQ(Wait(Start({"run", path}, dir_ + "/bad.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bad.log"), ::testing::HasSubstr("unknown task 'cartpole.flip'"));
  std::ofstream(path) << "mode: RL\nlearner { batch_size: \"big\" }\n";
  EXPECT_EQ(Wait(Start({"run", path}, dir_ + "/bad.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bad.log"), ::testing::HasSubstr("bad.textproto:2:"));
  EXPECT_FALSE(fs::exists(dir_ + "/runs"));
  // A device this machine cannot give (no GPU here; or a build without
  // CUDA), and NCCL on a CPU device: refused saying why, no run directory.
  const std::string runs = "runs_dir: \"" + dir_ + "/runs\"\n";
  std::ofstream(path) << "mode: RL\n" << runs << "learner { engine { device: CUDA } }\n";
  EXPECT_NE(Wait(Start({"run", path}, dir_ + "/bad.log"), 30), 0);
  EXPECT_THAT(Read(dir_ + "/bad.log"), ::testing::AnyOf(::testing::HasSubstr("learner.engine.device CUDA: 1 GPU(s) needed"),
                                                        ::testing::HasSubstr("built without CUDA")));
  std::ofstream(path) << "mode: RL\n" << runs << "learner { engine { collectives: NCCL } }\n";
  EXPECT_EQ(Wait(Start({"run", path}, dir_ + "/bad.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bad.log"), ::testing::HasSubstr("learner.engine.collectives NCCL: NCCL reduces between GPUs"));
  std::ofstream(path) << "mode: RL\n" << runs << "learner { engine { device: TPU } }\n";
  EXPECT_EQ(Wait(Start({"run", path}, dir_ + "/bad.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bad.log"), ::testing::HasSubstr("bad.textproto:3:"));
  EXPECT_FALSE(fs::exists(dir_ + "/runs"));
  // A resume of a directory with no checkpoint.
  EXPECT_NE(Wait(Start({"run", "--resume", dir_}, dir_ + "/bad.log"), 30), 0);
}

// `troupe bench --device`: only the learner and GAN steps (and scaling's)
// run on a device, and one that is not here is refused saying why (no GPU on
// these machines).
TEST_F(RlEndToEndTest, BenchRefusesADeviceItCannotUse) {
  EXPECT_EQ(Wait(Start({"bench", "envs", "--device", "cuda"}, dir_ + "/bench.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bench.log"),
              ::testing::HasSubstr("only the learner, gan and scaling benchmarks run on a device"));
  EXPECT_EQ(Wait(Start({"bench", "scaling", "--device", "pjrt"}, dir_ + "/bench.log"), 30), 2);
  EXPECT_THAT(Read(dir_ + "/bench.log"), ::testing::HasSubstr("only the learner and gan benchmarks run on a PJRT plugin"));
  EXPECT_EQ(Wait(Start({"bench", "scaling", "--device", "cuda", "--quick"}, dir_ + "/bench.log"), 60), 1);
  EXPECT_THAT(Read(dir_ + "/bench.log"), ::testing::AnyOf(::testing::HasSubstr("1 GPU(s) needed, 0 found"),
                                                         ::testing::HasSubstr("built without CUDA")));
  EXPECT_NE(Wait(Start({"bench", "learner", "--device", "tpu"}, dir_ + "/bench.log"), 30), 0);
  EXPECT_THAT(Read(dir_ + "/bench.log"), ::testing::HasSubstr("--device"));
  EXPECT_EQ(Wait(Start({"bench", "learner", "--device", "cuda", "--quick"}, dir_ + "/bench.log"), 60), 1);
  EXPECT_THAT(Read(dir_ + "/bench.log"), ::testing::AnyOf(::testing::HasSubstr("1 GPU(s) needed, 0 found"),
                                                         ::testing::HasSubstr("built without CUDA")));
}

}  // namespace
}  // namespace troupe
