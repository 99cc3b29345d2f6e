#include "envs/env_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::envs {

absl::StatusOr<EnvPoolOptions> EnvPoolOptions::FromConfig(const config::EnvConfig& env,
                                                          const config::EnvPoolConfig& pool) {
  EnvPoolOptions options;
  ASSIGN_OR_RETURN(options.env, EnvOptions::FromConfig(env));
  options.num_envs = pool.num_envs();
  options.num_threads = pool.num_threads();
  options.batch_size = pool.batch_size();
  options.render_in_processes = pool.render_in_processes();
  RETURN_IF_ERROR(options.Validate());
  return options;
}

absl::Status EnvPoolOptions::Validate() const {
  RETURN_IF_ERROR(env.Validate());
  if (num_envs < 1 || num_envs > kMaxEnvs) {
    return absl::InvalidArgumentError(absl::StrCat("pool.num_envs: ", num_envs, " is outside [1, ", kMaxEnvs, "]"));
  }
  if (num_threads < 0 || num_threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat("pool.num_threads: ", num_threads, " is outside [0, 256]"));
  }
  if (batch_size < 0 || batch_size > num_envs) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.batch_size: ", batch_size, " is outside [0, num_envs=", num_envs, "]"));
  }
  return absl::OkStatus();
}

EnvPool::EnvPool(const EnvPoolOptions& options)
    : num_envs_(options.num_envs), batch_size_(options.batch_size == 0 ? options.num_envs : options.batch_size) {}

absl::StatusOr<std::unique_ptr<EnvPool>> EnvPool::Create(const EnvPoolOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<EnvPool> pool(new EnvPool(options));
  EnvPool& p = *pool;
  int threads = options.num_threads > 0 ? options.num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, p.num_envs_);
  // The caller's thread steps envs too, so T threads = T - 1 workers.
  p.num_workers_ = threads - 1;
  for (int t = 0; t <= threads; ++t) p.home_.push_back(int32_t(int64_t(t) * p.num_envs_ / threads));
  const bool in_processes = options.env.pixels && options.render_in_processes && threads > 1;

  // Envs share one immutable model; each has its own seed. With env
  // workers, this process makes only the caller's thread's home envs.
  ASSIGN_OR_RETURN(p.model_, LoadTaskModel(options.env.task, options.env.multisample));
  p.envs_.resize(p.num_envs_);
  for (int i = 0; i < (in_processes ? p.home_[1] : p.num_envs_); ++i) {
    EnvOptions env_options = options.env;
    env_options.seed = SeedFor(options.env.seed, i);
    ASSIGN_OR_RETURN(p.envs_[i], MakeEnv(env_options, p.model_));
  }
  p.spec_ = p.envs_[0]->spec();
  p.progress_.resize(p.num_envs_);
  p.state_lines_ = (p.spec_.state_size + 15) / 16;
  if (in_processes) {
    p.mirrors_.resize(p.num_envs_);
    for (int t = 1; t < threads; ++t) {
      ASSIGN_OR_RETURN(auto worker, EnvWorker::Start(options.env, p.spec_, p.model_->get(), p.home_[t],
                                                     p.home_[t + 1] - p.home_[t]));
      p.env_workers_.push_back(std::move(worker));
    }
  }

  // Sync mode writes its one buffer in place. Async mode: enough buffers
  // that results of envs still in flight never overwrite the batch the
  // owner is reading.
  const int ring = p.sync() ? 1 : (p.num_envs_ + p.batch_size_ - 1) / p.batch_size_ + 1;
  for (int r = 0; r < ring; ++r) {
    auto buffer = std::make_unique<Buffer>();
    const size_t m = p.batch_size_;
    buffer->env_id.resize(m);
    if (p.sync()) std::iota(buffer->env_id.begin(), buffer->env_id.end(), 0);  // row i is env i, always
    buffer->step_type.resize(m);
    buffer->reward.resize(m);
    buffer->discount.resize(m);
    buffer->state.resize(m * p.spec_.state_size);
    buffer->pixels.resize(m * p.spec_.pixel_bytes());
    buffer->episode_step.resize(m);
    if (!p.sync()) {  // async: rows staged, then gathered
      buffer->rows.resize(m);
      buffer->staged_state.resize(m * p.state_lines_);
    }
    p.ring_.push_back(std::move(buffer));
  }

  // The scheduler: worker threads (none in sync mode with env workers: the
  // caller's thread hands them their shares itself); a thread that renders
  // here makes its GL context before the first job (a failure resurfaces at
  // the first render).
  const bool renders_here = options.env.pixels && !in_processes;
  auto on_start = [&p, renders_here](int) {
    if (renders_here) (void)PrepareRenderer(p.model_);
  };
  if (p.sync() && in_processes) {
    SyncProcessScheduler::Options o;
    for (const auto& worker : p.env_workers_) o.workers.push_back(worker.get());
    o.own_envs = p.home_[1];
    o.run_own = [&p](int32_t begin, int32_t end) { p.RunSyncJobs(begin, end); };
    o.collect = [&p](const EnvWorker& worker, int32_t id) { p.CopyWorkerResult(worker, id, *p.ring_[0], id); };
    o.on_error = [&p](const absl::Status& status) { p.RecordError(status); };
    p.sync_processes_ = std::make_unique<SyncProcessScheduler>(std::move(o));
  } else if (p.sync()) {
    p.sync_threads_ = std::make_unique<SyncThreadScheduler>(
        p.home_, on_start, [&p](int, int32_t begin, int32_t end) { p.RunSyncJobs(begin, end); });
  } else {
    p.actions_.assign(size_t(p.num_envs_) * p.spec_.action_size, 0.0f);
    p.in_flight_.assign(p.num_envs_, 0);
    AsyncQueueScheduler::Options o;
    o.home = p.home_;
    o.queue_per_thread = in_processes;
    o.batch_size = p.batch_size_;
    o.ring = ring;
    o.on_start = on_start;
    o.start = [&p](int thread, std::span<const Job> jobs) {
      if (EnvWorker* worker = p.WorkerOf(thread)) {
        if (auto status = worker->Run(jobs, p.actions_.data()); !status.ok()) p.RecordError(status);
      }
    };
    o.finish = [&p](int thread, const Job& job, int buffer, int row) {
      if (EnvWorker* worker = p.WorkerOf(thread)) {
        p.CopyWorkerResult(*worker, job.env_id, *p.ring_[buffer], row);
      } else {
        p.RunJob(job.env_id, job.reset, &p.actions_[size_t(job.env_id) * p.spec_.action_size], *p.ring_[buffer], row);
      }
    };
    p.async_ = std::make_unique<AsyncQueueScheduler>(std::move(o));
  }
  return pool;
}

