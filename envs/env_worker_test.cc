#include "envs/env_worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "envs/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using ::testing::HasSubstr;

EnvOptions Options(const std::string& task, bool pixels) {
  EnvOptions options;
  options.task = task;
  options.pixels = pixels;
  options.seed = 11;
  return options;
}

// Envs [first, first + count) of a pool with `options`, made in this process.
std::vector<std::unique_ptr<Environment>> LocalEnvs(const EnvOptions& options, int first, int count) {
  std::vector<std::unique_ptr<Environment>> envs;
  for (int i = first; i < first + count; ++i) {
    EnvOptions o = options;
    o.seed = EnvPool::SeedFor(options.seed, i);
    auto env = MakeEnv(o);
    EXPECT_TRUE(env.ok()) << env.status();
    if (env.ok()) envs.push_back(*std::move(env));
  }
  return envs;
}

// A worker for envs [first, first + count) of a pool with `options`, given
// the sizes of such an env made here.
absl::StatusOr<std::unique_ptr<EnvWorker>> StartWorker(const EnvOptions& options, int first, int count) {
  auto env = MakeEnv(options);
  if (!env.ok()) return env.status();
  return EnvWorker::Start(options, (*env)->spec(), (*env)->model(), first, count);
}

// Points `TROUPE_ASSETS_DIR` at a directory of its own while it lives.
class AssetsOverride {
 public:
  AssetsOverride(const std::string& name, const std::string& file, const std::string& text)
      : dir_(::testing::TempDir() + "/" + name) {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/" + file) << text;
    setenv("TROUPE_ASSETS_DIR", dir_.c_str(), 1);
  }
  ~AssetsOverride() { unsetenv("TROUPE_ASSETS_DIR"); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

std::string ReadAsset(const std::string& file) {
  std::ifstream in(AssetsDir() + "/" + file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A worker steps its envs exactly as this process steps the same envs:
// every task with pixels (frame stacks and action repeats on some), and one
// state-only worker over two episode ends. Jobs come in any order, any
// subset, with resets in between; results, observations and physics state
// are compared byte for byte.
TEST(EnvWorkerTest, StepsItsEnvsByteForByteAsThisProcess) {
  std::vector<EnvOptions> cases;
  for (const TaskInfo& info : Tasks()) {
    EnvOptions options = Options(info.name, /*pixels=*/true);
    options.frame_stack = 1 + int(cases.size() % 3);
    options.action_repeat = 1 + int(cases.size() % 2);
    cases.push_back(options);
  }
  EnvOptions state_only = Options("cartpole.swingup", /*pixels=*/false);
  state_only.action_repeat = 8;  // 125 steps an episode
  cases.push_back(state_only);

  for (const EnvOptions& options : cases) {
    SCOPED_TRACE(absl::StrCat(options.task, options.pixels ? " pixels" : " state", ", stack ", options.frame_stack,
                              ", repeat ", options.action_repeat));
    constexpr int kFirst = 2, kCount = 2;
    auto local = LocalEnvs(options, kFirst, kCount);
    ASSERT_EQ(local.size(), size_t(kCount));
    const EnvSpec& spec = local[0]->spec();
    auto worker = EnvWorker::Start(options, spec, local[0]->model(), kFirst, kCount);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_GT((*worker)->pid(), 0);

    std::vector<EpisodeProgress> progress(kCount);
    std::vector<float> actions(size_t(kFirst + kCount) * spec.action_size);  // by pool id
    std::vector<float> state(spec.state_size);
    std::vector<uint8_t> pixels(spec.pixel_bytes());
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> uniform(-1, 1);
    const int steps = options.pixels ? 25 : 300;
    int episode_ends = 0;
    for (int step = 0; step < steps; ++step) {
      for (float& a : actions) a = uniform(rng);
      // Both envs, in either order; now and then only one; a reset at step 11.
      std::vector<EnvWorker::Job> jobs;
      if (step % 7 != 3) jobs.push_back({kFirst, step == 11});
      jobs.insert(step % 2 ? jobs.end() : jobs.begin(), EnvWorker::Job{kFirst + 1, false});
      ASSERT_TRUE((*worker)->Run(jobs, actions.data()).ok()) << "step " << step;
      for (const EnvWorker::Job& job : jobs) {
        const int i = job.env_id - kFirst;
        absl::Status error;
        const TimeStep expected =
            AdvanceEnv(*local[i], progress[i], job.reset, &actions[size_t(job.env_id) * spec.action_size],
                       {state.data(), pixels.empty() ? nullptr : pixels.data()}, &error);
        ASSERT_TRUE(error.ok()) << error;
        const EnvWorker::Result got = (*worker)->result(job.env_id);
        ASSERT_EQ(got.timestep.step_type, expected.step_type) << "step " << step << " env " << job.env_id;
        EXPECT_EQ(got.timestep.reward, expected.reward);
        EXPECT_EQ(got.timestep.discount, expected.discount);
        EXPECT_EQ(got.episode_step, progress[i].episode_step);
        EXPECT_TRUE(std::equal(state.begin(), state.end(), got.state)) << "state, step " << step;
        if (!pixels.empty()) {
          EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), got.pixels)) << "pixels, step " << step;
        }
        episode_ends += expected.step_type == StepType::kLast;
        // The physics state, as EnvPool::data shows it.
        const mjModel* m = local[i]->model();
        mjData* copy = mj_makeData(m);
        (*worker)->CopyPhysicsState(job.env_id, copy);
        const mjData* d = local[i]->data();
        EXPECT_TRUE(std::equal(d->qpos, d->qpos + m->nq, copy->qpos));
        EXPECT_TRUE(std::equal(d->qvel, d->qvel + m->nv, copy->qvel));
        EXPECT_TRUE(std::equal(d->mocap_pos, d->mocap_pos + 3 * m->nmocap, copy->mocap_pos));
        EXPECT_EQ(d->time, copy->time);
        mj_deleteData(copy);
      }
    }
    if (!options.pixels) {
      EXPECT_GE(episode_ends, 3);  // the state case crossed episode ends
    }
  }
}

TEST(EnvWorkerTest, AnEnvErrorIsReturnedAndTheWorkerKeepsServing) {
  auto worker = StartWorker(Options("pendulum.swingup", /*pixels=*/true), 0, 2);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> actions = {0.5f, 0.5f};
  ASSERT_TRUE((*worker)->Run(std::vector<EnvWorker::Job>{{0, true}, {1, true}}, actions.data()).ok());
  // Env 0 gets a NaN: its error, its row ends the episode; env 1 steps normally.
  actions[0] = NAN;
  absl::Status status = (*worker)->Run(std::vector<EnvWorker::Job>{{0, false}, {1, false}}, actions.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("finite"));
  EXPECT_EQ((*worker)->result(0).timestep.step_type, StepType::kLast);
  EXPECT_EQ((*worker)->result(1).timestep.step_type, StepType::kMid);
  EXPECT_EQ((*worker)->result(1).episode_step, 1);
  // The next job of env 0 starts a new episode.
  actions[0] = 0.5f;
  ASSERT_TRUE((*worker)->Run(std::vector<EnvWorker::Job>{{0, false}, {1, false}}, actions.data()).ok());
  EXPECT_EQ((*worker)->result(0).timestep.step_type, StepType::kFirst);
  EXPECT_EQ((*worker)->result(1).episode_step, 2);
  // An env that is not the worker's: refused before anything runs.
  status = (*worker)->Run(std::vector<EnvWorker::Job>{{1, false}, {2, false}}, actions.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("env 2 is not one of the worker's envs [0, 2)"));
  // Nothing was sent, so there is nothing to wait for: an error at once, not a hang.
  status = (*worker)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("Wait without a request sent"));
  ASSERT_TRUE((*worker)->Run(std::vector<EnvWorker::Job>{{1, false}}, actions.data()).ok());
  EXPECT_EQ((*worker)->result(1).episode_step, 3);
}

