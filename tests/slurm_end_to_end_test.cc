// End to end on a real Slurm: a private cluster on this machine
// (tests/slurm_cluster.sh: munged, slurmctld, two slurmd daemons as nodes n0
// and n1), `troupe run CONFIG --slurm` of a short D4PG-from-state run, and
// what must hold: the job runs, parameters advance, an actor killed with
// SIGKILL is restarted, `scancel` leaves a checkpoint, `troupe run --resume
// RUN_DIR --slurm` continues its counters, and every daemon and job is gone
// at the end (a watchdog stops the cluster if this test dies). Errors are
// refused before anything is submitted: no sbatch on the PATH, an unknown
// partition, an allocation too small. Needs root (skipped otherwise).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "common/build_tree.h"
#include "common/generations.h"
#include "common/host.h"
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

std::string cluster_dir;        // the private Slurm's state, logs, slurm.conf
std::string skip_reason;        // why the suite cannot run here
std::vector<std::string> daemon_pids;

// Runs a shell command line, returning its output (stdout and stderr) and
// exit status.
std::pair<int, std::string> Shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed: " + std::string(std::strerror(errno)) + ": " + command};
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string SlurmEnv() { return "SLURM_CONF=" + cluster_dir + "/slurm.conf "; }

// The job's state ("PENDING", "RUNNING", "COMPLETED", ...); "" when squeue
// lists nothing for it, and "squeue failed: ..." when squeue itself fails
// (a busy controller), which matches no state a test waits for. The private
// cluster keeps a finished job listed for 10 minutes (MinJobAge), so a test
// never needs "" to mean "finished".
std::string JobState(const std::string& job) {
  auto [code, out] = Shell(SlurmEnv() + "squeue --noheader --states=all --format=%T --jobs=" + job);
  if (code != 0) return "squeue failed: " + out;
  return out.find_first_of("\n ") == std::string::npos ? out : out.substr(0, out.find_first_of("\n "));
}

// squeue's listing of every job, once the controller answers (a controller
// just started, on a loaded machine, may not answer squeue's first call; its
// error would read as a listed job).
std::string JobsListed() {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  auto [code, out] = Shell(SlurmEnv() + "squeue --noheader");
  while (code != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::tie(code, out) = Shell(SlurmEnv() + "squeue --noheader");
  }
  return out;
}

