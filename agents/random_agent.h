// RANDOM: the uniform random policy, the baseline a task's returns are read
// against (what an agent scores before it learns anything). Actors and the
// evaluator act uniformly in [-1, 1]; the learner samples replay as a
// learning agent would (so the rate limiter, priorities aside, paces the
// run the same way) and learns nothing; its policy is
// agents/random_policy.h. Written against agents/policy.h and agents/agent.h
// only, it is also the proof that no part of the platform
// needs D4PG: `troupe run` trains it with actors, replay, checkpoints, the
// evaluator and the viewer (tests/rl_end_to_end_test.cc).
//
// Threads: as Agent's (agents/agent.h).
#ifndef TROUPE_AGENTS_RANDOM_AGENT_H_
#define TROUPE_AGENTS_RANDOM_AGENT_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agents/agent.h"
#include "agents/random_policy.h"
#include "engine/replicator/replicator.h"
#include "proto/config.pb.h"

namespace troupe::agents {

class RandomAgent final : public Agent {
 public:
  // InvalidArgument for a batch the replicas cannot share.
  static absl::StatusOr<std::unique_ptr<RandomAgent>> Create(const config::ExperimentConfig& config,
                                                             const ObservationSpec& spec, int action_size,
                                                             replicator::Replicator* replicator);

  void StartInput(SampleFn sample, std::function<void()> cancel = nullptr) override;
  void StopInput() override;
  // Each update samples every local replica's shard of a batch (on the
  // calling thread), and counts.
  absl::Status Train(int64_t num_updates) override;
  int64_t updates() const override { return updates_; }
  void PolicyParameters(std::vector<float>* out) const override { out->clear(); }
  int64_t num_policy_parameters() const override { return 0; }
  int64_t gradient_floats() const override { return 0; }
  int64_t optimizer_state_bytes() const override { return 0; }
  int64_t parameter_state_bytes() const override { return 0; }
  // No values of its own: only the updates and the input's wait.
  AgentMetrics metrics() const override;
  std::vector<std::string> metric_names() const override { return {}; }
  bool frame_references() const override { return false; }
  DeviceFrameStats frame_stats() const override { return {}; }
  void LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const override;
  absl::Status Save(const std::string& path) const override;
  absl::Status Load(const std::string& path) override;
  std::vector<nn::CheckpointTensor> CheckpointState() const override;
  uint64_t StateChecksum() const override;
  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  RandomAgent() = default;

  ObservationSpec spec_;
  int action_size_ = 0;
  std::vector<int> replicas_;  // this process's
  int64_t shard_ = 0;
  SampleFn sample_;
  replay::SampledBatch batch_;
  int64_t updates_ = 0;
  mutable absl::Mutex metrics_mu_;
  mutable double wait_s_ ABSL_GUARDED_BY(metrics_mu_) = 0;  // since the last metrics()
  mutable int64_t waits_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  int64_t metric_updates_ ABSL_GUARDED_BY(metrics_mu_) = 0;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_RANDOM_AGENT_H_
