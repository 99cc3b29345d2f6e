// A trained policy of the run's agent (agents/policy.h) loaded from the
// run's agent checkpoint, acting with exploration off (its deterministic
// actions, as the evaluator uses them). The checkpoint is reloaded at the start of an episode when the
// learner has written a newer one, so watching a run that is still going
// shows its latest policy.
//
// Loading goes through Policy::LoadAgentCheckpoint, so the checkpoint
// format and the policy's parameter layout have a single owner: agents/.
//
// Threading: like every PolicySource, used on the viewer's physics thread
// only; no locking.
#ifndef TROUPE_VIZ_POLICIES_CHECKPOINT_H_
#define TROUPE_VIZ_POLICIES_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "proto/config.pb.h"
#include "viz/policies/interface.h"

namespace troupe::viz {

// Checks that a checkpoint written by the run whose config is `trained`
// fits the agent `config` describes: same task, observation kind, frame
// stack and render size (pixels), action repeat, and the agent and its
// network sizes (agents::ArchitectureDifferences). InvalidArgument naming every field that
// differs with both values ("env.task: checkpoint 'walker.walk', run
// 'cartpole.swingup'").
absl::Status CheckCheckpointConfig(const config::ExperimentConfig& config, const config::ExperimentConfig& trained,
                                   const std::string& checkpoint_path);

class CheckpointPolicy : public PolicySource {
 public:
  // Loads `checkpoint_path` (an agent.ckpt) for the agent of `config` (a
  // run's config.textproto, mode RL). When the checkpoint sits in another
  // run directory (DIR/checkpoints/agent.ckpt with DIR/config.textproto),
  // that run's config is compared first (CheckCheckpointConfig). Errors:
  // InvalidArgument for a config that is not an RL run, or a checkpoint of
  // another task or architecture (naming what differs: config fields, or
  // the first parameter whose shape differs); NotFound / DataLoss from the
  // file itself, each naming the path.
  static absl::StatusOr<std::unique_ptr<CheckpointPolicy>> Load(const config::ExperimentConfig& config,
                                                                const std::string& checkpoint_path);

  // "<AGENT> checkpoint agent.ckpt": the agent's name and the file.
  std::string Describe() const override;
  // "version 12345 (updates), 140000 frames, saved 2m ago" (frames when
  // the learner's counters.txt is beside the checkpoint).
  std::string Version() const override;
  // Reloads the checkpoint if the file changed since it was loaded; a failed
  // reload keeps the loaded policy.
  void BeginEpisode() override;
  absl::Status Act(const envs::Environment& env, const Observation& observation, std::span<float> action) override;

  // The learner's update count stored in the loaded checkpoint.
  int64_t updates() const { return updates_; }
  // Frames from counters.txt beside the checkpoint, -1 when there is none.
  int64_t frames() const { return frames_; }

 private:
  CheckpointPolicy(config::ExperimentConfig config, std::string path) : config_(std::move(config)), path_(std::move(path)) {}
  // (Re)reads the checkpoint into policy_.
  absl::Status Reload();

  config::ExperimentConfig config_;  // the viewed run's
  std::string path_;
  agents::ObservationSpec spec_;
  std::unique_ptr<agents::Policy> policy_;
  std::vector<uint8_t> stacked_;  // scratch: [k, H, W, 3] from the env's [H, W, 3k]
  int64_t updates_ = 0;
  int64_t frames_ = -1;
  std::filesystem::file_time_type modified_{};
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_POLICIES_CHECKPOINT_H_