bool AwaitJobState(const std::string& job, const std::regex& wanted, int seconds) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < deadline) {
    if (std::regex_match(JobState(job), wanted)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// A short D4PG-from-state run over both nodes; it runs until cancelled and
// checkpoints only when it stops (checkpoint_every_s is an hour), so a
// checkpoint proves the stop wrote it.
std::string WriteConfig(const std::string& dir, const std::string& slurm_section, bool secure = true) {
  const std::string path = dir + "/slurm.textproto";
  std::ofstream(path) << R"(name: "slurm_e2e" mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: 4 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [64, 64] v_min: 0 v_max: 200 n_step: 3 actor_learning_rate: 1e-3 critic_learning_rate: 1e-3 }
learner { engine { threads: 1 } batch_size: 64 publish_every: 10 min_replay_size: 300 samples_per_insert: 32
          checkpoint_every_s: 3600 }
actors { count: 2 random_frames: 1000 max_restarts: 3 }
evaluator { every_frames: 0 }
total_frames: 1000000000
runs_dir: ")" << dir << R"(/runs"
slurm { )" << slurm_section << " }\n";
  // TLS and a token from `troupe certs` (the learner listens beyond loopback).
  if (secure) std::ofstream(path, std::ios::app) << "security { certs_dir: \"" << cluster_dir << "/certs\" }\n";
  return path;
}

const char* kSlurmSection = R"(nodes: 2 cpus_per_actor: 1 cpus_per_learner_rank: 1 time_limit: "10")";

// Polls RUN_DIR/status.txt for "params vN" with N >= `at_least`; returns N
// (0 on timeout).
int AwaitParameterVersion(const std::string& run_dir, int at_least, int seconds) {
  const std::regex version("params v(\\d+)");
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < deadline) {
    std::smatch m;
    const std::string text = Read(RunLayout(run_dir).status());
    if (std::regex_search(text, m, version) && std::stoi(m[1]) >= at_least) return std::stoi(m[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

class SlurmEndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_reason = "a private Slurm needs root (slurmctld, slurmd and munged run as root here)";
      return;
    }
    cluster_dir = ::testing::TempDir() + "/troupe_slurm_cluster_" + std::to_string(getpid());
    Shell(std::string(TROUPE_SOURCE_DIR) + "/tests/slurm_cluster.sh stop " + cluster_dir);
    fs::remove_all(cluster_dir);
    const auto [code, out] = Shell(std::string(TROUPE_SOURCE_DIR) + "/tests/slurm_cluster.sh start " + cluster_dir +
                                   " " + std::to_string(getpid()));
    if (code == 77) {
      skip_reason = out;
    } else if (code != 0) {
      skip_reason = "FAILED to start the private Slurm: " + out;
    }
    for (const char* name : {"slurmctld.pid", "slurmd-n0.pid", "slurmd-n1.pid", "munged.pid"}) {
      daemon_pids.push_back(Read(cluster_dir + "/" + name));
    }
    // Certificates naming this host (the nodes' learner address) and a token.
    const auto [certs_code, certs_out] =
        Shell(std::string(TROUPE_BINARY) + " certs " + cluster_dir + "/certs --hosts " + HostName());
    if (certs_code != 0 && skip_reason.empty()) skip_reason = "FAILED to make certificates: " + certs_out;
  }
  static void TearDownTestSuite() {
    if (cluster_dir.empty()) return;
    Shell(std::string(TROUPE_SOURCE_DIR) + "/tests/slurm_cluster.sh stop " + cluster_dir);
    // Every daemon is gone, and no job step outlived them.
    for (const std::string& pid : daemon_pids) {
      if (!pid.empty()) {
        EXPECT_FALSE(fs::exists("/proc/" + std::to_string(std::stoi(pid)))) << "daemon pid " << pid;
      }
    }
    const std::string steps = Shell(std::string(TROUPE_SOURCE_DIR) + "/tests/slurm_cluster.sh steps " + cluster_dir).second;
    EXPECT_EQ(steps, "") << "slurmstepd processes of the private cluster left";
  }
  void SetUp() override {
    if (skip_reason.rfind("FAILED", 0) == 0) FAIL() << skip_reason;
    if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
    dir_ = FreshTestDir("slurm_e2e_");
  }
  // `troupe ARGS` with the private cluster's SLURM_CONF; output and status.
  std::pair<int, std::string> Troupe(const std::string& args, const std::string& env = "") {
    return Shell(SlurmEnv() + env + " " + TROUPE_BINARY + " " + args);
  }
  // Nothing was submitted and no run directory made.
  void ExpectNothingSubmitted() {
    EXPECT_EQ(JobsListed(), "");
    EXPECT_FALSE(fs::exists(dir_ + "/runs") && !fs::is_empty(dir_ + "/runs"));
  }
  std::string dir_;
};

TEST_F(SlurmEndToEndTest, RefusesWithoutSbatchOnThePath) {
  const std::string config = WriteConfig(dir_, kSlurmSection);
  const auto [code, out] = Troupe("run " + config + " --slurm", "PATH=/nonexistent");
  EXPECT_NE(code, 0);
  EXPECT_THAT(out, HasSubstr("no sbatch on the PATH")) << out;
  ExpectNothingSubmitted();
}

TEST_F(SlurmEndToEndTest, RefusesALearnerOnEveryInterfaceWithoutTlsAndAToken) {
  const auto [code, out] = Troupe("run " + WriteConfig(dir_, kSlurmSection, /*secure=*/false) + " --slurm");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("troupe run --slurm (its learner listens on every interface of its node)")) << out;
  ExpectNothingSubmitted();
}

