#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/config.h"
#include "common/files.h"
#include "common/grpc_security.h"
#include "common/host.h"
#include "common/run_layout.h"
#include "launch/experiment.h"
#include "launch/launcher.h"
#include "learner/rl_learner.h"

namespace troupe::cli {
namespace {
std::atomic<bool> learner_stop{false};
void OnLearnerSignal(int) { learner_stop = true; }

// Under `mpirun -np K` (K > 1), a rank that fails ends the whole job at once
// (MPI_Abort: mpirun names the rank and stops the others) instead of leaving
// the others to time out in their next collective.
void AbortOtherRanksIfAny() {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
}
}  // namespace

void AddLearnerCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config, run_dir, listen, address_file;
    std::vector<std::string> overrides;
    bool resume = false;
    double collective_timeout_s = 60;
    SecurityFlags security;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "learner",
      "Run the learner alone (replay embedded); start actors on other machines with troupe actor. With "
      "learner.engine.collectives MPI: `mpirun -np K troupe learner ...` runs K replicas, rank 0 serving");
  cmd->add_option("--config", args->config, "Experiment config")->required();
  cmd->add_option("--run-dir", args->run_dir, "Run directory (metrics, checkpoints; written by rank 0)")->required();
  cmd->add_option("--listen", args->listen, "HOST:PORT to serve on (overrides learner.listen)");
  cmd->add_option("--set", args->overrides, "Override a config field: path.to.field=value (repeatable)");
  cmd->add_option("--address-file", args->address_file,
                  "Rank 0 writes the HOST:PORT actors connect to into this file (e.g. on shared storage)");
  cmd->add_flag("--resume", args->resume, "Continue from the run directory's checkpoint");
  cmd->add_option("--collective-timeout-s", args->collective_timeout_s,
                  "Seconds a replica waits for the others in a collective before failing, naming them")
      ->check(CLI::PositiveNumber);
  args->security.AddTo(cmd);
  cmd->callback([args, exit_code] {
    auto loaded = LoadExperimentConfigWithSource(args->config, args->overrides);
    if (!loaded.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", std::string(loaded.status().message()).c_str());
      *exit_code = 2;
      return;
    }
    config::ExperimentConfig* config = &loaded->config;
    if (!args->listen.empty()) {
      config->mutable_learner()->set_listen(args->listen);
      loaded->source.overrides["learner.listen"] = "--listen " + args->listen;
    }
    args->security.ApplyTo(config->mutable_security());
    absl::Status valid = launch::ValidateExperiment(*config);
    // The credentials and the listen address they allow, before the run
    // directory is touched: a refusal leaves nothing behind.
    if (valid.ok()) {
      absl::StatusOr<GrpcCredentials> credentials = LoadGrpcCredentials(config->security());
      valid = credentials.ok() ? CheckServerCredentials(*credentials, config->learner().listen(), "learner.listen")
                               : credentials.status();
    }
    if (!valid.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", loaded->source.Locate(valid.message()).c_str());
      *exit_code = 2;
      return;
    }
    learner::RlLearnerOptions options;
    options.collective_timeout = std::chrono::milliseconds(int64_t(args->collective_timeout_s * 1000));
    // The run directory; one this start made goes again if the start fails.
    std::error_code ec;
    const bool had_run_dir = std::filesystem::exists(args->run_dir, ec);
    std::filesystem::create_directories(args->run_dir, ec);
    auto learner = learner::RlLearner::Create(*config, args->run_dir, args->resume, options);
    if (!learner.ok() && !had_run_dir) std::filesystem::remove(args->run_dir, ec);  // only when still empty
    if (!learner.ok()) {
      std::fprintf(stderr, "troupe learner: %s\n", std::string(learner.status().message()).c_str());
      std::fflush(stderr);
      AbortOtherRanksIfAny();
      *exit_code = absl::IsInvalidArgument(learner.status()) ? 2 : 1;
      return;
    }
    learner::RlLearner& l = **learner;
    const std::string who = l.num_ranks() > 1 ? absl::StrFormat("learner rank %d of %d", l.rank(), l.num_ranks())
                                              : std::string("learner");
    if (l.is_chief()) {
      std::string text;
      google::protobuf::TextFormat::PrintToString(*config, &text);
      (void)WriteFileAtomically(RunLayout(args->run_dir).config(), text);
      std::printf("%s serving replay and parameters on %s (%s)\n", who.c_str(), l.address().c_str(),
                  l.credentials().DescribeServer().c_str());
      if (!args->address_file.empty()) {
        if (absl::Status s = WriteFileAtomically(args->address_file, ReachableAddress(l.address()) + "\n");
            !s.ok()) {
          std::fprintf(stderr, "troupe %s: --address-file: %s\n", who.c_str(), std::string(s.message()).c_str());
        }
      }
    } else {
      std::printf("%s (pid %d) sampling replay from rank 0 at %s\n", who.c_str(), int(getpid()),
                  l.address().c_str());
    }
    std::fflush(stdout);
    std::signal(SIGINT, OnLearnerSignal);
    std::signal(SIGTERM, OnLearnerSignal);
    std::signal(SIGUSR1, OnLearnerSignal);  // what mpirun forwards to its ranks (a Slurm job's stop)
    std::jthread interrupter([&](std::stop_token token) {
      while (!token.stop_requested() && !learner_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (learner_stop) l.Interrupt();
    });
    if (absl::Status s = l.Run(&learner_stop); !s.ok()) {
      std::fprintf(stderr, "troupe %s: %s\n", who.c_str(), s.ToString().c_str());
      std::fflush(stderr);
      AbortOtherRanksIfAny();
      *exit_code = 1;
      return;
    }
    if (l.is_chief()) {
      std::printf("%s: %ld updates; replay took %ld transitions from the actors\n", who.c_str(),
                  long(l.Stats().updates), long(l.TransitionsInserted()));
    }
    if (l.num_ranks() > 1 && !l.state_gathered()) {
      std::printf("%s: %ld updates (no state checksum: the optimizer state is split over the ranks, which stopped "
                  "without agreeing on a last update)\n",
                  who.c_str(), long(l.Stats().updates));
    } else if (l.num_ranks() > 1) {
      std::printf("%s: %ld updates, state checksum %016lx\n", who.c_str(), long(l.Stats().updates),
                  static_cast<unsigned long>(l.StateChecksum()));
    }
  });
}

}  // namespace troupe::cli
