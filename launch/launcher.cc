#include "launch/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/grpc_security.h"
#include "common/host.h"
#include "common/run_layout.h"
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

// Starts argv (the actor's command, wrapped or not) with its output appended
// to `log`. The child dies with the launcher. A token reaches it in its
// environment ($TROUPE_TOKEN; srun passes it on to a job step), never on its
// command line.
absl::StatusOr<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& log,
                                  const std::string& token, int index) {
  std::vector<std::string> copy = argv;
  std::vector<char*> pointers;
  for (std::string& a : copy) pointers.push_back(a.data());
  pointers.push_back(nullptr);
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
    execvpe(pointers[0], pointers.data(), envp.data());
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

std::string SelfBinary() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("/proc/self/exe") : self.string();
}

std::vector<std::string> ActorCommand(const std::string& troupe_binary, const std::string& run_dir,
                                      const std::string& learner_address, int index) {
  return {troupe_binary, "actor", "--learner", learner_address, "--config", RunLayout(run_dir).config(),
          "--index", std::to_string(index)};
}

void WriteStatusFile(const std::string& run_dir, const std::string& line) {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  (void)WriteFileAtomically(RunLayout(run_dir).status(), absl::StrCat(line, "\nupdated ", now, "\n"));
}

absl::StatusOr<pid_t> ActorFleet::Spawn(int index) const {
  // Forked here: this same binary as /proc/self/exe; wrapped: its real path.
  std::vector<std::string> argv =
      ActorCommand(wrapper_ ? binary_ : "/proc/self/exe", run_dir_, learner_address_, index);
  if (wrapper_) {
    std::vector<std::string> wrapped = wrapper_.argv(index);
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    argv = std::move(wrapped);
  }
  return SpawnLogged(argv, RunLayout(run_dir_).actor_log(index), token_, index);
}

