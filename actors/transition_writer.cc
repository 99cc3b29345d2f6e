#include "actors/transition_writer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::actors {

using agents::kAction;
using agents::kDiscount;
using agents::kNextObservation;
using agents::kObservation;
using agents::kReward;

TransitionWriter::TransitionWriter(replay::Writer* writer, int num_envs, const TransitionLayout& layout)
    : writer_(writer), layout_(layout), envs_(num_envs) {
  const std::vector<replay::FieldSpec>& fields = layout_.signature.fields;
  TROUPE_CHECK(layout_.n_step >= 1);
  TROUPE_CHECK(fields.size() == agents::kNumTransitionFields);
  observation_ = &fields[kObservation];
  const replay::FieldSpec& next = fields[kNextObservation];
  TROUPE_CHECK(next.dtype == observation_->dtype && next.shape == observation_->shape &&
               next.frames == observation_->frames);
  // Pixels: frames of uint8 [H, W, C]; else the state's float32 bytes.
  TROUPE_CHECK(observation_->frames > 0 ? observation_->shape.size() == 3
                                        : observation_->dtype == proto::DTYPE_FLOAT32);
  TROUPE_CHECK(fields[kAction].dtype == proto::DTYPE_FLOAT32);
  const int64_t action_bytes = fields[kAction].bytes;
  for (const replay::FieldSpec& field : fields) {
    values_.push_back(field.frames > 0 ? replay::FieldValue::Frames({})
                                       : replay::FieldValue::Dense(field.dtype, field.shape, nullptr));
  }
  // Every buffer at its size, once.
  const auto size = [this](Observation& o) {
    if (observation_->frames > 0) {
      o.frames.resize(observation_->frames);
    } else {
      o.state.resize(observation_->bytes);
    }
  };
  for (EnvState& env : envs_) {
    size(env.current);
    size(env.next);
    env.ring.resize(layout_.n_step);
    for (Pending& p : env.ring) {
      size(p.observation);
      p.action.resize(action_bytes);
    }
  }
}

absl::Status TransitionWriter::Observe(const EnvState& env, const float* state, const uint8_t* frame, bool first,
                                       Observation* out) {
  if (observation_->frames == 0) {
    std::memcpy(out->state.data(), state, out->state.size());
    return absl::OkStatus();
  }
  return StackNewFrame(*writer_, frame, observation_->shape, env.current.frames.data(), first, out->frames);
}

absl::Status TransitionWriter::Start(int env_index, const float* state, const uint8_t* frame) {
  EnvState& env = envs_[env_index];
  env.size = 0;
  RETURN_IF_ERROR(Observe(env, state, frame, /*first=*/true, &env.current));
  env.started = true;
  return absl::OkStatus();
}

void TransitionWriter::SetObservation(agents::TransitionField field, const Observation& o) {
  replay::FieldValue& value = values_[field];
  if (observation_->frames > 0) {
    value.frame_keys.assign(o.frames.begin(), o.frames.end());
  } else {
    value.data = o.state.data();
  }
}

absl::Status TransitionWriter::InsertFront(EnvState& env, size_t steps, const Observation& next, absl::Status* sent) {
  // The discounted sum of the first `steps` rewards and the bootstrap discount.
  float total = 0, discount = 1;
  for (size_t j = 0; j < steps; ++j) {
    const Pending& p = env.pending(j);
    total += discount * p.reward;
    discount *= layout_.discount * p.discount;
  }
  const Pending& front = env.pending(0);
  SetObservation(kObservation, front.observation);
  values_[kAction].data = front.action.data();
  values_[kReward].data = &total;
  values_[kDiscount].data = &discount;
  SetObservation(kNextObservation, next);
  const int64_t queued = writer_->items_queued();
  absl::Status status = writer_->Insert(layout_.table, /*priority=*/1.0, values_);
  // Not queued: a bad item. Queued but its send failed: the writer keeps
  // it (a resumable writer re-sends it), and the episode goes on.
  if (writer_->items_queued() == queued) return status;
  sent->Update(status);
  ++inserted_;
  env.head = (env.head + 1) % env.ring.size();
  --env.size;
  return absl::OkStatus();
}

absl::Status TransitionWriter::Step(int env_index, const float* action, float reward, float discount, bool last,
                                    const float* state, const uint8_t* frame) {
  EnvState& env = envs_[env_index];
  if (!env.started) {
    return absl::FailedPreconditionError(absl::StrCat("TransitionWriter: env ", env_index, " stepped before Start"));
  }
  if (env.size == env.ring.size()) {
    return absl::FailedPreconditionError(absl::StrCat("TransitionWriter: env ", env_index,
                                                      " still holds a transition replay refused; Start it again"));
  }
  // The step joins the pending ones (with the current observation, its
  // buffers swapped in); the new observation becomes current.
  RETURN_IF_ERROR(Observe(env, state, frame, /*first=*/false, &env.next));
  Pending& added = env.pending(env.size++);
  std::swap(added.observation, env.current);
  std::swap(env.current, env.next);
  std::memcpy(added.action.data(), action, added.action.size());
  added.reward = reward;
  added.discount = discount;
  // A full n-step window is complete; at the end, every pending one is.
  absl::Status sent;
  if (env.size == env.ring.size()) {
    RETURN_IF_ERROR(InsertFront(env, env.size, env.current, &sent));
  }
  if (last) {
    while (env.size > 0) RETURN_IF_ERROR(InsertFront(env, env.size, env.current, &sent));
    env.started = false;
  }
  return sent;
}

void TransitionWriter::Clear() {
  for (EnvState& env : envs_) {
    env.size = 0;
    env.started = false;
  }
}

}  // namespace troupe::actors
