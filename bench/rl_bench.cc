// `troupe bench rl`: end-to-end throughput from pixels on this machine —
// configs/cartpole_swingup.textproto (84x84, 3 frames, action repeat 8) with
// 2 actor processes (launch::ActorFleet, the launcher's) and the learner with
// replay embedded (learner::RlLearner, in this process) — over a fixed window
// after warm-up: env frames/s into replay, learner updates/s, and the CPU
// seconds each process used in the window (/proc/PID/stat) as fractions of
// the machine's cores. Each rate sits next to a reference measured in the
// same run:
//   env frames/s  — the same env pools (one per actor, on as many threads)
//                   stepping alone with the same policy inference and
//                   exploration noise: no learner, no replay writes;
//   updates/s     — the same learner (RlLearner::Run, same batch size and
//                   threads) alone on a replay filled with rendered frames
//                   through the actors' TransitionWriter, no actors and no
//                   samples-per-insert limit.
// The end-to-end run happens twice: as configured (samples_per_insert 32:
// replay's rate limiter holds the actors to the learner, so env frames/s is
// updates/s x batch / 32 x action repeat, and the actors mostly wait), and
// with no samples-per-insert limit, where actors and learner compete for the
// cores freely. The actors act with the policy from their first step
// (actors.random_frames 0) and the evaluator is off, so every figure
// measures the same work.
// `--seconds S` scales the window (20 S) and the references (5 S each);
// `--quick` is a smoke test of a few seconds (batch 32, smaller replay).
// The actor processes are `troupe actor` run from /proc/self/exe: this
// benchmark works inside the troupe command only.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "actors/actor.h"
#include "actors/observation_stack.h"
#include "actors/transition_writer.h"
#include "agents/d4pg_agent.h"
#include "bench/bench.h"
#include "common/config.h"
#include "common/files.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "envs/env_pool.h"
#include "launch/launcher.h"
#include "learner/rl_learner.h"
#include "replay/grpc_client.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// User + system CPU seconds of process `pid` so far (0 if it is gone).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at ") ".
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Field 3 is the state; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// The experiment every phase uses: the pixel config with the benchmark's overrides.
absl::StatusOr<config::ExperimentConfig> BenchConfig(const Options& options, const std::string& runs_dir) {
  std::vector<std::string> overrides = {
      "actors.count=2", "actors.random_frames=0", "evaluator.every_frames=0", "learner.checkpoint_every_s=100000",
      "total_frames=1000000000000", absl::StrCat("runs_dir=", runs_dir)};
  if (options.quick) {
    overrides.insert(overrides.end(), {"learner.batch_size=32", "learner.min_replay_size=64", "learner.publish_every=2"});
  } else {
    overrides.push_back("learner.min_replay_size=500");
  }
  return LoadExperimentConfig(ProjectPath("configs/cartpole_swingup.textproto"), overrides);
}

// Reference: each actor's env pool and policy stepping alone, one thread per
// actor, for `seconds`. Returns env frames/s over all of them.
absl::StatusOr<double> EnvFramesAlone(const config::ExperimentConfig& config, double seconds) {
  ASSIGN_OR_RETURN(const envs::EnvSpec env_spec, envs::DescribeEnv(config.env()));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(env_spec);
  const int action_size = env_spec.action_size;
  const int count = config.actors().count();
  std::vector<int64_t> frames(count, 0);
  std::vector<absl::Status> errors(count);
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> ready{0};
  {
    std::vector<std::jthread> threads;
    for (int index = 0; index < count; ++index) {
      threads.emplace_back([&, index] {
        // What RunActor builds: a pool with single frames, a stack, the policy.
        auto body = [&]() -> absl::Status {
          config::EnvConfig env_config = config.env();
          env_config.set_frame_stack(1);
          env_config.set_seed(config.env().seed() + 1000003ull * (index + 1));
          ASSIGN_OR_RETURN(auto pool_options, envs::EnvPoolOptions::FromConfig(env_config, config.pool()));
          pool_options.batch_size = 0;
          ASSIGN_OR_RETURN(auto pool, envs::EnvPool::Create(pool_options));
          ASSIGN_OR_RETURN(auto policy, agents::D4pgPolicy::Create(config.d4pg(), spec, action_size));
          const int n = pool->num_envs();
          const size_t pixel_bytes = pool->spec().pixel_bytes();
          actors::ObservationStack stack(n, spec.frames, spec.height, spec.width);
          std::vector<float> actions(size_t(n) * action_size);
          std::mt19937_64 rng(index);
          std::normal_distribution<float> gaussian(0.0f, 1.0f);
          const float noise = agents::D4pgNoiseScale(config.actors(), index, /*frames=*/0);
          ASSIGN_OR_RETURN(envs::EnvBatch batch, pool->Reset());
          for (int i = 0; i < n; ++i) stack.Reset(i, batch.pixels.data() + i * pixel_bytes);
          // Warm (GL context, first inference), then wait for the others.
          RETURN_IF_ERROR(policy->Act(nullptr, stack.Stacked(), n, actions.data()));
          ++ready;
          while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          while (!stop) {
            RETURN_IF_ERROR(policy->Act(nullptr, stack.Stacked(), n, actions.data()));
            for (float& a : actions) a = std::clamp(a + noise * gaussian(rng), -1.0f, 1.0f);
            ASSIGN_OR_RETURN(batch, pool->Step(actions));
            for (int i = 0; i < n; ++i) {
              const uint8_t* frame = batch.pixels.data() + i * pixel_bytes;
              if (static_cast<envs::StepType>(batch.step_type[i]) == envs::StepType::kFirst) {
                stack.Reset(i, frame);
              } else {
                stack.Push(i, frame);
                frames[index] += config.env().action_repeat();
              }
            }
          }
          return absl::OkStatus();
        };
        errors[index] = body();
        if (!errors[index].ok()) ++ready;
      });
    }
    while (ready < count) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    go = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
  }  // joined
  for (const absl::Status& e : errors) RETURN_IF_ERROR(e);
  int64_t total = 0;
  for (int64_t f : frames) total += f;
  return total / seconds;
}

