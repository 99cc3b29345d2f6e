#include "envs/env_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

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
  if (num_envs < 1 || num_envs > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("pool.num_envs: ", num_envs, " is outside [1, 4096]"));
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
  // Envs share one immutable model; each has its own seed.
  ASSIGN_OR_RETURN(auto model, LoadTaskModel(options.env.task, options.env.multisample));
  for (int i = 0; i < pool->num_envs_; ++i) {
    EnvOptions env_options = options.env;
    env_options.seed = SeedFor(options.env.seed, i);
    ASSIGN_OR_RETURN(auto env, MakeEnv(env_options, model));
    pool->envs_.push_back(std::move(env));
  }
  pool->spec_ = pool->envs_[0]->spec();
  const int action_size = pool->spec_.action_size;
  pool->actions_.assign(size_t(pool->num_envs_) * action_size, 0.0f);
  pool->progress_.resize(pool->num_envs_);
  pool->state_lines_ = (pool->spec_.state_size + 15) / 16;
  pool->in_flight_.assign(pool->num_envs_, 0);
  for (int i = 0; i < pool->num_envs_; ++i) pool->all_env_ids_.push_back(i);

  // Enough buffers that results of envs still in flight never overwrite
  // the batch the owner is reading (see the header).
  const int ring = (pool->num_envs_ + pool->batch_size_ - 1) / pool->batch_size_ + 1;
  for (int r = 0; r < ring; ++r) {
    auto buffer = std::make_unique<Buffer>();
    const size_t m = pool->batch_size_;
    buffer->env_id.resize(m);
    buffer->step_type.resize(m);
    buffer->reward.resize(m);
    buffer->discount.resize(m);
    buffer->state.resize(m * pool->spec_.state_size);
    buffer->pixels.resize(m * pool->spec_.pixel_bytes());
    buffer->episode_step.resize(m);
    if (!pool->sync()) {  // async: rows staged, then gathered
      buffer->rows.resize(m);
      buffer->staged_state.resize(m * pool->state_lines_);
    }
    pool->ring_.push_back(std::move(buffer));
  }

  // Workers, each with its GL context made before the first job.
  int threads = options.num_threads > 0 ? options.num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, pool->num_envs_);
  // The caller's thread steps envs inside Recv, so T threads = T - 1 workers.
  pool->num_workers_ = threads - 1;
  pool->queues_.resize(threads);
  if (options.env.pixels && options.render_in_processes) {
    for (int t = 0; t < pool->num_workers_; ++t) {
      ASSIGN_OR_RETURN(auto worker, RenderWorker::Start(model, options.env.multisample));
      pool->render_workers_.push_back(std::move(worker));
    }
  }
  for (int t = 0; t < pool->num_workers_; ++t) {
    RenderWorker* render_worker = pool->render_workers_.empty() ? nullptr : pool->render_workers_[t].get();
    pool->workers_.emplace_back([p = pool.get(), model, pixels = options.env.pixels, render_worker, t](std::stop_token stop) {
      if (render_worker != nullptr) {
        SetThreadRenderWorker(render_worker);
      } else if (pixels) {
        // Pay for this thread's GL context now; a failure resurfaces at the first render.
        (void)PrepareRenderer(model);
      }
      p->WorkerLoop(stop, t + 1);
    });
  }
  return pool;
}

EnvPool::~EnvPool() {
  for (auto& worker : workers_) worker.request_stop();
  workers_.clear();  // joins
}

std::vector<pid_t> EnvPool::render_worker_pids() const {
  std::vector<pid_t> pids;
  for (const auto& worker : render_workers_) pids.push_back(worker->pid());
  return pids;
}

int64_t EnvPool::physics_errors() const {
  int64_t total = 0;
  for (const auto& env : envs_) total += env->physics_errors();
  return total;
}

