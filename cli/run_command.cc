#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <google/protobuf/text_format.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/scripted_actor.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/config.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/grpc_security.h"
#include "common/host.h"
#include "common/run_layout.h"
#include "engine/engine_config.h"
#include "gan/run.h"
#include "launch/experiment.h"
#include "launch/launcher.h"
#include "launch/slurm_submit.h"

namespace troupe::cli {
namespace {

std::atomic<bool> stop_requested{false};
void OnSignal(int) { stop_requested = true; }

// What troupe run cannot do that `troupe learner` can: MPI replicas are
// processes mpirun starts (and that must not fork actors after MPI is up).
absl::Status CheckRunnable(const config::ExperimentConfig& config) {
  const config::EngineConfig& engine = config.learner().engine();
  if (config.mode() == config::ExperimentConfig::RL && !engine::InProcessReplicas(engine)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.engine.collectives: ", config::EngineConfig::Collectives_Name(engine.collectives()),
        " runs one learner replica per MPI rank, which troupe run does not start. "
        "Start the replicas with `mpirun -np K troupe learner --config CONFIG --run-dir DIR --listen "
        "127.0.0.1:7000` and each actor with `troupe actor --learner 127.0.0.1:7000 --config CONFIG --index I`; "
        "or keep troupe run with learner.engine.collectives IN_PROCESS (or NCCL) and learner.engine.replicas K "
        "(threads)"));
  }
  return absl::OkStatus();
}

// This process's rank when mpirun started it (Open MPI's, PMIx's or PMI's
// variable, read before MPI starts); 0 otherwise.
int LaunchedRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    int rank = 0;
    if (const char* value = std::getenv(name); value != nullptr && absl::SimpleAtoi(value, &rank)) return rank;
  }
  return 0;
}

// Removes a fresh run directory that holds nothing but its config (and
// empty files or folders): what a run that failed at its start leaves.
void RemoveRunDirectoryIfUnused(const std::string& run_dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(run_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    // The config and launch.txt are troupe run's own, written before anything ran.
    const std::string name = it->path().filename().string();
    if (it->is_regular_file(ec) && name != kConfigFile && name != kLaunchFile && it->file_size(ec) > 0) return;
    if (!it->is_regular_file(ec) && !it->is_directory(ec)) return;
  }
  if (!ec) std::filesystem::remove_all(run_dir, ec);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "troupe run: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 2 : 1;
}

