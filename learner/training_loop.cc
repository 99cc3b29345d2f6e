// The RL learner's training loop (Run): every rank trains on rank 0's
// decision of each step; rank 0 publishes policies, records stats and
// metrics rows, starts evaluations, checkpoints, and finishes the run.
#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "learner/rank_agreement.h"
#include "learner/rl_learner.h"

namespace troupe::learner {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void RlLearner::RecordStats(bool write_row) {
  const auto now = Clock::now();
  const proto::InfoResponse info = replay_->Info();
  const int64_t frames = FramesFrom(info);
  {
    absl::MutexLock lock(&mutex_);
    stats_.frames = frames;
    stats_.updates = agent_->updates();
    stats_.replay_size = info.tables_size() ? info.tables(0).size() : 0;
    stats_.parameter_version = parameter_store_.version();
    const int64_t inserted = (frames - frames_before_) / (std::max(config_.env().action_repeat(), 1) * steps_per_item_);
    stats_.samples_per_insert = inserted > 0 ? double(samples_ - samples_before_) / double(inserted) : 0.0;
    if (write_row) {
      // Rates and losses over the interval since the last row.
      const double seconds = std::max(std::chrono::duration<double>(now - last_row_).count(), 1e-9);
      stats_.updates_per_second = (agent_->updates() - row_updates_) / seconds;
      stats_.frames_per_second = (frames - row_frames_) / seconds;
      stats_.checkpoint_seconds = checkpoint_seconds_ - row_checkpoint_seconds_;
      if (agent_->updates() > row_updates_) {
        // The agent's values by their column's name.
        const agents::AgentMetrics m = agent_->metrics();
        stats_.agent_metrics.clear();
        for (const std::string& name : agent_metric_names_) stats_.agent_metrics.push_back(m[name]);
        stats_.input_wait_ms = 1e3 * m.input_wait_s;
        stats_.device_idle_ms = 1e3 * m.device_idle_s;
        const int64_t uploaded = agent_->frame_stats().frames_uploaded;
        stats_.frames_uploaded_per_update =
            static_cast<double>(uploaded - row_frames_uploaded_) / static_cast<double>(agent_->updates() - row_updates_);
        row_frames_uploaded_ = uploaded;
      }
    }
  }
  if (!write_row) return;
  // A row that cannot be written (a full disk) is warned about by the log,
  // and the run goes on.
  const LearnerStats s = Stats();
  run_log_->AppendMetrics({.seconds = std::chrono::duration<double>(now - start_).count(),
                           .frames = s.frames,
                           .updates = s.updates,
                           .updates_per_s = s.updates_per_second,
                           .frames_per_s = s.frames_per_second,
                           .replay_size = s.replay_size,
                           .samples_per_insert = s.samples_per_insert,
                           .agent = s.agent_metrics,
                           .eval_return = s.last_eval_return,
                           .parameter_version = s.parameter_version,
                           .checkpoint_s = s.checkpoint_seconds,
                           .input_wait_ms = s.input_wait_ms,
                           .frames_uploaded_per_update = s.frames_uploaded_per_update,
                           .device_idle_ms = s.device_idle_ms});
  last_row_ = now;
  row_updates_ = agent_->updates();
  row_frames_ = frames;
  row_checkpoint_seconds_ = checkpoint_seconds_;
}

absl::Status RlLearner::Run(const std::atomic<bool>* stop, const std::function<void()>& stop_actors) {
  if (!resumed_) start_ = Clock::now();  // a resumed run's clock goes on (Restore)
  auto last_checkpoint = Clock::now();
  last_row_ = Clock::now();
  row_updates_ = agent_->updates();
  row_frames_ = is_chief() ? FramesNow() : 0;
  const int64_t publish_every = std::max(config_.learner().publish_every(), 1);
  // Training starts once the agent's table could give a batch (its rate
  // limiter's min_size_to_sample: learner.min_replay_size for transitions,
  // one for a queue).
  const int64_t min_size = std::max<int64_t>(min_sample_size_, config_.learner().batch_size());
  // What every rank does next; rank 0 decides (it has replay and counters).
  enum Step { kStop = 0, kWait = 1, kTrain = 2 };
  auto decide = [&]() -> int {
    if (!is_chief()) return kStop;  // replaced by rank 0's decision
    const proto::InfoResponse info = replay_->Info();
    if ((stop && stop->load()) || interrupted_ ||
        (config_.learner().max_updates() > 0 && agent_->updates() >= config_.learner().max_updates()) ||
        FramesFrom(info) >= config_.total_frames()) {
      return kStop;
    }
    return (info.tables_size() ? info.tables(0).size() : 0) < min_size ? kWait : kTrain;
  };
  // The agent's input, made one update ahead across Train calls (so the
  // first update after a publish does not wait for its batch); stopped,
  // cancelling a sample blocked on the rate limiter, before Run returns.
  agent_->StartInput(
      [this](int replica_id, int64_t, replay::SampledBatch* out) -> absl::Status {
        const auto& local = replicator_->local_replicas();
        const size_t index = std::find(local.begin(), local.end(), replica_id) - local.begin();
        return samplers_[index]->Next(out);
      },
      [this] {
        for (auto& sampler : samplers_) sampler->Cancel();
      });
  absl::Cleanup stop_input = [this] { agent_->StopInput(); };

  absl::Status status;
  for (;;) {
    absl::StatusOr<int> step = AgreeOnStep(decide());
    if (!step.ok()) {
      status = step.status();
      break;
    }
    if (*step == kStop) break;
    if (*step == kWait) {
      // Actors are filling replay.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      status = agent_->Train(publish_every);
      if (!status.ok()) break;
      samples_ += publish_every * config_.learner().batch_size();
      if (is_chief()) {
        // A new policy version for the actors.
        agent_->PolicyParameters(&policy_parameters_);
        parameter_store_.Publish(agent_->updates() + 1, "policy", policy_parameters_);
      }
      if (config_.learner().prioritized()) {
        // Each rank sends the priorities of its own replicas' samples.
        proto::MutatePrioritiesRequest request;
        request.set_table(table_);
        std::vector<uint64_t> keys;
        std::vector<double> priorities;
        agent_->LastPriorities(&keys, &priorities);
        for (size_t i = 0; i < keys.size(); ++i) {
          request.add_keys(keys[i]);
          request.add_priorities(priorities[i]);
        }
        // A lost update leaves those items at their old priorities: not worth stopping for.
        (void)replay_client_->MutatePriorities(request);
      }
    }
    // A checkpoint is rank 0's to write, when due; where part of the state
    // lives on other ranks (optimizer state split over MPI ranks), every
    // rank agrees on when and gathers it first.
    const auto checkpoint_every = std::chrono::seconds(config_.learner().checkpoint_every_s());
    bool checkpoint_due = is_chief() && Clock::now() - last_checkpoint >= checkpoint_every;
    if (agent_->state_split_across_processes()) {
      absl::StatusOr<int> agreed = AgreeOnStep(checkpoint_due ? 1 : 0);
      if (!agreed.ok()) {
        status = agreed.status();
        break;
      }
      checkpoint_due = *agreed == 1;
      if (checkpoint_due) {
        status = agent_->PrepareCheckpoint();
        if (!status.ok()) break;
      }
    }
    if (!is_chief()) {
      absl::MutexLock lock(&mutex_);
      stats_.updates = agent_->updates();
      continue;
    }
    // Stats every pass; rates, losses and a metrics row every 2 s, or every
    // 500 updates when training is fast.
    const auto now = Clock::now();
    RecordStats(now - last_row_ >= std::chrono::seconds(2) || agent_->updates() - row_updates_ >= 500);
    MaybeEvaluate();
    if (checkpoint_due) {
      CheckpointOrWarn();  // a failed checkpoint (a full disk) is said, and training goes on
      last_checkpoint = now;
    }
  }
  std::move(stop_input).Invoke();  // training ended: no sampling during Finish
  // With 2 ranks, a replica stalled inside a collective can only be the other one.
  if (mpi_ && num_ranks_ == 2 && absl::IsDeadlineExceeded(status) &&
      absl::StrContains(status.message(), "another replica stalled")) {
    status = absl::DeadlineExceededError(absl::StrCat(status.message(), " (rank ", 1 - rank_, ", the other of 2)"));
  }
  // A stop request closes replay, which ends a blocked Train with Cancelled.
  if (!status.ok() && !(stop && stop->load())) return status;
  // Every rank ends with the same state (only after a clean, agreed stop:
  // after an error the ranks are no longer in step).
  if (status.ok() && mpi_ && num_ranks_ > 1) {
    // (The final checkpoint's whole state, gathered from every rank first
    // where it is split across them.)
    RETURN_IF_ERROR(agent_->PrepareCheckpoint());
    RETURN_IF_ERROR(CheckReplicasAgree(*replicator_, [&](int) { return agent_->StateChecksum(); }, agent_->updates()));
  }
  if (!is_chief()) return absl::OkStatus();
  if (stop_actors) {
    // The actors stop first, their last inserts let in and acknowledged
    // (rather than blocked, then cut off by replay closing), so that the
    // last row and checkpoint count all they wrote.
    replay_->StopLimitingInserts();
    stop_actors();
  }
  return Finish(stop);
}

absl::Status RlLearner::Finish(const std::atomic<bool>* stop) {
  // Videos still being encoded are written (the last evaluation's is the
  // one most worth watching).
  evaluator_->Wait();  // let a running evaluation finish
  evaluator_->FlushVideos();
  // A run that reached its end has its final policy evaluated there, unless
  // the last evaluation already was (a stop request ends without one).
  if (!(stop && stop->load()) && Stats().last_eval_frames < std::min(FramesNow(), config_.total_frames())) {
    MaybeEvaluate(/*force=*/true);
    evaluator_->Wait();
    evaluator_->FlushVideos();
  }
  RecordStats(/*write_row=*/true);
  if (!agent_->state_gathered()) {
    // Split across MPI ranks and stopped without an update they agreed on:
    // the others' parts cannot be had.
    std::fprintf(stderr,
                 "learner: no final checkpoint: the training state is split over the MPI ranks, which stopped "
                 "without agreeing on a last update; the last checkpoint, %s, stands (`--resume` goes on from it)\n",
                 LastGenerationText().c_str());
    return absl::OkStatus();
  }
  // The final checkpoint: one that fails ends the run with an error saying
  // what is kept.
  if (const absl::Status final_status = Checkpoint(); !final_status.ok()) {
    return absl::Status(final_status.code(),
                        absl::StrCat("final checkpoint failed: ", final_status.message(), "; the last good checkpoint is ",
                                     LastGenerationText(), " (`troupe run --resume ", layout_.dir(),
                                     "` goes on from it)"));
  }
  return absl::OkStatus();
}

void RlLearner::MaybeEvaluate(bool force) {
  evaluator_->MaybeStart(FramesNow(), agent_->updates(), policy_parameters_, force);
}

}  // namespace troupe::learner