TEST_F(SlurmEndToEndTest, RefusesAPartitionThatDoesNotExist) {
  const std::string config = WriteConfig(dir_, std::string(kSlurmSection) + R"( partition: "gpu")");
  const auto [code, out] = Troupe("run " + config + " --slurm");
  EXPECT_NE(code, 0);
  EXPECT_THAT(out, HasSubstr("slurm.partition \"gpu\": no such partition")) << out;
  EXPECT_THAT(out, HasSubstr("sinfo lists: debug")) << out;
  // The same through sbatch's own option.
  const auto [code2, out2] = Troupe("run " + WriteConfig(dir_, kSlurmSection) + " --slurm --partition=batch");
  EXPECT_NE(code2, 0);
  EXPECT_THAT(out2, HasSubstr("\"batch\": no such partition")) << out2;
  ExpectNothingSubmitted();
}

TEST_F(SlurmEndToEndTest, RefusesAnAllocationTooSmallForTheConfig) {
  // More nodes than the partition has.
  auto [code, out] = Troupe("run " + WriteConfig(dir_, "nodes: 3") + " --slurm --set actors.count=4");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("too small for the config: slurm.nodes 3, but the default partition \"debug\" has 2"))
      << out;
  // Fewer task slots than learner + actors.
  std::tie(code, out) = Troupe("run " + WriteConfig(dir_, "nodes: 1 tasks_per_node: 2") + " --slurm");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("slurm.nodes 1 x slurm.tasks_per_node 2 = 2 task slots, but the job runs 1 learner "
                             "rank(s) and 2 actors"))
      << out;
  // More CPUs per node than the nodes have (4 each).
  std::tie(code, out) = Troupe("run " + WriteConfig(dir_, "nodes: 1 cpus_per_actor: 2") + " --slurm");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("= 6 CPUs per node, but the nodes of the default partition \"debug\" have 4")) << out;
  // The job's shape is the config's, not sbatch's.
  std::tie(code, out) = Troupe("run " + WriteConfig(dir_, kSlurmSection) + " --slurm -N1");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--slurm -N1: the job's nodes, tasks and CPUs come from the config's slurm section")) << out;
  ExpectNothingSubmitted();
}

