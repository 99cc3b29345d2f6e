// What an actor hands replay after each env step, whatever item its agent
// learns from (agents::ActorReplayItem): n-step transitions
// (actors/transition_writer.h) or fixed-length trajectories with the
// behaviour's log-probabilities (actors/trajectory_writer.h). The actor's
// loop drives this interface only.
//
// Not thread-safe: one owner thread.
#ifndef TROUPE_ACTORS_ITEM_WRITER_H_
#define TROUPE_ACTORS_ITEM_WRITER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/policies.h"
#include "proto/config.pb.h"
#include "replay/client.h"

namespace troupe::actors {

// One env step as the actor saw it.
struct ActorStep {
  const float* action = nullptr;  // the action taken from the previous observation [A]
  float reward = 0;
  float discount = 1;  // the env's: 0 at a true terminal
  bool last = false;   // the episode ended with this step
  const float* state = nullptr;     // the new observation: state [S] ...
  const uint8_t* frame = nullptr;   // ... or its newest frame [H, W, 3]
  // Trajectories: the behaviour's log-density of `action`, its policy
  // version, and at an episode's last step V(new observation) in reward
  // units (the value bootstrap at a time limit).
  float log_prob = 0;
  int64_t policy_version = 0;
  float bootstrap_value = 0;
};

class ItemWriter {
 public:
  virtual ~ItemWriter() = default;
  // The first observation of env `env`'s episode.
  virtual absl::Status Start(int env, const float* state, const uint8_t* frame) = 0;
  // One step of env `env`: inserts the items it completes. A send that
  // fails is returned only after the step is wholly recorded (its items stay
  // queued in a resumable writer).
  virtual absl::Status Step(int env, const ActorStep& step) = 0;
  // Drops everything pending (after replay was lost); envs Start again.
  virtual void Clear() = 0;
  // Items handed to the writer (queued or sent).
  virtual int64_t items_inserted() const = 0;
};

// Frames once (both writers): appends `frame` (a pixel field's [H, W, C],
// `shape`) to `writer` and makes the stack of k frame keys it ends in
// `stack`: its key k times at an episode's `first` frame, else `previous`
// (the last observation's k keys) shifted by one and it last.
absl::Status StackNewFrame(replay::Writer& writer, const uint8_t* frame, const std::vector<int64_t>& shape,
                           const uint64_t* previous, bool first, std::span<uint64_t> stack);

// The frame window (replay::WriterOptions::frame_window) an actor's writer
// needs for the config's agent's items from `num_envs` envs observing
// `spec`: the actor's pool steps its envs together, each appending one frame
// a step, so an item's frames (its observations, a trajectory's T + 1 or a
// transition's n_step + 1, and the k - 1 older frames of its first stack)
// lie within num_envs x (observations + k) appended frames. At least the
// writer's default (64); state observations need none beyond it.
int ItemFrameWindow(const config::ExperimentConfig& config, const agents::ObservationSpec& spec, int num_envs);

// The writer of the config's agent's items on `writer` for `num_envs` envs
// observing `spec` with `action_size` actions. Errors: the item's
// signature's (InvalidArgument).
absl::StatusOr<std::unique_ptr<ItemWriter>> MakeItemWriter(const config::ExperimentConfig& config,
                                                           const agents::ObservationSpec& spec, int action_size,
                                                           replay::Writer* writer, int num_envs);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_ITEM_WRITER_H_