absl::StatusOr<std::unique_ptr<ActorFleet>> ActorFleet::Start(const config::ExperimentConfig& config,
                                                              const std::string& run_dir,
                                                              const std::string& learner_address,
                                                              const std::atomic<bool>* stop, const std::string& token,
                                                              ActorWrapper wrapper) {
  std::unique_ptr<ActorFleet> fleet(new ActorFleet());
  fleet->stop_ = stop;
  fleet->config_ = config;
  fleet->run_dir_ = run_dir;
  // Actors here dial an any-interface learner on loopback; wrapped ones
  // (other nodes) the address given.
  fleet->learner_address_ = wrapper ? learner_address : LocalAddressOf(learner_address);
  fleet->token_ = token;
  fleet->wrapper_ = std::move(wrapper);
  fleet->binary_ = SelfBinary();
  std::filesystem::create_directories(RunLayout(run_dir).logs());
  {
    absl::MutexLock lock(&fleet->mutex_);
    fleet->actors_.resize(config.actors().count());
    for (int i = 0; i < config.actors().count(); ++i) {
      fleet->actors_[i].index = i;
      ASSIGN_OR_RETURN(fleet->actors_[i].pid, fleet->Spawn(i));
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
          actor.given_up = true;
          std::printf("\nactor %d %s; not restarted (actors.max_restarts %d reached), see %s\n", actor.index,
                      how.c_str(), config_.actors().max_restarts(), RunLayout(run_dir_).actor_log(actor.index).c_str());
          std::fflush(stdout);
          continue;
        }
        auto pid = Spawn(actor.index);
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
  // The stop signal (SIGTERM, or the wrapper's) to all, at once; after
  // kStopGrace, SIGTERM to wrappers still there (srun then ends its step
  // through Slurm); after 2 s more, SIGKILL, said for each actor it ends.
  absl::MutexLock stop_lock(&stop_mutex_);
  const int stop_signal = wrapper_ ? wrapper_.stop_signal : SIGTERM;
  auto signal_all = [this](int signal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    for (const Actor& actor : actors_) {
      if (actor.pid > 0) kill(actor.pid, signal);
    }
  };
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;  // the watcher restarts no one from now on
    signal_all(stop_signal);
  }
  watcher_ = std::jthread();  // requests stop and joins
  absl::MutexLock lock(&mutex_);
  auto reap_until = [this](std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    while (true) {
      bool alive = false;
      for (Actor& actor : actors_) {
        if (actor.pid > 0 && waitpid(actor.pid, nullptr, WNOHANG) == actor.pid) actor.pid = -1;
        alive = alive || actor.pid > 0;
      }
      if (!alive || std::chrono::steady_clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  const auto start = std::chrono::steady_clock::now();
  reap_until(start + kStopGrace);
  if (stop_signal != SIGTERM) {
    signal_all(SIGTERM);
    reap_until(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Actor& actor : actors_) {
    if (actor.pid > 0) {
      kill(actor.pid, SIGKILL);
      waitpid(actor.pid, nullptr, 0);
      std::printf("actor %d still running %.0f s after its stop signal; killed\n", actor.index, waited);
    }
    actor.pid = -1;
  }
  std::fflush(stdout);
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

int ActorFleet::given_up() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(std::count_if(actors_.begin(), actors_.end(), [](const Actor& a) { return a.given_up; }));
}

int ActorFleet::count() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(actors_.size());
}

int ActorFleet::restarts() const {
  absl::MutexLock lock(&mutex_);
  return total_restarts_;
}

absl::Status RunRlExperiment(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                             const std::atomic<bool>* stop, const RlRunOptions& options) {
  std::filesystem::create_directories(RunLayout(run_dir).logs());
  ASSIGN_OR_RETURN(auto learner, learner::RlLearner::Create(config, run_dir, resume));
  // The address actors use, also in the run directory for those started by
  // hand and for troupe status.
  const std::string address = ReachableAddress(learner->address(), options.advertised_host);
  RETURN_IF_ERROR(WriteFileAtomically(RunLayout(run_dir).learner_address(), address + "\n"));
  std::printf("learner serving replay and parameters on %s; run directory %s\n", address.c_str(), run_dir.c_str());
  std::fflush(stdout);

  // The actors, watched and restarted on a thread of their own.
  ASSIGN_OR_RETURN(std::unique_ptr<ActorFleet> actors,
                   ActorFleet::Start(config, run_dir, options.actor_wrapper ? address : learner->address(), stop,
                                     learner->credentials().token, options.actor_wrapper));

  // The status line, from the learner's stats, on another thread.
  std::jthread status_thread([&](std::stop_token token) {
    StatusLine line(std::chrono::milliseconds(500));
    auto last_file = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    while (!token.stop_requested()) {
      const learner::LearnerStats s = learner->Stats();
      const std::string text = absl::StrFormat(
          "%s | frames %s | %.0f fps | updates %s (%.1f/s) | replay %s | spi %.1f | eval %s | params v%d | "
          "actors %d/%d (restarts %d)",
          config.env().task(), Thousands(s.frames), s.frames_per_second, Thousands(s.updates), s.updates_per_second,
          Thousands(s.replay_size), s.samples_per_insert,
          s.last_eval_return < 0 ? "-" : absl::StrFormat("%.1f @ %s", s.last_eval_return, Thousands(s.last_eval_frames)),
          s.parameter_version, actors->alive(), actors->count(), actors->restarts());
      // A failed checkpoint (a full disk) or a damaged one passed over at
      // resume stays on the line until a checkpoint commits.
      const std::string shown = s.checkpoint_note.empty() ? text : absl::StrCat(text, " | ", s.checkpoint_note);
      line.Update(shown);
      // The same line in the run directory (troupe status), every 0.5 s.
      if (std::chrono::steady_clock::now() - last_file >= std::chrono::milliseconds(500)) {
        WriteStatusFile(run_dir, shown);
        last_file = std::chrono::steady_clock::now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });

  // Train on this thread until done or stopped. A stop request stops the
  // actors first (replay no longer holding their inserts back, so their
  // last ones are acknowledged at once), then wakes a Run blocked on
  // replay by closing it.
  // Every actor gone for good (each failed past actors.max_restarts: a
  // policy that acts NaN, a broken env) ends the run too: nothing would
  // fill replay again.
  std::atomic<bool> actors_gave_up{false};
  std::jthread interrupter([&](std::stop_token token) {
    const auto all_gave_up = [&] { return actors->count() > 0 && actors->given_up() == actors->count(); };
    while (!token.stop_requested() && !(stop && stop->load()) && !all_gave_up()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (all_gave_up()) {
      actors_gave_up = true;
      learner->Interrupt();
    } else if (stop && stop->load()) {
      learner->StopLimitingInserts();  // the actors' last inserts go in while the learner ends its Train
      actors->Stop();
      learner->Interrupt();
    }
  });
  // A run that ends cleanly stops its actors inside Run, before its final
  // checkpoint and while replay still serves them (RlLearner::Run).
  absl::Status status = learner->Run(stop, [&] { actors->Stop(); });
  if (actors_gave_up) {
    status = absl::UnavailableError(absl::StrCat("every actor failed with its restarts spent (actors.max_restarts ",
                                                 config.actors().max_restarts(),
                                                 "); the run stopped. Their logs say why: ", RunLayout(run_dir).logs()));
  }
  interrupter.request_stop();
  status_thread.request_stop();
  // After an error (the actors may still run): replay closed first, so an
  // actor blocked on an insert the rate limiter holds (nothing samples any
  // more) sees it at once, and then its stop.
  learner->Interrupt();
  actors->Stop();
  status_thread = std::jthread();
  const learner::LearnerStats s = learner->Stats();
  WriteStatusFile(run_dir, absl::StrFormat("%s | ended (%s) | frames %s | updates %s | params v%d",
                                           config.env().task(), status.ok() ? "ok" : status.ToString(),
                                           Thousands(s.frames), Thousands(s.updates), s.parameter_version));
  std::printf("\n%s: %s frames, %s updates, last eval return %s; run directory %s\n", config.env().task().c_str(),
              Thousands(s.frames).c_str(), Thousands(s.updates).c_str(),
              s.last_eval_return < 0 ? "-" : absl::StrFormat("%.1f", s.last_eval_return).c_str(), run_dir.c_str());
  return status;
}

}  // namespace troupe::launch
