// troupe: distributed reinforcement learning from pixels.
#include <CLI/CLI.hpp>

#include <string>

#include "cli/commands.h"
#include "common/allocator.h"
#include "common/build_info.h"

int main(int argc, char** argv) {
  CLI::App app{"troupe: distributed reinforcement learning from pixels (MuJoCo control tasks, replay, learner)"};
  // The commit, then the malloc the process runs on (common/allocator.h).
  app.set_version_flag("--version",
                       std::string("troupe ") + troupe::BuildCommit() + "\nmalloc: " + troupe::Allocator());
  app.require_subcommand(1);
  int exit_code = 0;
  troupe::cli::AddRunCommand(app, &exit_code);
  troupe::cli::AddBenchCommand(app, &exit_code);
  troupe::cli::AddViewCommand(app, &exit_code);
  troupe::cli::AddReplayCommand(app, &exit_code);
  troupe::cli::AddLearnerCommand(app, &exit_code);
  troupe::cli::AddActorCommand(app, &exit_code);
  troupe::cli::AddStatusCommand(app, &exit_code);
  troupe::cli::AddSlurmJobCommand(app, &exit_code);
  troupe::cli::AddCertsCommand(app, &exit_code);
  troupe::cli::AddSweepCommand(app, &exit_code);
  troupe::cli::AddReportCommand(app, &exit_code);
  troupe::cli::AddDevicesCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