EnvPool::~EnvPool() {
  // The schedulers' threads first: they step envs and write buffers.
  sync_threads_.reset();
  async_.reset();
}

std::vector<pid_t> EnvPool::worker_pids() const {
  std::vector<pid_t> pids;
  for (const auto& worker : env_workers_) pids.push_back(worker->pid());
  return pids;
}

int64_t EnvPool::physics_errors() const {
  int64_t total = 0;
  for (const auto& env : envs_) {
    if (env) total += env->physics_errors();
  }
  for (const auto& worker : env_workers_) total += worker->physics_errors();
  return total;
}

int EnvPool::HomeThread(int32_t id) const {
  return int(std::upper_bound(home_.begin(), home_.end(), id) - home_.begin()) - 1;
}

const mjData* EnvPool::data(int index) {
  if (envs_[index]) return envs_[index]->data();
  const mjModel* m = model_->get();
  auto& mirror = mirrors_[index];
  if (!mirror) mirror.reset(mj_makeData(m));
  WorkerOf(HomeThread(index))->CopyPhysicsState(index, mirror.get());
  mj_forward(m, mirror.get());
  return mirror.get();
}

absl::Status EnvPool::CheckActions(std::span<const float> actions, size_t rows,
                                   std::span<const int32_t> env_ids) const {
  const size_t action_size = spec_.action_size;
  if (actions.size() != rows * action_size) {
    return absl::InvalidArgumentError(absl::StrCat(spec_.task, ": ", actions.size(), " action values for ", rows,
                                                   " envs; expected ", rows * action_size));
  }
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!std::isfinite(actions[i])) {
      const size_t row = i / action_size;
      return absl::InvalidArgumentError(absl::StrCat(spec_.task, ": env ", env_ids.empty() ? int32_t(row) : env_ids[row],
                                                     " action[", i % action_size, "] is ", actions[i],
                                                     "; actions must be finite"));
    }
  }
  return absl::OkStatus();
}

