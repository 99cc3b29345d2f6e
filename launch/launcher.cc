#include "launch/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_security.h"
#include "common/status_line.h"
#include "common/status_macros.h"
#include "learner/rl_learner.h"

namespace troupe::launch {
namespace {

// The address local actors dial: the learner's, with an any-interface host
// (0.0.0.0, [::]) replaced by loopback, which troupe certs' server
// certificate always names.
std::string LocalAddressOf(const std::string& learner) {
  const std::string host = HostOf(learner);
  const std::string port = learner.substr(learner.rfind(':') + 1);
  if (host == "0.0.0.0" || host.empty()) return "127.0.0.1:" + port;
  if (host == "::") return "[::1]:" + port;
  return learner;
}

// Starts `troupe actor` (this same binary) for `index`, its output to
// run_dir/logs/actor-INDEX.log. The child dies with the launcher. A token
// reaches it in its environment ($TROUPE_TOKEN), never on its command line.
absl::StatusOr<pid_t> SpawnActor(const std::string& run_dir, const std::string& learner, const std::string& token,
                                 int index) {
  const std::string log = absl::StrCat(run_dir, "/logs/actor-", index, ".log");
  const std::string config = run_dir + "/config.textproto";
  const std::string index_text = std::to_string(index);
  // The child's environment: ours, with the token set (made before fork).
  std::vector<std::string> environment;
  const std::string token_prefix = absl::StrCat(kTokenEnvironmentVariable, "=");
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, token_prefix)) environment.push_back(*e);
  }
  if (!token.empty()) environment.push_back(token_prefix + token);
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {"troupe", "actor", "--learner", learner, "--config", config, "--index", index_text};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork failed for actor ", index));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

