#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "actors/actor.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/config.h"
#include "common/host.h"
#include "launch/experiment.h"

namespace troupe::cli {
namespace {
std::atomic<bool> actor_stop{false};
void OnActorSignal(int) { actor_stop = true; }
}  // namespace

void AddActorCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<actors::ActorOptions>();
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto security = std::make_shared<SecurityFlags>();
  CLI::App* cmd = app.add_subcommand("actor", "Run one actor process against a learner (troupe learner / troupe run)");
  cmd->add_option("--learner", options->learner_address, "The learner's HOST:PORT (replay + parameters)")->required();
  cmd->add_option("--config", *config_path, "Experiment config (the run's config.textproto)")->required();
  cmd->add_option("--set", *overrides, "Override a config field: path.to.field=value (repeatable)");
  cmd->add_option("--index", options->index, "This actor's index (sets its exploration noise and seed)");
  cmd->add_option("--max-frames", options->max_frames, "Stop after this many env frames (0 = until stopped)");
  security->AddTo(cmd);
  cmd->callback([options, config_path, overrides, security, exit_code] {
    // A stop may come while the config loads (the learner ended as this
    // actor started): RunActor then ends at once, with its summary line.
    std::signal(SIGINT, OnActorSignal);
    std::signal(SIGTERM, OnActorSignal);
    std::signal(SIGUSR1, OnActorSignal);  // what srun forwards (troupe run --slurm stopping its actor steps)
    auto config = LoadExperimentConfig(*config_path, *overrides);
    if (!config.ok()) {
      std::fprintf(stderr, "troupe actor: %s\n", std::string(config.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    security->ApplyTo(config->mutable_security());
    if (absl::Status valid = launch::ValidateExperiment(*config); !valid.ok()) {
      std::fprintf(stderr, "troupe actor: %s: %s\n", config_path->c_str(), std::string(valid.message()).c_str());
      *exit_code = 2;
      return;
    }
    options->config = *config;
    const std::string host = HostName();
    const char* slurm_node = std::getenv("SLURMD_NODENAME");  // a job step of troupe run --slurm
    std::printf("actor %d (pid %d) on %s%s%s%s, learner %s\n", options->index, int(getpid()), host.c_str(),
                slurm_node ? " (Slurm node " : "", slurm_node ? slurm_node : "", slurm_node ? ")" : "",
                options->learner_address.c_str());
    std::fflush(stdout);
    auto stats = actors::RunActor(*options, &actor_stop);
    if (!stats.ok()) {
      std::fprintf(stderr, "troupe actor %d: %s\n", options->index, stats.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    std::printf("actor %d: %ld frames, %ld episodes, params v%ld, %ld reconnects, %ld transitions written, %ld lost"
                " (%ld parameter stream reconnects)\n",
                options->index, long(stats->frames), long(stats->episodes), long(stats->parameter_version),
                long(stats->reconnects), long(stats->transitions), long(stats->transitions_lost),
                long(stats->parameter_reconnects));
  });
}

}  // namespace troupe::cli
