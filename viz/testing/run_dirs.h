// Run directories for viewer tests, written the way `troupe run` writes them
// (learner/rl_learner.cc, gan/): a config, an agent checkpoint saved
// by the learner's own D4pgAgent, counters and metrics files.
#ifndef TROUPE_VIZ_TESTING_RUN_DIRS_H_
#define TROUPE_VIZ_TESTING_RUN_DIRS_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/agents.h"
#include "common/config.h"
#include "common/run_layout.h"
#include "engine/engine_config.h"
#include "envs/env.h"

namespace troupe::viz::testing {

// A fresh directory under the test's temp dir.
inline std::string FreshDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("viz_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The config of a small D4PG-from-state run on `task`.
inline std::string RlConfigText(const std::string& task, const std::string& hidden) {
  return absl::StrCat("name: \"t\"\nmode: RL\nenv { task: \"", task,
                      "\" observation: STATE action_repeat: 2 }\nd4pg { hidden: ", hidden,
                      " }\nlearner { batch_size: 16 engine { seed: 3 } }\n");
}

// A run directory `name` of an RL run on `task` with networks `hidden`
// ("[32, 32]"): config.textproto, checkpoints/agent.ckpt of a freshly
// initialised agent (D4pgAgent::Save), counters.txt and eval.csv.
// The policy's parameters go to *parameters when given.
inline std::string RlRunDir(const std::string& name, const std::string& task = "cartpole.swingup",
                            const std::string& hidden = "[32, 32]", std::vector<float>* parameters = nullptr) {
  const std::string dir = FreshDir(name);
  const std::string text = RlConfigText(task, hidden);
  std::ofstream(RunLayout(dir).config()) << text;
  config::ExperimentConfig config;
  EXPECT_TRUE(ParseTextConfig(text, kConfigFile, &config).ok());
  auto env_spec = envs::DescribeEnv(config.env());
  EXPECT_TRUE(env_spec.ok()) << env_spec.status();
  const agents::ObservationSpec spec = agents::ObservationSpecOf(*env_spec);
  const int action_size = env_spec->action_size;
  auto replicator = engine::MakeReplicator(config.learner().engine());
  EXPECT_TRUE(replicator.ok()) << replicator.status();
  auto agent = agents::CreateAgent(config, spec, action_size, replicator->get());
  EXPECT_TRUE(agent.ok()) << agent.status();
  std::filesystem::create_directories(dir + "/checkpoints");
  const absl::Status saved = (*agent)->Save(dir + "/checkpoints/agent.ckpt");
  EXPECT_TRUE(saved.ok()) << saved;
  if (parameters) (*agent)->PolicyParameters(parameters);
  std::ofstream(RunLayout(dir).checkpoints() + "/" + kCountersFile) << "frames 3000\nsamples 4096\n";
  std::ofstream(RunLayout(dir).eval_csv()) << "frames,updates,eval_return\n1000,10,12.5\n3000,40,30.0\n";
  return dir;
}

}  // namespace troupe::viz::testing

#endif  // TROUPE_VIZ_TESTING_RUN_DIRS_H_
