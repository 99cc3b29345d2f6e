#include "envs/env_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

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

  if (p.sync()) {
    p.ranges_ = std::vector<Range>(threads);
  } else {
    p.actions_.assign(size_t(p.num_envs_) * p.spec_.action_size, 0.0f);
    p.in_flight_.assign(p.num_envs_, 0);
    p.queues_ = std::vector<Queue>(in_processes ? threads : 1);
  }
  // Worker threads (none in sync mode with env workers: the caller's thread
  // hands them their shares itself); a thread that renders here makes its
  // GL context before the first job.
  for (int t = 1; t < (p.sync() && in_processes ? 1 : threads); ++t) {
    const bool renders_here = options.env.pixels && !in_processes;
    p.workers_.emplace_back([&p, renders_here, t](std::stop_token stop) {
      // A failure resurfaces at the first render.
      if (renders_here) (void)PrepareRenderer(p.model_);
      if (p.sync()) {
        p.SyncWorkerLoop(stop, t);
      } else {
        p.AsyncWorkerLoop(stop, t);
      }
    });
  }
  return pool;
}

EnvPool::~EnvPool() {
  for (auto& worker : workers_) worker.request_stop();
  // Sync workers sleep on the epoch rather than on a condition variable.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  workers_.clear();  // joins
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

namespace {

// Spins (with the CPU's pause hint) until `done()` or `budget` has passed;
// returns done(). A batch of cheap envs is over in tens of microseconds,
// sooner than a wake-up from the kernel, so both sides of a hand-off look
// before they sleep.
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

uint64_t PackRange(uint32_t front, uint32_t back) { return uint64_t(back) << 32 | front; }
uint32_t Front(uint64_t bounds) { return uint32_t(bounds); }
uint32_t Back(uint64_t bounds) { return uint32_t(bounds >> 32); }

}  // namespace

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
  std::lock_guard lock(mutex_);
  if (first_error_.ok()) first_error_ = status;
  failed_.store(true, std::memory_order_release);
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
  if (!env_workers_.empty()) {
    RunSyncBatchInWorkers(reset, actions);
  } else {
    RunSyncBatchInThreads(reset, actions);
  }
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    failed_.store(false, std::memory_order_relaxed);
    return std::exchange(first_error_, absl::OkStatus());
  }
  return View(*ring_[0]);
}

void EnvPool::RunSyncBatchInWorkers(bool reset, const float* actions) {
  // Every worker gets its share at once; this thread steps its own
  // meanwhile, then collects the answers. No worker threads: one hand-off
  // per worker and batch.
  // (A worker whose Send failed fails its Wait with the same error, at once.)
  Buffer& buffer = *ring_[0];
  for (const auto& worker : env_workers_) {
    worker_jobs_.clear();
    for (int32_t id = worker->first(); id < worker->first() + worker->count(); ++id) worker_jobs_.push_back({id, reset});
    if (const absl::Status status = worker->Send(worker_jobs_, actions); !status.ok()) RecordError(status);
  }
  const int action_size = spec_.action_size;
  for (int32_t id = home_[0]; id < home_[1]; ++id) {
    RunJob(id, reset, actions == nullptr ? nullptr : actions + size_t(id) * action_size, buffer, id);
  }
  for (const auto& worker : env_workers_) {
    if (const absl::Status status = worker->Wait(); !status.ok()) RecordError(status);
    for (int32_t id = worker->first(); id < worker->first() + worker->count(); ++id) {
      CopyWorkerResult(*worker, id, buffer, id);
    }
  }
}

void EnvPool::RunSyncBatchInThreads(bool reset, const float* actions) {
  // Publish the batch: its inputs, then every range (release: a thread that
  // claims an id sees the inputs), then the epoch the workers wait on.
  batch_reset_ = reset;
  batch_actions_ = actions;
  done_.store(0, std::memory_order_relaxed);
  for (size_t t = 0; t < ranges_.size(); ++t) {
    ranges_[t].bounds.store(PackRange(home_[t], home_[t + 1]), std::memory_order_release);
  }
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();

  RunSyncJobs(/*thread=*/0);
  // The workers are finishing the last envs: look before sleeping. (Either
  // the owner's load after announcing its sleep sees the last count, or the
  // last thread's load of owner_sleeping_ sees it asleep; both seq_cst.)
  auto all_done = [&] { return done_.load(std::memory_order_acquire) == num_envs_; };
  if (!SpinFor(kSpin, all_done)) {
    owner_sleeping_.store(true, std::memory_order_seq_cst);
    for (int d; (d = done_.load(std::memory_order_seq_cst)) != num_envs_;) done_.wait(d, std::memory_order_seq_cst);
    owner_sleeping_.store(false, std::memory_order_relaxed);
  }
}

bool EnvPool::TakeSyncJobs(int thread, int32_t& begin, int32_t& end) {
  // Own range, from the front, in chunks that shrink with what is left: big
  // ones cost one atomic for many cheap steps, small ones at the end keep
  // the threads finishing together.
  std::atomic<uint64_t>& own = ranges_[thread].bounds;
  uint64_t bounds = own.load(std::memory_order_acquire);
  while (Front(bounds) < Back(bounds)) {
    const uint32_t chunk = std::max(1u, (Back(bounds) - Front(bounds)) / 4);
    if (own.compare_exchange_weak(bounds, PackRange(Front(bounds) + chunk, Back(bounds)), std::memory_order_acq_rel)) {
      begin = int32_t(Front(bounds));
      end = begin + int32_t(chunk);
      return true;
    }
  }
  // Steal one env from the back of the fullest other range (its owner works
  // from the front): a stolen env's state moves to this core and back, so
  // move only as many as it takes to finish together.
  for (;;) {
    int victim = -1;
    uint32_t most = 0;
    for (size_t t = 0; t < ranges_.size(); ++t) {
      const uint64_t b = ranges_[t].bounds.load(std::memory_order_relaxed);
      if (Back(b) - Front(b) > most) {
        most = Back(b) - Front(b);
        victim = int(t);
      }
    }
    if (victim < 0) return false;
    std::atomic<uint64_t>& range = ranges_[victim].bounds;
    bounds = range.load(std::memory_order_acquire);
    if (Front(bounds) < Back(bounds) &&
        range.compare_exchange_strong(bounds, PackRange(Front(bounds), Back(bounds) - 1), std::memory_order_acq_rel)) {
      end = int32_t(Back(bounds));
      begin = end - 1;
      return true;
    }
  }
}

