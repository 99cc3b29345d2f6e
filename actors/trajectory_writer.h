// Cuts each env's stream of timesteps into trajectories of T steps
// (agents/trajectory.h) and inserts them into replay's trajectory queue.
// A trajectory runs on across an episode's end: that step's discount is 0
// and, when the env did not terminate (a time limit), its reward gains
// discount * V(last observation), the policy's bootstrap; the next
// observation recorded is the new episode's first. The trajectory's policy
// version is its oldest step's.
//
// Pixels: each env's newest frame is appended to the writer once; an
// observation is the keys of its stack of k frames (the first frame
// repeated at an episode's start), so replay stores every frame once.
//
// Not thread-safe: one owner thread.
#ifndef TROUPE_ACTORS_TRAJECTORY_WRITER_H_
#define TROUPE_ACTORS_TRAJECTORY_WRITER_H_

#include <cstdint>
#include <vector>

#include "actors/item_writer.h"
#include "replay/client.h"
#include "replay/item.h"

namespace troupe::actors {

class TrajectoryWriter final : public ItemWriter {
 public:
  // `signature`: agents::TrajectorySignature's; `discount`: gamma.
  TrajectoryWriter(replay::Writer* writer, int num_envs, const replay::Signature& signature, float discount);

  absl::Status Start(int env, const float* state, const uint8_t* frame) override;
  absl::Status Step(int env, const ActorStep& step) override;
  void Clear() override;
  int64_t items_inserted() const override { return inserted_; }

 private:
  struct EnvState {
    bool started = false;
    int64_t steps = 0;  // recorded of the trajectory in progress
    int64_t version = 0;
    std::vector<float> observation, action, reward, discount, log_prob;
    std::vector<uint64_t> frames;  // pixels: each observation's stack of frame keys, [T + 1, k]
  };
  // Observation `index` of env's trajectory: the state, or (pixels) the
  // newest frame appended and pushed onto the previous observation's stack
  // (`first`: the frame fills the stack).
  absl::Status Observe(EnvState& env, int64_t index, const float* state, const uint8_t* frame, bool first);

  replay::Writer* writer_;
  int64_t length_ = 0, state_size_ = 0, action_size_ = 0;
  int64_t stack_ = 0;  // pixels: frames per observation (0: state)
  std::vector<int64_t> frame_shape_;  // pixels: [H, W, 3]
  float discount_;
  std::vector<EnvState> envs_;
  std::vector<replay::FieldValue> values_;
  int64_t inserted_ = 0;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_TRAJECTORY_WRITER_H_
