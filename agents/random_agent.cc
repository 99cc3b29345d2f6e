#include "agents/random_agent.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"

namespace troupe::agents {

// --- RandomAgent -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RandomAgent>> RandomAgent::Create(const config::ExperimentConfig& config,
                                                                 const ObservationSpec& spec, int action_size,
                                                                 replicator::Replicator* replicator) {
  const int64_t batch = config.learner().batch_size();
  const int k = replicator->num_replicas();
  if (batch < k || batch % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat("learner.batch_size ", batch, ": must be a multiple of the ", k,
                                                   " replicas (learner.engine.replicas)"));
  }
  std::unique_ptr<RandomAgent> agent(new RandomAgent());
  agent->spec_ = spec;
  agent->action_size_ = action_size;
  agent->replicas_ = replicator->local_replicas();
  agent->shard_ = batch / k;
  return agent;
}

void RandomAgent::StartInput(SampleFn sample, std::function<void()>) { sample_ = std::move(sample); }

void RandomAgent::StopInput() { sample_ = nullptr; }

absl::Status RandomAgent::Train(int64_t num_updates) {
  if (!sample_) return absl::FailedPreconditionError("RandomAgent::Train: no input (StartInput first)");
  for (int64_t u = 0; u < num_updates; ++u) {
    const auto start = std::chrono::steady_clock::now();
    for (const int replica : replicas_) {
      const absl::Status sampled = sample_(replica, shard_, &batch_);
      if (!sampled.ok()) return absl::Status(sampled.code(), absl::StrCat("replica ", replica, ": ", sampled.message()));
    }
    ++updates_;
    absl::MutexLock lock(&metrics_mu_);
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++waits_;
    metric_updates_ = updates_;
  }
  return absl::OkStatus();
}

AgentMetrics RandomAgent::metrics() const {
  absl::MutexLock lock(&metrics_mu_);
  AgentMetrics m{.updates = metric_updates_, .input_wait_s = waits_ > 0 ? wait_s_ / double(waits_) : 0.0};
  wait_s_ = 0;
  waits_ = 0;
  return m;
}

void RandomAgent::LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const {
  keys->clear();
  priorities->clear();
}

std::vector<nn::CheckpointTensor> RandomAgent::CheckpointState() const {
  const int64_t updates[] = {updates_};
  return {nn::Int64Tensor(kRandomAgentUpdates, updates)};
}

absl::Status RandomAgent::Save(const std::string& path) const { return nn::WriteCheckpoint(path, CheckpointState()); }

absl::Status RandomAgent::Load(const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> tensors, nn::ReadCheckpoint(path));
  ASSIGN_OR_RETURN(updates_, RandomAgentUpdates(path, tensors));
  absl::MutexLock lock(&metrics_mu_);
  metric_updates_ = updates_;
  return absl::OkStatus();
}

uint64_t RandomAgent::StateChecksum() const {
  return Fnv1a64(reinterpret_cast<const char*>(&updates_), sizeof(updates_));
}

}  // namespace troupe::agents
