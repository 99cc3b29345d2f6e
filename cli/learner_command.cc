#include <csignal>
#include <cstdio>
#include <filesystem>

#include <google/protobuf/text_format.h>

#include "cli/commands.h"
#include "common/config.h"
#include "common/files.h"
#include "learner/rl_learner.h"

namespace troupe::cli {
namespace {
std::atomic<bool> learner_stop{false};
void OnLearnerSignal(int) { learner_stop = true; }
}  // namespace

void AddLearnerCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config, run_dir, listen;
    std::vector<std::string> overrides;
    bool resume = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "learner", "Run the learner alone (replay embedded); start actors on other machines with troupe actor");
  cmd->add_option("--config", args->config, "Experiment config")->required();
  cmd->add_option("--run-dir", args->run_dir, "Run directory (metrics, checkpoints)")->required();
  cmd->add_option("--listen", args->listen, "HOST:PORT to serve on (overrides learner.listen)");
  cmd->add_option("--set", args->overrides, "Override a config field: path.to.field=value (repeatable)");
  cmd->add_flag("--resume", args->resume, "Continue from the run directory's checkpoint");
  cmd->callback([args, exit_code] {
    auto config = LoadExperimentConfig(args->config, args->overrides);
    if (!config.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", std::string(config.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    if (!args->listen.empty()) config->mutable_learner()->set_listen(args->listen);
    std::filesystem::create_directories(args->run_dir);
    std::string text;
    google::protobuf::TextFormat::PrintToString(*config, &text);
    (void)WriteFileAtomically(args->run_dir + "/config.textproto", text);
    auto learner = learner::RlLearner::Create(*config, args->run_dir, args->resume);
    if (!learner.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", std::string(learner.status().message()).c_str());
      *exit_code = 1;
      return;
    }
    std::printf("learner serving replay and parameters on %s\n", (*learner)->address().c_str());
    std::fflush(stdout);
    std::signal(SIGINT, OnLearnerSignal);
    std::signal(SIGTERM, OnLearnerSignal);
    std::jthread interrupter([&](std::stop_token token) {
      while (!token.stop_requested() && !learner_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (learner_stop) (*learner)->Interrupt();
    });
    if (absl::Status s = (*learner)->Run(&learner_stop); !s.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", s.ToString().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace troupe::cli