TEST_F(SlurmEndToEndTest, TrainsRestartsAnActorCancelsWithACheckpointAndResumes) {
  const std::string config = WriteConfig(dir_, kSlurmSection);
  const auto submitted = Clock::now();
  auto [code, out] = Troupe("run " + config + " --slurm");
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+) .*run directory (\\S+)"))) << out;
  const std::string job = m[1], run_dir = m[2];
  EXPECT_TRUE(fs::exists(run_dir + "/slurm/job.sh"));
  const std::string job_output = run_dir + "/slurm/job-" + job + ".out";

  // It runs, and the learner publishes parameters that advance.
  ASSERT_TRUE(AwaitJobState(job, std::regex("RUNNING"), 30)) << JobState(job);
  const int first = AwaitParameterVersion(run_dir, 1, 60);
  const double to_first = std::chrono::duration<double>(Clock::now() - submitted).count();
  ASSERT_GT(first, 0) << Read(job_output);
  std::printf("[ slurm    ] troupe run --slurm to the first parameter version (v%d): %.1f s\n", first, to_first);
  EXPECT_GT(AwaitParameterVersion(run_dir, first + 5, 60), first) << Read(job_output);
  EXPECT_THAT(Read(RunLayout(run_dir).learner_address()), HasSubstr(":"));

  // The actors run as job steps, spread over both nodes.
  const std::string actor0 = AwaitMatch(run_dir + "/logs/actor-0.log", "actor 0 \\(pid (\\d+)\\)", 30);
  ASSERT_NE(actor0, "") << Read(run_dir + "/logs/actor-0.log");
  EXPECT_NE(AwaitMatch(run_dir + "/logs/actor-0.log", "actor 0 .*(Slurm node n1)", 5), "");
  EXPECT_NE(AwaitMatch(run_dir + "/logs/actor-1.log", "actor 1 .*(Slurm node n0)", 30), "");

  // An actor killed with SIGKILL is restarted within the allocation.
  ASSERT_EQ(kill(std::stoi(actor0), SIGKILL), 0);
  EXPECT_NE(AwaitMatch(job_output, "actor 0 .*; (restarted) \\(restart 1 of 3\\)", 30), "") << Read(job_output);
  const std::string restarted =
      AwaitMatch(run_dir + "/logs/actor-0.log", "actor 0 \\(pid \\d+\\)[\\s\\S]*actor 0 \\(pid (\\d+)\\)", 30);
  EXPECT_NE(restarted, "");
  EXPECT_NE(restarted, actor0);
  EXPECT_NE(AwaitMatch(RunLayout(run_dir).status(), "actors (2)/2 \\(restarts 1\\)", 30), "") << Read(RunLayout(run_dir).status());

  // troupe status tells where it stands.
  std::tie(code, out) = Troupe("status " + run_dir);
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("slurm job " + job + ": RUNNING")) << out;
  EXPECT_THAT(out, HasSubstr("params v")) << out;

  // scancel: the learner checkpoints (the only checkpoint: checkpoint_every_s
  // is an hour) and everything ends.
  ASSERT_EQ(NewestCheckpoint(run_dir), "");
  Shell(SlurmEnv() + "scancel " + job);
  ASSERT_TRUE(AwaitJobState(job, std::regex("CANCELLED|COMPLETED|FAILED"), 60)) << JobState(job);
  ASSERT_TRUE(fs::exists(NewestCheckpoint(run_dir) + "/agent.ckpt")) << Read(job_output);
  ASSERT_TRUE(fs::exists(NewestCheckpoint(run_dir) + "/" + kCountersFile));
  const auto before = Metrics(run_dir);
  ASSERT_FALSE(before.empty());
  const double updates_at_cancel = before.back()[kUpdates], frames_at_cancel = before.back()[kFrames];
  EXPECT_GT(updates_at_cancel, 0);
  std::tie(code, out) = Troupe("status " + run_dir);
  EXPECT_THAT(out, HasSubstr("slurm job " + job + ": CANCELLED")) << out;
  EXPECT_THAT(out, HasSubstr("checkpoint " + run_dir + "/checkpoints")) << out;

  // Resubmitted with --resume: the counters go on from the checkpoint.
  std::tie(code, out) = Troupe("run --resume " + run_dir + " --slurm");
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+) \\(resuming"))) << out;
  const std::string job2 = m[1];
  ASSERT_TRUE(AwaitJobState(job2, std::regex("RUNNING"), 30)) << JobState(job2);
  const std::string job2_output = run_dir + "/slurm/job-" + job2 + ".out";
  EXPECT_NE(AwaitMatch(job2_output, "(resuming from the checkpoint)", 30), "") << Read(job2_output);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && LastMetrics(run_dir)[kUpdates] <= updates_at_cancel + 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto after = Metrics(run_dir);
  ASSERT_GT(after.size(), before.size()) << Read(job2_output);
  // Every row the resumed job wrote continues the counters, none restarts them.
  for (size_t i = before.size(); i < after.size(); ++i) {
    EXPECT_GE(after[i][kUpdates], updates_at_cancel) << "row " << i;
    EXPECT_GE(after[i][kFrames], frames_at_cancel) << "row " << i;
  }
  EXPECT_GT(after.back()[kUpdates], updates_at_cancel + 50);

  // Slurm's warning before the time limit (what --signal=B:USR1@N sends the
  // batch shell, sent now): the learner checkpoints, the job requeues itself
  // and, started again, resumes from that checkpoint.
  Shell(SlurmEnv() + "scancel --batch --signal=USR1 " + job2);
  EXPECT_NE(AwaitMatch(job2_output, "checkpointed before the time limit; (requeueing) job", 30), "")
      << Read(job2_output);
  ASSERT_TRUE(AwaitJobState(job2, std::regex("PENDING|REQUEUED"), 30)) << JobState(job2);
  const double updates_at_warning = LastMetrics(run_dir)[kUpdates];
  const size_t rows_at_warning = Metrics(run_dir).size();
  // Slurm holds a requeued job until the old run's credentials expire
  // (cred_expire, 10 s on the test's cluster; 120 s by default).
  ASSERT_TRUE(AwaitJobState(job2, std::regex("RUNNING"), 45)) << Shell(SlurmEnv() + "scontrol show job " + job2).second;
  EXPECT_NE(AwaitMatch(job2_output, "troupe slurm job \\d+ \\(restart 1\\) .*(resuming from the checkpoint)", 30), "")
      << Read(job2_output);
  const auto requeued_deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < requeued_deadline && LastMetrics(run_dir)[kUpdates] <= updates_at_warning + 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto requeued = Metrics(run_dir);
  ASSERT_GT(requeued.size(), rows_at_warning) << Read(job2_output);
  for (size_t i = rows_at_warning; i < requeued.size(); ++i) {
    EXPECT_GE(requeued[i][kUpdates], updates_at_warning) << "row " << i;
  }
  EXPECT_GT(requeued.back()[kUpdates], updates_at_warning + 50);
  Shell(SlurmEnv() + "scancel " + job2);
  EXPECT_TRUE(AwaitJobState(job2, std::regex("CANCELLED|COMPLETED|FAILED"), 60)) << JobState(job2);
}

