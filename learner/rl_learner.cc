#include "learner/rl_learner.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/actor.h"
#include "actors/evaluator.h"
#include "common/files.h"
#include "common/image.h"
#include "common/plot.h"
#include "common/status_macros.h"
#include "replay/client.h"

namespace troupe::learner {
namespace {

using Clock = std::chrono::steady_clock;

std::string CheckpointDir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

// The learner's counters beside the agent checkpoint: "key value" lines.
absl::Status WriteCounters(const std::string& path, int64_t frames, int64_t samples) {
  return WriteFileAtomically(path, absl::StrCat("frames ", frames, "\nsamples ", samples, "\n"));
}

absl::Status ReadCounters(const std::string& path, int64_t* frames, int64_t* samples) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no learner counters at ", path));
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "frames") *frames = value;
    if (key == "samples") *samples = value;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RlLearner>> RlLearner::Create(const config::ExperimentConfig& config,
                                                             const std::string& run_dir, bool resume) {
  std::unique_ptr<RlLearner> l(new RlLearner());
  l->config_ = config;
  l->run_dir_ = run_dir;
  ASSIGN_OR_RETURN(l->spec_, actors::AgentObservationSpec(config, &l->action_size_));
  RETURN_IF_ERROR(agents::ValidateD4pg(config.d4pg(), l->spec_, l->action_size_));
  std::filesystem::create_directories(CheckpointDir(run_dir));

  // Replay, embedded: the D4PG transitions table unless the config lists tables.
  config::ReplayConfig replay_config = config.replay();
  if (replay_config.tables_size() == 0) {
    *replay_config.add_tables() = agents::D4pgTransitionTable(l->spec_, l->action_size_, config);
  }
  ASSIGN_OR_RETURN(l->replay_, replay::Replay::Create(replay_config));

  // One port for replay inserts and parameter streams.
  l->replay_service_ = std::make_unique<replay::ReplayService>(l->replay_.get(), replay_config.worker_threads());
  l->parameter_service_ = std::make_unique<ParameterService>(&l->parameter_store_);
  l->episode_publisher_ = std::make_unique<actors::EpisodePublisher>(config.env().task(), config.env().action_repeat());
  l->episode_service_ = std::make_unique<actors::EpisodeStreamService>(l->episode_publisher_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.learner().listen(), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(int(replay_config.max_message_bytes()));
  builder.SetMaxSendMessageSize(int(replay_config.max_message_bytes()));
  builder.RegisterService(l->replay_service_.get());
  builder.RegisterService(l->parameter_service_.get());
  builder.RegisterService(l->episode_service_.get());
  l->server_ = builder.BuildAndStart();
  if (!l->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("learner.listen: cannot listen on ", config.learner().listen(), " (port in use?)"));
  }
  l->address_ = absl::StrCat(config.learner().listen().substr(0, config.learner().listen().rfind(':')), ":", port);

  // The agent on the Replicator, one sampler per local replica.
  replicator::ReplicatorOptions options;
  if (config.learner().backend() == "mpi") {
    // Every rank would need the samples of rank 0's replay; until that is
    // wired, say so rather than train K-1 replicas on nothing.
    return absl::UnimplementedError(
        "learner.backend: \"mpi\" is not supported by the RL learner yet; use learner.replicas with "
        "\"in_process\" (the Replicator's MPI backend is used by the GAN mode)");
  } else if (config.learner().backend() != "in_process") {
    return absl::InvalidArgumentError(absl::StrCat("learner.backend: '", config.learner().backend(),
                                                   "' is neither \"in_process\" nor \"mpi\""));
  }
  options.num_replicas = config.learner().replicas();
  ASSIGN_OR_RETURN(l->replicator_, replicator::Replicator::Create(options));
  ASSIGN_OR_RETURN(l->agent_, agents::D4pgAgent::Create(config, l->spec_, l->action_size_, l->replicator_.get()));
  l->local_client_ = replay::NewLocalClient(l->replay_.get());
  const int shard = config.learner().batch_size() / l->replicator_->num_replicas();
  for (size_t i = 0; i < l->replicator_->local_replicas().size(); ++i) {
    ASSIGN_OR_RETURN(auto sampler, l->local_client_->NewSampler({.table = "transitions", .batch_size = shard}));
    l->samplers_.push_back(std::move(sampler));
  }
  ASSIGN_OR_RETURN(l->eval_policy_, agents::D4pgPolicy::Create(config.d4pg(), l->spec_, l->action_size_));

  if (resume) RETURN_IF_ERROR(l->Restore());
  l->next_eval_frames_ = l->frames_before_ + config.evaluator().every_frames();
  // Version 1 (or the restored one) before any actor asks.
  l->agent_->PolicyParameters(&l->policy_parameters_);
  l->parameter_store_.Publish(l->agent_->updates() + 1, "policy", l->policy_parameters_);
  return l;
}

RlLearner::~RlLearner() {
  Interrupt();
  evaluator_ = std::jthread();  // joins
  parameter_store_.Close();
  if (episode_publisher_) episode_publisher_->Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

void RlLearner::Interrupt() {
  if (replay_) replay_->Close();
}

int64_t RlLearner::FramesNow() const {
  const proto::InfoResponse info = replay_->Info();
  const int64_t inserts = info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0;
  return frames_before_ + (inserts - inserts_before_) * std::max(config_.env().action_repeat(), 1);
}

absl::Status RlLearner::Restore() {
  const std::string dir = CheckpointDir(run_dir_);
  RETURN_IF_ERROR(agent_->Load(dir + "/agent.ckpt"));
  RETURN_IF_ERROR(ReadCounters(dir + "/counters.txt", &frames_before_, &samples_));
  samples_before_ = samples_;
  if (std::filesystem::exists(dir + "/replay.ckpt")) {
    RETURN_IF_ERROR(replay_->Restore(dir + "/replay.ckpt").status());
    const proto::InfoResponse info = replay_->Info();
    inserts_before_ = info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0;
  }
  // Evaluations so far stay on the curve.
  std::ifstream eval(run_dir_ + "/eval.csv");
  std::string line;
  std::getline(eval, line);  // header
  while (std::getline(eval, line)) {
    std::stringstream row(line);
    std::string frames, updates, value;
    if (std::getline(row, frames, ',') && std::getline(row, updates, ',') && std::getline(row, value, ',')) {
      eval_frames_.push_back(std::stod(frames));
      eval_returns_.push_back(std::stod(value));
      stats_.last_eval_frames = std::stoll(frames);
      stats_.last_eval_return = std::stod(value);
    }
  }
  return absl::OkStatus();
}

absl::Status RlLearner::Checkpoint() {
  const std::string dir = CheckpointDir(run_dir_);
  // Replay first: the agent checkpoint and counters are the commit point.
  if (config_.learner().checkpoint_replay()) RETURN_IF_ERROR(replay_->Checkpoint(dir + "/replay.ckpt").status());
  RETURN_IF_ERROR(agent_->Save(dir + "/agent.ckpt"));
  return WriteCounters(dir + "/counters.txt", FramesNow(), samples_);
}

void RlLearner::MaybeEvaluate() {
  const int64_t frames = FramesNow();
  if (config_.evaluator().every_frames() <= 0 || frames < next_eval_frames_ || evaluating_.load()) return;
  next_eval_frames_ = frames + config_.evaluator().every_frames();
  // Evaluate a snapshot of the policy on the evaluator's thread.
  evaluator_ = std::jthread();  // the previous one has finished (evaluating_ is false)
  evaluating_ = true;
  std::vector<float> snapshot = policy_parameters_;
  const int64_t updates = agent_->updates();
  evaluator_ = std::jthread([this, snapshot = std::move(snapshot), frames, updates] {
    double value = -1;
    absl::Status status = eval_policy_->SetParameters(snapshot);
    if (status.ok()) {
      auto result = actors::Evaluate(config_, *eval_policy_, config_.evaluator().episodes(),
                                     config_.env().seed() + 7777 + uint64_t(updates), episode_publisher_.get(),
                                     updates);
      if (result.ok()) value = *result;
      status = result.status();
    }
    if (!status.ok()) std::fprintf(stderr, "evaluator: %s\n", status.ToString().c_str());
    if (status.ok()) {
      std::lock_guard lock(mutex_);
      stats_.last_eval_return = value;
      stats_.last_eval_frames = frames;
      eval_frames_.push_back(double(frames));
      eval_returns_.push_back(value);
      // The curve so far, as CSV and PNG.
      const bool header = !std::filesystem::exists(run_dir_ + "/eval.csv");
      std::ofstream csv(run_dir_ + "/eval.csv", std::ios::app);
      if (header) csv << "frames,updates,eval_return\n";
      csv << frames << ',' << updates << ',' << absl::StrFormat("%.3f", value) << '\n';
      PlotSeries curve{"eval return", eval_frames_, eval_returns_, {31, 119, 180}};
      (void)WritePng(run_dir_ + "/learning_curve.png",
                     PlotLines({curve}, PlotOptions{640, 400, config_.env().task() + " D4PG", "env frames",
                                                    "eval return"}));
    }
    evaluating_ = false;
  });
}

void RlLearner::WriteMetrics() {
  LearnerStats s = Stats();
  const bool header = !std::filesystem::exists(run_dir_ + "/metrics.csv");
  std::ofstream csv(run_dir_ + "/metrics.csv", std::ios::app);
  if (header) {
    csv << "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,critic_loss,actor_loss,"
           "q_mean,eval_return,parameter_version\n";
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  csv << absl::StrFormat("%.1f,%d,%d,%.2f,%.1f,%d,%.3f,%.5f,%.5f,%.4f,%.2f,%d\n", seconds, s.frames, s.updates,
                         s.updates_per_second, s.frames_per_second, s.replay_size, s.samples_per_insert,
                         s.critic_loss, s.actor_loss, s.q_mean, s.last_eval_return, s.parameter_version);
  std::ofstream jsonl(run_dir_ + "/metrics.jsonl", std::ios::app);
  jsonl << absl::StrFormat(
      "{\"seconds\": %.1f, \"frames\": %d, \"updates\": %d, \"updates_per_s\": %.2f, \"frames_per_s\": %.1f, "
      "\"replay_size\": %d, \"samples_per_insert\": %.3f, \"critic_loss\": %.5f, \"actor_loss\": %.5f, "
      "\"q_mean\": %.4f, \"eval_return\": %.2f, \"parameter_version\": %d}\n",
      seconds, s.frames, s.updates, s.updates_per_second, s.frames_per_second, s.replay_size, s.samples_per_insert,
      s.critic_loss, s.actor_loss, s.q_mean, s.last_eval_return, s.parameter_version);
}

LearnerStats RlLearner::Stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void RlLearner::RecordStats(bool write_row) {
  const auto now = Clock::now();
  const int64_t frames = FramesNow();
  const proto::InfoResponse info = replay_->Info();
  {
    std::lock_guard lock(mutex_);
    stats_.frames = frames;
    stats_.updates = agent_->updates();
    stats_.replay_size = info.tables_size() ? info.tables(0).size() : 0;
    stats_.parameter_version = parameter_store_.version();
    const int64_t inserted = (frames - frames_before_) / std::max(config_.env().action_repeat(), 1);
    stats_.samples_per_insert = inserted > 0 ? double(samples_ - samples_before_) / double(inserted) : 0.0;
    if (write_row) {
      // Rates and losses over the interval since the last row.
      const double seconds = std::max(std::chrono::duration<double>(now - last_row_).count(), 1e-9);
      stats_.updates_per_second = (agent_->updates() - row_updates_) / seconds;
      stats_.frames_per_second = (frames - row_frames_) / seconds;
      if (agent_->updates() > row_updates_) {
        const agents::D4pgMetrics m = agent_->metrics();
        stats_.critic_loss = m.critic_loss;
        stats_.actor_loss = m.actor_loss;
        stats_.q_mean = m.q_mean;
      }
    }
  }
  if (!write_row) return;
  WriteMetrics();
  last_row_ = now;
  row_updates_ = agent_->updates();
  row_frames_ = frames;
}

absl::Status RlLearner::Run(const std::atomic<bool>* stop) {
  start_ = Clock::now();
  auto last_checkpoint = Clock::now();
  last_row_ = Clock::now();
  row_updates_ = agent_->updates();
  row_frames_ = FramesNow();
  const int64_t publish_every = std::max(config_.learner().publish_every(), 1);
  const int64_t min_size = std::max<int64_t>(config_.learner().min_replay_size(), config_.learner().batch_size());
  auto done = [&] {
    return (stop && stop->load()) ||
           (config_.learner().max_updates() > 0 && agent_->updates() >= config_.learner().max_updates()) ||
           FramesNow() >= config_.total_frames();
  };
  auto sample = [&](int replica_id, int64_t shard, replay::SampledBatch* out) -> absl::Status {
    const auto& local = replicator_->local_replicas();
    const size_t index = std::find(local.begin(), local.end(), replica_id) - local.begin();
    return samplers_[index]->Next(out);
  };

  absl::Status status;
  while (!done()) {
    const proto::InfoResponse info = replay_->Info();
    const int64_t size = info.tables_size() ? info.tables(0).size() : 0;
    if (size < min_size) {
      // Actors are filling replay.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      status = agent_->Train(publish_every, sample);
      if (!status.ok()) break;
      samples_ += publish_every * config_.learner().batch_size();
      // A new policy version for the actors.
      agent_->PolicyParameters(&policy_parameters_);
      parameter_store_.Publish(agent_->updates() + 1, "policy", policy_parameters_);
      if (config_.learner().prioritized()) {
        proto::MutatePrioritiesRequest request;
        request.set_table("transitions");
        std::vector<uint64_t> keys;
        std::vector<double> priorities;
        agent_->LastPriorities(&keys, &priorities);
        for (size_t i = 0; i < keys.size(); ++i) {
          request.add_keys(keys[i]);
          request.add_priorities(priorities[i]);
        }
        (void)replay_->MutatePriorities(request);
      }
    }
    // Stats every pass; rates, losses and a metrics row every 2 s, or every
    // 500 updates when training is fast.
    const auto now = Clock::now();
    RecordStats(now - last_row_ >= std::chrono::seconds(2) || agent_->updates() - row_updates_ >= 500);
    MaybeEvaluate();
    if (now - last_checkpoint >= std::chrono::seconds(config_.learner().checkpoint_every_s())) {
      RETURN_IF_ERROR(Checkpoint());
      last_checkpoint = now;
    }
  }
  // A stop request closes replay, which ends a blocked Train with Cancelled.
  if (!status.ok() && !(stop && stop->load())) return status;
  evaluator_ = std::jthread();  // let a running evaluation finish
  RecordStats(/*write_row=*/true);
  return Checkpoint();
}

}  // namespace troupe::learner