TEST(EnvWorkerTest, AKilledWorkerIsAnErrorNamingItNotAHang) {
  auto worker = StartWorker(Options("cartpole.swingup", /*pixels=*/true), 0, 1);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const pid_t pid = (*worker)->pid();
  const std::vector<EnvWorker::Job> reset = {{0, true}};
  ASSERT_TRUE((*worker)->Run(reset, nullptr).ok());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the first call finds out; later ones repeat it
    auto status = (*worker)->Run(reset, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("pid ", pid)));
    EXPECT_THAT(status.message(), HasSubstr("killed by signal 9"));
  }
  // Reaped: no zombie left behind.
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// The worker of a pool whose process is killed sees its socket close and
// exits by itself: no orphan keeps stepping.
TEST(EnvWorkerTest, AWorkerWhosePoolProcessIsKilledExits) {
  // Orphans of this test's children become this process's to reap.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {  // the pool's process: starts a worker (state only: no GL here), then waits to die
    auto worker = StartWorker(Options("cartpole.swingup", /*pixels=*/false), 0, 1);
    const pid_t pid = worker.ok() ? (*worker)->pid() : -1;
    (void)!write(report[1], &pid, sizeof(pid));
    for (;;) pause();
  }
  close(report[1]);
  pid_t worker = -1;
  ASSERT_EQ(read(report[0], &worker, sizeof(worker)), ssize_t(sizeof(worker)));
  close(report[0]);
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(owner, SIGKILL), 0);
  ASSERT_EQ(waitpid(owner, nullptr, 0), owner);
  // The worker, now this process's child, exits normally within seconds.
  int status = 0;
  pid_t reaped = 0;
  for (int i = 0; i < 500 && reaped == 0; ++i) {
    reaped = waitpid(worker, &status, WNOHANG);
    if (reaped == 0) usleep(10'000);
  }
  if (reaped == 0) kill(worker, SIGKILL);
  ASSERT_EQ(reaped, worker) << "the worker kept running after its pool's process was killed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(EnvWorkerTest, AMissingWorkerBinaryIsAClearError) {
  setenv("TROUPE_ENV_WORKER", "/nonexistent/troupe_env_worker", 1);
  auto worker = StartWorker(Options("pendulum.swingup", /*pixels=*/false), 0, 1);
  unsetenv("TROUPE_ENV_WORKER");
  ASSERT_FALSE(worker.ok());
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(worker.status().message(), HasSubstr("/nonexistent/troupe_env_worker"));
  EXPECT_THAT(worker.status().message(), HasSubstr("TROUPE_ENV_WORKER"));
}