// Fills the learner's replay through its gRPC port with `transitions`
// rendered transitions (random actions), as an actor's writer does.
absl::Status FillReplay(const config::ExperimentConfig& config, const std::string& address, int64_t transitions) {
  ASSIGN_OR_RETURN(const envs::EnvSpec env_spec, envs::DescribeEnv(config.env()));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(env_spec);
  const int action_size = env_spec.action_size;
  config::EnvConfig env_config = config.env();
  env_config.set_frame_stack(1);
  ASSIGN_OR_RETURN(auto pool_options, envs::EnvPoolOptions::FromConfig(env_config, config.pool()));
  ASSIGN_OR_RETURN(auto pool, envs::EnvPool::Create(pool_options));
  auto client = replay::NewGrpcClient(address);
  ASSIGN_OR_RETURN(auto writer, client->NewWriter());
  ASSIGN_OR_RETURN(const actors::TransitionLayout layout, actors::ActorTransitionLayout(config, spec, action_size));
  const int n = pool->num_envs();
  actors::TransitionWriter transitions_writer(writer.get(), n, layout);
  const size_t pixel_bytes = pool->spec().pixel_bytes();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> actions(size_t(n) * action_size);
  ASSIGN_OR_RETURN(envs::EnvBatch batch, pool->Reset());
  for (int i = 0; i < n; ++i) RETURN_IF_ERROR(transitions_writer.Start(i, nullptr, batch.pixels.data() + i * pixel_bytes));
  while (transitions_writer.transitions_inserted() < transitions) {
    for (float& a : actions) a = uniform(rng);
    ASSIGN_OR_RETURN(batch, pool->Step(actions));
    for (int i = 0; i < n; ++i) {
      const uint8_t* frame = batch.pixels.data() + i * pixel_bytes;
      const auto type = static_cast<envs::StepType>(batch.step_type[i]);
      if (type == envs::StepType::kFirst) {
        RETURN_IF_ERROR(transitions_writer.Start(i, nullptr, frame));
        continue;
      }
      RETURN_IF_ERROR(transitions_writer.Step(i, &actions[size_t(i) * action_size], batch.reward[i],
                                              batch.discount[i], type == envs::StepType::kLast, nullptr, frame));
    }
  }
  return writer->Close();
}

// A learner running on a thread of its own until Stop().
class LearnerThread {
 public:
  static absl::StatusOr<std::unique_ptr<LearnerThread>> Start(const config::ExperimentConfig& config,
                                                              const std::string& run_dir) {
    std::filesystem::create_directories(run_dir);
    std::string text;
    google::protobuf::TextFormat::PrintToString(config, &text);
    RETURN_IF_ERROR(WriteFileAtomically(RunLayout(run_dir).config(), text));
    auto t = std::unique_ptr<LearnerThread>(new LearnerThread());
    ASSIGN_OR_RETURN(t->learner_, learner::RlLearner::Create(config, run_dir, /*resume=*/false));
    return t;
  }
  void Run() {
    thread_ = std::jthread([this] { status_ = learner_->Run(&stop_); });
  }
  absl::Status Stop() {
    stop_ = true;
    learner_->Interrupt();
    thread_ = std::jthread();  // joins
    return status_;
  }
  learner::RlLearner& learner() { return *learner_; }