void EnvPool::RecordError(const absl::Status& status) {
  std::lock_guard lock(error_mutex_);
  if (first_error_.ok()) first_error_ = status;
  failed_.store(true, std::memory_order_release);
}

absl::Status EnvPool::TakeError() {
  std::lock_guard lock(error_mutex_);
  failed_.store(false, std::memory_order_relaxed);
  return std::exchange(first_error_, absl::OkStatus());
}

ObservationBuffers EnvPool::RowOutputs(Buffer& buffer, int row) {
  // In sync mode row = env id, written straight into the batch's arrays (a
  // thread's home envs are a contiguous range of rows, so threads share
  // only the lines at the ends of their ranges); in async mode completion
  // order, staged on lines of the row's own (neighbouring rows come from
  // any thread) and gathered by Recv.
  float* state = nullptr;
  if (state_lines_ > 0) {
    state = sync() ? &buffer.state[size_t(row) * spec_.state_size] : buffer.staged_state[size_t(row) * state_lines_].v;
  }
  return ObservationBuffers{state,
                            spec_.pixel_bytes() ? buffer.pixels.data() + size_t(row) * spec_.pixel_bytes() : nullptr};
}

void EnvPool::WriteRow(Buffer& buffer, int row, int32_t id, const TimeStep& timestep, int32_t episode_step) {
  if (sync()) {
    buffer.step_type[row] = static_cast<uint8_t>(timestep.step_type);
    buffer.reward[row] = timestep.reward;
    buffer.discount[row] = timestep.discount;
    buffer.episode_step[row] = episode_step;
  } else {
    buffer.rows[row] =
        RowResult{id, static_cast<uint8_t>(timestep.step_type), timestep.reward, timestep.discount, episode_step};
  }
}

void EnvPool::RunJob(int32_t id, bool reset, const float* action, Buffer& buffer, int row) {
  EpisodeProgress& progress = progress_[id].progress;
  absl::Status error;
  const TimeStep timestep = AdvanceEnv(*envs_[id], progress, reset, action, RowOutputs(buffer, row), &error);
  if (!error.ok()) RecordError(error);
  WriteRow(buffer, row, id, timestep, progress.episode_step);
}

void EnvPool::CopyWorkerResult(const EnvWorker& worker, int32_t id, Buffer& buffer, int row) {
  const EnvWorker::Result result = worker.result(id);
  const ObservationBuffers out = RowOutputs(buffer, row);
  if (out.state) std::memcpy(out.state, result.state, sizeof(float) * spec_.state_size);
  if (out.pixels) std::memcpy(out.pixels, result.pixels, spec_.pixel_bytes());
  WriteRow(buffer, row, id, result.timestep, result.episode_step);
}

EnvBatch EnvPool::View(Buffer& buffer) const {
  const size_t m = batch_size_;
  return EnvBatch{batch_size_,
                  {buffer.env_id.data(), m},
                  {buffer.step_type.data(), m},
                  {buffer.reward.data(), m},
                  {buffer.discount.data(), m},
                  {buffer.state.data(), buffer.state.size()},
                  {buffer.pixels.data(), buffer.pixels.size()},
                  {buffer.episode_step.data(), m}};
}

// ---- Sync mode ----

absl::StatusOr<EnvBatch> EnvPool::Reset() {
  if (!sync()) return absl::FailedPreconditionError("Reset: sync mode only; use SendReset/Recv");
  return RunSyncBatch(/*reset=*/true, nullptr);
}

absl::StatusOr<EnvBatch> EnvPool::Step(std::span<const float> actions) {
  if (!sync()) return absl::FailedPreconditionError("Step: sync mode only; use Send/Recv");
  RETURN_IF_ERROR(CheckActions(actions, num_envs_, /*env_ids=*/{}));
  return RunSyncBatch(/*reset=*/false, actions.data());
}

absl::StatusOr<EnvBatch> EnvPool::RunSyncBatch(bool reset, const float* actions) {
  // Read by whichever thread steps an env of this process (RunSyncJobs);
  // SyncThreadScheduler::RunBatch publishes it to its workers.
  batch_reset_ = reset;
  batch_actions_ = actions;
  if (sync_processes_) {
    sync_processes_->RunBatch(reset, actions);
  } else {
    sync_threads_->RunBatch();
  }
  if (failed_.load(std::memory_order_acquire)) return TakeError();
  return View(*ring_[0]);
}

