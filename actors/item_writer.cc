#include "actors/item_writer.h"

#include <algorithm>

#include "actors/actor.h"
#include "actors/trajectory_writer.h"
#include "actors/transition_writer.h"
#include "agents/trajectory.h"
#include "common/status_macros.h"

namespace troupe::actors {

absl::Status StackNewFrame(replay::Writer& writer, const uint8_t* frame, const std::vector<int64_t>& shape,
                           const uint64_t* previous, bool first, std::span<uint64_t> stack) {
  ASSIGN_OR_RETURN(const uint64_t key, writer.AppendFrame(frame, static_cast<int>(shape[0]),
                                                          static_cast<int>(shape[1]), static_cast<int>(shape[2])));
  if (first) {
    std::fill(stack.begin(), stack.end(), key);
  } else {
    std::copy(previous + 1, previous + stack.size(), stack.begin());
    stack.back() = key;
  }
  return absl::OkStatus();
}

int ItemFrameWindow(const config::ExperimentConfig& config, const agents::ObservationSpec& spec, int num_envs) {
  const int default_window = replay::WriterOptions{}.frame_window;
  if (!spec.pixels()) return default_window;
  const agents::ReplayItem item = agents::ActorReplayItem(config);
  const int64_t observations =
      (item.kind == agents::ReplayItem::Kind::kTrajectories ? item.unroll_length : item.n_step) + 1;
  return static_cast<int>(std::max<int64_t>(default_window, int64_t{num_envs} * (observations + spec.frames)));
}

absl::StatusOr<std::unique_ptr<ItemWriter>> MakeItemWriter(const config::ExperimentConfig& config,
                                                           const agents::ObservationSpec& spec, int action_size,
                                                           replay::Writer* writer, int num_envs) {
  const agents::ReplayItem item = agents::ActorReplayItem(config);
  if (item.kind == agents::ReplayItem::Kind::kTrajectories) {
    ASSIGN_OR_RETURN(const replay::Signature signature,
                     agents::TrajectorySignature(spec, action_size, item.unroll_length));
    return std::make_unique<TrajectoryWriter>(writer, num_envs, signature, item.discount);
  }
  ASSIGN_OR_RETURN(const TransitionLayout layout, ActorTransitionLayout(config, spec, action_size));
  return std::make_unique<TransitionWriter>(writer, num_envs, layout);
}

}  // namespace troupe::actors
