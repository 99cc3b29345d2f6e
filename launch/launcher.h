// `troupe run` for RL on one machine: the learner (replay embedded) in this
// process, N actor processes (`troupe actor`) started from this binary, an
// actor that dies restarted (up to actors.max_restarts each), one live status
// line, and Ctrl-C stopping everything cleanly with a final checkpoint.
//
// Run directory: config.textproto (resolved), metrics.csv/jsonl, eval.csv,
// learning_curve.png, logs/actor-N.log, checkpoints/.
#ifndef TROUPE_LAUNCH_LAUNCHER_H_
#define TROUPE_LAUNCH_LAUNCHER_H_

#include <sys/types.h>

#include <atomic>
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
  // Errors: ResourceExhausted if fork fails.
  static absl::StatusOr<std::unique_ptr<ActorFleet>> Start(const config::ExperimentConfig& config,
                                                           const std::string& run_dir,
                                                           const std::string& learner_address,
                                                           const std::atomic<bool>* stop = nullptr,
                                                           const std::string& token = "");
  ~ActorFleet();  // Stop()

  // Stops restarting, sends SIGTERM, waits up to 3 s, then SIGKILLs.
  void Stop();

  // The live actors' process ids (for CPU accounting), and counts.
  std::vector<pid_t> pids() const;
  int alive() const;
  int restarts() const;
  int count() const;

 private:
  struct Actor {
    int index = 0;
    pid_t pid = -1;
    int restarts = 0;
  };
  ActorFleet() = default;
  void Watch(std::stop_token token);

  config::ExperimentConfig config_;
  std::string run_dir_, learner_address_;
  std::string token_;  // passed to each actor in its environment
  const std::atomic<bool>* stop_ = nullptr;
  mutable absl::Mutex mutex_;
  std::vector<Actor> actors_ ABSL_GUARDED_BY(mutex_);
  int total_restarts_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::jthread watcher_;
};

// Runs until total_frames / max_updates or *stop. `run_dir` exists and holds
// config.textproto; with `resume`, training continues from its checkpoint.
// Errors: config errors naming the field, "port in use", learner errors.
absl::Status RunRlExperiment(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                             const std::atomic<bool>* stop);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_LAUNCHER_H_