// A run that ends by itself (learner.max_updates): the learner's end stops
// the actors and the job completes.
TEST_F(SlurmEndToEndTest, TheLearnersEndStopsTheActorsAndCompletesTheJob) {
  const auto [code, out] = Troupe("run " + WriteConfig(dir_, kSlurmSection) + " --slurm --set learner.max_updates=300");
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+) .*run directory (\\S+)"))) << out;
  const std::string job = m[1], run_dir = m[2];
  ASSERT_TRUE(AwaitJobState(job, std::regex("COMPLETED|FAILED|CANCELLED"), 60)) << JobState(job);
  EXPECT_EQ(JobState(job), "COMPLETED") << Read(run_dir + "/slurm/job-" + job + ".out");
  EXPECT_EQ(LastMetrics(run_dir)[kUpdates], 300);
  // Each actor that began was stopped (SIGUSR1 through srun) and said so as
  // it ended. (On a loaded machine the learner can reach its end on one
  // actor's data while the other is still starting: the stop then ends that
  // process before `troupe actor` has begun, srun saying so, as it should.)
  int began = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string log = run_dir + "/logs/actor-" + std::to_string(i) + ".log";
    if (Read(log).find("actor " + std::to_string(i) + " (pid ") == std::string::npos) {
      EXPECT_THAT(Read(log), HasSubstr("User defined signal 1")) << "actor " << i << " neither began nor was stopped";
      continue;
    }
    ++began;
    EXPECT_NE(AwaitMatch(log, "actor \\d+: (\\d+) frames, \\d+ episodes", 5), "") << Read(log);
  }
  EXPECT_GE(began, 1);
  EXPECT_THAT(Read(RunLayout(run_dir).status()), HasSubstr("ended (ok)"));
}

// A job that fails (here: resumed from a checkpoint that is not one) says
// where its logs are, and troupe status shows it failed.
TEST_F(SlurmEndToEndTest, AFailedJobSaysWhereItsLogsAre) {
  auto [code, out] = Troupe("run " + WriteConfig(dir_, kSlurmSection) + " --slurm --set learner.max_updates=50");
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+) .*run directory (\\S+)"))) << out;
  const std::string job = m[1], run_dir = m[2];
  ASSERT_TRUE(AwaitJobState(job, std::regex("COMPLETED|FAILED|CANCELLED"), 60)) << JobState(job);
  // Every checkpoint damaged: nothing to fall back to.
  for (std::string newest; !(newest = NewestCheckpoint(run_dir)).empty();) {
    std::ofstream(newest + "/agent.ckpt", std::ios::trunc) << "not a checkpoint";
    fs::remove(newest + "/MANIFEST");
  }
  std::ofstream(run_dir + "/checkpoints/agent.ckpt", std::ios::trunc) << "not a checkpoint";
  std::tie(code, out) = Troupe("run --resume " + run_dir + " --slurm");
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+)"))) << out;
  const std::string failed = m[1];
  ASSERT_TRUE(AwaitJobState(failed, std::regex("COMPLETED|FAILED|CANCELLED"), 60)) << JobState(failed);
  EXPECT_EQ(JobState(failed), "FAILED");
  const std::string output = run_dir + "/slurm/job-" + failed + ".out";
  EXPECT_THAT(Read(output), HasSubstr("the job failed; its logs: " + output + " (this output), " + run_dir + "/logs/"));
  std::tie(code, out) = Troupe("status " + run_dir);
  EXPECT_THAT(out, HasSubstr("slurm job " + failed + ": FAILED")) << out;
  EXPECT_THAT(out, HasSubstr("job output " + output)) << out;
}

