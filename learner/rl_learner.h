// The RL learner process: replay embedded (the default, no server to start
// by hand), D4PG on the Replicator, and one gRPC port that serves both
// replay (for actors' inserts) and Parameters (a new policy version every
// `publish_every` updates). It writes the run directory's metrics
// (metrics.csv, metrics.jsonl, learning_curve.png), runs the evaluator on a
// schedule, and checkpoints (agent + counters, replay when configured).
//
// Threads: Run() trains on the calling thread (and the Replicator's replica
// threads); gRPC serves on its own threads; the evaluator runs on its own
// thread. Stats() may be called from any thread (guarded by a mutex).
#ifndef TROUPE_LEARNER_RL_LEARNER_H_
#define TROUPE_LEARNER_RL_LEARNER_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "actors/episode_stream.h"
#include "learner/agents/d4pg.h"
#include "learner/replicator/replicator.h"
#include "learner/service/parameter_service.h"
#include "proto/config.pb.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "replay/service.h"

namespace troupe::learner {

struct LearnerStats {
  int64_t frames = 0;            // env frames in replay's inserts (+ those before a resume)
  int64_t updates = 0;
  double updates_per_second = 0;
  double frames_per_second = 0;
  int64_t replay_size = 0;
  double samples_per_insert = 0;  // sampled transitions / inserted transitions
  double critic_loss = 0, actor_loss = 0, q_mean = 0;
  double last_eval_return = -1;   // -1 before the first evaluation
  int64_t last_eval_frames = 0;
  int64_t parameter_version = 0;
};

class RlLearner {
 public:
  // Sets everything up and starts serving on config.learner().listen().
  // With `resume`, loads run_dir/checkpoints (agent, counters, replay if
  // saved). Errors: config errors naming the field; Unavailable if the
  // address cannot be bound ("port in use"); checkpoint errors.
  static absl::StatusOr<std::unique_ptr<RlLearner>> Create(const config::ExperimentConfig& config,
                                                           const std::string& run_dir, bool resume);
  ~RlLearner();  // stops serving and joins the evaluator

  // "host:port" actors connect to.
  const std::string& address() const { return address_; }

  // Trains until total_frames / max_updates are reached or *stop turns true,
  // then checkpoints. Errors: training errors (a failed replica, ...).
  absl::Status Run(const std::atomic<bool>* stop);

  // Wakes a Run blocked on replay (used on shutdown).
  void Interrupt();

  LearnerStats Stats() const;

 private:
  RlLearner() = default;
  absl::Status Checkpoint();
  absl::Status Restore();
  void MaybeEvaluate();
  // Refreshes stats_; with `write_row`, also rates and losses since the last
  // row, and appends a metrics row. Learner thread only.
  void RecordStats(bool write_row);
  void WriteMetrics();
  int64_t FramesNow() const;

  config::ExperimentConfig config_;
  std::string run_dir_;
  agents::ObservationSpec spec_;
  int action_size_ = 0;
  std::unique_ptr<replay::Replay> replay_;
  std::unique_ptr<replay::ReplayService> replay_service_;
  ParameterStore parameter_store_;
  std::unique_ptr<ParameterService> parameter_service_;
  std::unique_ptr<actors::EpisodePublisher> episode_publisher_;  // the evaluator's episodes, for troupe view --live
  std::unique_ptr<actors::EpisodeStreamService> episode_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<replicator::Replicator> replicator_;
  std::unique_ptr<agents::D4pgAgent> agent_;
  std::unique_ptr<replay::ReplayClient> local_client_;
  std::vector<std::unique_ptr<replay::Sampler>> samplers_;  // one per local replica
  std::vector<float> policy_parameters_;
  std::unique_ptr<agents::D4pgPolicy> eval_policy_;  // used on the evaluator thread only
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_row_;  // when the last metrics row was written
  int64_t row_updates_ = 0, row_frames_ = 0;        // counters at that row

  int64_t frames_before_ = 0;    // frames counted before a resume
  int64_t inserts_before_ = 0;   // replay inserts restored from a checkpoint
  int64_t samples_ = 0;          // transitions sampled (learner thread), over the whole run
  int64_t samples_before_ = 0;   // of which before a resume

  // The evaluator: a thread that evaluates a snapshot of the policy.
  std::jthread evaluator_;
  std::atomic<bool> evaluating_{false};
  int64_t next_eval_frames_ = 0;

  mutable std::mutex mutex_;
  LearnerStats stats_;                // guarded by mutex_
  std::vector<double> eval_frames_;   // guarded by mutex_
  std::vector<double> eval_returns_;  // guarded by mutex_
};

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_RL_LEARNER_H_
