// Episodes of a local env driven by a PolicySource (exploration off: the
// policy's action is applied as is).
#ifndef TROUPE_VIZ_SOURCES_POLICY_EPISODES_H_
#define TROUPE_VIZ_SOURCES_POLICY_EPISODES_H_

#include <memory>
#include <vector>

#include "viz/policies/interface.h"
#include "viz/sources/interface.h"

namespace troupe::viz {

class PolicyEpisodes : public EpisodeSource {
 public:
  // Makes the env `options` describe (pixels are what the inset shows and
  // what a learned policy reads). Errors: MakeEnv's (unknown task naming the
  // known ones, EGL/renderer errors).
  static absl::StatusOr<std::unique_ptr<PolicyEpisodes>> Create(const envs::EnvOptions& options,
                                                                std::unique_ptr<PolicySource> policy);

  const mjModel* model() const override { return env_->model(); }
  const mjData* data() const override { return env_->data(); }
  const envs::EnvSpec& spec() const override { return env_->spec(); }
  double step_seconds() const override { return step_seconds_; }
  std::string Describe() const override { return policy_->Describe(); }
  std::string Version() const override { return policy_->Version(); }

  absl::StatusOr<SourceStep> ApplyReset() override;
  absl::Status PrepareStep() override;
  absl::StatusOr<SourceStep> ApplyStep() override;

 private:
  PolicyEpisodes(std::unique_ptr<envs::Environment> env, std::unique_ptr<PolicySource> policy, double step_seconds);
  // The outcome of the last Reset/Step as a SourceStep.
  SourceStep Outcome(const envs::TimeStep& step, bool with_action);

  std::unique_ptr<envs::Environment> env_;
  std::unique_ptr<PolicySource> policy_;
  double step_seconds_;
  std::vector<float> state_;
  std::vector<uint8_t> pixels_;      // the env's (stacked) observation
  std::vector<uint8_t> last_frame_;  // its newest frame
  std::vector<float> action_;
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_SOURCES_POLICY_EPISODES_H_
