// `troupe bench envs`: per task, for state and for 84x84 pixel observations,
// every row a comparison by the protocol of bench/protocol.h (warm-up
// rounds discarded, then rounds alternated troupe, reference, troupe, ...,
// each side given the same seconds a round and the same threads; each
// side's median of its rounds, with their min-max, and the ratio of the
// medians). Each side keeps its state from round to round (episodes go on
// where they left off). The rows:
//   * one env against the raw MuJoCo loop doing the same physics (and
//     rendering) on the same model, both on this thread, timed on its CPU
//     clock (so the ratio holds on a shared machine);
//   * the pool on all cores (wall clock) against the same envs stepped in
//     turn by one thread, and against the same envs in fixed slices stepped
//     freely, one a core (the machine's ceiling: a thread a slice for state,
//     an env worker process a slice for pixels);
//   * the pool on 1 and on 2 threads against EnvPool (PyPI envpool 1.2.5 as
//     its wheel ships it, its dm_control tasks, MuJoCo 3.x; for pixels
//     rendering every env at 84x84 every step), a process of it a round,
//     stepping the same number of envs on as many threads. Missing, saying
//     why, without PyPI and in --quick runs; for pixels, "does not render
//     here" where EnvPool's renderer fails on this machine.
#include <mujoco/mujoco.h>

#include <algorithm>
#include <cctype>
#include <optional>
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

}  // namespace

absl::StatusOr<Report> RunEnvsBenchmark(const Options& options) {
  Report report;
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // The protocol's rounds (5 measured after a warm-up, 3 with --quick), of
  // --seconds each (0.2 s with --quick), on `count` threads, unpinned.
  auto protocol = [&options](int count) {
    ProtocolOptions p = DefaultProtocol(options, count);
    if (options.quick) p.seconds_per_round = std::min(p.seconds_per_round, 0.2);
    return p;
  };
  // Why EnvPool is missing (empty: it runs), and for pixels why it cannot
  // render here (probed once, at the first pixel row).
  std::string envpool_missing = options.quick ? "not in --quick runs" : "";
  std::optional<std::string> envpool_pixels_missing;
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
      // Contexts first, so no round pays for making them.
      if (pixels) RETURN_IF_ERROR(envs::PrepareRenderer(model));
      // One env against the raw loop, on this thread's CPU clock.
      {
        ASSIGN_OR_RETURN(std::unique_ptr<RawLoop> raw, RawLoop::Create(info, model, pixels, actions));
        ASSIGN_OR_RETURN(Loop env, EnvLoop(env_options, model, actions));
        const Loop raw_loop = [&raw](long n) { return raw->Run(n); };
        ASSIGN_OR_RETURN(Comparison single, CompareAlternated(LoopSide(env, Clock::kThreadCpu),
                                                              LoopSide(raw_loop, Clock::kThreadCpu), protocol(1)));
        report.Add(absl::StrCat(info.name, " ", kind, " env, 1 thread"), "steps/cpu-s",
                   pixels ? "raw step+updateScene+render+readPixels" : "raw mj_step x substeps", single);
      }
      // The pool's wall-clock rate against the same envs stepped in turn by
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
      // A unit of these loops is a batch: a step of every env.
      const std::string name = absl::StrCat(info.name, " ", kind, " pool, ", threads, " threads, ", num_envs, " envs");
      ASSIGN_OR_RETURN(Comparison against_in_turn,
                       CompareAlternated(LoopSide(pool, Clock::kWall, num_envs),
                                         LoopSide(in_turn, Clock::kWall, num_envs), protocol(threads)));
      report.Add(name, "steps/s", "the same envs stepped in turn by 1 of the threads (wall clock)", against_in_turn);
      ASSIGN_OR_RETURN(Comparison against_free,
                       CompareAlternated(LoopSide(pool, Clock::kWall, num_envs),
                                         LoopSide(free_slices, Clock::kWall, num_envs), protocol(threads)));
      report.Add(name + (pixels ? ", against free processes" : ", against free threads"), "steps/s",
                 absl::StrCat("the same envs in ", threads, " fixed slices, a free ", pixels ? "process" : "thread",
                              " each (wall clock)"),
                 against_free);
      env_pool.reset();
      pool = in_turn = free_slices = nullptr;  // their envs, worker processes and threads go before the next pools
      // EnvPool stepping its dm_control task with as many envs on as many
      // threads, a process of it a round; for pixels rendering every env at
      // 84x84 every step.
      const std::string envpool_id = EnvPoolId(info.name);
      if (pixels && !envpool_pixels_missing.has_value() && envpool_missing.empty()) {
        absl::StatusOr<double> probe = RunEnvPoolPeer(envpool_id, 1, 1, 0.1, /*pixels=*/true);
        envpool_pixels_missing =
            probe.status().code() == absl::StatusCode::kFailedPrecondition ? std::string(probe.status().message()) : "";
        if (!envpool_pixels_missing->empty()) std::printf("(%s)\n", envpool_pixels_missing->c_str());
      }
      const bool renders = !pixels || !envpool_pixels_missing.has_value() || envpool_pixels_missing->empty();
      const std::string envpool_reference =
          renders ? absl::StrCat("EnvPool 1.2.5 (PyPI, as shipped) stepping its dm_control task (MuJoCo 3.17)",
                                 pixels ? ", rendering each env at 84x84" : "", ", the same envs on as many threads")
                  : "EnvPool: does not render here (PyPI envpool 1.2.5 as shipped)";
      for (int pool_threads : {1, 2}) {
        pool_options.num_threads = pool_threads;
        ASSIGN_OR_RETURN(std::shared_ptr<envs::EnvPool> our_pool, envs::EnvPool::Create(pool_options));
        ASSIGN_OR_RETURN(Loop ours, PoolLoop(our_pool, actions));
        const Side envpool = [&](const Round& round) -> absl::StatusOr<double> {
          if (!envpool_missing.empty()) return absl::UnavailableError(envpool_missing);
          if (!renders) return absl::FailedPreconditionError(*envpool_pixels_missing);
          absl::StatusOr<double> rate = RunEnvPoolPeer(envpool_id, num_envs, round.threads, round.seconds, pixels);
          // Without PyPI: the rows after this one say why at once.
          if (rate.status().code() == absl::StatusCode::kUnavailable) envpool_missing = std::string(rate.status().message());
          return rate;
        };
        RETURN_IF_ERROR(AddComparison(report,
                                      absl::StrCat(info.name, " ", kind, " pool, ", pool_threads,
                                                   pool_threads == 1 ? " thread, " : " threads, ", num_envs,
                                                   " envs, against EnvPool"),
                                      "steps/s", envpool_reference, LoopSide(ours, Clock::kWall, num_envs), envpool,
                                      protocol(pool_threads))
                            .status());
      }
    }
  }
  return report;
}

}  // namespace troupe::bench
