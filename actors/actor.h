// The actor process (`troupe actor --learner HOST:PORT`): a batched env
// pool, a copy of the agent's policy (agents/policy.h: inference and the
// agent's own exploration for this actor), and an n-step transition writer
// streaming to replay over gRPC. It follows the
// learner's Parameters stream and switches to a new version between env
// steps. When the learner or replay goes away (a partition, a restart) it
// resumes its insert stream with backoff (0.1 s doubling to 5 s): replay
// keeps the actor's writer session, the transitions it had not
// acknowledged are re-sent and those it had are skipped, so nothing is lost
// or inserted twice and episodes are never cut. Only a learner that
// restarted (no session to resume) loses what was in flight.
#ifndef TROUPE_ACTORS_ACTOR_H_
#define TROUPE_ACTORS_ACTOR_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "actors/transition_writer.h"
#include "agents/policy.h"
#include "proto/config.pb.h"

namespace troupe::actors {

struct ActorOptions {
  config::ExperimentConfig config;
  int index = 0;                // 0 .. config.actors().count() - 1
  std::string learner_address;  // serves Replay and Parameters
  // Stop after this many env frames (0 = until stopped).
  int64_t max_frames = 0;
  // How long to wait for the learner's first parameters before acting with
  // uniform random actions anyway (they are the first `random_frames` anyway).
  int connect_timeout_ms = 30000;
};

// The most actor processes `troupe run` starts on one machine.
inline constexpr int kMaxActors = 256;

// InvalidArgument naming the field ("actors.noise_decay_frames -5: must be
// >= 0") for exploration settings an actor cannot use, or more than
// kMaxActors actors.
absl::Status ValidateActorsConfig(const config::ActorsConfig& actors);

// How an actor for `config` writes its transitions into replay: the
// transition's signature (agents/transition.h) for `spec` and `action_size`,
// with the agent's n-step and discount (agents::ActorReplayItem). InvalidArgument for sizes that
// make no signature.
absl::StatusOr<TransitionLayout> ActorTransitionLayout(const config::ExperimentConfig& config,
                                                       const agents::ObservationSpec& spec, int action_size);

struct ActorStats {
  int64_t frames = 0;
  int64_t episodes = 0;
  double last_return = 0;
  int64_t parameter_version = 0;
  int64_t reconnects = 0;            // insert streams resumed (or restarted)
  int64_t parameter_reconnects = 0;  // Parameters streams reconnected
  // Transitions replay acknowledged, and those it never did (in flight
  // when a learner restarted, or when the actor stopped).
  int64_t transitions = 0;
  int64_t transitions_lost = 0;
};

// Runs the actor until *stop, max_frames, or an error that retrying cannot
// fix (a bad config, an env error). Prints one progress line per finished
// episode to stdout. Errors: config errors naming the field; env errors.
absl::StatusOr<ActorStats> RunActor(const ActorOptions& options, const std::atomic<bool>* stop);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_ACTOR_H_
