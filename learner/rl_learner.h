// The RL learner process: replay embedded (the default, no server to start
// by hand), the config's agent on the Replicator (agents/agent.h), and one gRPC port that serves both
// replay (for actors' inserts) and Parameters (a new policy version every
// `publish_every` updates). It writes the run directory's metrics
// (metrics.csv, metrics.jsonl, learning_curve.png, and with config
// `tensorboard` a TensorBoard event file of the same scalars at step = env
// frames plus each evaluation video's frame strip), runs the evaluator on a
// schedule, and checkpoints (agent + counters, replay when configured) as
// generations (common/generations.h): all of a step's files committed at
// once, the newest learner.keep_checkpoints kept. A checkpoint that fails (a
// full disk) is said in the log and the status line, its partial
// generation removed, and training goes on; the next one tries again.
//
// Replicas: learner.engine.replicas > 1 with collectives IN_PROCESS runs them
// as threads of this process. Collectives MPI runs one replica per rank of
// `mpirun -np K troupe learner ...`: rank 0 (the chief) owns everything above
// (replay, the port, Parameters, the evaluator, metrics, checkpoints); every
// other rank samples its shard of each global batch from rank 0's replay
// over gRPC (replay/grpc_client.h), and the Replicator averages gradients
// over MPI, so all ranks hold identical parameters (checked at the end of
// Run by comparing every rank's state checksum). Rank 0 decides each step
// (train, wait for replay, stop) and broadcasts it, so every rank runs the
// same collectives in the same order.
//
// Threads: Run() trains on the calling thread (and the Replicator's replica
// threads); gRPC serves on its own threads; the evaluator runs on its own
// thread. Stats() may be called from any thread (guarded by a mutex). Under
// MPI, Create and Run must be called from the thread that initialised MPI
// (they run collectives).
//
// Files, one concern each: rl_learner.cc wires the process (Create: replay,
// the port, the agent, the samplers); rank_agreement.h keeps the ranks in
// step; checkpoint.cc writes checkpoints and resumes from them; run_log.h
// writes (and on resume cuts back) the run directory's logs;
// evaluator_thread.h evaluates; training_loop.cc is Run.
#ifndef TROUPE_LEARNER_RL_LEARNER_H_
#define TROUPE_LEARNER_RL_LEARNER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "actors/episode_stream.h"
#include "agents/agents.h"
#include "common/grpc_security.h"
#include "common/run_layout.h"
#include "engine/replicator/replicator.h"
#include "learner/evaluator_thread.h"
#include "learner/run_log.h"
#include "learner/service/parameter_service.h"
#include "proto/config.pb.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "replay/service.h"

namespace troupe::learner {

// The largest global batch the learner takes.
inline constexpr int kMaxLearnerBatchSize = 1 << 16;

// InvalidArgument naming the field ("learner.min_replay_size 0: must be >=
// 1") for a learner section the RL learner cannot run, its engine section
// included (engine::ValidateEngineConfig); listen a strict HOST:PORT; sizes
// within limits (batch_size, replay_size within replay's table limit and
// this machine's memory).
absl::Status ValidateLearnerConfig(const config::LearnerConfig& learner);

// Writes one learner checkpoint into the checkpoint folder `dir` as a
// generation (common/generations.h): replay.ckpt (when `replay` is given;
// its crc32 from its writer), agent.ckpt and counters.txt (`counters` is
// called once replay is written), committed at once, the newest `keep`
// kept. The agent's state is downloaded on the calling thread (the one that
// trains) and written and synced on a thread of its own while replay is
// written on this one, so the two files' syncs overlap. Returns the
// generation's number. Errors: the writers' (ResourceExhausted for a full
// disk), the partial generation then removed.
absl::StatusOr<int64_t> WriteLearnerCheckpoint(const std::string& dir, const agents::Agent& agent,
                                               replay::Replay* replay, absl::FunctionRef<std::string()> counters,
                                               int keep);

struct LearnerStats {
  int64_t frames = 0;            // env frames in replay's inserts (+ those before a resume)
  int64_t updates = 0;
  double updates_per_second = 0;
  double frames_per_second = 0;
  int64_t replay_size = 0;
  double samples_per_insert = 0;  // items sampled / items inserted
  // The agent's metrics over the interval (Agent::metric_names' order).
  std::vector<double> agent_metrics;
  // What an update waited for its input (sampling, new frames) over the
  // interval, mean milliseconds: near 0 unless input is the bottleneck.
  double input_wait_ms = 0;
  // Pixel frames uploaded to the device frame table per update over the
  // interval (agents/device_frames.h).
  double frames_uploaded_per_update = 0;
  // What the device sat idle per update between executions, waiting for
  // the host (Agent metrics' device_idle_s), mean milliseconds.
  double device_idle_ms = 0;
  double last_eval_return = -1;   // -1 before the first evaluation
  int64_t last_eval_frames = 0;
  int64_t parameter_version = 0;
  // Seconds spent checkpointing over the interval of the last metrics row.
  double checkpoint_seconds = 0;
  // Why the status line should warn about checkpoints ("" when all is
  // well): the last checkpoint failed (a full disk), or the resume passed
  // over a damaged or unfinished newer one.
  std::string checkpoint_note;
};

struct RlLearnerOptions {
  // How long a replica waits in a collective for the others (MPI and
  // IN_PROCESS collectives alike): a replica that stalls or dies makes the others fail
  // with an error naming it after this long.
  std::chrono::milliseconds collective_timeout{60000};
};

class RlLearner {
 public:
  // Sets everything up and starts serving on config.learner().listen().
  // With `resume`, loads the newest usable generation of run_dir/checkpoints
  // (agent, counters, replay if saved), passing over (and printing why) a
  // newer one that is damaged or was cut short; a run directory from before
  // generations (agent.ckpt and counters.txt directly in checkpoints/)
  // resumes from those. Errors: config errors naming the field; credential errors
  // (LoadGrpcCredentials); FailedPrecondition for a listen address beyond
  // loopback without TLS and a token (AddSecureListeningPort); Unavailable
  // if the address cannot be bound ("port in use"); checkpoint errors. Under MPI
  // only rank 0 serves and writes to run_dir (every rank loads the agent
  // checkpoint from run_dir/checkpoints on resume); the others learn rank
  // 0's address by broadcast, and fail with rank 0's error if it could not
  // start.
  static absl::StatusOr<std::unique_ptr<RlLearner>> Create(const config::ExperimentConfig& config,
                                                           const std::string& run_dir, bool resume,
                                                           const RlLearnerOptions& options = {});
  ~RlLearner();  // stops serving and joins the evaluator