absl::Status EnvPool::Enqueue(std::span<const float> actions, std::span<const int32_t> env_ids, bool reset) {
  const int action_size = spec_.action_size;
  // Check everything before queueing anything.
  if (!reset && actions.size() != env_ids.size() * action_size) {
    return absl::InvalidArgumentError(absl::StrCat(spec_.task, ": ", actions.size(), " action values for ",
                                                   env_ids.size(), " envs; expected ", env_ids.size() * action_size));
  }
  for (size_t i = 0; i < env_ids.size(); ++i) {
    const int32_t id = env_ids[i];
    if (id < 0 || id >= num_envs_) {
      return absl::InvalidArgumentError(absl::StrCat("env id ", id, " is outside [0, ", num_envs_, ")"));
    }
    if (in_flight_[id]) return absl::InvalidArgumentError(absl::StrCat("env ", id, " is already in flight"));
    for (size_t j = i + 1; j < env_ids.size(); ++j) {
      if (env_ids[j] == id) return absl::InvalidArgumentError(absl::StrCat("env id ", id, " sent twice"));
    }
    if (!reset) {
      for (int a = 0; a < action_size; ++a) {
        const float v = actions[i * action_size + a];
        if (!std::isfinite(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat(spec_.task, ": env ", id, " action[", a, "] is ", v, "; actions must be finite"));
        }
      }
    }
  }
  // Record actions, then hand the jobs to the workers.
  for (size_t i = 0; i < env_ids.size(); ++i) {
    if (!reset) std::memcpy(&actions_[size_t(env_ids[i]) * action_size], &actions[i * action_size], action_size * sizeof(float));
    in_flight_[env_ids[i]] = 1;
  }
  in_flight_count_ += static_cast<int>(env_ids.size());
  {
    std::lock_guard lock(mutex_);
    for (int32_t id : env_ids) queues_[HomeThread(id)].push_back({id, reset});
    queued_.fetch_add(int(env_ids.size()), std::memory_order_relaxed);
  }
  if (env_ids.size() == 1) {
    work_ready_.notify_one();
  } else {
    work_ready_.notify_all();
  }
  return absl::OkStatus();
}

absl::Status EnvPool::Send(std::span<const float> actions, std::span<const int32_t> env_ids) {
  return Enqueue(actions, env_ids, /*reset=*/false);
}

absl::Status EnvPool::SendReset(std::span<const int32_t> env_ids) { return Enqueue({}, env_ids, /*reset=*/true); }

namespace {

// Spins (with the CPU's pause hint) until `done()` or `budget` has passed;
// returns done(). A batch of cheap envs is over in tens of microseconds,
// sooner than a condition-variable wake-up, so both sides of the hand-off
// look before they sleep.
template <typename Done>
bool SpinFor(std::chrono::microseconds budget, Done done) {
  const auto until = std::chrono::steady_clock::now() + budget;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
  }
  return true;
}

constexpr std::chrono::microseconds kSpin{200};

}  // namespace

