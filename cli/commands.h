// The `troupe` command's subcommands. Each Add*Command registers one
// subcommand on `app`; its callback stores the process exit status in
// *exit_code (0 = success) and prints errors to stderr.
#ifndef TROUPE_CLI_COMMANDS_H_
#define TROUPE_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace troupe::cli {

void AddRunCommand(CLI::App& app, int* exit_code);    // troupe run CONFIG [--set k=v]...
void AddBenchCommand(CLI::App& app, int* exit_code);  // troupe bench NAME [--json PATH]
void AddViewCommand(CLI::App& app, int* exit_code);   // troupe view RUN_DIR | --task TASK | --live HOST:PORT
void AddReplayCommand(CLI::App& app, int* exit_code);  // troupe replay --config CONFIG [--listen ADDR]
void AddLearnerCommand(CLI::App& app, int* exit_code);  // troupe learner --config CONFIG --run-dir DIR
void AddActorCommand(CLI::App& app, int* exit_code);    // troupe actor --learner HOST:PORT --config CONFIG
void AddStatusCommand(CLI::App& app, int* exit_code);   // troupe status RUN_DIR
void AddSlurmJobCommand(CLI::App& app, int* exit_code);  // troupe slurm-job RUN_DIR (inside a Slurm job)
void AddCertsCommand(CLI::App& app, int* exit_code);    // troupe certs DIR --hosts A,B
void AddSweepCommand(CLI::App& app, int* exit_code);    // troupe sweep CONFIG --grid f=v1,v2 [--seeds N] [--parallel P]
void AddReportCommand(CLI::App& app, int* exit_code);   // troupe report RUN_OR_SWEEP_DIR [-o FILE]
void AddDevicesCommand(CLI::App& app, int* exit_code);  // troupe devices [--pjrt-plugin PATH]

}  // namespace troupe::cli

#endif  // TROUPE_CLI_COMMANDS_H_
