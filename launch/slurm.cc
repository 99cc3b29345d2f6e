#include "launch/slurm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/grpc_security.h"
#include "common/host.h"
#include "common/run_layout.h"
#include "common/shell.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "launch/launcher.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(line));
  }
  return out;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Starts argv with stdout/stderr inherited (the job's output); it dies with
// this process.
absl::StatusOr<pid_t> SpawnInherited(const std::vector<std::string>& argv) {
  std::vector<std::string> copy = argv;
  std::vector<char*> pointers;
  for (std::string& a : copy) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork failed for ", argv[0]));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    execvp(pointers[0], pointers.data());
    std::fprintf(stderr, "cannot run %s\n", pointers[0]);
    _exit(127);
  }
  return pid;
}

// Inside the job, learner ranks over MPI: the ranks as a child (mpirun or
// srun --mpi=pmix), rank 0's address from RUN_DIR/learner.address, the
// actors against it; the status line from the metrics rank 0 writes.
absl::Status RunMpiLearnerJob(const config::ExperimentConfig& config, const SlurmPlan& plan,
                              const std::vector<std::string>& nodes, const std::string& run_dir,
                              const std::string& binary, bool resume, const std::atomic<bool>* stop,
                              const ActorWrapper& actor_wrapper) {
  const config::SlurmConfig& slurm = config.slurm();
  std::map<int, int> ranks_per_node;
  for (int node : plan.learner_rank_nodes) ++ranks_per_node[node];
  std::vector<std::string> hosts, slots;
  for (const auto& [node, count] : ranks_per_node) {
    hosts.push_back(nodes[node]);
    slots.push_back(absl::StrCat(nodes[node], ":", count));
  }
  std::vector<std::string> argv;
  if (slurm.mpi_launch() == config::SlurmConfig::SRUN_PMIX) {
    argv = {"srun", "--mpi=pmix", absl::StrCat("--ntasks=", plan.learner_ranks),
            absl::StrCat("--nodes=", hosts.size()), "--nodelist=" + absl::StrJoin(hosts, ","),
            absl::StrCat("--cpus-per-task=", plan.cpus_per_task), "--overlap", "--kill-on-bad-exit=1",
            "--job-name=learner"};
    if (slurm.gpus_per_learner_rank() > 0) argv.push_back(absl::StrCat("--gpus-per-task=", slurm.gpus_per_learner_rank()));
  } else {
    argv = {"mpirun", "-np", std::to_string(plan.learner_ranks), "--host", absl::StrJoin(slots, ","), "--bind-to",
            "none"};
    if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  }
  const std::string address_file = RunLayout(run_dir).learner_address();
  fs::remove(address_file);
  std::string listen = config.learner().listen();
  listen = "0.0.0.0" + listen.substr(listen.rfind(':'));
  for (const std::string& a : {binary, std::string("learner"), std::string("--config"), RunLayout(run_dir).config(),
                               std::string("--run-dir"), run_dir, std::string("--listen"), listen,
                               std::string("--address-file"), address_file}) {
    argv.push_back(a);
  }
  if (resume) argv.push_back("--resume");
  absl::PrintF("learner ranks: %s\n", absl::StrJoin(argv, " ").c_str());
  std::fflush(stdout);
  ASSIGN_OR_RETURN(const pid_t learner, SpawnInherited(argv));

  // Rank 0's address, or the ranks' early end.
  std::string address;
  int wstatus = 0;
  bool exited = false;
  while (address.empty() && !exited && !stop->load()) {
    std::ifstream in(address_file);
    std::getline(in, address);
    if (waitpid(learner, &wstatus, WNOHANG) == learner) exited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::unique_ptr<ActorFleet> actors;
  if (!address.empty() && !exited) {
    // The token the ranks serve with reaches each actor step in its
    // environment, as for a learner in this process.
    ASSIGN_OR_RETURN(const GrpcCredentials credentials, LoadGrpcCredentials(config.security()));
    ASSIGN_OR_RETURN(actors, ActorFleet::Start(config, run_dir, address, stop, credentials.token, actor_wrapper));
  }
  // Until the ranks end; a stop goes to them (mpirun forwards SIGUSR1 to its
  // ranks, srun SIGTERM) and they checkpoint.
  bool signalled = false;
  fs::file_time_type stopped_at;
  auto last_status = std::chrono::steady_clock::now();
  while (!exited) {
    if (stop->load() && !signalled) {
      stopped_at = fs::file_time_type::clock::now();
      kill(learner, slurm.mpi_launch() == config::SlurmConfig::SRUN_PMIX ? SIGTERM : SIGUSR1);
      signalled = true;
    }
    if (waitpid(learner, &wstatus, WNOHANG) == learner) {
      exited = true;
      break;
    }
    if (actors && std::chrono::steady_clock::now() - last_status >= std::chrono::milliseconds(500)) {
      auto row = LastCsvRow(RunLayout(run_dir).metrics_csv());
      WriteStatusFile(run_dir, absl::StrFormat("%s | frames %s | updates %s | params v%s | learner ranks %d | "
                                               "actors %d/%d (restarts %d)",
                                               config.env().task(), row["frames"], row["updates"],
                                               row["parameter_version"], plan.learner_ranks, actors->alive(),
                                               actors->count(), actors->restarts()));
      last_status = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (actors) actors->Stop();
  const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  WriteStatusFile(run_dir, absl::StrFormat("%s | ended (learner ranks exit status %d)", config.env().task(), code));
  if (code == 0) return absl::OkStatus();
  // scancel signals mpirun too, which then ends with an error of its own
  // after its ranks have stopped: a checkpoint written since the stop means
  // they stopped as asked.
  std::error_code error;
  const auto checkpoint = fs::last_write_time(RunLayout(run_dir).NewestCheckpoint(), error);
  if (signalled && !error && checkpoint >= stopped_at - std::chrono::seconds(1)) {
    absl::PrintF("the learner ranks checkpointed and stopped (%s exit status %d)\n", argv[0], code);
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("the learner ranks (", argv[0], ") ended with exit status ", code));
}

}  // namespace

std::optional<int64_t> SlurmTimeLimitSeconds(std::string_view text) {
  if (text == "UNLIMITED" || text == "INFINITE") return -1;
  // Each field: 1 to 7 digits, nothing else.
  auto number = [](std::string_view field) -> std::optional<int64_t> {
    if (field.empty() || field.size() > 7 || field.find_first_not_of("0123456789") != std::string_view::npos) {
      return std::nullopt;
    }
    int64_t value = 0;
    for (const char c : field) value = value * 10 + (c - '0');
    return value;
  };
  std::optional<int64_t> days = 0;
  std::string_view clock = text;
  if (const size_t dash = text.find('-'); dash != std::string_view::npos) {
    days = number(text.substr(0, dash));
    clock = text.substr(dash + 1);
    if (!days) return std::nullopt;
  }
  std::vector<std::optional<int64_t>> parts;
  for (absl::string_view part : absl::StrSplit(absl::string_view(clock.data(), clock.size()), ':')) {
    parts.push_back(number(std::string_view(part.data(), part.size())));
    if (!parts.back()) return std::nullopt;
  }
  const bool with_days = clock.size() != text.size();
  if (parts.empty() || parts.size() > 3) return std::nullopt;
  if (with_days) {
    // DAYS-HOURS[:MINUTES[:SECONDS]]
    const int64_t hours = *parts[0], minutes = parts.size() > 1 ? *parts[1] : 0, seconds = parts.size() > 2 ? *parts[2] : 0;
    return ((*days * 24 + hours) * 60 + minutes) * 60 + seconds;
  }
  switch (parts.size()) {
    case 1: return *parts[0] * 60;                                    // MINUTES
    case 2: return *parts[0] * 60 + *parts[1];                        // MINUTES:SECONDS
    default: return (*parts[0] * 60 + *parts[1]) * 60 + *parts[2];   // HOURS:MINUTES:SECONDS
  }
}

absl::Status ValidateSlurmConfig(const config::SlurmConfig& slurm) {
  if (slurm.nodes() < 1) return absl::InvalidArgumentError(absl::StrCat("slurm.nodes ", slurm.nodes(), ": must be >= 1"));
  if (slurm.tasks_per_node() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("slurm.tasks_per_node ", slurm.tasks_per_node(),
                                                   ": must be >= 0 (0 = just enough)"));
  }
  if (slurm.cpus_per_actor() < 1 || slurm.cpus_per_learner_rank() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slurm.cpus_per_actor ", slurm.cpus_per_actor(),
                                                   ", slurm.cpus_per_learner_rank ", slurm.cpus_per_learner_rank(),
                                                   ": each must be >= 1"));
  }
  if (slurm.gpus_per_learner_rank() < 0 || slurm.warn_before_end_s() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("slurm.gpus_per_learner_rank ", slurm.gpus_per_learner_rank(),
                                                   ", slurm.warn_before_end_s ", slurm.warn_before_end_s(),
                                                   ": must be >= 0"));
  }
  // The partition goes into the job script: one plain word.
  for (const char c : slurm.partition()) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat("slurm.partition \"", absl::CHexEscape(slurm.partition()),
                                                     "\": a partition name is one word of [A-Za-z0-9_.-]"));
    }
  }
  if (slurm.time_limit().empty()) return absl::OkStatus();
  const std::optional<int64_t> seconds = SlurmTimeLimitSeconds(slurm.time_limit());
  const std::string field = absl::StrCat("slurm.time_limit \"", absl::CHexEscape(slurm.time_limit()), "\"");
  if (!seconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": not a Slurm time limit; write MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
               "DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS (\"90\", \"1:30:00\", \"2-12\"), UNLIMITED, or "
               "leave it empty for the partition's own limit"));
  }
  if (*seconds == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be more than 0 (leave it empty for the partition's own limit, or UNLIMITED)"));
  }
  if (*seconds > 0 && slurm.warn_before_end_s() >= *seconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slurm.warn_before_end_s ", slurm.warn_before_end_s(), ": not shorter than ", field, " (", *seconds,
        " s): the job would be told to checkpoint and stop as it starts; lower it (0 = no warning)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SlurmPlan> PlanSlurmJob(const config::ExperimentConfig& config) {
  const config::SlurmConfig& slurm = config.slurm();
  if (config.mode() != config::ExperimentConfig::RL) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", config::ExperimentConfig::Mode_Name(config.mode()),
                                                   ": troupe run --slurm runs RL experiments (mode: RL)"));
  }
  RETURN_IF_ERROR(ValidateSlurmConfig(slurm));
  SlurmPlan plan;
  const config::EngineConfig& engine = config.learner().engine();
  plan.mpi = !engine::InProcessReplicas(engine);
  plan.learner_ranks = plan.mpi ? std::max(1, engine.replicas()) : 1;
  plan.actors = config.actors().count();
  plan.nodes = slurm.nodes();
  const int total = plan.learner_ranks + plan.actors;
  plan.tasks_per_node = slurm.tasks_per_node() > 0 ? slurm.tasks_per_node() : (total + plan.nodes - 1) / plan.nodes;
  plan.cpus_per_task = std::max(slurm.cpus_per_actor(), slurm.cpus_per_learner_rank());
  if (plan.nodes * plan.tasks_per_node < total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the allocation is too small for the config: slurm.nodes %d x slurm.tasks_per_node %d = %d task slots, but "
        "the job runs %d learner rank(s) and %d actors (actors.count) = %d tasks; raise slurm.nodes or "
        "slurm.tasks_per_node (0 = just enough), or lower actors.count",
        plan.nodes, plan.tasks_per_node, plan.nodes * plan.tasks_per_node, plan.learner_ranks, plan.actors, total));
  }
  if (plan.nodes > total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slurm.nodes %d: more nodes than the job's %d processes (%d learner rank(s), %d actors); at most %d",
        plan.nodes, total, plan.learner_ranks, plan.actors, total));
  }
  // Ranks fill node 0 first; actors go round-robin over the nodes' free
  // slots, starting after the learner's node.
  std::vector<int> free(plan.nodes, plan.tasks_per_node);
  for (int r = 0, node = 0; r < plan.learner_ranks; ++r) {
    while (free[node] == 0) ++node;
    plan.learner_rank_nodes.push_back(node);
    --free[node];
  }
  int node = plan.nodes > 1 ? 1 : 0;
  for (int a = 0; a < plan.actors; ++a) {
    while (free[node] == 0) node = (node + 1) % plan.nodes;
    plan.actor_nodes.push_back(node);
    --free[node];
    node = (node + 1) % plan.nodes;
  }
  return plan;
}