void EnvPool::RunSyncJobs(int thread) {
  Buffer& buffer = *ring_[0];
  const int action_size = spec_.action_size;
  int32_t begin, end;
  while (TakeSyncJobs(thread, begin, end)) {
    for (int32_t id = begin; id < end; ++id) {
      RunJob(id, batch_reset_, batch_actions_ == nullptr ? nullptr : batch_actions_ + size_t(id) * action_size,
             buffer, id);
    }
    // One atomic add per chunk; the last one wakes a sleeping owner.
    const int count = end - begin;
    if (done_.fetch_add(count, std::memory_order_seq_cst) + count == num_envs_ &&
        owner_sleeping_.load(std::memory_order_seq_cst)) {
      done_.notify_one();
    }
  }
}

void EnvPool::SyncWorkerLoop(std::stop_token stop, int thread) {
  uint32_t seen = 0;  // the epoch before the first batch
  for (;;) {
    auto next_batch = [&] { return epoch_.load(std::memory_order_acquire) != seen || stop.stop_requested(); };
    if (!SpinFor(kSpin, next_batch)) {
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      while (!stop.stop_requested() && epoch_.load(std::memory_order_seq_cst) == seen) {
        epoch_.wait(seen, std::memory_order_seq_cst);
      }
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop.stop_requested()) return;
    seen = epoch_.load(std::memory_order_acquire);
    RunSyncJobs(thread);
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
  {
    std::lock_guard lock(mutex_);
    for (int32_t id : env_ids) {
      Queue& queue = QueueOfEnv(id);
      queue.jobs.push_back({id, reset});
      queue.queued.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // With one queue any worker will do; with a queue per thread, only its own.
  if (env_ids.size() == 1 && queues_.size() == 1) {
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

void EnvPool::TakeShare(Queue& queue, std::vector<Job>& jobs) {
  // A share shrinks with the queue: big ones cost one lock for many cheap
  // steps, small ones at the end keep the threads finishing together. A
  // queue of its own goes to its thread whole (one request to its worker).
  const size_t share = queues_.size() > 1 ? queue.jobs.size()
                                          : std::max<size_t>(1, queue.jobs.size() / (2 * size_t(num_workers_ + 1)));
  for (size_t i = 0; i < share; ++i) {
    jobs.push_back(queue.jobs.front());
    queue.jobs.pop_front();
  }
  queue.queued.fetch_sub(int(share), std::memory_order_relaxed);
}

void EnvPool::RunAsyncJobs(int thread, std::span<const Job> jobs) {
  EnvWorker* worker = WorkerOf(thread);
  if (worker) {
    if (auto status = worker->Run(jobs, actions_.data()); !status.ok()) RecordError(status);
  }
  // Each env claims its result slot as it is taken up (rows in that order)
  // and is published at once: Recv returns the first envs done. A slot's
  // row was last written a ring ago, by any thread; the claims' chain of
  // acq_rel adds orders this write after that one and after the Recv that
  // returned it (some claim before this one is of a job sent after it).
  for (const Job& job : jobs) {
    const int64_t slot = next_slot_.fetch_add(1, std::memory_order_acq_rel);
    Buffer& buffer = *ring_[(slot / batch_size_) % ring_.size()];
    const int row = int(slot % batch_size_);
    if (worker) {
      CopyWorkerResult(*worker, job.env_id, buffer, row);
    } else {
      RunJob(job.env_id, job.reset, &actions_[size_t(job.env_id) * spec_.action_size], buffer, row);
    }
    // The last row of a batch wakes the owner.
    if (buffer.written.fetch_add(1, std::memory_order_acq_rel) + 1 == batch_size_) {
      std::lock_guard lock(mutex_);
      batch_ready_.notify_one();
    }
  }
}

void EnvPool::AsyncWorkerLoop(std::stop_token stop, int thread) {
  Queue& queue = QueueOfThread(thread);
  std::vector<Job> jobs;
  for (;;) {
    jobs.clear();
    SpinFor(kSpin, [&] { return queue.queued.load(std::memory_order_relaxed) != 0 || stop.stop_requested(); });
    {
      std::unique_lock lock(mutex_);
      if (!work_ready_.wait(lock, stop, [&] { return queue.queued.load(std::memory_order_relaxed) > 0; })) return;
      TakeShare(queue, jobs);
    }
    RunAsyncJobs(thread, jobs);
  }
}

absl::StatusOr<EnvBatch> EnvPool::Recv() {
  if (sync()) return absl::FailedPreconditionError("Recv: async mode only (pool.batch_size < num_envs); use Step");
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
    Queue& own = QueueOfThread(0);
    while (!full() && own.queued.load(std::memory_order_relaxed) > 0) {
      TakeShare(own, caller_jobs_);
      lock.unlock();
      RunAsyncJobs(/*thread=*/0, caller_jobs_);
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
    failed_.store(false, std::memory_order_relaxed);
  }
  ++next_recv_;
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
