#include "envs/render_worker.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "envs/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using ::testing::HasSubstr;

// A worker renders every task exactly as this process does: same model, and
// states from real episodes (random actions, mocap targets placed by the
// task), compared byte for byte.
TEST(RenderWorkerTest, RendersEveryTaskByteForByteAsThisProcess) {
  for (const TaskInfo& info : Tasks()) {
    SCOPED_TRACE(info.name);
    auto model = LoadTaskModel(info.name, /*multisample=*/false);
    ASSERT_TRUE(model.ok()) << model.status();
    auto worker = RenderWorker::Start(*model, /*multisample=*/false);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_GT((*worker)->pid(), 0);
    const mjModel* m = (*model)->get();
    mjData* d = mj_makeData(m);
    auto task = info.make();
    ASSERT_TRUE(task->Bind(m).ok());
    std::mt19937_64 rng(7);
    task->InitializeEpisode(m, d, rng);
    mj_forward(m, d);
    const int camera = mj_name2id(m, mjOBJ_CAMERA, info.pixel_camera.c_str());
    const RenderOptions options;
    std::vector<uint8_t> here(84 * 84 * 3), there(84 * 84 * 3, 0);
    std::uniform_real_distribution<double> action(-1, 1);
    for (int frame = 0; frame < 3; ++frame) {
      for (int s = 0; s < 20; ++s) {
        for (int j = 0; j < m->nu; ++j) d->ctrl[j] = action(rng);
        mj_step(m, d);
      }
      mj_forward(m, d);  // poses of the new qpos, as the envs have them after a step (mj_step1)
      ASSERT_TRUE(RenderPixels(*model, d, camera, options, here.data()).ok());
      ASSERT_TRUE((*worker)->Render(d, camera, options, there.data()).ok());
      EXPECT_EQ(here, there) << "frame " << frame;
    }
    // A bad request gets RenderPixels' own error, and the worker keeps serving.
    auto bad = (*worker)->Render(d, m->ncam + 3, options, there.data());
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.message(), HasSubstr("camera id"));
    EXPECT_TRUE((*worker)->Render(d, camera, options, there.data()).ok());
    mj_deleteData(d);
  }
}

TEST(RenderWorkerTest, AKilledWorkerIsAnErrorNamingItNotAHang) {
  auto model = LoadTaskModel("cartpole.swingup", /*multisample=*/false);
  ASSERT_TRUE(model.ok()) << model.status();
  auto worker = RenderWorker::Start(*model, /*multisample=*/false);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const pid_t pid = (*worker)->pid();
  mjData* d = mj_makeData((*model)->get());
  mj_forward((*model)->get(), d);
  std::vector<uint8_t> out(84 * 84 * 3);
  ASSERT_TRUE((*worker)->Render(d, 0, {}, out.data()).ok());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the first call finds out; later ones repeat it
    auto status = (*worker)->Render(d, 0, {}, out.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("pid ", pid)));
    EXPECT_THAT(status.message(), HasSubstr("killed by signal 9"));
  }
  // Reaped: no zombie left behind.
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  mj_deleteData(d);
}

TEST(RenderWorkerTest, AMissingWorkerBinaryIsAClearError) {
  setenv("TROUPE_RENDER_WORKER", "/nonexistent/troupe_render_worker", 1);
  auto model = LoadTaskModel("pendulum.swingup", /*multisample=*/false);
  ASSERT_TRUE(model.ok()) << model.status();
  auto worker = RenderWorker::Start(*model, /*multisample=*/false);
  unsetenv("TROUPE_RENDER_WORKER");
  ASSERT_FALSE(worker.ok());
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(worker.status().message(), HasSubstr("/nonexistent/troupe_render_worker"));
  EXPECT_THAT(worker.status().message(), HasSubstr("TROUPE_RENDER_WORKER"));
}

TEST(RenderWorkerTest, AWorkerThatCannotLoadTheModelReportsMuJoCosMessage) {
  // The worker loads the model file again; a file changed in between is refused with its message.
  const std::string path = ::testing::TempDir() + "/render_worker_model.xml";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("<mujoco><worldbody><geom type='sphere' size='0.1'/></worldbody></mujoco>", f);
    std::fclose(f);
  }
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("<mujoco><worldbody><geom type='sphere' size='0.1'></worldbody></mujoco>", f);
    std::fclose(f);
  }
  auto worker = RenderWorker::Start(*model, /*multisample=*/false);
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(worker.status().message(), HasSubstr(path));
  std::remove(path.c_str());
}

// The pool: its worker thread renders in a worker process, the images equal
// those of a pool rendering in this process, and a killed worker process
// is the next step's error; the pool reaps its workers when destroyed.
TEST(RenderWorkerTest, APoolRendersInWorkerProcessesAndReportsAKilledOne) {
  EnvPoolOptions options;
  options.env.task = "reacher.easy";
  options.env.pixels = true;
  options.env.seed = 3;
  options.num_envs = 4;
  options.num_threads = 2;
  auto in_processes = EnvPool::Create(options);
  ASSERT_TRUE(in_processes.ok()) << in_processes.status();
  options.render_in_processes = false;
  auto in_threads = EnvPool::Create(options);
  ASSERT_TRUE(in_threads.ok()) << in_threads.status();
  ASSERT_EQ((*in_processes)->render_worker_pids().size(), 1u);
  EXPECT_TRUE((*in_threads)->render_worker_pids().empty());

  std::vector<float> actions(4 * 2);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> action(-1, 1);
  auto a = (*in_processes)->Reset();
  auto b = (*in_threads)->Reset();
  ASSERT_TRUE(a.ok() && b.ok());
  for (int step = 0; step < 10; ++step) {
    for (float& v : actions) v = action(rng);
    a = (*in_processes)->Step(actions);
    ASSERT_TRUE(a.ok()) << a.status();
    std::vector<uint8_t> pixels(a->pixels.begin(), a->pixels.end());
    b = (*in_threads)->Step(actions);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), b->pixels.begin())) << "step " << step;
  }

  const pid_t pid = (*in_processes)->render_worker_pids()[0];
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // The worker thread's next render fails; within a few steps one lands on it.
  absl::Status status;
  for (int step = 0; step < 20 && status.ok(); ++step) status = (*in_processes)->Step(actions).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("render worker"));
  EXPECT_THAT(status.message(), HasSubstr("killed by signal 9"));

  in_processes->reset();
  EXPECT_EQ(kill(pid, 0), -1);
}

TEST(RenderWorkerTest, DestroyingAPoolEndsItsWorkerProcesses) {
  EnvPoolOptions options;
  options.env.task = "cartpole.swingup";
  options.env.pixels = true;
  options.num_envs = 3;
  options.num_threads = 3;
  auto pool = EnvPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<pid_t> pids = (*pool)->render_worker_pids();
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
