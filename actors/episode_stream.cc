#include "actors/episode_stream.h"

#include <deque>

#include "common/serial_write_reactor.h"

namespace troupe::actors {

int64_t EpisodePublisher::BeginEpisode() {
  absl::MutexLock lock(&mutex_);
  return ++episode_;
}

void EpisodePublisher::Publish(const mjModel* model, const mjData* data, int64_t step, bool last,
                               std::span<const float> action, double reward, int64_t parameter_version) {
  // Nobody following: nothing to build.
  absl::MutexLock lock(&mutex_);
  if (listeners_.empty() || closed_) return;
  auto state = std::make_shared<proto::EpisodeState>();
  state->set_task(task_);
  state->set_action_repeat(action_repeat_);
  state->set_episode(episode_);
  state->set_step(step);
  state->set_last(last);
  state->set_time(data->time);
  state->mutable_qpos()->Add(data->qpos, data->qpos + model->nq);
  state->mutable_qvel()->Add(data->qvel, data->qvel + model->nv);
  state->mutable_act()->Add(data->act, data->act + model->na);
  state->mutable_action()->Add(action.begin(), action.end());
  state->set_reward(reward);
  state->set_parameter_version(parameter_version);
  for (Listener* listener : listeners_) listener->OnState(state, false);
}

int EpisodePublisher::followers() const {
  absl::MutexLock lock(&mutex_);
  return int(listeners_.size());
}

void EpisodePublisher::Close() {
  absl::MutexLock lock(&mutex_);
  closed_ = true;
  for (Listener* listener : listeners_) listener->OnState(nullptr, true);
}

void EpisodePublisher::AddListener(Listener* listener) {
  absl::MutexLock lock(&mutex_);
  listeners_.insert(listener);
  if (closed_) {
    listener->OnState(nullptr, true);
    return;
  }
  auto greeting = std::make_shared<proto::EpisodeState>();
  greeting->set_task(task_);
  greeting->set_action_repeat(action_repeat_);
  listener->OnState(std::move(greeting), false);
}

void EpisodePublisher::RemoveListener(Listener* listener) {
  absl::MutexLock lock(&mutex_);
  listeners_.erase(listener);
}

namespace {

class FollowReactor final : public SerialWriteReactor<proto::EpisodeState>, public EpisodePublisher::Listener {
 public:
  explicit FollowReactor(EpisodePublisher* publisher)
      : SerialWriteReactor("episode stream write failed"), publisher_(publisher) {
    // Step 1: register; the greeting comes at once.
    publisher_->AddListener(this);
  }

  // Step 2: a state to send (or the publisher closing).
  void OnState(std::shared_ptr<const proto::EpisodeState> state, bool closed) override {
    absl::MutexLock lock(&mutex_);
    if (closed) {
      FinishLocked(absl::UnavailableError("the evaluator's episode stream closed"));
      return;
    }
    // A full queue drops this state and the rest of its episode.
    if (skipping_ && state->step() == 0) skipping_ = false;
    if (skipping_ || queue_.size() >= EpisodePublisher::kMaxQueuedStates) {
      skipping_ = true;
      return;
    }
    queue_.push_back(std::move(state));
    MaybeWriteLocked();
  }

  void OnDone() override {
    publisher_->RemoveListener(this);  // no OnState runs after this returns
    { absl::MutexLock lock(&mutex_); }
    delete this;
  }

 private:
  // Step 3: the front of the queue, which stays queued (and counted) until
  // its write completes.
  std::shared_ptr<const proto::EpisodeState> NextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return queue_.empty() ? nullptr : queue_.front();
  }
  void WrittenLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { queue_.pop_front(); }

  EpisodePublisher* publisher_;
  std::deque<std::shared_ptr<const proto::EpisodeState>> queue_ ABSL_GUARDED_BY(mutex_);
  bool skipping_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace

grpc::ServerWriteReactor<proto::EpisodeState>* EpisodeStreamService::Follow(grpc::CallbackServerContext* context,
                                                                           const proto::FollowRequest* request) {
  return new FollowReactor(publisher_);
}

}  // namespace troupe::actors
