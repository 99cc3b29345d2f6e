// Where the viewer's actions come from. One interface, one file pair per
// implementation:
//   scripted.*    the task's hand-written controller, zero or random actions
//   checkpoint.*  a trained policy loaded from a run's checkpoint (issue 5)
// A policy runs on the viewer's physics thread only and is never shared
// between threads, so implementations need no locking.
#ifndef TROUPE_VIZ_POLICIES_INTERFACE_H_
#define TROUPE_VIZ_POLICIES_INTERFACE_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "envs/env.h"

namespace troupe::viz {

// What the agent observes at the current step: the env's state vector and,
// when the env renders pixels, its (frame-stacked) pixel observation.
struct Observation {
  std::span<const float> state;     // spec().state_size floats
  std::span<const uint8_t> pixels;  // spec().pixel_bytes() bytes; empty when pixels are off
};

class PolicySource {
 public:
  virtual ~PolicySource() = default;

  // One line for the HUD, e.g. "controller" or "checkpoint step 120000".
  virtual std::string Describe() const = 0;

  // Parameter version and checkpoint age for the HUD; empty where there are
  // none (scripted policies).
  virtual std::string Version() const { return ""; }

  // Called after each env Reset, before the episode's first Act.
  virtual void BeginEpisode() {}

  // Writes env.spec().action_size actions (inside the action spec) for the
  // current step into `action`. `env` is the env being viewed, read-only: a
  // scripted policy reads its physics state, a learned one `observation`.
  // Blocks only on its own computation. Errors end the viewer's episode loop
  // and are shown in the HUD.
  virtual absl::Status Act(const envs::Environment& env, const Observation& observation, std::span<float> action) = 0;
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_POLICIES_INTERFACE_H_
