#include <csignal>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "actors/scripted_actor.h"
#include "cli/commands.h"
#include "common/config.h"

namespace troupe::cli {
namespace {

std::atomic<bool> stop_requested{false};
void OnSignal(int) { stop_requested = true; }

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("run", "Run an experiment from a config file (configs/*.textproto)");
  cmd->add_option("config", args->config, "Experiment config, protobuf text format")->required();
  cmd->add_option("--set", args->overrides, "Override a config field: path.to.field=value (repeatable)");
  cmd->callback([args, exit_code] {
    auto config = LoadExperimentConfig(args->config, args->overrides);
    if (!config.ok()) {
      std::fprintf(stderr, "troupe run: %s\n", std::string(config.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    auto result = actors::RunScripted(*config, &stop_requested);
    if (!result.ok()) {
      std::fprintf(stderr, "troupe run: %s\n", std::string(result.status().message()).c_str());
      *exit_code = 1;
      return;
    }
    double best = 0, mean = 0;
    for (double r : result->returns) {
      best = std::max(best, r);
      mean += r / result->returns.size();
    }
    std::printf("%s: %ld frames at %.0f frames/s, %zu episodes, mean return %.1f, best %.1f, physics errors %ld\n",
                config->env().task().c_str(), long(result->frames), result->frames_per_second,
                result->returns.size(), mean, best, long(result->physics_errors));
    std::printf("run directory: %s\n", result->run_dir.c_str());
  });
}

}  // namespace troupe::cli
