// The trajectory, declared once: what actors of an on-policy agent (APPO)
// write into replay's queue and the learner samples, T = unroll_length
// consecutive steps of one env. Episodes may end inside one: a step's
// discount is 0 where its episode ended, and the observation after it is
// the next episode's first. At an episode cut by its time limit the actor
// adds discount * V(last observation) to that step's reward (the value
// bootstrap, as Sample Factory does), so the learner needs no terminal
// observation.
//
//   field           dtype and shape      what it holds
//   observation     float32 [T + 1, S]   x_0 .. x_T (x_T: the bootstrap's)
//                   | uint8 [H, W, 3] x (T + 1) k   or each x_t's stack of k frames, oldest first,
//                                        by reference: every frame stored once in the frame store
//   action          float32 [T, A]       the behaviour's sample (before the env's clip to [-1, 1])
//   reward          float32 [T]
//   discount        float32 [T]          gamma, 0 where the episode ended
//   log_prob        float32 [T]          log mu(a_t | x_t), the behaviour's
//   policy_version  int64 []             the behaviour's version (learner updates + 1 when published)
#ifndef TROUPE_AGENTS_TRAJECTORY_H_
#define TROUPE_AGENTS_TRAJECTORY_H_

#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "proto/config.pb.h"
#include "replay/item.h"

namespace troupe::agents {

inline constexpr char kTrajectoryTable[] = "trajectories";

// A trajectory's fields in signature order.
enum TrajectoryField : int {
  kTrajectoryObservation = 0,
  kTrajectoryAction,
  kTrajectoryReward,
  kTrajectoryDiscount,
  kTrajectoryLogProb,
  kTrajectoryVersion,
  kNumTrajectoryFields
};

// The fields for `steps` steps of observations `spec` and `action_size`
// actions, appended to `table`.
void AddTrajectoryFields(const ObservationSpec& spec, int action_size, int steps, config::ReplayTableConfig* table);

// Their signature. InvalidArgument for sizes below 1.
absl::StatusOr<replay::Signature> TrajectorySignature(const ObservationSpec& spec, int action_size, int steps);

// The queue the actors fill and the learner empties: FIFO (each trajectory
// sampled once), inserts held back once two batches wait (samples per
// insert 1), so the policy lag stays within about two updates.
config::ReplayTableConfig TrajectoryTable(const ObservationSpec& spec, int action_size,
                                          const config::ExperimentConfig& config);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_TRAJECTORY_H_