// learner.engine.collectives MPI: the job starts the learner's ranks with
// mpirun inside the allocation (ranks 0, 1 on n0, rank 2 on n1; the actor on
// n1), the actor finds rank 0 through learner.address, and all ranks end
// with the same state.
TEST_F(SlurmEndToEndTest, MpiLearnerRanksSpanTheNodes) {
  const auto [code, out] =
      Troupe("run " + WriteConfig(dir_, "nodes: 2 tasks_per_node: 2 cpus_per_actor: 1 cpus_per_learner_rank: 1") +
                 " --slurm --set learner.engine.collectives=MPI --set learner.engine.replicas=3 --set "
                 "learner.batch_size=96 --set actors.count=1 --set learner.max_updates=200",
             "OMPI_MCA_btl=self,vader,tcp");
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted Slurm job (\\d+) .*run directory (\\S+)"))) << out;
  const std::string job = m[1], run_dir = m[2];
  const std::string output = run_dir + "/slurm/job-" + job + ".out";
  ASSERT_TRUE(AwaitJobState(job, std::regex("COMPLETED|FAILED|CANCELLED"), 90)) << JobState(job);
  EXPECT_EQ(JobState(job), "COMPLETED") << Read(output);
  const std::string log = Read(output);
  EXPECT_THAT(log, HasSubstr("mpirun -np 3 --host n0:2,n1:1"));
  const std::regex final_line("learner rank (\\d) of 3: (\\d+) updates, state checksum ([0-9a-f]{16})");
  std::set<std::string> ranks, states;
  for (std::sregex_iterator it(log.begin(), log.end(), final_line), end; it != end; ++it) {
    ranks.insert((*it)[1]);
    states.insert(std::string((*it)[2]) + " " + std::string((*it)[3]));
  }
  EXPECT_EQ(ranks.size(), 3u) << log;
  EXPECT_EQ(states.size(), 1u) << log;
  EXPECT_NE(AwaitMatch(run_dir + "/logs/actor-0.log", "actor 0 .*(Slurm node n1)", 5), "");
  EXPECT_NE(AwaitMatch(run_dir + "/logs/actor-0.log", "params v(\\d+)", 5), "") << Read(run_dir + "/logs/actor-0.log");
}

