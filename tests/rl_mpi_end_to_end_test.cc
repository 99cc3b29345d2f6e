// End to end, learner replicas over MPI: `mpiexec -np 2 troupe learner` with
// learner.engine.collectives MPI (rank 0 serves replay and parameters, rank 1 samples
// its shard of every batch from rank 0 over gRPC, gradients all-reduced over
// MPI) and 2 `troupe actor` processes on loopback. Checks that training
// happens, the actors follow new parameter versions, losses stay finite, both
// ranks end with bit-identical state, that with Adam's moments split over
// the ranks (shard_state OPTIMIZER) the checkpoints hold them whole, and
// that a rank that dies or stalls ends the job with an error naming it
// instead of hanging.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/build_tree.h"
#include "common/generations.h"
#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/processes.h"
#include "common/run_layout.h"

namespace troupe {
namespace {

// The newest committed checkpoint generation of a run, "" when none.
std::string NewestCheckpoint(const std::string& run_dir) { return NewestCommittedGeneration(run_dir + "/checkpoints"); }

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using namespace troupe::e2e;  // Start, Wait, Stop, Read, AwaitMatch, Metrics and its columns

// A small, fast experiment from state, learner replicas over MPI.
std::string WriteConfig(const std::string& dir, int64_t total_frames, int64_t max_updates = 0,
                        const std::string& engine_extra = "") {
  const std::string path = dir + "/mpi.textproto";
  std::ofstream(path) << R"(name: "mpi" mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: 4 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [64, 64] v_min: 0 v_max: 200 n_step: 3 actor_learning_rate: 1e-3 critic_learning_rate: 1e-3 }
learner { engine { collectives: MPI threads: 1 )" << engine_extra << R"( } batch_size: 64 publish_every: 10 min_replay_size: 300 samples_per_insert: 32
          checkpoint_every_s: 2 max_updates: )" << max_updates << R"( }
actors { count: 2 random_frames: 1000 }
evaluator { every_frames: 4000 episodes: 1 record_video: false }
total_frames: )" << total_frames << "\n";
  return path;
}

// Shared memory between the ranks; 2 ranks on a small machine.
const std::vector<std::pair<std::string, std::string>> kMpiEnv = {{"OMPI_MCA_btl", "self,vader"},
                                                                  {"OMPI_MCA_rmaps_base_oversubscribe", "1"}};

pid_t StartLearners(const std::string& config, const std::string& run_dir, const std::string& log,
                    std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"-np", "2", "--oversubscribe", "--allow-run-as-root", TROUPE_BINARY, "learner",
                                   "--config", config, "--run-dir", run_dir, "--listen", "127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return Start(TROUPE_MPIEXEC, args, log, kMpiEnv);
}

// Each rank's last line: rank -> (updates, state checksum).
std::map<std::string, std::pair<std::string, std::string>> FinalStates(const std::string& log) {
  const std::regex final_line("learner rank (\\d) of 2: (\\d+) updates, state checksum ([0-9a-f]{16})");
  std::map<std::string, std::pair<std::string, std::string>> states;
  for (std::sregex_iterator it(log.begin(), log.end(), final_line), end; it != end; ++it) {
    states[(*it)[1]] = {(*it)[2], (*it)[3]};
  }
  return states;
}

// Both ranks' last lines in `log` say `updates` updates and the same state checksum.
void ExpectRanksAgreeAt(const std::string& log, const std::string& updates) {
  auto final_state = FinalStates(log);
  ASSERT_EQ(final_state.size(), 2u) << log;
  EXPECT_EQ(final_state["0"], final_state["1"]) << log;
  EXPECT_EQ(final_state["0"].first, updates) << log;
}

// The floats of a checkpoint file's entries whose names match `names` (a
// regex: "adam\\.v" Adam's second moments) and how many are zero. The file's
// format (engine/nn/checkpoint.h): "TRPCKPT1" | u32 entries | entries | u64
// checksum, an entry u32 name length | name | u32 rank | i64 dims[rank] |
// f32 data.
bool CountFloats(const std::string& path, const std::string& names, int64_t* floats, int64_t* zeros) {
  const std::regex match(names);
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint32_t entries = 0;
  if (!in.read(magic, 8) || std::string(magic, 8) != "TRPCKPT1" || !in.read(reinterpret_cast<char*>(&entries), 4)) {
    return false;
  }
  for (uint32_t e = 0; e < entries; ++e) {
    uint32_t length = 0, rank = 0;
    if (!in.read(reinterpret_cast<char*>(&length), 4)) return false;
    std::string name(length, '\0');
    if (!in.read(name.data(), length) || !in.read(reinterpret_cast<char*>(&rank), 4)) return false;
    int64_t count = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      int64_t dim = 0;
      if (!in.read(reinterpret_cast<char*>(&dim), 8)) return false;
      count *= dim;
    }
    std::vector<float> values(count);
    if (!in.read(reinterpret_cast<char*>(values.data()), 4 * count)) return false;
    if (!std::regex_search(name, match)) continue;
    *floats += count;
    for (float v : values) *zeros += v == 0.0f;
  }
  return true;
}

class RlMpiEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("rl_mpi_");
    run_dir_ = dir_ + "/run";
  }
  void TearDown() override {
    for (pid_t actor : actors_) Stop(actor);
  }
  // The learner ranks' address from rank 0's first line in `log`; then the actors.
  std::string StartActors(const std::string& config, const std::string& log = "") {
    const std::string address = AwaitMatch(log.empty() ? dir_ + "/learner.log" : log,
                                           "learner rank 0 of 2 serving replay and parameters on (\\S+)", 60);
    if (address.empty()) return "";
    for (int i = 0; i < 2; ++i) {
      actors_.push_back(Start(TROUPE_BINARY,
                              {"actor", "--learner", address, "--config", config, "--index", std::to_string(i)},
                              dir_ + "/actor-" + std::to_string(i) + ".log"));
    }
    return address;
  }
  void KillActors() {
    for (pid_t actor : actors_) kill(-actor, SIGKILL);
    for (pid_t actor : actors_) Wait(actor, 10);
    actors_.clear();
  }
  std::string dir_, run_dir_;
  std::vector<pid_t> actors_;
};

TEST_F(RlMpiEndToEndTest, TwoRanksTrainWithActorsAndEndWithIdenticalState) {
  // Updates, not frames, end it: as long on a slow (sanitizer) build.
  const std::string config = WriteConfig(dir_, /*total_frames=*/1000000000, /*max_updates=*/300);
  const pid_t learners = StartLearners(config, run_dir_, dir_ + "/learner.log");
  ASSERT_NE(StartActors(config), "") << Read(dir_ + "/learner.log");
  const int exit_code = Wait(learners, /*seconds=*/150);
  const std::string log = Read(dir_ + "/learner.log");
  ASSERT_EQ(exit_code, 0) << log;
  EXPECT_THAT(log, HasSubstr("learner rank 1 of 2 (pid "));

  // Both ranks did the same updates and hold bit-identical state.
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgreeAt(log, "300"));

  // Rank 0's metrics: training went on, losses finite, parameters published.
  const auto rows = Metrics(run_dir_);
  ASSERT_FALSE(rows.empty()) << log;
  for (const auto& row : rows) {
    EXPECT_TRUE(std::isfinite(row[kCriticLoss]) && std::isfinite(row[kActorLoss]) && std::isfinite(row[kQ]));
  }
  EXPECT_EQ(rows.back()[kUpdates], 300);
  EXPECT_GT(rows.back()[kFrames], 1000);
  EXPECT_GT(rows.back()[kCriticLoss], 0);
  EXPECT_GT(rows.back()[kVersion], 5);
  EXPECT_TRUE(fs::exists(NewestCheckpoint(run_dir_) + "/agent.ckpt"));
  EXPECT_TRUE(fs::exists(RunLayout(run_dir_).config()));

  // The actors followed newer parameter versions (episode lines, and the
  // line an actor prints when it stops: with the learner gone, an actor tries
  // to deliver its last transitions for ~10 s before it gives up and says
  // so, longer than Stop's 5 s before SIGKILL).
  for (pid_t actor : actors_) kill(-actor, SIGTERM);
  for (pid_t actor : actors_) EXPECT_EQ(Wait(actor, 60), 0) << "an actor did not stop on SIGTERM";
  actors_.clear();
  for (int i = 0; i < 2; ++i) {
    const std::string actor_log = Read(dir_ + "/actor-" + std::to_string(i) + ".log");
    const std::regex version("params v(\\d+)");
    int64_t newest = 0;
    for (std::sregex_iterator it(actor_log.begin(), actor_log.end(), version), end; it != end; ++it) {
      newest = std::max<int64_t>(newest, std::stoll((*it)[1]));
    }
    EXPECT_GT(newest, 1) << "actor " << i << ":\n" << actor_log;
  }
}