  // "host:port" actors connect to (on every rank: rank 0's).
  const std::string& address() const { return address_; }
  // The credentials of its port and its connections (config.security and
  // $TROUPE_TOKEN, common/grpc_security.h).
  const GrpcCredentials& credentials() const { return credentials_; }

  // This process's rank and the number of ranks (0 and 1 unless collectives
  // MPI). Rank 0 is the chief: it serves, evaluates and writes run_dir.
  int rank() const { return rank_; }
  int num_ranks() const { return num_ranks_; }
  bool is_chief() const { return rank_ == 0; }

  // A checksum of the agent's whole state (networks, targets, optimizer
  // state, update counter) on this process; equal on every rank.
  uint64_t StateChecksum() const { return agent_->StateChecksum(); }
  // False after a stop the ranks did not agree on where the agent's state is
  // split across them (Agent::state_gathered): no checksum or checkpoint then.
  bool state_gathered() const { return agent_->state_gathered(); }

  // Trains until total_frames / max_updates are reached or *stop turns true,
  // then checkpoints (rank 0). Under MPI every rank calls Run; rank 0's
  // counters and *stop decide for all, and at the end every rank's state
  // checksum is compared (Internal naming the rank that differs). Errors:
  // training errors (a failed replica, a collective timeout naming the
  // replica that did not arrive, ...); the final checkpoint's error, naming
  // the last good checkpoint (a periodic one that fails does not stop Run).
  // With `stop_actors` (rank 0: the caller's actors), a run that reached its
  // end or a stop request (not an error) stops them before its final
  // evaluation, row and checkpoint, while replay and the port still serve:
  // replay stops holding inserts back (nothing samples any more), then
  // stop_actors is called and must return once they are gone (within a
  // deadline of its own). At the run's end their last inserts are thus
  // acknowledged, counted and checkpointed, and no writer sees replay go
  // away. After an error it is not called.
  absl::Status Run(const std::atomic<bool>* stop, const std::function<void()>& stop_actors = {});

  // Ends Run: wakes it where it is blocked on replay, and where it waits for
  // replay to fill, it stops waiting (used on shutdown, and when no actor
  // is left to fill it).
  void Interrupt();

  // Replay stops holding inserts back (Replay::StopLimitingInserts), as Run
  // does before it stops the actors; for a stop request, before the caller
  // stops them while Run still trains: an actor the rate limiter holds then
  // delivers its last items at once, not after the learner's next samples,
  // which may be a long Train(publish_every) away (and past the actors'
  // stop deadline, when they would be killed with those items unsent).
  void StopLimitingInserts();

  LearnerStats Stats() const;

  // Transitions the actors inserted into replay since this process
  // started (those restored from a checkpoint not counted). Rank 0 only.
  int64_t TransitionsInserted() const;

