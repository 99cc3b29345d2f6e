// `troupe run` for RL on one machine: the learner (replay embedded) in this
// process, N actor processes (`troupe actor`) started from this binary, an
// actor that dies restarted (up to actors.max_restarts each), one live status
// line, and Ctrl-C stopping everything cleanly with a final checkpoint.
//
// Run directory (common/run_layout.h): config.textproto (resolved),
// metrics.csv/jsonl, eval.csv, learning_curve.png, logs/actor-N.log,
// checkpoints/, status.txt (the status line, rewritten every second),
// learner.address (HOST:PORT actors use).
// The same code runs inside a Slurm job (launch/slurm.h), with each actor
// started as a job step.
#ifndef TROUPE_LAUNCH_LAUNCHER_H_
#define TROUPE_LAUNCH_LAUNCHER_H_

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// How actors start when they are not simply forked here: the argv an
// actor's command is wrapped in, given the actor's index (e.g. `srun
// --nodelist=NODE ...` for a Slurm job step), and the signal that asks a
// wrapped actor to stop (srun turns SIGTERM into a kill of its step, but
// forwards SIGUSR1, which troupe actor takes as a stop). Unset argv = forked
// here, stopped with SIGTERM.
struct ActorWrapper {
  std::function<std::vector<std::string>(int index)> argv;
  int stop_signal = SIGTERM;
  explicit operator bool() const { return static_cast<bool>(argv); }
};

// The argv of `troupe actor` for actor `index` of the run in `run_dir`.
std::vector<std::string> ActorCommand(const std::string& troupe_binary, const std::string& run_dir,
                                      const std::string& learner_address, int index);

// The troupe binary this process runs (/proc/self/exe resolved).
std::string SelfBinary();

// This machine's actor processes: config.actors().count() children running
// `troupe actor` (this same binary, /proc/self/exe, so only the troupe
// command can use it) against a learner, each with its output in
// run_dir/logs/actor-INDEX.log and dying with its parent. A watcher thread
// restarts an actor that dies, up to actors.max_restarts each, and says so
// on stdout. Thread-safe (a mutex guards the process table).
class ActorFleet {
 public:
  // Starts the actors. `run_dir` holds config.textproto (what they read;
  // its security section names certificate files, never the token). Once
  // *stop (if given) turns true, dead actors are no longer restarted.
  // `token` (the learner's, if it has one) reaches each actor as
  // $TROUPE_TOKEN in its environment, never on its command line. An
  // any-interface learner address (0.0.0.0:PORT) is dialled on loopback.
  // With `wrapper`, each actor runs under it (a Slurm job step on another
  // node: it dials `learner_address` as given; the pid watched is the
  // wrapper's, and its stop signal reaches the actor through it).
  // Errors: ResourceExhausted if fork fails.
  static absl::StatusOr<std::unique_ptr<ActorFleet>> Start(const config::ExperimentConfig& config,
                                                           const std::string& run_dir,
                                                           const std::string& learner_address,
                                                           const std::atomic<bool>* stop = nullptr,
                                                           const std::string& token = "",
                                                           ActorWrapper wrapper = {});
  ~ActorFleet();  // Stop()

  // Stops restarting, sends SIGTERM (the wrapper's stop signal), waits up
  // to kStopGrace (then SIGTERM to a wrapper and 2 s more), then SIGKILLs,
  // saying on stdout which actors it had to kill; returns once every actor
  // is gone. A call while another is under way waits for it.
  void Stop();

  // How long an actor has to end after its stop signal: 3 s; 60 s in a
  // build with AddressSanitizer, whose actors run LeakSanitizer's check as
  // they exit (seconds at this size) and, killed first, would report no
  // leak whether they leak or not.
#if defined(__SANITIZE_ADDRESS__)
  static constexpr std::chrono::seconds kStopGrace{60};
#else
  static constexpr std::chrono::seconds kStopGrace{3};
#endif

  // The live actors' process ids (for CPU accounting), and counts.
  std::vector<pid_t> pids() const;
  int alive() const;
  int restarts() const;
  int count() const;
  // Actors that died after their last restart (actors.max_restarts) and
  // stay dead; when it is count(), no one fills replay any more.
  int given_up() const;

 private:
  struct Actor {
    int index = 0;
    pid_t pid = -1;
    int restarts = 0;
    bool given_up = false;
  };
  ActorFleet() = default;
  void Watch(std::stop_token token);

  absl::StatusOr<pid_t> Spawn(int index) const;

  config::ExperimentConfig config_;
  std::string run_dir_, learner_address_, binary_;
  std::string token_;  // passed to each actor in its environment
  ActorWrapper wrapper_;
  const std::atomic<bool>* stop_ = nullptr;
  absl::Mutex stop_mutex_;  // held through Stop
  mutable absl::Mutex mutex_;
  std::vector<Actor> actors_ ABSL_GUARDED_BY(mutex_);
  int total_restarts_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::jthread watcher_;
};

struct RlRunOptions {
  // How actors start (see ActorWrapper); unset = forked on this machine.
  ActorWrapper actor_wrapper;
  // The host actors are told when the learner listens on every interface
  // (0.0.0.0); empty = this machine's host name.
  std::string advertised_host;
};

// Runs until total_frames / max_updates or *stop. `run_dir` exists and holds
// config.textproto; with `resume`, training continues from its checkpoint.
// Errors: config errors naming the field, "port in use", learner errors.
absl::Status RunRlExperiment(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                             const std::atomic<bool>* stop, const RlRunOptions& options = {});


// Writes RUN_DIR/status.txt: `line`, then "updated UNIX_SECONDS".
void WriteStatusFile(const std::string& run_dir, const std::string& line);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_LAUNCHER_H_