// The training state split over the 2 ranks: Adam's moments
// (learner.engine.shard_state OPTIMIZER), the networks and their targets
// too (PARAMETERS), or the critic's first two layers (model_parallel 2, a
// 1x2 mesh of ranks). Each rank keeps its part, and every checkpoint
// gathers the whole from both ranks at an update they agree on. A run of 300 updates
// ends with both ranks' state the same and its final checkpoint whole;
// resumed on 2 ranks (each taking its half of what it loaded), its next
// periodic checkpoint is whole too. Gathered from rank 0 alone, the second
// half of every split buffer would be zeros; Adam's second moment is
// positive wherever a gradient was, and no weight is exactly zero.
struct Split {
  const char* name;
  const char* engine;  // the engine settings (the learner's or the GAN's)
  const char* log;     // what the run says of it
};
void PrintTo(const Split& split, std::ostream* os) { *os << split.name; }  // (the test's name in ctest)
class RlMpiSplitStateTest : public RlMpiEndToEndTest, public ::testing::WithParamInterface<Split> {};

TEST_P(RlMpiSplitStateTest, TwoRanksWithTheStateSplitCheckpointItWhole) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/1000000000, /*max_updates=*/300, GetParam().engine);
  auto expect_whole = [&](const std::string& generation, const std::string& log) {
    // The second moments, and the weights of the networks and their targets
    // ("param/critic/NAME.w", "param/target_actor/NAME.w").
    for (const std::string names : {"adam\\.v", "^param/[a-z_]+/.*\\.w$"}) {
      int64_t floats = 0, zeros = 0;
      ASSERT_TRUE(CountFloats(generation + "/agent.ckpt", names, &floats, &zeros)) << generation;
      ASSERT_GT(floats, 10000) << names << ": the critic's and actor's";
      EXPECT_LT(double(zeros) / floats, 0.05) << generation << ": " << zeros << " of " << floats << " floats of "
                                              << names << " are zero\n" << log;
    }
  };
  pid_t learners = StartLearners(config, run_dir_, dir_ + "/learner.log");
  ASSERT_NE(StartActors(config), "") << Read(dir_ + "/learner.log");
  int exit_code = Wait(learners, /*seconds=*/150);
  std::string log = Read(dir_ + "/learner.log");
  ASSERT_EQ(exit_code, 0) << log;
  EXPECT_THAT(log, HasSubstr(GetParam().log));
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgreeAt(log, "300"));
  const std::string last = NewestCheckpoint(run_dir_);
  ASSERT_FALSE(last.empty()) << log;
  expect_whole(last, log);
  // (The actors' own stop is another test's: killed, they do not spend 10 s
  // trying to reach the learners that have gone.)
  KillActors();

  // Resumed, far from its end: the first checkpoint after the one it loaded
  // is a periodic one (every 2 s).
  const std::string resumed_log = dir_ + "/resumed.log";
  learners = StartLearners(config, run_dir_, resumed_log, {"--resume", "--set", "learner.max_updates=1000000000"});
  ASSERT_NE(StartActors(config, resumed_log), "") << Read(resumed_log);
  std::string periodic;
  for (const auto until = Clock::now() + std::chrono::seconds(120); Clock::now() < until && periodic.empty();) {
    if (const std::string newest = NewestCheckpoint(run_dir_); newest != last) periodic = newest;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // A stop the ranks may not agree on (rank 0's update cut short): no final
  // checkpoint, the periodic one stands, and nothing crashes.
  KillActors();
  Stop(learners);
  log = Read(resumed_log);
  ASSERT_FALSE(periodic.empty()) << "no checkpoint after the resumed one within 120 s\n" << log;
  EXPECT_THAT(log, HasSubstr("resumed"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("check failed"))) << log;
  // The newest generation now: more may have been written (and the one
  // seen above pruned, learner.keep_checkpoints 2) while the ranks stopped.
  expect_whole(NewestCheckpoint(run_dir_), log);
}