 private:
  RlLearner() = default;
  // Rank 0's part of Create: replay, the port and its services.
  absl::Status StartChief(const config::ReplayConfig& replay_config);
  // Rank 0's evaluator and its logs, last in Create (learner/evaluator_thread.h).
  absl::Status StartEvaluator();
  // Under MPI: rank 0's `step` (what to do next in Run) for every rank.
  absl::StatusOr<int> AgreeOnStep(int step);
  // learner/checkpoint.cc: writes and commits one checkpoint generation; on
  // error the partial generation is removed. Learner thread, rank 0.
  absl::Status Checkpoint();
  // Checkpoint(), and on failure a warning (log and status line) instead of
  // an error: the run goes on and the next checkpoint tries again.
  void CheckpointOrWarn();
  // "generation 7 at 12,000 frames", or "none yet".
  std::string LastGenerationText() const;
  // Rank 0's resume: the newest usable generation, then the logs cut back
  // to it (LearnerRunLog::Resume).
  absl::Status Restore();
  // Other ranks' resume: the agent of the newest usable generation.
  absl::Status RestoreAgent();
  // Loads agent.ckpt, counters.txt and (when `has_replay` and configured)
  // replay.ckpt from `folder`; DataLoss when they are damaged or disagree
  // (counters of another step than the networks), so that an older
  // generation is tried. Sets the counters; `replay_note` says what replay
  // got.
  absl::Status LoadCheckpointFiles(const std::string& folder, bool has_replay, std::string* replay_note);
  // learner/training_loop.cc: refreshes stats_; with `write_row`, also
  // rates and losses since the last row, and appends a metrics row.
  // Learner thread only.
  void RecordStats(bool write_row);
  // The end of Run on rank 0: the last evaluation, row and checkpoint.
  absl::Status Finish(const std::atomic<bool>* stop);
  // Starts an evaluation when one is due (or, with `force`, now).
  void MaybeEvaluate(bool force = false);
  // Env frames so far: those before a resume plus replay's inserts since,
  // from an Info() of replay (FramesNow asks it).
  int64_t FramesFrom(const proto::InfoResponse& info) const;
  int64_t FramesNow() const { return FramesFrom(replay_->Info()); }

  config::ExperimentConfig config_;
  RunLayout layout_{""};
  bool resumed_ = false;  // from a checkpoint in the run directory (its clock goes on)
  GrpcCredentials credentials_;
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
  std::unique_ptr<agents::Agent> agent_;
  // Samples and priority updates: rank 0's embedded replay, in process on
  // rank 0 and over gRPC on the other ranks.
  std::unique_ptr<replay::ReplayClient> replay_client_;
  std::vector<std::unique_ptr<replay::Sampler>> samplers_;  // one per local replica
  std::string table_;  // the agent's replay table (agents::AgentReplayTable), which the samplers sample
  int64_t min_sample_size_ = 1;  // its rate limiter's min_size_to_sample
  std::atomic<bool> interrupted_{false};  // Interrupt was called
  int64_t steps_per_item_ = 1;   // agent steps (of action_repeat frames) per item it holds
  bool mpi_ = false;
  int rank_ = 0, num_ranks_ = 1;
  std::vector<float> policy_parameters_;
  // The run's logs (rank 0; null elsewhere): metrics rows (learner thread),
  // evaluations (the evaluator's thread), frame strips (the video
  // recorder's). Declared before evaluator_, whose threads write to it, so
  // that it is destroyed after.
  std::unique_ptr<LearnerRunLog> run_log_;
  std::vector<std::string> agent_metric_names_;  // the agent's metrics.csv columns (Agent::metric_names)
  // The evaluator (rank 0): evaluates snapshots of the policy on its thread.
  std::unique_ptr<EvaluatorThread> evaluator_;
  // When the run's clock started: Run(), or for a resumed run its last
  // metrics row's seconds before now (Restore).
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_row_;  // when the last metrics row was written
  int64_t row_updates_ = 0, row_frames_ = 0;        // counters at that row
  int64_t row_frames_uploaded_ = 0;                  // the agent's frame_stats() at that row

  int64_t frames_before_ = 0;    // frames counted before a resume
  int64_t inserts_before_ = 0;   // replay inserts restored from a checkpoint
  int64_t samples_ = 0;          // transitions sampled (learner thread), over the whole run
  int64_t samples_before_ = 0;   // of which before a resume

  // Checkpoints (learner thread): the last committed generation (0: the
  // single-file layout resumed from, -1: none) and its frames; failures in
  // a row; seconds spent checkpointing in all, and at the last metrics row.
  int64_t last_generation_ = -1;
  int64_t last_generation_frames_ = 0;
  int checkpoint_failures_ = 0;
  bool without_replay_ = false;  // the last generation was committed without replay (a full disk)
  double checkpoint_seconds_ = 0;
  double row_checkpoint_seconds_ = 0;

  mutable absl::Mutex mutex_;
  LearnerStats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_RL_LEARNER_H_