std::string FindOnPath(const std::string& program) {
  for (absl::string_view dir : absl::StrSplit(Env("PATH"), ':', absl::SkipEmpty())) {
    const std::string path = absl::StrCat(dir, "/", program);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& argv) {
  if (argv.empty() || (argv[0].find('/') == std::string::npos && FindOnPath(argv[0]).empty())) {
    return absl::NotFoundError(absl::StrCat("no ", argv.empty() ? "program" : argv[0], " on the PATH"));
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::ResourceExhaustedError("pipe failed");
  std::vector<std::string> copy = argv;
  std::vector<char*> pointers;
  for (std::string& a : copy) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork failed for ", argv[0]));
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    execvp(pointers[0], pointers.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  ProgramResult result;
  char buffer[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    result.output.append(buffer, size_t(n));
  }
  close(pipe_fds[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return result;
}

absl::StatusOr<SlurmPartition> QuerySlurmPartition(const std::string& partition) {
  // One line per partition and node kind: NAME[*]|NODES|CPUS (a default
  // partition is starred; CPUS "4+" where nodes differ).
  ASSIGN_OR_RETURN(const ProgramResult sinfo, RunProgram({"sinfo", "--noheader", "--format=%P|%D|%c"}));
  if (sinfo.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sinfo failed (exit status ", sinfo.exit_code,
                                               "): ", absl::StripAsciiWhitespace(sinfo.output)));
  }
  std::map<std::string, SlurmPartition> partitions;
  std::string default_name;
  for (const std::string& line : Lines(sinfo.output)) {
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() != 3) continue;
    absl::string_view starred = cells[0];
    const bool is_default = absl::ConsumeSuffix(&starred, "*");
    const std::string name(starred);
    if (is_default) default_name = name;
    int nodes = 0, cpus = 0;
    (void)absl::SimpleAtoi(cells[1], &nodes);
    (void)absl::SimpleAtoi(absl::StripSuffix(cells[2], "+"), &cpus);
    SlurmPartition& p = partitions[name];
    p.name = name;
    p.nodes += nodes;
    p.cpus_per_node = p.cpus_per_node == 0 ? cpus : std::min(p.cpus_per_node, cpus);
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : partitions) names.push_back(name);
  const std::string wanted = partition.empty() ? default_name : partition;
  if (wanted.empty()) {
    return absl::NotFoundError(absl::StrCat("slurm.partition is empty and the cluster has no default partition; name "
                                            "one of: ", absl::StrJoin(names, ", ")));
  }
  auto it = partitions.find(wanted);
  if (it == partitions.end()) {
    return absl::NotFoundError(absl::StrCat("slurm.partition \"", wanted, "\": no such partition on this cluster (sinfo "
                                            "lists: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  return it->second;
}

absl::Status CheckPlanFitsPartition(const SlurmPlan& plan, const SlurmPartition& partition,
                                    const std::string& partition_field) {
  if (plan.nodes > partition.nodes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the allocation is too small for the config: slurm.nodes %d, but %s \"%s\" has %d node(s); lower "
        "slurm.nodes (and raise slurm.tasks_per_node) or pick another partition",
        plan.nodes, partition_field, partition.name, partition.nodes));
  }
  const int cpus = plan.tasks_per_node * plan.cpus_per_task;
  if (partition.cpus_per_node > 0 && cpus > partition.cpus_per_node) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the allocation is too small for the config: %d tasks per node x %d CPUs each (max of "
        "slurm.cpus_per_actor, slurm.cpus_per_learner_rank) = %d CPUs per node, but the nodes of %s \"%s\" have "
        "%d; raise slurm.nodes, or lower actors.count or the CPUs per task",
        plan.tasks_per_node, plan.cpus_per_task, cpus, partition_field, partition.name, partition.cpus_per_node));
  }
  return absl::OkStatus();
}

std::string SlurmJobScript(const config::ExperimentConfig& config, const SlurmPlan& plan, const std::string& run_dir,
                           const std::string& troupe_binary) {
  const config::SlurmConfig& slurm = config.slurm();
  std::string s = "#!/bin/bash\n";
  absl::StrAppend(&s, "#SBATCH --job-name=troupe-", config.name(), "\n");
  absl::StrAppend(&s, "#SBATCH --output=", RunLayout(run_dir).slurm_output("%j"), "\n");
  absl::StrAppend(&s, "#SBATCH --open-mode=append\n");
  absl::StrAppend(&s, "#SBATCH --nodes=", plan.nodes, "\n");
  absl::StrAppend(&s, "#SBATCH --ntasks-per-node=", plan.tasks_per_node, "\n");
  absl::StrAppend(&s, "#SBATCH --cpus-per-task=", plan.cpus_per_task, "\n");
  if (!slurm.partition().empty()) absl::StrAppend(&s, "#SBATCH --partition=", slurm.partition(), "\n");
  if (!slurm.time_limit().empty()) absl::StrAppend(&s, "#SBATCH --time=", slurm.time_limit(), "\n");
  if (slurm.gpus_per_learner_rank() > 0) {
    absl::StrAppend(&s, "#SBATCH --gpus=", slurm.gpus_per_learner_rank() * plan.learner_ranks, "\n");
  }
  if (slurm.warn_before_end_s() > 0) absl::StrAppend(&s, "#SBATCH --signal=B:USR1@", slurm.warn_before_end_s(), "\n");
  absl::StrAppend(&s, slurm.requeue() ? "#SBATCH --requeue\n" : "#SBATCH --no-requeue\n");
  absl::StrAppend(&s,
                  "# Written by `troupe run --slurm` for the run directory below (on storage every node sees).\n"
                  "# Resubmit: troupe run --resume ", run_dir, " --slurm. Where it stands: troupe status ", run_dir,
                  "\n"
                  "# Credentials: never on a command line. The hook for a token of the learner's port (not yet\n"
                  "# used: TLS and tokens are still to land) is ", RunLayout(run_dir).secrets(), "/ (mode 0700, files 0600).\n");
  absl::StrAppend(&s, "exec ", ShellQuote(troupe_binary), " slurm-job ", ShellQuote(run_dir), "\n");
  return s;
}

absl::StatusOr<std::string> SubmitSlurmJob(const std::string& script, const std::vector<std::string>& sbatch_options) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), sbatch_options.begin(), sbatch_options.end());
  argv.push_back(script);
  ASSIGN_OR_RETURN(const ProgramResult sbatch, RunProgram(argv));
  const std::vector<std::string> lines = Lines(sbatch.output);
  if (sbatch.exit_code != 0 || lines.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("sbatch refused the job (exit status ", sbatch.exit_code,
                                                      "): ", absl::StripAsciiWhitespace(sbatch.output)));
  }
  // --parsable: "JOBID" or "JOBID;CLUSTER" on the last line.
  std::string id = lines.back();
  return id.substr(0, id.find(';'));
}