// "KEY VALUE" lines saying how the run in run_dir was started (troupe status).
void WriteLaunchFile(const std::string& run_dir, const std::string& text) {
  (void)WriteFileAtomically(RunLayout(run_dir).launch(), text);
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int RunScriptedMode(const config::ExperimentConfig& config) {
  auto result = actors::RunScripted(config, &stop_requested);
  if (!result.ok()) return Fail(result.status());
  double best = 0, mean = 0;
  for (double r : result->returns) {
    best = std::max(best, r);
    mean += r / result->returns.size();
  }
  std::printf("%s: %ld frames at %.0f frames/s, %zu episodes, mean return %.1f, best %.1f, physics errors %ld\n",
              config.env().task().c_str(), long(result->frames), result->frames_per_second, result->returns.size(),
              mean, best, long(result->physics_errors));
  std::printf("run directory: %s\n", result->run_dir.c_str());
  return 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;
    bool slurm = false;
    SecurityFlags security;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("run", "Run an experiment from a config file (configs/*.textproto)");
  cmd->add_option("config", args->config, "Experiment config, protobuf text format");
  cmd->add_option("--set", args->overrides, "Override a config field: path.to.field=value (repeatable)");
  cmd->add_option("--resume", args->resume, "Continue the run in this directory from its last checkpoint");
  args->security.AddTo(cmd);
  cmd->add_flag("--slurm", args->slurm,
                "Submit the run as a Slurm batch job (the config's slurm section); options troupe does not know "
                "(--partition=P, --time=10, ...) go to sbatch");
  cmd->allow_extras();
  cmd->callback([args, exit_code, cmd] {
    const std::vector<std::string> extras = cmd->remaining();
    if (!extras.empty() && !args->slurm) {
      std::fprintf(stderr, "troupe run: unknown arguments: %s (sbatch options go after --slurm)\n",
                   absl::StrJoin(extras, " ").c_str());
      *exit_code = 2;
      return;
    }
    if (args->config.empty() == args->resume.empty()) {
      std::fprintf(stderr, "troupe run: give a CONFIG file, or --resume RUN_DIR (not both)\n");
      *exit_code = 2;
      return;
    }
    const bool resume = !args->resume.empty();
    std::error_code ec;
    if (resume && !std::filesystem::is_directory(args->resume, ec)) {
      *exit_code = Fail(absl::InvalidArgumentError(
          absl::StrCat("--resume ", args->resume, ": not a run directory (give the RUN_DIR troupe run made)")));
      return;
    }
    const std::string config_path = resume ? RunLayout(args->resume).config() : args->config;
    // Every check before anything is created: the config file, the
    // overrides, the whole experiment; each error says where the field was
    // set (file:line or the --set).
    auto loaded = LoadExperimentConfigWithSource(config_path, args->overrides);
    if (!loaded.ok()) {
      *exit_code = Fail(loaded.status());
      return;
    }
    config::ExperimentConfig* config = &loaded->config;
    // What to run is said, never assumed: an empty file (or one that forgot
    // `mode`) would otherwise run the default, a scripted cartpole.
    if (!config->has_mode()) {
      *exit_code = Fail(absl::InvalidArgumentError(absl::StrCat(
          config_path, ": no mode set (", std::filesystem::file_size(config_path, ec) == 0 ? "the file is empty" : "nothing says what to run",
          "); set mode: RL, GAN or SCRIPTED in the file or with --set mode=RL (configs/*.textproto are ready "
          "experiments)")));
      return;
    }
    args->security.ApplyTo(config->mutable_security());
    absl::Status valid = launch::ValidateExperiment(*config);
    if (valid.ok() && !args->slurm) valid = CheckRunnable(*config);
    // The credentials and the listen address they allow, before a run
    // directory exists. A Slurm job's learner listens on every interface of
    // its node (actors on other nodes dial it): TLS and a token, or insecure.
    if (valid.ok() && config->mode() == config::ExperimentConfig::RL) {
      const std::string listen = config->learner().listen();
      auto credentials = LoadGrpcCredentials(config->security());
      valid = !credentials.ok() ? credentials.status()
              : args->slurm
                  ? CheckServerCredentials(*credentials, "0.0.0.0" + listen.substr(listen.rfind(':')),
                                           "troupe run --slurm (its learner listens on every interface of its node)")
                  : CheckServerCredentials(*credentials, listen, "learner.listen");
    }
    if (!valid.ok()) {
      // A refused config exits 2 whatever the reason (as a usage error).
      *exit_code = Fail(absl::InvalidArgumentError(loaded->source.Locate(valid.message())));
      return;
    }
    // A checkpoint to resume from: a committed generation, or the one file
    // of the layout before generations.
    if (resume &&
        RunLayout(args->resume).NewestCheckpoint(config->mode() == config::ExperimentConfig::GAN).empty()) {
      *exit_code = Fail(absl::NotFoundError(absl::StrCat("--resume ", args->resume, ": no checkpoint in ",
                                                         RunLayout(args->resume).checkpoints(),
                                                         " (was the run started with troupe run?)")));
      return;
    }
    if (args->slurm) {
      auto job = launch::SubmitRunToSlurm(*config, config_path, args->resume, extras);
      if (!job.ok()) {
        *exit_code = Fail(job.status());
        return;
      }
      std::printf("submitted Slurm job %s (%s); run directory %s\n", job->job_id.c_str(),
                  resume ? "resuming from its checkpoint" : "a new run", job->run_dir.c_str());
      std::printf("follow it: troupe status %s   (or: squeue -j %s; tail -f %s)\n", job->run_dir.c_str(),
                  job->job_id.c_str(), job->output.c_str());
      std::printf("stop it with a checkpoint: scancel %s; continue it later: troupe run --resume %s --slurm\n",
                  job->job_id.c_str(), job->run_dir.c_str());
      return;
    }
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    if (config->mode() == config::ExperimentConfig::SCRIPTED) {
      *exit_code = RunScriptedMode(*config);
      return;
    }
    // RL: a fresh run directory holding the resolved config, or the one resumed.
    std::string run_dir = args->resume;
    // Under mpirun (the GAN with gan.engine.collectives MPI) every rank runs
    // this command, and rank 0's run directory is the run's: the others
    // write nothing of it, and a fresh run's work in a scratch directory
    // removed at the end (a resumed run names its directory, whose
    // checkpoint every rank reads).
    const int launched_rank = LaunchedRank();
    const bool other_rank = launched_rank > 0;
    absl::Cleanup remove_scratch = [&] {
      if (other_rank && !resume) std::filesystem::remove_all(run_dir, ec);
    };
    const bool had_runs_dir = std::filesystem::exists(config->runs_dir(), ec);
    // What a fresh run that failed at its start made goes again: its
    // directory, and runs_dir when this run made it.
    auto remove_unused = [&] {
      if (resume || other_rank) return;
      RemoveRunDirectoryIfUnused(run_dir);
      if (!had_runs_dir && std::filesystem::is_empty(config->runs_dir(), ec)) {
        std::filesystem::remove(config->runs_dir(), ec);
      }
    };
    if (!resume && other_rank) {
      std::string scratch = (std::filesystem::temp_directory_path() / "troupe-rank-XXXXXX").string();
      if (mkdtemp(scratch.data()) == nullptr) {
        *exit_code = Fail(absl::ErrnoToStatus(
            errno, absl::StrCat("rank ", launched_rank, "'s scratch directory (mkdtemp ", scratch, ")")));
        return;
      }
      run_dir = scratch;
    } else if (!resume) {
      auto made = MakeRunDirectory(config->runs_dir(), config->name());
      if (!made.ok()) {
        *exit_code = Fail(made.status());
        return;
      }
      run_dir = *made;
      std::string text;
      google::protobuf::TextFormat::PrintToString(*config, &text);
      if (absl::Status s = WriteFileAtomically(RunLayout(run_dir).config(), text); !s.ok()) {
        remove_unused();
        *exit_code = Fail(s);
        return;
      }
    }
    if (config->tensorboard() && !other_rank) {
      std::printf("tensorboard: tensorboard --logdir %s   (event files in the run directory)\n", run_dir.c_str());
      std::fflush(stdout);
    }
    if (!other_rank) {
      WriteLaunchFile(run_dir, absl::StrCat("launcher local\nhost ", HostName(), "\npid ", getpid(), "\nstarted ",
                                            UnixSeconds(), "\n"));
    }
    if (absl::Status s = config->mode() == config::ExperimentConfig::GAN ? gan::RunGan(*config, run_dir, resume, &stop_requested)
                                                 : launch::RunRlExperiment(*config, run_dir, resume, &stop_requested);
        !s.ok()) {
      // A fresh run that failed before writing anything (a port taken, data
      // that does not load) leaves no directory behind.
      remove_unused();
      *exit_code = Fail(s);
    }
  });
}

}  // namespace troupe::cli
