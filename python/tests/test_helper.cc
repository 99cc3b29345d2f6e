// What the C++ side computes, written to files for the Python tests to
// compare with (python/tests/*.py):
//
//   troupe_python_test_helper pool TASK OBSERVATION NUM_ENVS THREADS ACTION_REPEAT FRAME_STACK SEED STEPS OUT
//     A sync EnvPool (observation "pixels" or "state") reset, then stepped
//     STEPS times with PoolTestAction(step, env, j); OUT gets, per batch
//     (the reset's first), its step types, rewards, discounts, env ids,
//     states, pixels and episode steps, raw, in that order.
//   troupe_python_test_helper checkpoint RUN_DIR SEED BATCH
//     A run directory for cartpole.swingup from state: config.textproto, the
//     agent's checkpoints/agent.ckpt (networks initialised from SEED),
//     RUN_DIR/observations.f32 (BATCH x state_size) and the actions
//     the agent's policy gives for them with the agent's policy parameters,
//     RUN_DIR/actions.f32 (BATCH x action_size).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/agents.h"
#include "common/config.h"
#include "common/run_layout.h"
#include "engine/engine_config.h"
#include "envs/env.h"
#include "envs/env_pool.h"

namespace troupe {
namespace {

// Exact in float32 on both sides: small integers over 10 (Python's
// tests compute the same with numpy float32).
float PoolTestAction(int step, int env, int j) { return float((step * 7 + env * 13 + j * 5) % 21 - 10) / 10.0f; }

template <typename T>
void Write(std::ofstream& out, std::span<const T> values) {
  out.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size_bytes()));
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "troupe_python_test_helper: %s\n", status.ToString().c_str());
  return 1;
}

int Pool(char** argv) {
  envs::EnvPoolOptions options;
  options.env.task = argv[0];
  options.env.pixels = std::string(argv[1]) == "pixels";
  options.num_envs = std::atoi(argv[2]);
  options.num_threads = std::atoi(argv[3]);
  options.env.action_repeat = std::atoi(argv[4]);
  options.env.frame_stack = std::atoi(argv[5]);
  options.env.seed = std::strtoull(argv[6], nullptr, 10);
  const int steps = std::atoi(argv[7]);
  std::ofstream out(argv[8], std::ios::binary);
  auto pool = envs::EnvPool::Create(options);
  if (!pool.ok()) return Fail(pool.status());
  const int A = (*pool)->spec().action_size;
  std::vector<float> actions(size_t(options.num_envs) * A);
  for (int step = 0; step <= steps; ++step) {
    absl::StatusOr<envs::EnvBatch> batch;
    if (step == 0) {
      batch = (*pool)->Reset();
    } else {
      for (int i = 0; i < options.num_envs; ++i) {
        for (int j = 0; j < A; ++j) actions[size_t(i) * A + j] = PoolTestAction(step, i, j);
      }
      batch = (*pool)->Step(actions);
    }
    if (!batch.ok()) return Fail(batch.status());
    Write(out, batch->step_type);
    Write(out, batch->reward);
    Write(out, batch->discount);
    Write(out, batch->env_id);
    Write(out, batch->state);
    Write(out, batch->pixels);
    Write(out, batch->episode_step);
  }
  return out.good() ? 0 : Fail(absl::DataLossError(absl::StrCat("cannot write ", argv[8])));
}

constexpr char kRunConfig[] = R"(name: "python_policy_test"
mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: 2 }
d4pg { hidden: [32, 32] atoms: 21 v_min: 0 v_max: 100 }
learner { batch_size: 8 engine { threads: 1 seed: SEED } }
)";

int Checkpoint(char** argv) {
  const std::string dir = argv[0];
  const int batch = std::atoi(argv[2]);
  std::string text = kRunConfig;
  text.replace(text.find("SEED"), 4, argv[1]);
  config::ExperimentConfig config;
  if (auto parsed = ParseTextConfig(text, kConfigFile, &config); !parsed.ok()) return Fail(parsed);
  std::filesystem::create_directories(dir + "/checkpoints");
  std::ofstream(RunLayout(dir).config()) << text;

  auto env = envs::DescribeEnv(config.env());
  if (!env.ok()) return Fail(env.status());
  const agents::ObservationSpec spec = agents::ObservationSpecOf(*env);
  config::EngineConfig engine = config.learner().engine();
  engine.set_replicas(1);
  auto replicator = engine::MakeReplicator(engine);
  if (!replicator.ok()) return Fail(replicator.status());
  auto agent = agents::CreateAgent(config, spec, env->action_size, replicator->get());
  if (!agent.ok()) return Fail(agent.status());
  if (auto saved = (*agent)->Save(dir + "/checkpoints/agent.ckpt"); !saved.ok()) return Fail(saved);

  // The policy as actors get it: the agent's flat parameters, no file.
  std::vector<float> parameters;
  (*agent)->PolicyParameters(&parameters);
  auto policy = agents::CreatePolicy(config, spec, env->action_size);
  if (!policy.ok()) return Fail(policy.status());
  if (auto set = (*policy)->SetParameters(parameters); !set.ok()) return Fail(set);
  std::vector<float> observations(size_t(batch) * spec.state_size);
  for (size_t i = 0; i < observations.size(); ++i) observations[i] = float(int(i * 11 % 17) - 8) / 4.0f;
  std::vector<float> actions(size_t(batch) * env->action_size);
  if (auto acted = (*policy)->Act(observations.data(), nullptr, batch, actions.data()); !acted.ok()) return Fail(acted);
  std::ofstream obs_out(dir + "/observations.f32", std::ios::binary);
  Write(obs_out, std::span<const float>(observations));
  std::ofstream actions_out(dir + "/actions.f32", std::ios::binary);
  Write(actions_out, std::span<const float>(actions));
  return obs_out.good() && actions_out.good() ? 0 : Fail(absl::DataLossError("cannot write the outputs"));
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "pool" && argc == 11) return troupe::Pool(argv + 2);
  if (command == "checkpoint" && argc == 5) return troupe::Checkpoint(argv + 2);
  std::fprintf(stderr,
               "usage: %s pool TASK OBSERVATION NUM_ENVS THREADS ACTION_REPEAT FRAME_STACK SEED STEPS OUT\n"
               "       %s checkpoint RUN_DIR SEED BATCH\n",
               argv[0], argv[0]);
  return 2;
}