absl::Status CheckSbatchOnPath() {
  if (!FindOnPath("sbatch").empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "--slurm: no sbatch on the PATH; run troupe where Slurm's commands are (a login node of the cluster), or "
      "install them (Debian: apt-get install slurm-client); nothing was submitted");
}

absl::Status CheckSbatchOptionsAvoid(const std::vector<std::string>& sbatch_options,
                                     const std::vector<std::string>& reserved, const std::string& why) {
  for (const std::string& option : sbatch_options) {
    const std::string name = option.substr(0, option.find('='));
    for (const std::string& shape : reserved) {
      // "-N2": a short option with its value attached.
      const bool short_form = shape.size() > 1 && shape[1] != '-' && option.rfind(shape, 0) == 0 &&
                              option.size() > 2 && option[1] != '-';
      if (name == shape || short_form) {
        return absl::InvalidArgumentError(absl::StrCat("--slurm ", option, ": ", why, "; nothing was submitted"));
      }
    }
  }
  return absl::OkStatus();
}

std::string SlurmJobState(const std::string& job_id) {
  auto squeue = RunProgram({"squeue", "--noheader", "--states=all", "--jobs=" + job_id, "--format=%T"});
  if (squeue.ok() && squeue->exit_code == 0) {
    const std::vector<std::string> lines = Lines(squeue->output);
    if (!lines.empty()) return lines.front();
  }
  auto scontrol = RunProgram({"scontrol", "show", "job", job_id});
  if (scontrol.ok() && scontrol->exit_code == 0) {
    const size_t at = scontrol->output.find("JobState=");
    if (at != std::string::npos) {
      const size_t begin = at + 9;
      return scontrol->output.substr(begin, scontrol->output.find_first_of(" \n", begin) - begin);
    }
  }
  return "";
}

