// `troupe replay --config CONFIG [--listen ADDR] [--set k=v]...`: the
// standalone replay server. Serves the tables of the config's `replay`
// section until SIGINT or SIGTERM, then shuts down cleanly (blocked clients
// get UNAVAILABLE).
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/grpc_security.h"
#include "common/config.h"
#include "replay/server.h"

namespace troupe::cli {

void AddReplayCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config;
    std::string listen;
    std::string restore;
    std::string checkpoint_dir;
    std::vector<std::string> overrides;
    SecurityFlags security;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("replay", "Run a standalone replay server (tables from the config's replay section)");
  cmd->add_option("--config", args->config, "Experiment config (text proto) with a replay section")->required();
  cmd->add_option("--listen", args->listen, "host:port to listen on (default: replay.listen, 127.0.0.1:0)");
  cmd->add_option("--restore", args->restore, "Checkpoint to restore at start");
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Directory where clients' Checkpoint/Restore calls write and read, by name (default: "
                  "replay.checkpoint_dir; none: those calls are refused)");
  cmd->add_option("--set", args->overrides, "Override a config field: path.to.field=value");
  args->security.AddTo(cmd);
  cmd->callback([args, exit_code] {
    auto experiment = LoadExperimentConfigWithSource(args->config, args->overrides);
    if (!experiment.ok()) {
      std::fprintf(stderr, "troupe replay: %s\n", std::string(experiment.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    args->security.ApplyTo(experiment->config.mutable_security());
    auto credentials = LoadGrpcCredentials(experiment->config.security());
    if (!credentials.ok()) {
      std::fprintf(stderr, "troupe replay: %s\n", std::string(credentials.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    config::ReplayConfig config = experiment->config.replay();
    ConfigSource& source = experiment->source;
    if (!args->listen.empty()) {
      config.set_listen(args->listen);
      source.overrides["replay.listen"] = "--listen " + args->listen;
    }
    if (!args->restore.empty()) {
      config.set_restore_path(args->restore);
      source.overrides["replay.restore_path"] = "--restore " + args->restore;
    }
    if (!args->checkpoint_dir.empty()) {
      config.set_checkpoint_dir(args->checkpoint_dir);
      source.overrides["replay.checkpoint_dir"] = "--checkpoint-dir " + args->checkpoint_dir;
    }
    // Checked whole before anything starts (tables below say it better).
    if (absl::Status valid = replay::ValidateReplayConfig(config, /*tables_required=*/false); !valid.ok()) {
      std::fprintf(stderr, "troupe replay: %s\n", source.Locate(valid.message()).c_str());
      *exit_code = 2;
      return;
    }
    if (config.tables_size() == 0) {
      std::fprintf(stderr, "troupe replay: %s has no replay.tables; add at least one table to serve\n",
                   args->config.c_str());
      *exit_code = 2;
      return;
    }
    // Block the stop signals in every thread (gRPC's inherit the mask); this
    // thread waits for them.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    auto server = replay::Server::Start(config, *credentials);
    if (!server.ok()) {
      std::fprintf(stderr, "troupe replay: %s\n", std::string(server.status().message()).c_str());
      *exit_code = 1;
      return;
    }
    std::printf("troupe replay: listening on %s (%d tables; %s)\n", (*server)->address().c_str(),
                config.tables_size(), credentials->DescribeServer().c_str());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&stop, &signal);
    std::printf("troupe replay: signal %d, shutting down\n", signal);
    (*server)->Shutdown();
  });
}

}  // namespace troupe::cli