INSTANTIATE_TEST_SUITE_P(
    ShardState, RlMpiSplitStateTest,
    ::testing::Values(Split{"OPTIMIZER", "shard_state: OPTIMIZER", "optimizer state split over 2 replicas"},
                      Split{"PARAMETERS", "shard_state: PARAMETERS",
                            "networks and optimizer state split over 2 replicas"},
                      Split{"CRITIC", "model_parallel: 2", "a model split over the 2 replicas of each of 1 copies"}),
    [](const auto& info) { return std::string(info.param.name); });

// The GAN under mpirun (`mpirun -np 2 troupe run` with gan.engine.collectives
// MPI, its state split over the 2 ranks: the generator by model_parallel,
// or every network and its moments by shard_state PARAMETERS): every rank
// runs the command, and the run keeps one run directory, rank 0's (the
// other rank works in a scratch directory it removes), with its checkpoint
// and evaluations (each gathers the split state on every rank first); a
// resume from it runs on both ranks and keeps that one directory.
class RlMpiGanTest : public RlMpiEndToEndTest, public ::testing::WithParamInterface<Split> {};

TEST_P(RlMpiGanTest, AGanUnderMpirunKeepsOneRunDirectoryAndResumes) {
  const std::string runs = dir_ + "/runs", config = dir_ + "/gan.textproto";
  // The FID classifier FashionClassifierTest trains (ctest runs it first),
  // or one trained here when it is not there.
  const std::string classifier =
      fs::exists(TROUPE_FASHION_CLASSIFIER) ? TROUPE_FASHION_CLASSIFIER : dir_ + "/classifier.ckpt";
  std::ofstream(config) << "name: \"gan_mpi\" mode: GAN runs_dir: \"" << runs << "\"\n"
                        << "gan { batch_size: 64 total_images: 2048 eval_every_images: 1024 eval_samples: 256\n"
                        << "      classifier_checkpoint: \"" << classifier << "\"\n"
                        << "      engine { collectives: MPI " << GetParam().engine << " } }\n";
  auto run_directories = [&] {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(runs)) found.push_back(entry.path().string());
    return found;
  };
  const std::vector<std::string> mpiexec = {"-np", "2", "--oversubscribe", "--allow-run-as-root", TROUPE_BINARY, "run"};
  std::vector<std::string> args = mpiexec;
  args.push_back(config);
  ASSERT_EQ(Wait(Start(TROUPE_MPIEXEC, args, dir_ + "/gan.log", kMpiEnv), /*seconds=*/240), 0) << Read(dir_ + "/gan.log");
  std::string log = Read(dir_ + "/gan.log");
  std::vector<std::string> made = run_directories();
  ASSERT_EQ(made.size(), 1u) << log;
  const std::string run_dir = made[0];
  EXPECT_THAT(log, HasSubstr(GetParam().log));
  // One rank says where the run's event files are: rank 0.
  size_t tensorboard_lines = 0;
  for (size_t at = log.find("tensorboard: "); at != std::string::npos; at = log.find("tensorboard: ", at + 1)) {
    ++tensorboard_lines;
  }
  EXPECT_EQ(tensorboard_lines, 1u) << log;
  EXPECT_FALSE(NewestCheckpoint(run_dir).empty()) << log;
  EXPECT_TRUE(fs::exists(RunLayout(run_dir).eval_csv())) << log;

  args = mpiexec;
  for (const char* arg : {"--resume", run_dir.c_str(), "--set", "gan.total_images=4096"}) args.push_back(arg);
  ASSERT_EQ(Wait(Start(TROUPE_MPIEXEC, args, dir_ + "/gan_resumed.log", kMpiEnv), 240), 0)
      << Read(dir_ + "/gan_resumed.log");
  log = Read(dir_ + "/gan_resumed.log");
  EXPECT_THAT(log, HasSubstr("resumed from"));
  EXPECT_EQ(run_directories(), made) << log;
}

