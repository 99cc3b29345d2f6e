// The evaluator: episodes with exploration off, whose mean return is the
// figure that counts.
#ifndef TROUPE_ACTORS_EVALUATOR_H_
#define TROUPE_ACTORS_EVALUATOR_H_

#include "absl/status/statusor.h"
#include "actors/episode_stream.h"
#include "learner/agents/d4pg.h"
#include "proto/config.pb.h"

namespace troupe::actors {

// Runs `episodes` full episodes of config's env (one env each, stepped
// together on one thread) with `policy`'s deterministic actions, seeded by
// `seed`. Returns the mean episode return. Errors: config and env errors.
// With a `publisher`, the first env's episode is published state by state
// (for `troupe view --live`), tagged with `parameter_version`.
absl::StatusOr<double> Evaluate(const config::ExperimentConfig& config, agents::D4pgPolicy& policy, int episodes,
                                uint64_t seed, EpisodePublisher* publisher = nullptr, int64_t parameter_version = 0);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_EVALUATOR_H_
