// Scripted policies: what `troupe view --task TASK` shows without a trained
// agent, the same choices as `troupe run`'s policy.kind.
#ifndef TROUPE_VIZ_POLICIES_SCRIPTED_H_
#define TROUPE_VIZ_POLICIES_SCRIPTED_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/scripted_actor.h"
#include "viz/policies/interface.h"

namespace troupe::viz {

// The same choices as `troupe run`'s policy.kind (actors/scripted_actor.h).
using ScriptedKind = actors::ScriptedPolicyKind;

class ScriptedPolicy : public PolicySource {
 public:
  // kController uses the task's Controller where the task has one and
  // uniform random actions where it has none (Describe says which).
  ScriptedPolicy(ScriptedKind kind, uint64_t seed) : kind_(kind), rng_(seed) {}

  std::string Describe() const override;
  absl::Status Act(const envs::Environment& env, const Observation& observation, std::span<float> action) override;

 private:
  ScriptedKind kind_;
  std::mt19937_64 rng_;
  std::vector<double> command_;
  bool has_controller_ = true;  // false once the task's Controller returned false
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_POLICIES_SCRIPTED_H_