void EnvPool::RunSyncJobs(int32_t begin, int32_t end) {
  Buffer& buffer = *ring_[0];
  const int action_size = spec_.action_size;
  for (int32_t id = begin; id < end; ++id) {
    RunJob(id, batch_reset_, batch_actions_ == nullptr ? nullptr : batch_actions_ + size_t(id) * action_size, buffer,
           id);
  }
}

// ---- Async mode ----

absl::Status EnvPool::Enqueue(std::span<const float> actions, std::span<const int32_t> env_ids, bool reset) {
  if (sync()) {
    return absl::FailedPreconditionError(
        absl::StrCat(reset ? "SendReset" : "Send", ": async mode only (pool.batch_size < num_envs); use Reset/Step"));
  }
  const int action_size = spec_.action_size;
  // Check everything before queueing anything. Ids are marked as they are
  // checked, so a repeated one is found in one pass; the marks are undone
  // on an error.
  constexpr uint8_t kChecked = 2;
  absl::Status error;
  if (!reset) error = CheckActions(actions, env_ids.size(), env_ids);
  size_t checked = 0;
  for (; checked < env_ids.size() && error.ok(); ++checked) {
    const int32_t id = env_ids[checked];
    if (id < 0 || id >= num_envs_) {
      error = absl::InvalidArgumentError(absl::StrCat("env id ", id, " is outside [0, ", num_envs_, ")"));
    } else if (in_flight_[id] == kChecked) {
      error = absl::InvalidArgumentError(absl::StrCat("env id ", id, " sent twice"));
    } else if (in_flight_[id]) {
      error = absl::InvalidArgumentError(absl::StrCat("env ", id, " is already in flight"));
    } else {
      in_flight_[id] = kChecked;
      continue;
    }
    break;
  }
  if (!error.ok()) {
    for (size_t i = 0; i < checked; ++i) in_flight_[env_ids[i]] = 0;
    return error;
  }
  // Record actions, then hand the jobs to the workers.
  for (size_t i = 0; i < env_ids.size(); ++i) {
    if (!reset) std::memcpy(&actions_[size_t(env_ids[i]) * action_size], &actions[i * action_size], action_size * sizeof(float));
    in_flight_[env_ids[i]] = 1;
  }
  in_flight_count_ += static_cast<int>(env_ids.size());
  async_->Enqueue(env_ids, reset);
  return absl::OkStatus();
}

absl::Status EnvPool::Send(std::span<const float> actions, std::span<const int32_t> env_ids) {
  return Enqueue(actions, env_ids, /*reset=*/false);
}

absl::Status EnvPool::SendReset(std::span<const int32_t> env_ids) { return Enqueue({}, env_ids, /*reset=*/true); }

absl::StatusOr<EnvBatch> EnvPool::Recv() {
  if (sync()) return absl::FailedPreconditionError("Recv: async mode only (pool.batch_size < num_envs); use Step");
  if (in_flight_count_ < batch_size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Recv: ", in_flight_count_, " envs in flight, fewer than batch_size ", batch_size_));
  }
  Buffer& buffer = *ring_[async_->WaitBatch()];
  const absl::Status error = TakeError();
  // Gather the staged rows into the batch's arrays.
  for (int i = 0; i < batch_size_; ++i) {
    const RowResult& r = buffer.rows[i];
    buffer.env_id[i] = r.env_id;
    buffer.step_type[i] = r.step_type;
    buffer.reward[i] = r.reward;
    buffer.discount[i] = r.discount;
    buffer.episode_step[i] = r.episode_step;
    if (state_lines_ > 0) {
      std::memcpy(&buffer.state[size_t(i) * spec_.state_size], buffer.staged_state[size_t(i) * state_lines_].v,
                  sizeof(float) * spec_.state_size);
    }
  }
  for (int i = 0; i < batch_size_; ++i) in_flight_[buffer.env_id[i]] = 0;
  in_flight_count_ -= batch_size_;
  if (!error.ok()) return error;
  return View(buffer);
}

}  // namespace troupe::envs