// `troupe sweep --slurm`: two seeds of a short state run as a job array (one
// array task per run, on the cluster's nodes), then the summary job once the
// array ended: both runs done, the summary lists both; the same command again
// submits nothing.
TEST_F(SlurmEndToEndTest, ASweepRunsAsAJobArrayThenItsSummary) {
  const std::string config = WriteConfig(dir_, kSlurmSection);
  const std::string sweep = dir_ + "/sweep";
  const std::string command = "sweep " + config + " --seeds 2 --cores 2 --parallel 2 --dir " + sweep +
                              " --set total_frames=3000 --set evaluator.every_frames=1500 --set evaluator.episodes=1"
                              " --set evaluator.record_video=false --slurm --time=5";
  auto [code, out] = Troupe(command);
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("submitted job array (\\d+) \\(2 runs, 2 CPUs each, at most 2 at a "
                                                   "time\\) and summary job (\\d+)")))
      << out;
  const std::string array = m[1], summary = m[2];
  EXPECT_THAT(Read(sweep + "/slurm/array.sh"), HasSubstr("#SBATCH --array=0-1%2"));
  EXPECT_THAT(Read(sweep + "/slurm/array.sh"), HasSubstr("#SBATCH --cpus-per-task=2"));
  // Not "" as well: once, in 62 runs under ASan, the wait returned with
  // seed-1 still training (2,984 of 3,000 frames) and the summary job, which
  // depends on the whole array, still pending: squeue had listed nothing.
  ASSERT_TRUE(AwaitJobState(summary, std::regex("COMPLETED|FAILED|CANCELLED"), 150))
      << JobState(summary) << Read(sweep + "/seed-0/log.txt");
  for (const char* run : {"seed-0", "seed-1"}) {
    EXPECT_TRUE(fs::exists(sweep + "/" + run + "/done")) << Read(sweep + "/" + run + "/log.txt");
    EXPECT_GE(LastMetrics(sweep + "/" + run)[kFrames], 3000) << run;
  }
  // Each array task said where it ran; the summary job wrote the table.
  EXPECT_THAT(Read(sweep + "/slurm/job-" + array + "_0.out"), HasSubstr("array task 0 on n"));
  EXPECT_THAT(Read(sweep + "/slurm/job-" + array + "_1.out"), HasSubstr("array task 1 on n"));
  const std::string table = Read(sweep + "/runs.csv");
  EXPECT_THAT(table, HasSubstr("seed-0")) << table;
  EXPECT_THAT(table, HasSubstr("seed-1")) << table;
  EXPECT_TRUE(fs::exists(sweep + "/summary.md"));
  EXPECT_TRUE(fs::exists(sweep + "/curves.png"));
  std::tie(code, out) = Troupe(command);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("every run is done: nothing to submit")) << out;
}

// Refused before anything is made or submitted: sbatch options that would
// reshape the array, --slurm with --summary-only, no sbatch on the PATH.
TEST_F(SlurmEndToEndTest, ASweepRefusesWhatWouldReshapeItsArray) {
  const std::string config = WriteConfig(dir_, kSlurmSection);
  const std::string sweep = " --seeds 2 --dir " + dir_ + "/sweep";
  auto [code, out] = Troupe("sweep " + config + sweep + " --slurm --array=0-9");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--slurm --array=0-9: troupe shapes the job array")) << out;
  std::tie(code, out) = Troupe("sweep " + config + sweep + " --slurm -c8");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--slurm -c8: troupe shapes the job array")) << out;
  std::tie(code, out) = Troupe("sweep " + config + sweep + " --slurm --summary-only");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--slurm and --summary-only")) << out;
  std::tie(code, out) = Troupe("sweep " + config + sweep + " --slurm", "PATH=/nonexistent");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("no sbatch on the PATH")) << out;
  std::tie(code, out) = Troupe("sweep " + config + sweep + " --partition=x");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("sbatch options go after --slurm")) << out;
  EXPECT_FALSE(fs::exists(dir_ + "/sweep"));
  EXPECT_EQ(JobsListed(), "");
}

// The same config run locally (troupe run without --slurm), for the time to
// the first parameter version next to the Slurm one.
TEST_F(SlurmEndToEndTest, TheSameConfigLocallyForComparison) {
  const std::string config = WriteConfig(dir_, kSlurmSection);
  const auto started = Clock::now();
  const pid_t run = Start(TROUPE_BINARY, {"run", config}, dir_ + "/local.log");
  const std::string run_dir = AwaitMatch(dir_ + "/local.log", "run directory (\\S+)", 60);
  ASSERT_NE(run_dir, "") << Read(dir_ + "/local.log");
  const int first = AwaitParameterVersion(run_dir, 1, 60);
  const double to_first = std::chrono::duration<double>(Clock::now() - started).count();
  Stop(run);
  ASSERT_GT(first, 0) << Read(dir_ + "/local.log");
  std::printf("[ local    ] troupe run to the first parameter version (v%d): %.1f s\n", first, to_first);
  EXPECT_THAT(Read(RunLayout(run_dir).launch()), HasSubstr("launcher local"));
  const auto [code, out] = Troupe("status " + run_dir);
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("local run: troupe run (pid " + std::to_string(run))) << out;
  EXPECT_THAT(out, HasSubstr(": ended")) << out;
}

}  // namespace
}  // namespace troupe
