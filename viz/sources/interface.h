// What the viewer's physics thread advances: a stream of episodes on one
// task's mjModel/mjData. One interface, one file pair per implementation:
//   policy_episodes.*  a local env stepped by a PolicySource (scripted now,
//                      a checkpoint's policy with issue 5)
//   live.*             the evaluator's current episode streamed
//                      over gRPC as states; applying one is setting
//                      qpos/qvel/act/time and calling mj_forward, so no
//                      pixels cross the wire
//
// Threading: every method is called on the physics thread only. The viewer
// reads model() and data() on its drawing thread while holding the
// Simulation's lock; a source therefore mutates data() only inside
// ApplyReset/ApplyStep, which the Simulation calls under that lock, and does
// its slow work (policy inference, network waits) in PrepareStep, outside it.
#ifndef TROUPE_VIZ_SOURCES_INTERFACE_H_
#define TROUPE_VIZ_SOURCES_INTERFACE_H_

#include <mujoco/mujoco.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/env.h"

namespace troupe::viz {

// The outcome of one Reset or Step, valid until the next call.
struct SourceStep {
  envs::StepType step_type = envs::StepType::kFirst;
  double reward = 0;
  std::span<const float> action;   // the action just applied (empty on kFirst)
  // The newest frame of the agent's pixel observation, RGB rows top-down;
  // empty when the source has none.
  std::span<const uint8_t> pixels;
  int pixel_width = 0;
  int pixel_height = 0;
  // ApplyStep only: nothing to count (a live source with no new state, or
  // one that applied the first state of an episode already begun). A kFirst
  // from ApplyStep that is not idle starts a new episode by itself (a live
  // stream that moved on).
  bool idle = false;
};

class EpisodeSource {
 public:
  virtual ~EpisodeSource() = default;

  virtual const mjModel* model() const = 0;
  virtual const mjData* data() const = 0;
  virtual const envs::EnvSpec& spec() const = 0;
  // Simulated seconds per agent step (control timestep x action repeat):
  // the physics thread paces steps by it.
  virtual double step_seconds() const = 0;
  // HUD lines: who acts ("controller (scripted)"), and the parameter
  // version / checkpoint age ("" where there is none).
  virtual std::string Describe() const = 0;
  virtual std::string Version() const = 0;

  // Starts a new episode. Under the lock.
  virtual absl::StatusOr<SourceStep> ApplyReset() = 0;
  // Decides the next step (runs the policy, waits for the next state).
  // Outside the lock; may read data() (only this thread writes it).
  virtual absl::Status PrepareStep() = 0;
  // Applies what PrepareStep decided. Under the lock.
  virtual absl::StatusOr<SourceStep> ApplyStep() = 0;
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_SOURCES_INTERFACE_H_
