#include "viz/sources/live.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "envs/env.h"

namespace troupe::viz {

absl::StatusOr<std::unique_ptr<LiveEpisodes>> LiveEpisodes::Create(const std::string& address,
                                                                   absl::Duration connect_timeout,
                                                                   const GrpcCredentials& credentials) {
  std::unique_ptr<LiveEpisodes> live(new LiveEpisodes(address));
  ASSIGN_OR_RETURN(live->channel_, NewSecureChannel(credentials, address));
  live->stub_ = proto::EpisodeStream::NewStub(live->channel_);
  live->reader_ = std::jthread([self = live.get()](std::stop_token stop) { self->ReadLoop(stop); });

  // The greeting names the task.
  proto::EpisodeState greeting;
  {
    absl::MutexLock lock(&live->mutex_);
    auto greeted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live->mutex_) { return live->greeting_.has_value(); };
    if (!live->mutex_.AwaitWithTimeout(absl::Condition(&greeted), connect_timeout)) {
      return absl::UnavailableError(absl::StrCat(
          "--live ", address, ": no evaluator episode stream answered within ", absl::FormatDuration(connect_timeout),
          live->last_error_.empty() ? "" : absl::StrCat(" (last attempt: ", live->last_error_, ")"),
          ". Is `troupe run` of an RL config going, and is this the learner's address (its status line prints it)?"));
    }
    greeting = *live->greeting_;
  }
  live->task_ = greeting.task();
  live->action_repeat_ = std::max(1, greeting.action_repeat());

  // The task's model (no pixels: the state is all the viewer draws) and a
  // state of our own to replay into.
  envs::EnvOptions options;
  options.task = live->task_;
  options.pixels = false;
  options.action_repeat = live->action_repeat_;
  ASSIGN_OR_RETURN(const envs::TaskInfo* info, envs::FindTask(options.task));
  ASSIGN_OR_RETURN(live->env_, envs::MakeEnv(options));
  live->data_ = mj_makeData(live->env_->model());
  mj_forward(live->env_->model(), live->data_);
  live->step_seconds_ = live->env_->model()->opt.timestep * info->control_substeps * live->action_repeat_;
  live->action_.assign(live->env_->spec().action_size, 0.0f);
  return live;
}

LiveEpisodes::~LiveEpisodes() {
  // Stop the reader: cancel its call, then join.
  reader_.request_stop();
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    if (context_) context_->TryCancel();
  }
  if (reader_.joinable()) reader_.join();
  if (data_) mj_deleteData(data_);
}

void LiveEpisodes::ReadLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mutex_);
      if (stop.stop_requested()) break;
      context_ = &context;
    }
    // Follow: the greeting, then states until the stream ends.
    std::unique_ptr<grpc::ClientReader<proto::EpisodeState>> reader = stub_->Follow(&context, proto::FollowRequest());
    proto::EpisodeState state;
    while (reader->Read(&state)) {
      absl::MutexLock lock(&mutex_);
      connected_ = true;
      ++received_;
      if (state.episode() == 0) {
        greeting_ = state;
      } else {
        queue_.push_back(std::move(state));
        // Too far behind: drop the oldest whole episodes.
        while (queue_.size() > kMaxQueuedStates) {
          queue_.pop_front();
          while (!queue_.empty() && queue_.front().step() != 0) queue_.pop_front();
        }
      }
    }
    const grpc::Status finished = reader->Finish();
    // Broken or refused: try again in a second.
    absl::MutexLock lock(&mutex_);
    if (!finished.ok()) last_error_ = finished.error_message();
    context_ = nullptr;
    connected_ = false;
    mutex_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
  }
}

void LiveEpisodes::Apply(const proto::EpisodeState& state) {
  const mjModel* m = env_->model();
  // A state of another model (a different task) is ignored.
  if (state.qpos_size() != m->nq || state.qvel_size() != m->nv || state.act_size() != m->na) return;
  data_->time = state.time();
  std::copy(state.qpos().begin(), state.qpos().end(), data_->qpos);
  std::copy(state.qvel().begin(), state.qvel().end(), data_->qvel);
  std::copy(state.act().begin(), state.act().end(), data_->act);
  mj_forward(m, data_);
  parameter_version_ = state.parameter_version();
}

std::string LiveEpisodes::Describe() const {
  absl::MutexLock lock(&mutex_);
  return absl::StrCat(task_, " from the evaluator at ", address_, connected_ ? " (live)" : " (reconnecting)");
}

std::string LiveEpisodes::Version() const {
  return parameter_version_ < 0 ? "" : absl::StrCat("version ", parameter_version_, " (updates)");
}

int64_t LiveEpisodes::received() const {
  absl::MutexLock lock(&mutex_);
  return received_;
}

absl::StatusOr<SourceStep> LiveEpisodes::ApplyReset() {
  // Skip to the next episode's first state, if one has arrived.
  std::optional<proto::EpisodeState> first;
  {
    absl::MutexLock lock(&mutex_);
    while (!queue_.empty() && queue_.front().step() != 0) queue_.pop_front();
    if (!queue_.empty()) {
      first = std::move(queue_.front());
      queue_.pop_front();
    }
  }
  if (first) Apply(*first);
  mid_episode_ = false;
  return SourceStep{.step_type = envs::StepType::kFirst};
}

absl::Status LiveEpisodes::PrepareStep() {
  // The next state, waiting at most 100 ms so pause and quit stay prompt.
  next_.reset();
  absl::MutexLock lock(&mutex_);
  auto queued = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !queue_.empty(); };
  if (mutex_.AwaitWithTimeout(absl::Condition(&queued), absl::Milliseconds(100))) {
    next_ = std::move(queue_.front());
    queue_.pop_front();
  }
  return absl::OkStatus();
}

absl::StatusOr<SourceStep> LiveEpisodes::ApplyStep() {
  if (!next_) return SourceStep{.idle = true};
  const proto::EpisodeState& state = *next_;
  Apply(state);
  SourceStep out;
  if (state.step() == 0) {
    // A new episode: already begun by a reset (idle), or the stream moved
    // on without our seeing the last state (a new episode now).
    out.step_type = envs::StepType::kFirst;
    out.idle = !mid_episode_;
    mid_episode_ = false;
    return out;
  }
  mid_episode_ = true;
  for (size_t i = 0; i < action_.size() && int(i) < state.action_size(); ++i) action_[i] = state.action(int(i));
  out.step_type = state.last() ? envs::StepType::kLast : envs::StepType::kMid;
  out.reward = state.reward();
  out.action = action_;
  return out;
}

}  // namespace troupe::viz
