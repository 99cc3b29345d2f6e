#include "actors/transition_writer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::actors {

TransitionWriter::TransitionWriter(replay::Writer* writer, int num_envs, const TransitionLayout& layout)
    : writer_(writer), layout_(layout), envs_(num_envs) {
  TROUPE_CHECK(layout_.n_step >= 1);
  TROUPE_CHECK((layout_.state_size > 0) != (layout_.frames > 0));
}

absl::StatusOr<TransitionWriter::Observation> TransitionWriter::Observe(const EnvState& env, const float* state,
                                                                        const uint8_t* frame, bool first) {
  Observation observation;
  if (layout_.state_size > 0) {
    observation.state.assign(state, state + layout_.state_size);
    return observation;
  }
  ASSIGN_OR_RETURN(uint64_t key, writer_->AppendFrame(frame, layout_.height, layout_.width, 3));
  if (first) {
    observation.frames.assign(layout_.frames, key);
  } else {
    observation.frames.assign(env.current.frames.begin() + 1, env.current.frames.end());
    observation.frames.push_back(key);
  }
  return observation;
}

absl::Status TransitionWriter::Start(int env_index, const float* state, const uint8_t* frame) {
  EnvState& env = envs_[env_index];
  env.pending.clear();
  ASSIGN_OR_RETURN(env.current, Observe(env, state, frame, /*first=*/true));
  env.started = true;
  return absl::OkStatus();
}

absl::Status TransitionWriter::InsertFront(EnvState& env, size_t steps, const Observation& next, absl::Status* sent) {
  // The discounted sum of the first `steps` rewards and the bootstrap discount.
  float total = 0, discount = 1;
  for (size_t j = 0; j < steps; ++j) {
    total += discount * env.pending[j].reward;
    discount *= layout_.discount * env.pending[j].discount;
  }
  const Pending& front = env.pending.front();
  auto observation_field = [&](const Observation& o) {
    return layout_.state_size > 0
               ? replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {layout_.state_size}, o.state.data())
               : replay::FieldValue::Frames(o.frames);
  };
  const int64_t queued = writer_->items_queued();
  absl::Status status = writer_->Insert(
      layout_.table, /*priority=*/1.0,
      {observation_field(front.observation),
       replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {layout_.action_size}, front.action.data()),
       replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &total),
       replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount), observation_field(next)});
  // Not queued: a bad item. Queued but its send failed: the writer keeps
  // it (a resumable writer re-sends it), and the episode goes on.
  if (writer_->items_queued() == queued) return status;
  sent->Update(status);
  ++inserted_;
  env.pending.pop_front();
  return absl::OkStatus();
}

absl::Status TransitionWriter::Step(int env_index, const float* action, float reward, float discount, bool last,
                                    const float* state, const uint8_t* frame) {
  EnvState& env = envs_[env_index];
  if (!env.started) {
    return absl::FailedPreconditionError(absl::StrCat("TransitionWriter: env ", env_index, " stepped before Start"));
  }
  // The step joins the pending ones; the new observation becomes current.
  ASSIGN_OR_RETURN(Observation next, Observe(env, state, frame, /*first=*/false));
  env.pending.push_back({std::move(env.current), std::vector<float>(action, action + layout_.action_size), reward,
                         discount});
  env.current = std::move(next);
  // A full n-step window is complete; at the end, every pending one is.
  absl::Status sent;
  if (env.pending.size() == size_t(layout_.n_step)) {
    RETURN_IF_ERROR(InsertFront(env, env.pending.size(), env.current, &sent));
  }
  if (last) {
    while (!env.pending.empty()) RETURN_IF_ERROR(InsertFront(env, env.pending.size(), env.current, &sent));
    env.started = false;
  }
  return sent;
}

void TransitionWriter::Clear() {
  for (EnvState& env : envs_) {
    env.pending.clear();
    env.started = false;
  }
}

}  // namespace troupe::actors