TEST(EnvWorkerTest, AWorkerThatCannotLoadTheModelReportsMuJoCosMessage) {
  // The worker loads the task's model file itself; here the file it finds is malformed.
  const EnvOptions options = Options("cartpole.swingup", /*pixels=*/false);
  auto local = LocalEnvs(options, 0, 1);
  ASSERT_EQ(local.size(), 1u);
  AssetsOverride assets("env_worker_bad_assets", "cartpole.xml",
                        "<mujoco><worldbody><geom type='sphere' size='0.1'></worldbody></mujoco>");
  auto worker = EnvWorker::Start(options, local[0]->spec(), local[0]->model(), 0, 1);
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(worker.status().message(), HasSubstr("env worker for cartpole.swingup envs [0, 1)"));
  EXPECT_THAT(worker.status().message(), HasSubstr(assets.dir() + "/cartpole.xml"));
}

TEST(EnvWorkerTest, ANameTooLongToPassIsRefused) {
  EnvOptions options = Options("cartpole.swingup", /*pixels=*/true);
  auto local = LocalEnvs(options, 0, 1);
  ASSERT_EQ(local.size(), 1u);
  options.camera = std::string(100, 'c');
  auto worker = EnvWorker::Start(options, local[0]->spec(), local[0]->model(), 0, 1);
  ASSERT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(worker.status().message(), HasSubstr("env.render.camera"));
}

// A blow-up in a worker's env ends the episode there and is counted here.
TEST(EnvWorkerTest, PhysicsErrorsInAWorkerAreCounted) {
  std::string xml = ReadAsset("cartpole.xml");
  const std::string gear = "gear=\"10\"";
  ASSERT_NE(xml.find(gear), std::string::npos);
  xml.replace(xml.find(gear), gear.size(), "gear=\"1e30\"");
  AssetsOverride assets("env_worker_blowup_assets", "cartpole.xml", xml);
  auto worker = StartWorker(Options("cartpole.swingup", /*pixels=*/false), 0, 1);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> action = {1.0f};
  ASSERT_TRUE((*worker)->Run(std::vector<EnvWorker::Job>{{0, true}}, action.data()).ok());
  int steps = 0;
  for (; steps < 1000 && (*worker)->physics_errors() == 0; ++steps) {
    ASSERT_TRUE((*worker)->Run(std::vector<EnvWorker::Job>{{0, false}}, action.data()).ok());
  }
  EXPECT_LT(steps, 1000);
  EXPECT_EQ((*worker)->physics_errors(), 1);
  EXPECT_EQ((*worker)->result(0).timestep.step_type, StepType::kLast);
}