INSTANTIATE_TEST_SUITE_P(
    GanSplit, RlMpiGanTest,
    ::testing::Values(Split{"GENERATOR", "model_parallel: 2", "generator split over 2 replicas (engine.model_parallel)"},
                      Split{"PARAMETERS", "shard_state: PARAMETERS",
                            "networks and optimizer state split over 2 replicas (engine.shard_state PARAMETERS)"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(RlMpiEndToEndTest, ARankThatDiesEndsTheJobNamingIt) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/10000000);
  const pid_t learners = StartLearners(config, run_dir_, dir_ + "/learner.log");
  ASSERT_NE(StartActors(config), "") << Read(dir_ + "/learner.log");
  const std::string rank1 = AwaitMatch(dir_ + "/learner.log", "learner rank 1 of 2 \\(pid (\\d+)\\)", 30);
  ASSERT_NE(rank1, "") << Read(dir_ + "/learner.log");
  // Let it train, then kill rank 1.
  ASSERT_NE(AwaitMatch(RunLayout(run_dir_).metrics_csv(), "\\n[0-9.]+,\\d+,([1-9]\\d*),", 60), "") << Read(dir_ + "/learner.log");
  ASSERT_EQ(kill(std::stoi(rank1), SIGKILL), 0);
  const int exit_code = Wait(learners, /*seconds=*/30);
  const std::string log = Read(dir_ + "/learner.log");
  EXPECT_NE(exit_code, -1) << "the job hung after rank 1 died:\n" << log;
  EXPECT_NE(exit_code, 0) << log;
  EXPECT_THAT(log, HasSubstr("rank 1")) << log;
}

TEST_F(RlMpiEndToEndTest, ARankThatStallsFailsTheOthersWithinTheTimeout) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/10000000);
  const pid_t learners = StartLearners(config, run_dir_, dir_ + "/learner.log", {"--collective-timeout-s", "3"});
  ASSERT_NE(StartActors(config), "") << Read(dir_ + "/learner.log");
  const std::string rank1 = AwaitMatch(dir_ + "/learner.log", "learner rank 1 of 2 \\(pid (\\d+)\\)", 30);
  ASSERT_NE(rank1, "") << Read(dir_ + "/learner.log");
  ASSERT_NE(AwaitMatch(RunLayout(run_dir_).metrics_csv(), "\\n[0-9.]+,\\d+,([1-9]\\d*),", 60), "") << Read(dir_ + "/learner.log");
  // Stop rank 1 without killing it: rank 0 must give up on it, not wait forever.
  ASSERT_EQ(kill(std::stoi(rank1), SIGSTOP), 0);
  const int exit_code = Wait(learners, /*seconds=*/30);
  kill(std::stoi(rank1), SIGCONT);
  const std::string log = Read(dir_ + "/learner.log");
  EXPECT_NE(exit_code, -1) << "the job hung after rank 1 stalled:\n" << log;
  EXPECT_NE(exit_code, 0) << log;
  // Rank 0's error names rank 1: missing from a collective, or stalled inside one.
  EXPECT_THAT(log, ::testing::AnyOf(HasSubstr("replica 1 did not reach collective"),
                                    HasSubstr("stalled mid-collective (rank 1, the other of 2)")))
      << log;
  EXPECT_THAT(log, HasSubstr("troupe learner rank 0 of 2:")) << log;
}

TEST_F(RlMpiEndToEndTest, TroupeRunRefusesMpiNamingTheMpirunCommand) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/1000);
  const pid_t run = Start(TROUPE_BINARY, {"run", config}, dir_ + "/run.log");
  EXPECT_EQ(Wait(run, 30), 2);
  EXPECT_THAT(Read(dir_ + "/run.log"), HasSubstr("mpirun -np K troupe learner --config CONFIG"));
}

}  // namespace
}  // namespace troupe