void EnvPool::TakeShare(std::vector<Job>& jobs, int thread) {
  // Guided scheduling: a share shrinks with the queue, so big shares at the
  // start cost one lock for many cheap (state-only) steps and small ones at
  // the end keep the threads finishing together.
  std::deque<Job>& own = queues_[sync() ? thread : 0];
  if (!own.empty()) {
    const size_t threads = sync() ? 1 : size_t(num_workers_ + 1);
    const size_t share = std::max<size_t>(1, own.size() / (2 * threads));
    for (size_t i = 0; i < share; ++i) {
      jobs.push_back(own.front());
      own.pop_front();
    }
  } else {
    // Steal one job from the far end of the longest queue (its owner works
    // from the front): a stolen env's state moves to this core and back, so
    // move only as many as it takes to finish together.
    auto victim = std::max_element(queues_.begin(), queues_.end(),
                                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
    jobs.push_back(victim->back());
    victim->pop_back();
  }
  queued_.fetch_sub(int(jobs.size()), std::memory_order_relaxed);
}

void EnvPool::RunJobs(std::span<const Job> jobs) {
  // In sync mode completions are counted once per run of jobs into the same
  // buffer: one contended atomic per share rather than per step. In async
  // mode each is published at once (Recv returns the first envs done).
  Buffer* pending = nullptr;
  int count = 0;
  auto publish = [&] {
    if (pending == nullptr) return;
    // The last row of a batch wakes the owner.
    if (pending->written.fetch_add(count, std::memory_order_acq_rel) + count == batch_size_) {
      std::lock_guard lock(mutex_);
      batch_ready_.notify_one();
    }
    pending = nullptr;
    count = 0;
  };
  // Result slots: in sync mode every slot of a batch is in one buffer (row =
  // env id), so a share claims its slots with one atomic add rather than one
  // contended add per step; in async mode each env claims its slot as it is
  // taken up (rows in that order).
  int64_t slot = sync() ? next_slot_.fetch_add(int64_t(jobs.size()), std::memory_order_relaxed) : 0;
  for (const Job& job : jobs) {
    Buffer* buffer = &RunJob(job, sync() ? slot++ : next_slot_.fetch_add(1, std::memory_order_relaxed));
    if (buffer != pending) publish();
    pending = buffer;
    ++count;
    if (!sync()) publish();
  }
  publish();
}

void EnvPool::WorkerLoop(std::stop_token stop, int thread) {
  std::vector<Job> jobs;
  for (;;) {
    jobs.clear();
    SpinFor(kSpin, [&] { return queued_.load(std::memory_order_relaxed) != 0 || stop.stop_requested(); });
    {
      std::unique_lock lock(mutex_);
      if (!work_ready_.wait(lock, stop, [&] { return queued_.load(std::memory_order_relaxed) > 0; })) return;
      TakeShare(jobs, thread);
    }
    RunJobs(jobs);
  }
}

EnvPool::Buffer& EnvPool::RunJob(const Job& job, int64_t slot) {
  const int32_t id = job.env_id;
  Environment& env = *envs_[id];
  // The result row: in sync mode row = env id, written straight into the
  // batch's arrays (a thread's home envs are a contiguous range of rows, so
  // threads share only the lines at the ends of their ranges); in async mode
  // completion order, staged on lines of the row's own (neighbouring rows
  // come from any thread) and gathered by Recv.
  Buffer& buffer = *ring_[(slot / batch_size_) % ring_.size()];
  const int row = sync() ? id : int(slot % batch_size_);
  float* state = nullptr;
  if (state_lines_ > 0) {
    state = sync() ? &buffer.state[size_t(row) * spec_.state_size] : buffer.staged_state[size_t(row) * state_lines_].v;
  }
  ObservationBuffers out{state,
                         spec_.pixel_bytes() ? buffer.pixels.data() + size_t(row) * spec_.pixel_bytes() : nullptr};
  EnvProgress& progress = progress_[id];

  // Step, or reset an env that was asked to or whose episode ended.
  absl::StatusOr<TimeStep> timestep;
  if (job.reset || progress.needs_reset) {
    timestep = env.Reset(out);
    progress.episode_step = 0;
  } else {
    timestep = env.Step(std::span<const float>(&actions_[size_t(id) * spec_.action_size], spec_.action_size), out);
    ++progress.episode_step;
  }
  if (!timestep.ok()) {
    std::lock_guard lock(mutex_);
    if (first_error_.ok()) first_error_ = timestep.status();
    timestep = TimeStep{StepType::kLast, 0.0f, 1.0f};
  }
  progress.needs_reset = timestep->step_type == StepType::kLast;
  if (sync()) {
    buffer.env_id[row] = id;
    buffer.step_type[row] = static_cast<uint8_t>(timestep->step_type);
    buffer.reward[row] = timestep->reward;
    buffer.discount[row] = timestep->discount;
    buffer.episode_step[row] = progress.episode_step;
  } else {
    buffer.rows[row] = RowResult{id, static_cast<uint8_t>(timestep->step_type), timestep->reward, timestep->discount,
                                 progress.episode_step};
  }
  return buffer;
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

absl::StatusOr<EnvBatch> EnvPool::Recv() {
  if (in_flight_count_ < batch_size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Recv: ", in_flight_count_, " envs in flight, fewer than batch_size ", batch_size_));
  }
  // The previously returned buffer is free again.
  if (next_recv_ > 0) ring_[(next_recv_ - 1) % ring_.size()]->written.store(0, std::memory_order_relaxed);
  Buffer& buffer = *ring_[next_recv_ % ring_.size()];
  // The caller works too: it steps queued envs until none are left, then
  // sleeps until the workers finish the batch. (Only the owner enqueues, so
  // no job can arrive while it waits.)
  auto full = [&] { return buffer.written.load(std::memory_order_acquire) == batch_size_; };
  absl::Status error;
  {
    std::unique_lock lock(mutex_);
    while (!full() && queued_.load(std::memory_order_relaxed) > 0) {
      TakeShare(caller_jobs_, /*thread=*/0);
      lock.unlock();
      RunJobs(caller_jobs_);
      caller_jobs_.clear();
      lock.lock();
    }
    if (!full()) {
      // The workers are finishing the last envs: look before sleeping.
      lock.unlock();
      SpinFor(kSpin, full);
      lock.lock();
    }
    batch_ready_.wait(lock, full);
    error = std::exchange(first_error_, absl::OkStatus());
  }
  ++next_recv_;
  // Async mode: gather the staged rows into the batch's arrays.
  for (int i = 0; i < batch_size_ && !sync(); ++i) {
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

absl::StatusOr<EnvBatch> EnvPool::Reset() {
  if (!sync()) return absl::FailedPreconditionError("Reset: sync mode only; use SendReset/Recv");
  RETURN_IF_ERROR(SendReset(all_env_ids_));
  return Recv();
}

absl::StatusOr<EnvBatch> EnvPool::Step(std::span<const float> actions) {
  if (!sync()) return absl::FailedPreconditionError("Step: sync mode only; use Send/Recv");
  RETURN_IF_ERROR(Send(actions, all_env_ids_));
  return Recv();
}

}  // namespace troupe::envs