 private:
  LearnerThread() = default;
  std::unique_ptr<learner::RlLearner> learner_;
  std::atomic<bool> stop_{false};
  absl::Status status_;
  std::jthread thread_;
};

// Waits until the learner has done `updates` and `seconds` have passed
// since `start`; DeadlineExceeded after `limit` seconds.
absl::Status AwaitUpdates(learner::RlLearner& learner, int64_t updates, Clock::time_point start, double seconds,
                          double limit, const std::string& what) {
  while (learner.Stats().updates < updates || SecondsSince(start) < seconds) {
    if (SecondsSince(start) > limit) {
      return absl::DeadlineExceededError(absl::StrFormat("%s: %d learner updates after %.0f s (waited for %d)", what,
                                                         learner.Stats().updates, limit, updates));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

// The learner's counters and the processes' CPU seconds at one moment.
struct Snapshot {
  Clock::time_point time;
  learner::LearnerStats stats;
  double learner_cpu = 0;
  std::vector<double> actor_cpu;
};

// A measurement window. The learner's counters move once per Train call
// (learner.publish_every updates, up to a second each from pixels), so the
// window runs from one such step to another: it opens at the first step and
// closes at the first step after `seconds` with at least `min_steps` steps
// inside, and partial steps never count. DeadlineExceeded after `limit` s.
absl::StatusOr<std::pair<Snapshot, Snapshot>> MeasureWindow(learner::RlLearner& learner,
                                                            const std::vector<pid_t>& actors, double seconds,
                                                            int min_steps, double limit) {
  auto take = [&] {
    Snapshot x;
    x.time = Clock::now();
    x.stats = learner.Stats();
    x.learner_cpu = ProcessCpuSeconds(getpid());
    for (pid_t pid : actors) x.actor_cpu.push_back(ProcessCpuSeconds(pid));
    return x;
  };
  const auto start = Clock::now();
  const int64_t before = learner.Stats().updates;
  auto wait_for_step = [&](int64_t after) -> absl::Status {
    while (learner.Stats().updates == after) {
      if (SecondsSince(start) > limit) {
        return absl::DeadlineExceededError(
            absl::StrFormat("the learner stopped updating (%d updates, %.0f s into the window)", after, limit));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(wait_for_step(before));
  Snapshot first = take(), last = first;
  int steps = 0;
  while (std::chrono::duration<double>(last.time - first.time).count() < seconds || steps < min_steps) {
    RETURN_IF_ERROR(wait_for_step(last.stats.updates));
    last = take();
    ++steps;
  }
  return std::make_pair(std::move(first), std::move(last));
}

// Reference: the learner alone on a filled replay, updates/s over `seconds`.
absl::StatusOr<double> UpdatesAlone(config::ExperimentConfig config, const std::string& run_dir, int64_t fill,
                                    double seconds, int min_steps) {
  config.mutable_learner()->set_samples_per_insert(0);  // nothing is inserted while it trains
  config.mutable_learner()->set_min_replay_size(std::min<int64_t>(fill, config.learner().min_replay_size()));
  ASSIGN_OR_RETURN(auto learner, LearnerThread::Start(config, run_dir));
  RETURN_IF_ERROR(FillReplay(config, learner->learner().address(), fill));
  learner->Run();
  // Warm-up: the first Train call (scratch, arenas), then the window.
  absl::StatusOr<std::pair<Snapshot, Snapshot>> window =
      MeasureWindow(learner->learner(), {}, /*seconds=*/0, /*min_steps=*/0, /*limit=*/300);
  if (window.ok()) window = MeasureWindow(learner->learner(), {}, seconds, min_steps, /*limit=*/300);
  const absl::Status stopped = learner->Stop();
  RETURN_IF_ERROR(window.status());
  RETURN_IF_ERROR(stopped);
  const auto& [first, last] = *window;
  return (last.stats.updates - first.stats.updates) / std::chrono::duration<double>(last.time - first.time).count();
}

struct EndToEnd {
  double frames_per_second = 0, updates_per_second = 0, samples_per_insert = 0;
  double learner_cpu = 0, actors_cpu = 0;  // CPU seconds in the window
  std::vector<double> actor_cpu;           // per actor
  double window = 0;
};

// The learner (this process) and the actor processes, measured over a
// window of `window` seconds (and `min_steps` Train calls) after `warmup`
// seconds and `warmup_steps` Train calls.
absl::StatusOr<EndToEnd> RunEndToEnd(const config::ExperimentConfig& config, const std::string& run_dir,
                                     double warmup, int warmup_steps, double window, int min_steps) {
  ASSIGN_OR_RETURN(auto learner, LearnerThread::Start(config, run_dir));
  learner->Run();
  std::atomic<bool> no_stop{false};
  ASSIGN_OR_RETURN(auto actors, launch::ActorFleet::Start(config, run_dir, learner->learner().address(), &no_stop));
  const int64_t publish_every = std::max(config.learner().publish_every(), 1);
  absl::Status status =
      AwaitUpdates(learner->learner(), warmup_steps * publish_every, Clock::now(), warmup, 300, "end to end warm-up");
  const std::vector<pid_t> pids = actors->pids();
  if (status.ok() && int(pids.size()) != config.actors().count()) {
    status = absl::InternalError(absl::StrCat("only ", pids.size(), " of ", config.actors().count(),
                                              " actors are running; see ", RunLayout(run_dir).logs()));
  }
  absl::StatusOr<std::pair<Snapshot, Snapshot>> measured =
      status.ok() ? MeasureWindow(learner->learner(), pids, window, min_steps, /*limit=*/300)
                  : absl::StatusOr<std::pair<Snapshot, Snapshot>>(status);
  actors->Stop();
  const absl::Status stopped = learner->Stop();
  RETURN_IF_ERROR(measured.status());
  RETURN_IF_ERROR(stopped);
  const auto& [first, last] = *measured;
  EndToEnd e;
  e.window = std::chrono::duration<double>(last.time - first.time).count();
  e.learner_cpu = last.learner_cpu - first.learner_cpu;
  for (size_t i = 0; i < pids.size(); ++i) {
    e.actor_cpu.push_back(last.actor_cpu[i] - first.actor_cpu[i]);
    e.actors_cpu += e.actor_cpu.back();
  }
  e.frames_per_second = (last.stats.frames - first.stats.frames) / e.window;
  e.updates_per_second = (last.stats.updates - first.stats.updates) / e.window;
  const double inserts = double(last.stats.frames - first.stats.frames) / std::max(config.env().action_repeat(), 1);
  e.samples_per_insert =
      inserts > 0 ? (last.stats.updates - first.stats.updates) * double(config.learner().batch_size()) / inserts : 0;
  return e;
}

}  // namespace

absl::StatusOr<Report> RunRlBenchmark(const Options& options) {
  Report report;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("troupe_bench_rl_", getpid())).string();
  std::filesystem::remove_all(dir);
  ASSIGN_OR_RETURN(const config::ExperimentConfig config, BenchConfig(options, dir + "/runs"));
  const double reference_seconds = options.quick ? 1.0 : 5.0 * options.seconds_per_figure;
  const double warmup = options.quick ? 1.0 : 5.0 * options.seconds_per_figure;
  const double window = options.quick ? 2.0 : 20.0 * options.seconds_per_figure;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int count = config.actors().count();
  std::printf("(%s from pixels, batch %d, samples per insert %g, %d actors: references %.0f s each, then %.0f s "
              "warm-up and a window of at least %.0f s)\n",
              config.env().task().c_str(), config.learner().batch_size(), config.learner().samples_per_insert(), count,
              reference_seconds, warmup, window);
  std::fflush(stdout);

  // The references, each alone on the machine.
  ASSIGN_OR_RETURN(const double frames_alone, EnvFramesAlone(config, reference_seconds));
  ASSIGN_OR_RETURN(const double updates_alone,
                   UpdatesAlone(config, dir + "/learner_alone", options.quick ? 200 : 2000, reference_seconds,
                                /*min_steps=*/options.quick ? 1 : 2));
  // Everything together: as configured (the rate limiter holds actors to
  // samples_per_insert), then with no ratio, where actors and learner
  // compete for the cores freely.
  const double limit = config.learner().samples_per_insert();
  for (const double samples_per_insert : {limit, 0.0}) {
    if (samples_per_insert == 0 && limit == 0 && !report.figures.empty()) break;
    config::ExperimentConfig variant = config;
    variant.mutable_learner()->set_samples_per_insert(samples_per_insert);
    const std::string how = samples_per_insert > 0 ? absl::StrFormat("samples/insert %g", samples_per_insert)
                                                   : std::string("no samples/insert limit");
    auto e2e = RunEndToEnd(variant, absl::StrCat(dir, "/end_to_end_", report.figures.size()), warmup,
                           /*warmup_steps=*/options.quick ? 1 : 2, window, /*min_steps=*/options.quick ? 1 : 3);
    if (!e2e.ok()) {
      std::filesystem::remove_all(dir);
      return e2e.status();
    }
    report.Add(absl::StrCat("env frames/s, ", count, " actors + learner, ", how), e2e->frames_per_second,
               "frames/s", absl::StrCat(count, " env pools + policy, alone"), frames_alone);
    report.Add(absl::StrCat("learner updates/s, batch ", config.learner().batch_size(), ", ", how),
               e2e->updates_per_second, "updates/s", "the same learner alone, filled replay", updates_alone);
    const double machine = e2e->window * cores;
    report.Add(absl::StrCat("CPU share: ", count, " actor processes, ", how), e2e->actors_cpu / machine, "of cores",
               absl::StrCat("all ", cores, " cores"), 1.0);
    for (size_t i = 0; i < e2e->actor_cpu.size(); ++i) {
      report.Add(absl::StrCat("CPU share: actor ", i, ", ", how), e2e->actor_cpu[i] / machine, "of cores",
                 absl::StrCat("all ", cores, " cores"), 1.0);
    }
    report.Add(absl::StrCat("CPU share: learner process (replay embedded), ", how), e2e->learner_cpu / machine,
               "of cores", absl::StrCat("all ", cores, " cores"), 1.0);
    std::printf("(window %.1f s; samples per insert in it %.1f)\n", e2e->window, e2e->samples_per_insert);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return report;
}

// `troupe bench appo`: APPO end to end from state on this machine —
// configs/appo_cartpole_balance_state.textproto, 2 actor processes (8 envs)
// and the learner with its trajectory queue embedded — env frames/s over a
// window after warm-up (updates included: the actors wait on the queue's
// rate limiter for the learner), next to the PyTorch PPO peer
// (bench/peers/torch_ppo.py: CleanRL's single file on dm_control's suite,
// the same batch, unroll, networks, epochs and minibatches) doing the same
// work per frame in one process, by the protocol (alternated rounds, a
// fresh run or process each, both on the machine's cores).
absl::StatusOr<Report> RunAppoBenchmark(const Options& options) {
  Report report;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("troupe_bench_appo_", getpid())).string();
  std::filesystem::remove_all(dir);
  ASSIGN_OR_RETURN(const config::ExperimentConfig config,
                   LoadExperimentConfig(ProjectPath("configs/appo_cartpole_balance_state.textproto"),
                                        {"evaluator.every_frames=0", "learner.checkpoint_every_s=100000",
                                         "total_frames=1000000000000", absl::StrCat("runs_dir=", dir, "/runs")}));
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // A peer update is B x T x repeat frames (262,144 at 1.5k frames/s: ~5 s):
  // rounds long enough for a few of them.
  const double seconds = options.quick ? 3.0 : std::max(15.0, 15.0 * options.seconds_per_figure);
  ProtocolOptions protocol = DefaultProtocol(options, cores, seconds);
  int round_index = 0;
  const Side troupe = [&](const Round& round) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const EndToEnd e, RunEndToEnd(config, absl::StrCat(dir, "/round_", round_index++),
                                                   /*warmup=*/options.quick ? 1.0 : 3.0, /*warmup_steps=*/2,
                                                   round.seconds, /*min_steps=*/3));
    return e.frames_per_second;
  };
  const std::vector<std::string> task = absl::StrSplit(config.env().task(), '.');
  const config::AppoConfig& appo = config.appo();
  const std::string settings = absl::StrFormat(
      "batch=%d unroll=%d epochs=%d minibatches=%d lr=%g reward_scale=%g", config.learner().batch_size(),
      appo.unroll_length(), appo.epochs(), appo.minibatches(), appo.learning_rate(), appo.reward_scale());
  const Side peer = PeerSide(
      Peer::kPytorch, "torch_ppo",
      [&](const Round& round) {
        return absl::StrCat(task[0], " ", task[1], " ", config.env().action_repeat(), " speed ", round.seconds, " ",
                            settings);
      },
      "frames_per_second");
  std::printf("(%s from state, APPO, %d actors x %d envs + learner, batch %d x %d steps: rounds of %.0f s)\n",
              config.env().task().c_str(), config.actors().count(), config.pool().num_envs(),
              config.learner().batch_size(), appo.unroll_length(), seconds);
  std::fflush(stdout);
  const absl::StatusOr<double> measured = AddComparison(
      report, absl::StrCat("env frames/s end to end, APPO ", config.env().task(), " from state"), "frames/s",
      absl::StrCat("PyTorch ", "2.5.1 PPO (CleanRL-style, dm_control suite), same recipe"), troupe, peer, protocol);
  std::filesystem::remove_all(dir);
  RETURN_IF_ERROR(measured.status());
  return report;
}

}  // namespace troupe::bench
