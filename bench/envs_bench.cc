// `troupe bench envs`: per task, for state and for 84x84 pixel observations,
// env steps per CPU-second on one thread next to the raw MuJoCo loop doing
// the same physics (and rendering) on the same model (thread CPU clocks, so
// the ratio holds on a shared machine), and the pool's wall-clock steps/s on
// all cores next to the same envs stepped in turn on one thread (wall
// clock) and next to the same envs in fixed slices stepped freely, one a
// core (the machine's ceiling: a thread a slice for state, an env worker
// process a slice for pixels). The loops compared run the same
// steps of the same episodes in alternated windows, and each figure is its
// best window (bench.h, BestOfAlternated). For state and pixels, the pool on
// 1 and 2 threads next to EnvPool (PyPI envpool, its dm_control tasks,
// MuJoCo 3.x; for pixels rendering every env at 84x84 every step) stepping
// the same number of envs on as many threads, in the same run (skipped,
// saying why, without PyPI; not in --quick runs).
#include <mujoco/mujoco.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench.h"
#include "common/status_macros.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "envs/env_worker.h"

namespace troupe::bench {
namespace {

constexpr int kActionTableSize = 4096;  // precomputed random actions, cycled
constexpr int kAttempts = 16;           // every pair: best of this many alternated windows

// EnvPool's id of a troupe task: "ball_in_cup.catch" -> "BallInCupCatch-v1".
std::string EnvPoolId(const std::string& task) {
  std::string id;
  bool upper = true;
  for (char c : task) {
    if (c == '.' || c == '_') {
      upper = true;
      continue;
    }
    id += upper ? char(std::toupper(c)) : c;
    upper = false;
  }
  return id + "-v1";
}

std::vector<float> RandomActions(int action_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> table(size_t(kActionTableSize) * action_size);
  for (float& a : table) a = uniform(rng);
  return table;
}

// Raw MuJoCo: substeps x mj_step per control step, optionally followed by
// the render-and-read-back an observation needs, from the task's initial
// state with seed 0 (the env's episodes), resetting at each episode's end.
class RawLoop {
 public:
  static absl::StatusOr<std::unique_ptr<RawLoop>> Create(const envs::TaskInfo& info,
                                                         std::shared_ptr<const envs::Model> model, bool pixels,
                                                         const std::vector<float>& actions) {
    std::unique_ptr<RawLoop> loop(new RawLoop(info, std::move(model), pixels, actions));
    RETURN_IF_ERROR(loop->task_->Bind(loop->model_->get()));
    loop->Reset();
    return loop;
  }
  ~RawLoop() {
    if (pixels_) {
      mjr_freeContext(&context_);
      mjv_freeScene(&scene_);
    }
    mj_deleteData(d_);
  }

  // The next `steps` control steps.
  absl::Status Run(long steps) {
    const mjModel* m = model_->get();
    const mjrRect viewport = {0, 0, 84, 84};
    for (long i = 0; i < steps; ++i, ++step_) {
      if (step_ > 0 && step_ % info_.episode_steps == 0) Reset();
      const float* a = &actions_[size_t(step_ % kActionTableSize) * m->nu];
      for (int j = 0; j < m->nu; ++j) d_->ctrl[j] = a[j];
      for (int s = 0; s < info_.control_substeps; ++s) mj_step(m, d_);
      if (pixels_) {
        mjr_setBuffer(mjFB_OFFSCREEN, &context_);
        mjv_updateScene(m, d_, &option_, nullptr, &camera_, mjCAT_ALL, &scene_);
        mjr_render(viewport, &scene_, &context_);
        mjr_readPixels(rgb_, nullptr, viewport, &context_);
      }
    }
    return absl::OkStatus();
  }