std::string Thousands(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ActorFleet>> ActorFleet::Start(const config::ExperimentConfig& config,
                                                              const std::string& run_dir,
                                                              const std::string& learner_address,
                                                              const std::atomic<bool>* stop,
                                                              const std::string& token) {
  std::unique_ptr<ActorFleet> fleet(new ActorFleet());
  fleet->stop_ = stop;
  fleet->config_ = config;
  fleet->run_dir_ = run_dir;
  fleet->learner_address_ = LocalAddressOf(learner_address);
  fleet->token_ = token;
  std::filesystem::create_directories(run_dir + "/logs");
  {
    absl::MutexLock lock(&fleet->mutex_);
    fleet->actors_.resize(config.actors().count());
    for (int i = 0; i < config.actors().count(); ++i) {
      fleet->actors_[i].index = i;
      ASSIGN_OR_RETURN(fleet->actors_[i].pid, SpawnActor(run_dir, fleet->learner_address_, token, i));
    }
  }
  fleet->watcher_ = std::jthread([f = fleet.get()](std::stop_token token) { f->Watch(token); });
  return fleet;
}

ActorFleet::~ActorFleet() { Stop(); }

void ActorFleet::Watch(std::stop_token token) {
  while (!token.stop_requested()) {
    {
      absl::MutexLock lock(&mutex_);
      for (Actor& actor : actors_) {
        int wstatus = 0;
        if (actor.pid <= 0 || waitpid(actor.pid, &wstatus, WNOHANG) != actor.pid) continue;
        // It died: restart it unless we are stopping or it ran out of restarts.
        actor.pid = -1;
        if (stopping_ || (stop_ && stop_->load())) continue;
        const std::string how = WIFSIGNALED(wstatus) ? absl::StrCat("killed by signal ", WTERMSIG(wstatus))
                                                     : absl::StrCat("exited with status ", WEXITSTATUS(wstatus));
        if (actor.restarts >= config_.actors().max_restarts()) {
          std::printf("\nactor %d %s; not restarted (actors.max_restarts %d reached), see %s/logs/actor-%d.log\n",
                      actor.index, how.c_str(), config_.actors().max_restarts(), run_dir_.c_str(), actor.index);
          continue;
        }
        auto pid = SpawnActor(run_dir_, learner_address_, token_, actor.index);
        if (pid.ok()) {
          actor.pid = *pid;
          ++actor.restarts;
          ++total_restarts_;
          std::printf("\nactor %d %s; restarted (restart %d of %d)\n", actor.index, how.c_str(), actor.restarts,
                      config_.actors().max_restarts());
        }
        std::fflush(stdout);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void ActorFleet::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  watcher_ = std::jthread();  // requests stop and joins
  // SIGTERM, then SIGKILL after 3 s.
  absl::MutexLock lock(&mutex_);
  for (const Actor& actor : actors_) {
    if (actor.pid > 0) kill(actor.pid, SIGTERM);
  }
  for (Actor& actor : actors_) {
    if (actor.pid <= 0) continue;
    for (int i = 0; i < 30 && waitpid(actor.pid, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (kill(actor.pid, SIGKILL) == 0) waitpid(actor.pid, nullptr, 0);
    actor.pid = -1;
  }
}

std::vector<pid_t> ActorFleet::pids() const {
  absl::MutexLock lock(&mutex_);
  std::vector<pid_t> out;
  for (const Actor& actor : actors_) {
    if (actor.pid > 0) out.push_back(actor.pid);
  }
  return out;
}

int ActorFleet::alive() const { return static_cast<int>(pids().size()); }

int ActorFleet::count() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(actors_.size());
}

int ActorFleet::restarts() const {
  absl::MutexLock lock(&mutex_);
  return total_restarts_;
}

absl::Status RunRlExperiment(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                             const std::atomic<bool>* stop) {
  std::filesystem::create_directories(run_dir + "/logs");
  ASSIGN_OR_RETURN(auto learner, learner::RlLearner::Create(config, run_dir, resume));
  std::printf("learner serving replay and parameters on %s; run directory %s\n", learner->address().c_str(),
              run_dir.c_str());
  std::fflush(stdout);

  // The actors, watched and restarted on a thread of their own.
  ASSIGN_OR_RETURN(std::unique_ptr<ActorFleet> actors,
                   ActorFleet::Start(config, run_dir, learner->address(), stop, learner->credentials().token));

  // The status line, from the learner's stats, on another thread.
  std::jthread status_thread([&](std::stop_token token) {
    StatusLine line(std::chrono::milliseconds(500));
    while (!token.stop_requested()) {
      const learner::LearnerStats s = learner->Stats();
      line.Update(absl::StrFormat(
          "%s | frames %s | %.0f fps | updates %s (%.1f/s) | replay %s | spi %.1f | eval %s | params v%d | "
          "actors %d/%d (restarts %d)",
          config.env().task(), Thousands(s.frames), s.frames_per_second, Thousands(s.updates), s.updates_per_second,
          Thousands(s.replay_size), s.samples_per_insert,
          s.last_eval_return < 0 ? "-" : absl::StrFormat("%.1f @ %s", s.last_eval_return, Thousands(s.last_eval_frames)),
          s.parameter_version, actors->alive(), actors->count(), actors->restarts()));
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });

  // Train on this thread until done or stopped; a stop request wakes it.
  std::jthread interrupter([&](std::stop_token token) {
    while (!token.stop_requested() && !(stop && stop->load())) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stop && stop->load()) learner->Interrupt();
  });
  const absl::Status status = learner->Run(stop);
  interrupter.request_stop();
  status_thread.request_stop();
  actors->Stop();
  status_thread = std::jthread();
  const learner::LearnerStats s = learner->Stats();
  std::printf("\n%s: %s frames, %s updates, last eval return %s; run directory %s\n", config.env().task().c_str(),
              Thousands(s.frames).c_str(), Thousands(s.updates).c_str(),
              s.last_eval_return < 0 ? "-" : absl::StrFormat("%.1f", s.last_eval_return).c_str(), run_dir.c_str());
  return status;
}

}  // namespace troupe::launch
