#include "learner/rl_learner.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "common/generations.h"
#include "common/grpc_security.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "envs/env.h"
#include "learner/rank_agreement.h"
#include "replay/client.h"
#include "replay/grpc_client.h"

namespace troupe::learner {

absl::Status ValidateLearnerConfig(const config::LearnerConfig& learner) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat("learner.", parts...)); };
  RETURN_IF_ERROR(engine::ValidateEngineConfig(learner.engine(), "learner", learner.batch_size()));
  if (learner.publish_every() < 1) return bad("publish_every ", learner.publish_every(), ": must be >= 1");
  if (learner.updates_per_execution() < 1 || learner.updates_per_execution() > agents::kMaxUpdatesPerExecution) {
    return bad("updates_per_execution ", learner.updates_per_execution(), ": must be in [1, ",
               agents::kMaxUpdatesPerExecution, "]");
  }
  if (learner.checkpoint_every_s() < 1) {
    return bad("checkpoint_every_s ", learner.checkpoint_every_s(), ": must be >= 1");
  }
  if (learner.max_updates() < 0) return bad("max_updates ", learner.max_updates(), ": must be >= 0 (0 = no limit)");
  if (learner.batch_size() > kMaxLearnerBatchSize) {
    return bad("batch_size ", learner.batch_size(), ": must be in [1, ", kMaxLearnerBatchSize, "]");
  }
  if (learner.replay_size() < 1 || learner.replay_size() > replay::kMaxTableSize) {
    return bad("replay_size ", learner.replay_size(), ": must be in [1, ", replay::kMaxTableSize, "]");
  }
  RETURN_IF_ERROR(CheckFitsInMemory(absl::StrCat("learner.replay_size ", learner.replay_size()),
                                    static_cast<double>(learner.replay_size()) * replay::kTableBytesPerSlot));
  if (learner.min_replay_size() < 1 || learner.min_replay_size() > learner.replay_size()) {
    return bad("min_replay_size ", learner.min_replay_size(), ": must be in [1, learner.replay_size ",
               learner.replay_size(), "]");
  }
  // !(>= 0) also refuses NaN.
  if (!(learner.samples_per_insert() >= 0) || std::isinf(learner.samples_per_insert())) {
    return bad("samples_per_insert ", learner.samples_per_insert(), ": must be finite and >= 0 (0 = no ratio)");
  }
  if (learner.keep_checkpoints() < 1 || learner.keep_checkpoints() > kMaxKeptGenerations) {
    return bad("keep_checkpoints ", learner.keep_checkpoints(), ": must be in [1, ", kMaxKeptGenerations,
               "] (checkpoints kept, the newest first)");
  }
  RETURN_IF_ERROR(ValidateHostPort(learner.listen(), "learner.listen"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RlLearner>> RlLearner::Create(const config::ExperimentConfig& config,
                                                             const std::string& run_dir, bool resume,
                                                             const RlLearnerOptions& options) {
  std::unique_ptr<RlLearner> l(new RlLearner());
  l->config_ = config;
  l->layout_ = RunLayout(run_dir);
  RETURN_IF_ERROR(ValidateLearnerConfig(config.learner()));
  ASSIGN_OR_RETURN(const envs::EnvSpec env_spec, envs::DescribeEnv(config.env()));
  l->spec_ = agents::ObservationSpecOf(env_spec);
  l->action_size_ = env_spec.action_size;
  RETURN_IF_ERROR(agents::ValidateAgent(config, l->spec_, l->action_size_));
  RETURN_IF_ERROR(agents::ValidateDeviceFrames(config, l->spec_));
  // TLS and the token of the port and of other ranks' connections to rank 0.
  ASSIGN_OR_RETURN(l->credentials_, LoadGrpcCredentials(config.security()));

  // The Replicator first: under MPI it says which rank this process is.
  const config::EngineConfig& engine = config.learner().engine();
  l->mpi_ = !engine::InProcessReplicas(engine);
  ASSIGN_OR_RETURN(l->replicator_, engine::MakeReplicator(engine, options.collective_timeout));
  if (l->mpi_) {
    l->rank_ = l->replicator_->local_replicas().front();
    l->num_ranks_ = l->replicator_->num_replicas();
    RETURN_IF_ERROR(CheckRanksMatchReplicas(engine, l->num_ranks_));
  }

  // Replay, embedded: the agent's table unless the config lists tables.
  config::ReplayConfig replay_config = config.replay();
  const config::ReplayTableConfig agent_table = agents::AgentReplayTable(config, l->spec_, l->action_size_);
  l->table_ = agent_table.name();
  // Agent steps per item: a trajectory's length, or one per transition.
  const agents::ReplayItem item = agents::ActorReplayItem(config);
  l->steps_per_item_ = item.kind == agents::ReplayItem::Kind::kTrajectories ? item.unroll_length : 1;
  if (replay_config.tables_size() == 0) *replay_config.add_tables() = agent_table;
  for (const config::ReplayTableConfig& table : replay_config.tables()) {
    if (table.name() == l->table_) l->min_sample_size_ = table.rate_limiter().min_size_to_sample();
  }
  absl::Status chief_status;
  if (l->is_chief()) chief_status = l->StartChief(replay_config);
  if (l->mpi_) {
    // Every rank learns rank 0's address (or why it could not start); the
    // others sample its replay over gRPC.
    ASSIGN_OR_RETURN(l->address_, ShareChiefAddress(*l->replicator_, l->is_chief(), chief_status, l->address_));
    if (!l->is_chief()) {
      l->replay_client_ = replay::NewGrpcClient(
          l->address_, {.max_message_bytes = replay_config.max_message_bytes(), .credentials = l->credentials_});
    }
  } else {
    RETURN_IF_ERROR(chief_status);
  }

  // The agent on the Replicator, one sampler per local replica. Rank 0
  // samples its embedded replay; other ranks sample it over gRPC. (Rather
  // than rank 0 sampling the whole global batch and scattering shards: the
  // Replicator's collectives carry floats of equal size, not pixel batches,
  // rank 0 would decode every rank's frames on its own cores, and every
  // replica's input would wait on one thread. Over gRPC each rank's sample
  // stream decodes its own frames, and rank 0's rate limiter still counts
  // every sample, as it does for in-process replicas.)
  ASSIGN_OR_RETURN(l->agent_, agents::CreateAgent(config, l->spec_, l->action_size_, l->replicator_.get()));
  l->agent_metric_names_ = l->agent_->metric_names();
  {
    absl::MutexLock lock(&l->mutex_);
    l->stats_.agent_metrics.assign(l->agent_metric_names_.size(), 0.0);
  }
  // The device frame table's size, and what bounded it (every rank's is the
  // same), for an agent that keeps one (one that samples frame references).
  if (const agents::DeviceFrameSizing frames =
          agents::DeviceFrameSlots(config, l->spec_, l->replicator_->num_replicas());
      frames.slots > 0 && l->agent_->frame_references() && l->is_chief()) {
    std::fprintf(stderr, "learner: %s\n", frames.description.c_str());
  }
  if (engine.shard_state() == config::EngineConfig::OPTIMIZER && l->is_chief()) {
    std::fprintf(stderr, "learner: optimizer state split over %d replicas (engine.shard_state OPTIMIZER): %.2f MB each\n",
                 l->replicator_->num_replicas(), 1e-6 * l->agent_->optimizer_state_bytes());
  }
  if (l->replicator_->model_parallel() > 1 && l->is_chief()) {
    std::fprintf(stderr,
                 "learner: a model split over the %d replicas of each of %d copies (engine.model_parallel): %.2f MB "
                 "of networks on each\n",
                 l->replicator_->model_parallel(), l->replicator_->num_replicas() / l->replicator_->model_parallel(),
                 1e-6 * l->agent_->parameter_state_bytes());
  }
  if (engine.shard_state() == config::EngineConfig::PARAMETERS && l->is_chief()) {
    std::fprintf(stderr,
                 "learner: networks and optimizer state split over %d replicas (engine.shard_state PARAMETERS): "
                 "%.2f MB of networks and %.2f MB of optimizer state each between updates\n",
                 l->replicator_->num_replicas(), 1e-6 * l->agent_->parameter_state_bytes(),
                 1e-6 * l->agent_->optimizer_state_bytes());
  }
  // Each model copy's rows (a replica's, unless a model is split over
  // several: engine.model_parallel; only one replica of a copy samples).
  const int shard =
      config.learner().batch_size() / (l->replicator_->num_replicas() / l->replicator_->model_parallel());
  for (size_t i = 0; i < l->replicator_->local_replicas().size(); ++i) {
    replay::SamplerOptions sampler_options{.table = l->table_, .batch_size = shard};
    // A remote sampler gives up when rank 0 stops answering (as collectives do).
    if (!l->is_chief()) sampler_options.timeout = absl::FromChrono(options.collective_timeout);
    // Frame references for the device frame table: from the embedded replay,
    // or over gRPC (other ranks), each frame once per stream.
    sampler_options.frame_references = l->agent_->frame_references();
    ASSIGN_OR_RETURN(auto sampler, l->replay_client_->NewSampler(sampler_options));
    l->samplers_.push_back(std::move(sampler));
  }

  l->resumed_ = resume;
  if (!l->is_chief()) {
    if (resume) RETURN_IF_ERROR(l->RestoreAgent());
    return l;
  }
  l->run_log_ = std::make_unique<LearnerRunLog>(config, run_dir, l->agent_metric_names_);
  if (resume) RETURN_IF_ERROR(l->Restore());
  RETURN_IF_ERROR(l->StartEvaluator());
  // Version 1 (or the restored one) before any actor asks.
  l->agent_->PolicyParameters(&l->policy_parameters_);
  l->parameter_store_.Publish(l->agent_->updates() + 1, "policy", l->policy_parameters_);
  return l;
}

absl::Status RlLearner::StartChief(const config::ReplayConfig& replay_config) {
  // (The checkpoint folder is made by the first checkpoint: a start that
  // fails leaves nothing in run_dir.)
  ASSIGN_OR_RETURN(replay_, replay::Replay::Create(replay_config));
  replay_client_ = replay::NewLocalClient(replay_.get());

  // One port for replay inserts and parameter streams.
  replay_service_ = std::make_unique<replay::ReplayService>(replay_.get(), replay_config.worker_threads());
  parameter_service_ = std::make_unique<ParameterService>(&parameter_store_);
  episode_publisher_ = std::make_unique<actors::EpisodePublisher>(config_.env().task(), config_.env().action_repeat());
  episode_service_ = std::make_unique<actors::EpisodeStreamService>(episode_publisher_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string& listen = config_.learner().listen();
  RETURN_IF_ERROR(AddSecureListeningPort(builder, credentials_, listen, "learner.listen", &port));
  builder.SetMaxReceiveMessageSize(int(replay_config.max_message_bytes()));
  builder.SetMaxSendMessageSize(int(replay_config.max_message_bytes()));
  builder.RegisterService(replay_service_.get());
  builder.RegisterService(parameter_service_.get());
  builder.RegisterService(episode_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("learner.listen: cannot listen on ", listen, " (port in use?)"));
  }
  address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return absl::OkStatus();
}

absl::Status RlLearner::StartEvaluator() {
  // Videos: a missing encoder or a bad size fails here, before training.
  // Each written video becomes a frame strip in the event file.
  std::function<void(const std::string&)> on_video_written;
  if (config_.tensorboard()) {
    on_video_written = [log = run_log_.get()](const std::string& path) { log->AddFrameStrip(path); };
  }
  ASSIGN_OR_RETURN(
      evaluator_,
      EvaluatorThread::Create(config_, spec_, action_size_, layout_, episode_publisher_.get(),
                              std::move(on_video_written),
                              [this](int64_t frames, int64_t updates, const actors::Evaluation& evaluation) {
                                {
                                  absl::MutexLock lock(&mutex_);
                                  stats_.last_eval_return = evaluation.mean_return;
                                  stats_.last_eval_frames = frames;
                                }
                                run_log_->AppendEvaluation({.frames = frames,
                                                            .updates = updates,
                                                            .eval_return = evaluation.mean_return,
                                                            .actions_at_bound = evaluation.actions_at_bound});
                              }));
  // The next evaluation is due where it was (a resumed run's last is in its
  // eval.csv, Restore).
  evaluator_->ScheduleAfter(Stats().last_eval_frames);
  // TensorBoard, last: a start that failed leaves no event file (troupe run
  // then removes the run directory). A resumed run's file starts past its
  // checkpoint (Restore dropped the events after it from the files before).
  run_log_->OpenEventFile(resumed_ ? frames_before_ + 1 : 0);
  return absl::OkStatus();
}

absl::StatusOr<int> RlLearner::AgreeOnStep(int step) {
  if (!mpi_ || num_ranks_ == 1) return step;
  return learner::AgreeOnStep(*replicator_, step);
}

RlLearner::~RlLearner() {
  Interrupt();
  evaluator_.reset();  // joins a running evaluation
  parameter_store_.Close();
  if (episode_publisher_) episode_publisher_->Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

void RlLearner::Interrupt() {
  interrupted_ = true;
  if (replay_) replay_->Close();
}

void RlLearner::StopLimitingInserts() {
  if (replay_) replay_->StopLimitingInserts();
}

LearnerStats RlLearner::Stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

int64_t RlLearner::TransitionsInserted() const {
  const proto::InfoResponse info = replay_->Info();
  return (info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0) - inserts_before_;
}

int64_t RlLearner::FramesFrom(const proto::InfoResponse& info) const {
  const int64_t inserts = info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0;
  return frames_before_ + (inserts - inserts_before_) * steps_per_item_ * std::max(config_.env().action_repeat(), 1);
}

}  // namespace troupe::learner