EnvPoolOptions PixelPool(const std::string& task, int num_envs, int threads, int batch_size, bool in_processes) {
  EnvPoolOptions options;
  options.env = Options(task, /*pixels=*/true);
  options.env.seed = 3;
  options.num_envs = num_envs;
  options.num_threads = threads;
  options.batch_size = batch_size;
  options.render_in_processes = in_processes;
  return options;
}

// A sync pool whose worker thread's envs live in a worker process gives the
// same batches, and the same EnvPool::data, as one that steps all envs in
// this process; a killed worker is the next step's error; the pool reaps
// its workers when destroyed.
TEST(EnvWorkerTest, ASyncPoolInWorkerProcessesEqualsOneInThreads) {
  auto in_processes = EnvPool::Create(PixelPool("reacher.easy", 4, 2, 0, true));
  ASSERT_TRUE(in_processes.ok()) << in_processes.status();
  auto in_threads = EnvPool::Create(PixelPool("reacher.easy", 4, 2, 0, false));
  ASSERT_TRUE(in_threads.ok()) << in_threads.status();
  ASSERT_EQ((*in_processes)->worker_pids().size(), 1u);
  EXPECT_TRUE((*in_threads)->worker_pids().empty());

  std::vector<float> actions(4 * 2);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> action(-1, 1);
  ASSERT_TRUE((*in_processes)->Reset().ok());
  ASSERT_TRUE((*in_threads)->Reset().ok());
  for (int step = 0; step < 10; ++step) {
    for (float& v : actions) v = action(rng);
    auto a = (*in_processes)->Step(actions);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::vector<uint8_t> pixels(a->pixels.begin(), a->pixels.end());
    const std::vector<float> state(a->state.begin(), a->state.end());
    const std::vector<float> reward(a->reward.begin(), a->reward.end());
    const std::vector<int32_t> episode_step(a->episode_step.begin(), a->episode_step.end());
    auto b = (*in_threads)->Step(actions);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), b->pixels.begin())) << "step " << step;
    EXPECT_TRUE(std::equal(state.begin(), state.end(), b->state.begin())) << "step " << step;
    EXPECT_TRUE(std::equal(reward.begin(), reward.end(), b->reward.begin())) << "step " << step;
    EXPECT_TRUE(std::equal(episode_step.begin(), episode_step.end(), b->episode_step.begin())) << "step " << step;
  }
  // Env 3 lives in the worker process of one pool and in this process in the other.
  const mjModel* m = (*in_processes)->model();
  const mjData* mirrored = (*in_processes)->data(3);
  const mjData* here = (*in_threads)->data(3);
  EXPECT_TRUE(std::equal(here->qpos, here->qpos + m->nq, mirrored->qpos));
  EXPECT_TRUE(std::equal(here->qvel, here->qvel + m->nv, mirrored->qvel));
  EXPECT_TRUE(std::equal(here->xpos, here->xpos + 3 * m->nbody, mirrored->xpos));  // forwarded
  EXPECT_EQ(here->time, mirrored->time);

  const pid_t pid = (*in_processes)->worker_pids()[0];
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const absl::Status status = (*in_processes)->Step(actions).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("env worker"));
  EXPECT_THAT(status.message(), HasSubstr("killed by signal 9"));
  in_processes->reset();
  EXPECT_EQ(kill(pid, 0), -1);
}