absl::Status RunSlurmJob(const std::string& run_dir, const std::string& troupe_binary, const std::atomic<bool>* stop,
                         const std::atomic<bool>* requeue) {
  const std::string job_id = Env("SLURM_JOB_ID");
  if (job_id.empty()) {
    return absl::FailedPreconditionError(
        "troupe slurm-job runs inside a Slurm allocation (the job script `troupe run --slurm` writes); "
        "SLURM_JOB_ID is not set");
  }
  ASSIGN_OR_RETURN(config::ExperimentConfig config, LoadExperimentConfig(RunLayout(run_dir).config(), {}));
  ASSIGN_OR_RETURN(const SlurmPlan plan, PlanSlurmJob(config));
  ASSIGN_OR_RETURN(const ProgramResult hostnames,
                   RunProgram({"scontrol", "show", "hostnames", Env("SLURM_JOB_NODELIST")}));
  const std::vector<std::string> nodes = Lines(hostnames.output);
  if (hostnames.exit_code != 0 || int(nodes.size()) < plan.nodes) {
    return absl::FailedPreconditionError(absl::StrCat("the allocation's nodes (", Env("SLURM_JOB_NODELIST"), ": ",
                                                      absl::StripAsciiWhitespace(hostnames.output),
                                                      ") are fewer than slurm.nodes ", plan.nodes));
  }
  // A checkpoint means a resubmission (--resume) or a requeue: continue it.
  const bool resume = !RunLayout(run_dir).NewestCheckpoint().empty();
  std::vector<std::string> actor_hosts;
  for (int node : plan.actor_nodes) actor_hosts.push_back(nodes[node]);
  absl::PrintF(
      "troupe slurm job %s (restart %s) on %s: learner (%d rank%s) on %s, actors on %s; %s\n"
      "run directory %s; this output %s; actor logs %s/actor-N.log\n",
      job_id, Env("SLURM_RESTART_COUNT").empty() ? "0" : Env("SLURM_RESTART_COUNT"), absl::StrJoin(nodes, ","),
      plan.learner_ranks, plan.learner_ranks > 1 ? "s" : "", nodes[0], absl::StrJoin(actor_hosts, ","),
      resume ? "resuming from the checkpoint" : "starting fresh", run_dir, RunLayout(run_dir).slurm_output(job_id),
      RunLayout(run_dir).logs());
  std::fflush(stdout);

  // Each actor is a job step of one task on its node; it may share the
  // allocation's CPUs with the learner (--overlap), so that a step never
  // waits for resources the batch step holds.
  ActorWrapper wrapper;
  wrapper.stop_signal = SIGUSR1;  // srun forwards it; SIGTERM would make srun kill the step
  wrapper.argv = [&plan, &nodes, cpus = config.slurm().cpus_per_actor()](int index) {
    return std::vector<std::string>{"srun",
                                    "--nodes=1",
                                    "--ntasks=1",
                                    absl::StrCat("--cpus-per-task=", cpus),
                                    "--nodelist=" + nodes[plan.actor_nodes[index]],
                                    "--overlap",
                                    "--kill-on-bad-exit=1",
                                    "--quiet",
                                    absl::StrCat("--job-name=actor-", index)};
  };
  absl::Status status;
  if (plan.mpi) {
    status = RunMpiLearnerJob(config, plan, nodes, run_dir, troupe_binary, resume, stop, wrapper);
  } else {
    // The learner here, on the first node, reachable from the others.
    std::string listen = config.learner().listen();
    config.mutable_learner()->set_listen("0.0.0.0" + listen.substr(listen.rfind(':')));
    status = RunRlExperiment(config, run_dir, resume, stop, {.actor_wrapper = wrapper, .advertised_host = HostName()});
  }
  RETURN_IF_ERROR(status);
  // Slurm's warning before the time limit: checkpointed above; run on in a
  // requeued job.
  if (requeue->load() && config.slurm().requeue()) {
    absl::PrintF("\ncheckpointed before the time limit; requeueing job %s to continue\n", job_id);
    std::fflush(stdout);
    ASSIGN_OR_RETURN(const ProgramResult requeued, RunProgram({"scontrol", "requeue", job_id}));
    if (requeued.exit_code != 0) {
      return absl::FailedPreconditionError(absl::StrCat("scontrol requeue ", job_id, " failed: ", requeued.output));
    }
  }
  return absl::OkStatus();
}

}  // namespace troupe::launch
