#include "viz/simulation.h"

#include <algorithm>
#include <chrono>

#include "common/status_macros.h"

namespace troupe::viz {
namespace {
using Clock = std::chrono::steady_clock;
// Behind schedule by more than this (a slow policy, a debugger), the pacing
// starts over instead of running steps back to back to catch up.
constexpr auto kMaxLag = std::chrono::milliseconds(250);
}  // namespace

absl::StatusOr<std::unique_ptr<Simulation>> Simulation::Create(SourceFactory make_source,
                                                               const SimulationOptions& options) {
  std::unique_ptr<Simulation> simulation(new Simulation(options));
  std::promise<absl::Status> started;
  std::future<absl::Status> started_future = started.get_future();
  simulation->thread_ = std::jthread([s = simulation.get(), &make_source, &started](std::stop_token stop) {
    absl::Status status = s->Start(make_source);
    const bool ok = status.ok();
    started.set_value(std::move(status));
    if (ok) s->Loop(stop);
    // The source (its env, its EGL context's users) goes on this thread.
    std::lock_guard lock(s->mutex_);
    s->source_.reset();
  });
  RETURN_IF_ERROR(started_future.get());
  return simulation;
}

Simulation::Simulation(const SimulationOptions& options) : options_(options) {}

absl::Status Simulation::Start(const SourceFactory& make_source) {
  ASSIGN_OR_RETURN(auto source, make_source());
  std::lock_guard lock(mutex_);
  source_ = std::move(source);
  const envs::EnvSpec& spec = source_->spec();
  status_.paused = options_.start_paused;
  status_.speed = std::clamp(options_.speed, 1.0 / 64, 64.0);
  status_.action.assign(spec.action_size, 0.0f);
  status_.action_minimum = spec.action_minimum;
  status_.action_maximum = spec.action_maximum;
  status_.policy = source_->Describe();
  status_.version = source_->Version();
  return ResetLocked();
}

Simulation::~Simulation() {
  if (thread_.joinable()) {
    thread_.request_stop();
    changed_.notify_all();
    thread_.join();
  }
}

void Simulation::Read(const std::function<void(const mjModel*, const mjData*, const SimulationStatus&)>& fn) const {
  std::lock_guard lock(mutex_);
  fn(source_->model(), source_->data(), status_);
}

void Simulation::SetPaused(bool paused) {
  std::lock_guard lock(mutex_);
  status_.paused = paused;
  pending_steps_ = 0;
  resync_clock_ = true;
  changed_.notify_all();
}

void Simulation::TogglePaused() {
  bool paused;
  {
    std::lock_guard lock(mutex_);
    paused = status_.paused;
  }
  SetPaused(!paused);
}

void Simulation::RequestStep() {
  std::lock_guard lock(mutex_);
  if (!status_.paused) return;
  ++pending_steps_;
  changed_.notify_all();
}

void Simulation::RequestReset() {
  std::lock_guard lock(mutex_);
  pending_reset_ = true;
  changed_.notify_all();
}

void Simulation::ScaleSpeed(double factor) {
  std::lock_guard lock(mutex_);
  status_.speed = std::clamp(status_.speed * factor, 1.0 / 64, 64.0);
  resync_clock_ = true;
  changed_.notify_all();
}

bool Simulation::WaitUntilIdle(absl::Duration timeout) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [&] { return !busy_ && pending_steps_ == 0 && !pending_reset_; });
}

absl::Status Simulation::ResetLocked() {
  ASSIGN_OR_RETURN(SourceStep step, source_->ApplyReset());
  BeginEpisodeLocked(step);
  return absl::OkStatus();
}

void Simulation::BeginEpisodeLocked(const SourceStep& step) {
  ++status_.episode;
  status_.step = 0;
  status_.episode_return = 0;
  std::fill(status_.action.begin(), status_.action.end(), 0.0f);
  Record(step);
}

void Simulation::Record(const SourceStep& step) {
  if (step.step_type != envs::StepType::kFirst) {
    ++status_.step;
    ++status_.total_steps;
    status_.episode_return += step.reward;
    std::copy(step.action.begin(), step.action.end(), status_.action.begin());
  }
  status_.pixels.assign(step.pixels.begin(), step.pixels.end());
  status_.pixel_width = step.pixel_width;
  status_.pixel_height = step.pixel_height;
  status_.version = source_->Version();
  status_.policy = source_->Describe();
}

void Simulation::Loop(std::stop_token stop) {
  Clock::time_point sync_wall;  // pacing: steps_since_sync steps are due at sync_wall + n * step time / speed
  int64_t steps_since_sync = 0;
  Clock::time_point rate_start = Clock::now();
  int64_t rate_steps = 0;
  const double step_seconds = source_->step_seconds();

  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    // A requested reset first.
    if (pending_reset_) {
      busy_ = true;
      pending_reset_ = false;
      if (auto status = ResetLocked(); !status.ok()) {
        status_.error = status;
        status_.paused = true;
      } else {
        status_.error = absl::OkStatus();
      }
      resync_clock_ = true;
      busy_ = false;
      changed_.notify_all();
      continue;
    }
    // Paused (or stopped by an error): wait for a request.
    const bool single_step = status_.paused && pending_steps_ > 0;
    if (status_.paused && !single_step) {
      changed_.wait(lock, stop, [&] { return !status_.paused || pending_steps_ > 0 || pending_reset_; });
      continue;
    }
    // Running: wait until the next step is due in simulated time.
    if (!single_step) {
      const Clock::time_point now = Clock::now();
      if (resync_clock_ || now - sync_wall > std::chrono::hours(1)) {
        sync_wall = now;
        steps_since_sync = 0;
        resync_clock_ = false;
      }
      const auto due = sync_wall + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(steps_since_sync * step_seconds / status_.speed));
      if (now < due) {
        changed_.wait_until(lock, stop, due, [&] { return pending_reset_ || status_.paused || resync_clock_; });
        continue;
      }
      if (now - due > kMaxLag) resync_clock_ = true;
    } else {
      --pending_steps_;
    }
    // One step: the policy outside the lock, the state change under it.
    busy_ = true;
    lock.unlock();
    absl::Status prepared = source_->PrepareStep();
    lock.lock();
    absl::StatusOr<SourceStep> step = prepared.ok() ? source_->ApplyStep() : prepared;
    if (!step.ok()) {
      status_.error = step.status();
      status_.paused = true;
      pending_steps_ = 0;
    } else if (step->idle) {
      status_.version = source_->Version();  // nothing happened to count
      status_.policy = source_->Describe();
    } else if (step->step_type == envs::StepType::kFirst) {
      // The source started a new episode by itself (a live stream).
      if (status_.step > 0) {
        status_.last_episode_return = status_.episode_return;
        status_.has_last_episode = true;
      }
      BeginEpisodeLocked(*step);
    } else {
      Record(*step);
      if (step->step_type == envs::StepType::kLast) {
        // The episode is over: note its return and start the next.
        status_.last_episode_return = status_.episode_return;
        status_.has_last_episode = true;
        if (auto status = ResetLocked(); !status.ok()) {
          status_.error = status;
          status_.paused = true;
        }
      }
    }
    ++steps_since_sync;
    // Steps per second over the last second.
    if (!step.ok() || !step->idle) ++rate_steps;
    const double elapsed = std::chrono::duration<double>(Clock::now() - rate_start).count();
    if (elapsed >= 1.0) {
      status_.steps_per_second = rate_steps / elapsed;
      rate_steps = 0;
      rate_start = Clock::now();
    }
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace troupe::viz