 private:
  RawLoop(const envs::TaskInfo& info, std::shared_ptr<const envs::Model> model, bool pixels,
          const std::vector<float>& actions)
      : info_(info), model_(std::move(model)), pixels_(pixels), actions_(actions), task_(info.make()), rng_(0) {
    const mjModel* m = model_->get();
    d_ = mj_makeData(m);
    if (pixels_) {
      mjv_defaultScene(&scene_);
      mjv_defaultCamera(&camera_);
      mjv_defaultOption(&option_);
      mjr_defaultContext(&context_);
      mjv_makeScene(m, &scene_, 2000);
      mjr_makeContext(m, &context_, mjFONTSCALE_100);
      scene_.flags[mjRND_SHADOW] = 0;
      scene_.flags[mjRND_REFLECTION] = 0;
      camera_.type = mjCAMERA_FIXED;
      camera_.fixedcamid = mj_name2id(m, mjOBJ_CAMERA, info.pixel_camera.c_str());
    }
  }
  void Reset() {
    const mjModel* m = model_->get();
    mj_resetData(m, d_);
    task_->InitializeEpisode(m, d_, rng_);
    mj_forward(m, d_);
  }

  const envs::TaskInfo& info_;
  const std::shared_ptr<const envs::Model> model_;
  const bool pixels_;
  const std::vector<float>& actions_;
  std::unique_ptr<envs::Task> task_;
  std::mt19937_64 rng_;
  mjData* d_ = nullptr;
  mjvScene scene_;
  mjvCamera camera_;
  mjvOption option_;
  mjrContext context_;
  unsigned char rgb_[84 * 84 * 3];
  long step_ = 0;
};

// One env with the raw loop's actions, observation, reward and (with
// pixels) rendering included. Like the raw loop (and unlike SlicesLoop,
// whose envs reset on the next unit as the pool's do), it resets within the
// step that ended the episode.
absl::StatusOr<Loop> EnvLoop(const envs::EnvOptions& options, std::shared_ptr<const envs::Model> model,
                             const std::vector<float>& actions) {
  ASSIGN_OR_RETURN(std::shared_ptr<envs::Environment> env, envs::MakeEnv(options, std::move(model)));
  const envs::EnvSpec& spec = env->spec();
  auto state = std::make_shared<std::vector<float>>(spec.state_size);
  auto pixels = std::make_shared<std::vector<uint8_t>>(spec.pixel_bytes());
  const envs::ObservationBuffers out{state->data(), pixels->empty() ? nullptr : pixels->data()};
  RETURN_IF_ERROR(env->Reset(out).status());
  return [env, state, pixels, out, &actions, step = 0L](long steps) mutable -> absl::Status {
    const int action_size = env->spec().action_size;
    for (long i = 0; i < steps; ++i, ++step) {
      ASSIGN_OR_RETURN(
          envs::TimeStep t,
          env->Step(std::span<const float>(&actions[size_t(step % kActionTableSize) * action_size], action_size), out));
      if (t.step_type == envs::StepType::kLast) RETURN_IF_ERROR(env->Reset(out).status());
    }
    return absl::OkStatus();
  };
}

// The pool (sync mode): each unit is one batch, a step of every env.
absl::StatusOr<Loop> PoolLoop(std::shared_ptr<envs::EnvPool> pool, const std::vector<float>& actions) {
  RETURN_IF_ERROR(pool->Reset().status());
  return [pool, &actions, batch = 0L](long batches) mutable -> absl::Status {
    const size_t row = size_t(pool->num_envs()) * pool->spec().action_size;
    const long batches_in_table = kActionTableSize / pool->num_envs();
    for (long i = 0; i < batches; ++i, ++batch) {
      RETURN_IF_ERROR(pool->Step(std::span<const float>(&actions[size_t(batch % batches_in_table) * row], row)).status());
    }
    return absl::OkStatus();
  };
}

// Runs run(slice) for every slice at once, the first on this thread and
// each other one on a thread of its own, then returns the first slice error
// (clearing them all).
template <typename Slice, typename Run>
absl::Status RunSlicesAtOnce(std::vector<Slice>& slices, const Run& run) {
  std::vector<std::jthread> others;
  for (size_t s = 1; s < slices.size(); ++s) others.emplace_back(run, std::ref(slices[s]));
  run(slices[0]);
  others.clear();  // joins
  absl::Status first;
  for (Slice& slice : slices) first.Update(std::exchange(slice.error, absl::OkStatus()));
  return first;
}

// The pool's references: the same envs (same seeds, same actions, same
// auto-reset rule) in `slices` contiguous slices, each stepped in turn by a
// thread of its own (slices = 1: this thread), with no synchronization
// between them; a unit is one step of every env. With one slice it is the
// pool's work done serially; with one slice per core it is what this
// machine gives the same work on all cores, at that moment (shared caches,
// memory bandwidth, neighbours), with nothing spent on scheduling.
absl::StatusOr<Loop> SlicesLoop(const envs::EnvOptions& env_options, std::shared_ptr<const envs::Model> model,
                                int num_envs, int slices, const std::vector<float>& actions) {
  struct Slice {
    int begin = 0, end = 0;
    std::vector<float> state;
    std::vector<uint8_t> pixels;
    absl::Status error;
    envs::ObservationBuffers out() { return {state.data(), pixels.empty() ? nullptr : pixels.data()}; }
  };
  struct Envs {
    std::vector<std::unique_ptr<envs::Environment>> envs;
    std::vector<envs::EpisodeProgress> progress;
    std::vector<Slice> slices;
    long batch = 0;
  };
  auto e = std::make_shared<Envs>();
  for (int i = 0; i < num_envs; ++i) {
    envs::EnvOptions options = env_options;
    options.seed = envs::EnvPool::SeedFor(env_options.seed, i);
    ASSIGN_OR_RETURN(auto env, envs::MakeEnv(options, model));
    e->envs.push_back(std::move(env));
  }
  const envs::EnvSpec& spec = e->envs[0]->spec();
  e->progress.assign(num_envs, envs::EpisodeProgress{.episode_step = 0, .needs_reset = false});  // reset below
  for (int s = 0; s < slices; ++s) {
    Slice slice;
    slice.begin = s * num_envs / slices;
    slice.end = (s + 1) * num_envs / slices;
    slice.state.resize(spec.state_size);
    slice.pixels.resize(spec.pixel_bytes());
    e->slices.push_back(std::move(slice));
  }
  for (auto& env : e->envs) RETURN_IF_ERROR(env->Reset(e->slices[0].out()).status());
  return [e, &actions](long batches) -> absl::Status {
    const int n = int(e->envs.size());
    const int action_size = e->envs[0]->spec().action_size;
    const long batches_in_table = kActionTableSize / n;
    auto run = [&](Slice& slice) {
      const envs::ObservationBuffers out = slice.out();
      for (long b = 0; b < batches && slice.error.ok(); ++b) {
        const float* row = &actions[size_t((e->batch + b) % batches_in_table) * n * action_size];
        for (int i = slice.begin; i < slice.end && slice.error.ok(); ++i) {
          envs::AdvanceEnv(*e->envs[i], e->progress[i], /*reset=*/false, row + size_t(i) * action_size, out,
                           &slice.error);
        }
      }
    };
    const absl::Status status = RunSlicesAtOnce(e->slices, run);
    e->batch += batches;
    return status;
  };
}

// The pixel pool's ceiling: the same envs in `slices` contiguous slices,
// each in an env worker process of its own (as the pool's are) fed by a
// thread of its own, one request a batch, never waiting for the other
// slices. A unit is one step of every env.
absl::StatusOr<Loop> WorkerSlicesLoop(const envs::EnvOptions& env_options, const envs::EnvSpec& spec,
                                      const mjModel* model, int num_envs, int slices,
                                      const std::vector<float>& actions) {
  struct Slice {
    std::unique_ptr<envs::EnvWorker> worker;
    std::vector<envs::EnvWorker::Job> jobs;
    absl::Status error;
  };
  struct Workers {
    std::vector<Slice> slices;
    long batch = 0;
  };
  auto w = std::make_shared<Workers>();
  for (int s = 0; s < slices; ++s) {
    const int begin = s * num_envs / slices, end = (s + 1) * num_envs / slices;
    Slice slice;
    ASSIGN_OR_RETURN(slice.worker, envs::EnvWorker::Start(env_options, spec, model, begin, end - begin));
    for (int i = begin; i < end; ++i) slice.jobs.push_back({i, /*reset=*/true});
    RETURN_IF_ERROR(slice.worker->Run(slice.jobs, nullptr));
    for (auto& job : slice.jobs) job.reset = false;  // ended episodes still reset, as in the pool
    w->slices.push_back(std::move(slice));
  }
  return [w, num_envs, action_size = spec.action_size, &actions](long batches) -> absl::Status {
    const long batches_in_table = kActionTableSize / num_envs;
    auto run = [&](Slice& slice) {
      for (long b = 0; b < batches && slice.error.ok(); ++b) {
        slice.error = slice.worker->Run(
            slice.jobs, &actions[size_t((w->batch + b) % batches_in_table) * num_envs * action_size]);
      }
    };
    const absl::Status status = RunSlicesAtOnce(w->slices, run);
    w->batch += batches;
    return status;
  };
}

// Calibration: runs `loop` until one call takes `seconds` (wall clock) and
// returns its rate in units per second; then runs each of `partners` for as
// many units, untimed, so all go on in step.
absl::StatusOr<double> ProbeInStep(const Loop& loop, const std::vector<Loop>& partners, double seconds) {
  absl::Status error;
  long units = 0;
  const double rate = MeasureRate(seconds, [&](long n) {
    if (error.ok()) error = loop(n);
    units += n;
  });
  RETURN_IF_ERROR(error);
  for (const Loop& partner : partners) RETURN_IF_ERROR(partner(units));
  return rate;
}

}  // namespace

absl::StatusOr<Report> RunEnvsBenchmark(const Options& options) {
  Report report;
  std::string envpool_missing = options.quick ? "not in --quick runs" : "";  // why EnvPool is skipped
  const double seconds = options.quick ? 0.2 : options.seconds_per_figure;
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (const envs::TaskInfo& info : envs::Tasks()) {
    if (!options.filter.empty() && std::find(options.filter.begin(), options.filter.end(), info.name) == options.filter.end()) {
      continue;
    }
    ASSIGN_OR_RETURN(auto model, envs::LoadTaskModel(info.name, /*multisample=*/false));
    const auto actions = RandomActions(model->get()->nu, /*seed=*/1);
    for (bool pixels : {false, true}) {
      const std::string kind = pixels ? "pixels 84x84" : "state";
      envs::EnvOptions env_options;
      env_options.task = info.name;
      env_options.pixels = pixels;
      // Contexts first, so no timed loop pays for making them.
      if (pixels) RETURN_IF_ERROR(envs::PrepareRenderer(model));
      // One env against the raw loop, on this thread's CPU clock; windows
      // sized from a short probe so all attempts take about `seconds`.
      ASSIGN_OR_RETURN(std::unique_ptr<RawLoop> raw, RawLoop::Create(info, model, pixels, actions));
      const Loop raw_loop = [&raw](long n) { return raw->Run(n); };
      ASSIGN_OR_RETURN(Loop env, EnvLoop(env_options, model, actions));
      ASSIGN_OR_RETURN(double probe, ProbeInStep(raw_loop, {env}, seconds / 20));
      ASSIGN_OR_RETURN(std::vector<double> single,
                       BestOfAlternated({env, raw_loop}, std::max(1L, long(probe * seconds / kAttempts)), kAttempts,
                                        Clock::kThreadCpu));
      report.Add(absl::StrCat(info.name, " ", kind, " env, 1 thread"), single[0], "steps/cpu-s",
                 pixels ? "raw step+updateScene+render+readPixels" : "raw mj_step x substeps", single[1]);
      raw.reset();
      // The pool's wall-clock rate against the same envs stepped in turn on
      // one thread, and against the machine's ceiling for the same work: a
      // fixed slice a core, each stepped freely, never waiting for the
      // others. State: a thread a slice. Pixels: a process a slice (threads
      // of one process take turns in llvmpipe), as the pool's env workers.
      const int num_envs = pixels ? 8 * threads : 32 * threads;
      envs::EnvPoolOptions pool_options;
      pool_options.env = env_options;
      pool_options.num_envs = num_envs;
      pool_options.num_threads = threads;
      ASSIGN_OR_RETURN(std::shared_ptr<envs::EnvPool> env_pool, envs::EnvPool::Create(pool_options));
      ASSIGN_OR_RETURN(Loop pool, PoolLoop(env_pool, actions));
      ASSIGN_OR_RETURN(Loop in_turn, SlicesLoop(env_options, model, num_envs, 1, actions));
      Loop free_slices;
      if (pixels) {
        ASSIGN_OR_RETURN(free_slices, WorkerSlicesLoop(env_options, env_pool->spec(), env_pool->model(), num_envs,
                                                       threads, actions));
      } else {
        ASSIGN_OR_RETURN(free_slices, SlicesLoop(env_options, model, num_envs, threads, actions));
      }
      const std::vector<Loop> loops = {pool, in_turn, free_slices};
      // (The probe keeps the others in step with in_turn.)
      ASSIGN_OR_RETURN(double batches_per_s, ProbeInStep(in_turn, {pool, free_slices}, seconds / 20));
      ASSIGN_OR_RETURN(std::vector<double> rates,
                       BestOfAlternated(loops, std::max(1L, long(batches_per_s * seconds / kAttempts)), kAttempts,
                                        Clock::kWall));
      const std::string name = absl::StrCat(info.name, " ", kind, " pool, ", threads, " threads, ", num_envs, " envs");
      report.Add(name, rates[0] * num_envs, "steps/s", "the same envs in turn on 1 thread (wall clock)",
                 rates[1] * num_envs);
      report.Add(name + (pixels ? ", against free processes" : ", against free threads"), rates[0] * num_envs,
                 "steps/s",
                 absl::StrCat("the same envs in ", threads, " fixed slices, a free ", pixels ? "process" : "thread",
                              " each"),
                 rates[2] * num_envs);
      // EnvPool on the same envs and threads: its dm_control task, rendering
      // every env at 84x84 every step for pixels.
      for (int pool_threads : {1, 2}) {
        pool_options.num_threads = pool_threads;
        ASSIGN_OR_RETURN(std::shared_ptr<envs::EnvPool> our_pool, envs::EnvPool::Create(pool_options));
        ASSIGN_OR_RETURN(Loop ours, PoolLoop(our_pool, actions));
        ASSIGN_OR_RETURN(double probe_rate, ProbeInStep(ours, {}, seconds / 20));
        ASSIGN_OR_RETURN(std::vector<double> our_rate,
                         BestOfAlternated({ours}, std::max(1L, long(probe_rate * seconds / kAttempts)), kAttempts,
                                          Clock::kWall));
        double envpool = 0;
        if (envpool_missing.empty()) {
          auto measured = RunEnvPoolPeer(EnvPoolId(info.name), num_envs, pool_threads, seconds, pixels);
          if (measured.ok()) {
            envpool = *measured;
          } else {
            envpool_missing = std::string(measured.status().message());
            std::printf("(EnvPool figures skipped: %s)\n", envpool_missing.c_str());
          }
        }
        report.Add(absl::StrCat(info.name, " ", kind, " pool, ", pool_threads,
                                pool_threads == 1 ? " thread, " : " threads, ", num_envs, " envs, against EnvPool"),
                   our_rate[0] * num_envs, "steps/s",
                   absl::StrCat("EnvPool 1.2.5 stepping its dm_control task (MuJoCo 3.17)",
                                pixels ? ", rendering each env at 84x84" : "", ", the same envs on as many threads"),
                   envpool);
      }
    }
  }
  return report;
}

}  // namespace troupe::bench