// Async: each env sees the same results in either pool (its actions depend
// only on its own step count), though envs finish in other orders.
TEST(EnvWorkerTest, AnAsyncPoolInWorkerProcessesEqualsOneInThreads) {
  std::map<int, std::vector<std::vector<uint8_t>>> seen[2];  // per pool, per env: pixels of each result
  std::map<int, std::vector<float>> rewards[2];
  for (int p = 0; p < 2; ++p) {
    EnvPoolOptions options = PixelPool("cartpole.swingup", 6, 3, 2, /*in_processes=*/p == 0);
    auto pool = EnvPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->worker_pids().size(), p == 0 ? 2u : 0u);
    std::vector<int32_t> all = {0, 1, 2, 3, 4, 5};
    ASSERT_TRUE((*pool)->SendReset(all).ok());
    const size_t bytes = (*pool)->spec().pixel_bytes();
    // Until every env has 6 results: which envs finish first depends on the
    // machine's load (a busy worker process serves its envs late), so a
    // fixed number of rounds could leave one with too few to compare.
    const auto fewest = [&] {
      size_t n = SIZE_MAX;
      for (int id = 0; id < 6; ++id) n = std::min(n, seen[p][id].size());
      return n;
    };
    for (int r = 0; r < 600 && fewest() < 6; ++r) {
      auto batch = (*pool)->Recv();
      ASSERT_TRUE(batch.ok()) << batch.status();
      std::vector<int32_t> ids(batch->env_id.begin(), batch->env_id.end());
      std::vector<float> actions;
      for (int i = 0; i < batch->size; ++i) {
        const int id = ids[i];
        seen[p][id].emplace_back(batch->pixels.begin() + i * bytes, batch->pixels.begin() + (i + 1) * bytes);
        rewards[p][id].push_back(batch->reward[i]);
        actions.push_back(std::sin(0.7f * id + 0.3f * float(seen[p][id].size())));
      }
      ASSERT_TRUE((*pool)->Send(actions, ids).ok());
    }
  }
  for (int id = 0; id < 6; ++id) {
    const size_t n = std::min(seen[0][id].size(), seen[1][id].size());
    EXPECT_GE(n, 6u) << "env " << id << " (an async pool left it unserved for 600 rounds)";
    for (size_t k = 0; k < n; ++k) {
      EXPECT_EQ(seen[0][id][k], seen[1][id][k]) << "env " << id << " result " << k;
      EXPECT_EQ(rewards[0][id][k], rewards[1][id][k]) << "env " << id << " result " << k;
    }
  }
}

// Async: a killed worker is an error from Recv, not a batch that never fills.
TEST(EnvWorkerTest, AnAsyncPoolReportsAKilledWorker) {
  auto pool = EnvPool::Create(PixelPool("pendulum.swingup", 4, 2, 2, true));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ((*pool)->worker_pids().size(), 1u);
  const pid_t pid = (*pool)->worker_pids()[0];
  ASSERT_TRUE((*pool)->SendReset(std::vector<int32_t>{0, 1, 2, 3}).ok());
  ASSERT_TRUE((*pool)->Recv().ok());
  ASSERT_TRUE((*pool)->Recv().ok());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Envs 2 and 3 live in the worker: the batch that holds them fails.
  ASSERT_TRUE((*pool)->Send(std::vector<float>{0.1f, 0.2f}, std::vector<int32_t>{2, 3}).ok());
  const absl::Status status = (*pool)->Recv().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("env worker (pid ", pid, ")")));
  EXPECT_THAT(status.message(), HasSubstr("killed by signal 9"));
  // The pool's own envs still step.
  ASSERT_TRUE((*pool)->Send(std::vector<float>{0.1f, 0.2f}, std::vector<int32_t>{0, 1}).ok());
  auto batch = (*pool)->Recv();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(std::vector<int32_t>(batch->env_id.begin(), batch->env_id.end()), (std::vector<int32_t>{0, 1}));
}

TEST(EnvWorkerTest, DestroyingAPoolEndsItsWorkerProcesses) {
  auto pool = EnvPool::Create(PixelPool("cartpole.swingup", 3, 3, 0, true));
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<pid_t> pids = (*pool)->worker_pids();
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) EXPECT_EQ(kill(pid, 0), 0);
  pool->reset();
  for (pid_t pid : pids) {
    EXPECT_EQ(kill(pid, 0), -1) << pid;
    EXPECT_EQ(errno, ESRCH);
  }
}

}  // namespace
}  // namespace troupe::envs
