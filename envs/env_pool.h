// A batched env pool after EnvPool (Weng et al. 2022): B envs of one task
// stepped by T worker threads, results written straight into preallocated
// batch buffers.
//
// Sync use:   Reset(); loop { Step(actions for all B) ; read batch }.
// Async use:  Send(actions, env_ids); Recv() returns the first `batch_size`
//             envs that finish, in completion order, while the others run.
// An env whose episode ended is reset by the next action sent to it (the
// action is ignored and the result is its kFirst timestep).
//
// Threading: Reset/Step/Send/Recv are called from one thread (the owner).
// T threads step envs: T - 1 workers and the owner itself, which takes jobs
// while it waits (no hand-off latency, no oversubscription). Each env is
// stepped by one thread at a time, so envs need no locks.
// - Sync mode: thread t has a contiguous range of home envs, whose state
//   stays in its core's cache from step to step. A batch is published by
//   setting every thread's range of envs still to take (one atomic word:
//   front and back) and bumping an epoch the workers spin (then sleep) on.
//   A thread takes chunks from the front of its own range and, once that is
//   empty, single envs from the back of the fullest other one. Finished envs
//   are counted with one atomic add per chunk; the owner spins, then sleeps,
//   until all are done. No lock and, while batches follow each other within
//   the spin time, no system call: a batch of cheap state envs is over in
//   tens of microseconds.
// - Async mode: env ids wait in one mutex-guarded FIFO, so no env waits
//   behind a thread that is slow to run; each result claims the next slot
//   of a ring of batch buffers and Recv returns a buffer once it is full.
// Pixels: one process's llvmpipe rasterizes one scene at a time, so threads
// rendering in it would take turns. With T > 1 threads, envs past the
// caller's home range therefore live in T - 1 env worker processes
// (envs/env_worker.h), which step and render them, a request per batch:
// - sync mode has no worker threads: the caller's thread sends each worker
//   its share, steps its own share meanwhile, then collects the answers;
// - async mode: env ids wait in a queue per thread, and worker thread t
//   hands all of its queue to its worker process in one request.
// Without processes (pool.render_in_processes off) each worker thread
// renders in this process with a GL context of its own (envs/renderer.h).
#ifndef TROUPE_ENVS_ENV_POOL_H_
#define TROUPE_ENVS_ENV_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/env.h"
#include "envs/env_worker.h"

namespace troupe::envs {

struct EnvPoolOptions {
  static constexpr int kMaxEnvs = 4096;
  EnvOptions env;
  int num_envs = 1;
  int num_threads = 0;  // 0: one per available core, at most num_envs
  int batch_size = 0;   // 0: num_envs (sync). Async: 1..num_envs
  // Pixels with several threads: the envs of each worker thread (not the
  // caller's) are stepped and rendered in a process of its own
  // (envs/env_worker.h).
  bool render_in_processes = true;
  static absl::StatusOr<EnvPoolOptions> FromConfig(const config::EnvConfig& env, const config::EnvPoolConfig& pool);
  absl::Status Validate() const;
};

// One batch of results; valid until the next Recv/Step/Reset. Row i is env
// env_id[i]; in sync mode row i is env i.
struct EnvBatch {
  int size = 0;
  std::span<const int32_t> env_id;
  std::span<const uint8_t> step_type;  // StepType values
  std::span<const float> reward;
  std::span<const float> discount;
  std::span<const float> state;        // size x state_size
  std::span<const uint8_t> pixels;     // size x pixel_bytes (empty without pixels)
  std::span<const int32_t> episode_step;  // agent steps since the episode's reset (0 on kFirst)
};

class EnvPool {
 public:
  // Makes every env (the model is loaded once and shared) and starts the
  // workers. Errors: the options' Validate(), env creation errors.
  static absl::StatusOr<std::unique_ptr<EnvPool>> Create(const EnvPoolOptions& options);
  ~EnvPool();  // stops and joins the workers

  const EnvSpec& spec() const { return spec_; }
  int num_envs() const { return num_envs_; }
  int batch_size() const { return batch_size_; }

  // The seed of env `index` in a pool seeded with `base` (so a lone env can
  // reproduce any pool member).
  static uint64_t SeedFor(uint64_t base, int index) { return base + uint64_t(index) * 0x9E3779B97F4A7C15ull; }
  // Threads (or, with env workers, processes) that step envs: the workers
  // and the caller's own thread.
  int num_threads() const { return num_workers_ + 1; }

  // Sync mode only (batch_size == num_envs): resets every env / steps every
  // env with actions (num_envs x action_size, row i for env i) and blocks
  // until all are done. Errors: FailedPrecondition in async mode;
  // InvalidArgument, before any env steps, for a wrong size or a NaN/inf
  // action (naming env and index); the first error an env returned
  // (Internal/InvalidArgument with the task).
  absl::StatusOr<EnvBatch> Reset();
  absl::StatusOr<EnvBatch> Step(std::span<const float> actions);

  // Async mode only. Queues one action row per env id (env_ids.size() x
  // action_size) and returns at once. Errors (nothing is queued):
  // FailedPrecondition in sync mode; InvalidArgument for a wrong size, an
  // env id out of range, repeated or already in flight, a NaN/inf action
  // (naming env and index).
  absl::Status Send(std::span<const float> actions, std::span<const int32_t> env_ids);
  // Queues a reset of each env id.
  absl::Status SendReset(std::span<const int32_t> env_ids);

  // Async mode only. Blocks until batch_size results are ready and returns
  // them. Errors: FailedPrecondition in sync mode or if fewer than
  // batch_size envs are in flight; the first error an env returned.
  absl::StatusOr<EnvBatch> Recv();

  // The task's model and task (e.g. for a controller).
  const mjModel* model() const { return model_->get(); }
  const Task& task() const { return envs_[0]->task(); }
  // Env `index`'s physics as of its last step, read-only (e.g. for a
  // controller or a viewer). For an env in a worker process, a copy of its
  // state (qpos, qvel, act, mocap poses, time) with mj_forward run on it.
  // Valid until the next call for this env or the next batch; only while
  // that env is not in flight.
  const mjData* data(int index);

  // Physics blow-ups over all envs (episodes ended early).
  int64_t physics_errors() const;

  // The env worker processes, one per thread but the caller's (empty
  // without pixels, with one thread, or with render_in_processes off).
  std::vector<pid_t> worker_pids() const;

 private:
  using Job = EnvWorker::Job;
  // Async mode: a row's small results as a thread writes them, on cache
  // lines of its own: rows are in completion order, so neighbouring rows
  // come from different threads (a cheap state step takes a microsecond or
  // two) and would pass the lines of the arrays below back and forth on
  // every step. Recv gathers a full buffer's rows. (Sync mode writes the
  // arrays directly: row = env id, and each thread steps a range of them.)
  struct alignas(64) RowResult {
    int32_t env_id;
    uint8_t step_type;
    float reward, discount;
    int32_t episode_step;
  };
  struct alignas(64) StateLine {
    float v[16];
  };
  // Per env, touched by whichever thread steps it; padded for the same reason.
  struct alignas(64) EnvProgress {
    EpisodeProgress progress;
  };
  // One batch of results (sync mode: the one buffer; async: a ring slot).
  struct Buffer {
    std::vector<int32_t> env_id;
    std::vector<uint8_t> step_type;
    std::vector<float> reward, discount, state;
    std::vector<uint8_t> pixels;  // written in place by the threads (a row is many lines)
    std::vector<int32_t> episode_step;
    std::vector<RowResult> rows;          // async: batch_size
    std::vector<StateLine> staged_state;  // async: batch_size x state_lines_
    std::atomic<int> written{0};          // async: rows written
  };
  // Sync mode: the ids of a thread's home range not yet taken in the batch
  // in flight, [front, back), in one word (front in the low half) so the
  // owner of the range (from the front) and a thief (from the back) claim
  // ids with one compare-and-swap each.
  struct alignas(64) Range {
    std::atomic<uint64_t> bounds{0};
  };
  // Async mode: env ids waiting for a thread.
  struct alignas(64) Queue {
    std::deque<Job> jobs;          // guarded by mutex_
    std::atomic<int> queued{0};    // jobs.size(), written under mutex_, read by spinning workers
  };
  struct DataDeleter {
    void operator()(mjData* data) const { mj_deleteData(data); }
  };

  explicit EnvPool(const EnvPoolOptions& options);
  bool sync() const { return batch_size_ == num_envs_; }
  // Size (rows x action_size) and finiteness of actions; row i is for env
  // env_ids[i], or env i when env_ids is empty.
  absl::Status CheckActions(std::span<const float> actions, size_t rows, std::span<const int32_t> env_ids) const;
  // Steps (or, with `reset` or an ended episode, resets) env `id` of this
  // process with `action` into row `row` of `buffer`.
  void RunJob(int32_t id, bool reset, const float* action, Buffer& buffer, int row);
  // Copies env `id`'s result of its last job in `worker` into row `row` of
  // `buffer`. (After a failed EnvWorker::Run the rows are still written, an
  // env's error row is kLast and a dead worker's are stale, and the batch
  // returns the error.)
  void CopyWorkerResult(const EnvWorker& worker, int32_t id, Buffer& buffer, int row);
  // Where row `row` of `buffer` keeps its observation.
  ObservationBuffers RowOutputs(Buffer& buffer, int row);
  void WriteRow(Buffer& buffer, int row, int32_t id, const TimeStep& timestep, int32_t episode_step);
  // The env worker of thread `thread` (null for the caller's, or without processes).
  EnvWorker* WorkerOf(int thread) const {
    return thread > 0 && !env_workers_.empty() ? env_workers_[thread - 1].get() : nullptr;
  }
  // The thread whose home range holds env `id`.
  int HomeThread(int32_t id) const;
  void RecordError(const absl::Status& status);

  // Sync mode.
  absl::StatusOr<EnvBatch> RunSyncBatch(bool reset, const float* actions);
  void RunSyncBatchInThreads(bool reset, const float* actions);
  void RunSyncBatchInWorkers(bool reset, const float* actions);
  void SyncWorkerLoop(std::stop_token stop, int thread);
  // Takes and runs envs of the batch in flight until none are left to take.
  void RunSyncJobs(int thread);
  // A chunk [begin, end) from the front of `thread`'s own range, or one env
  // from the back of the fullest other range; false when all are taken.
  bool TakeSyncJobs(int thread, int32_t& begin, int32_t& end);

  // Async mode.
  void AsyncWorkerLoop(std::stop_token stop, int thread);
  // The queue thread `thread` takes from / env `id` waits in.
  Queue& QueueOfThread(int thread) { return queues_[queues_.size() == 1 ? 0 : thread]; }
  Queue& QueueOfEnv(int32_t id) { return queues_[queues_.size() == 1 ? 0 : HomeThread(id)]; }
  // Moves a share of the queue's front into `jobs`. mutex_ held.
  void TakeShare(Queue& queue, std::vector<Job>& jobs);
  // Runs thread `thread`'s jobs, each into the next result slot, publishing
  // each as soon as it is written.
  void RunAsyncJobs(int thread, std::span<const Job> jobs);
  absl::Status Enqueue(std::span<const float> actions, std::span<const int32_t> env_ids, bool reset);
  EnvBatch View(Buffer& buffer) const;

  const int num_envs_;
  const int batch_size_;
  EnvSpec spec_;
  std::shared_ptr<const Model> model_;
  std::vector<std::unique_ptr<Environment>> envs_;  // by id; null for an env in a worker process
  std::vector<std::unique_ptr<mjData, DataDeleter>> mirrors_;  // by id: data() of envs in worker processes
  std::vector<EnvProgress> progress_;  // per env (touched by its thread only while in flight)
  int state_lines_ = 0;                // StateLines per row
  int num_workers_ = 0;                // set before the workers start
  // std::mutex rather than absl::Mutex on purpose (see engine/nn/thread_pool.h:
  // ThreadSanitizer, which this pool's lock-free paths rely on, sees it).
  std::mutex mutex_;
  absl::Status first_error_;           // guarded by mutex_
  std::atomic<bool> failed_{false};    // first_error_ is set

  // Thread t's home envs are [home_[t], home_[t + 1]).
  std::vector<int32_t> home_;
  std::vector<Range> ranges_;          // per thread
  bool batch_reset_ = false;           // the batch in flight resets its envs
  const float* batch_actions_ = nullptr;  // its actions (the caller's, valid during Step)
  alignas(64) std::atomic<uint32_t> epoch_{0};  // bumped by the owner to start a batch
  std::atomic<int> sleeping_workers_{0};        // workers waiting on epoch_ in the kernel
  alignas(64) std::atomic<int> done_{0};        // envs of the batch in flight finished
  std::atomic<bool> owner_sleeping_{false};     // the owner waits on done_ in the kernel

  // Async mode. Results: a ring of buffers; slot k of the stream is buffer
  // (k / batch_size) % ring, row k % batch_size.
  std::vector<std::unique_ptr<Buffer>> ring_;
  std::atomic<int64_t> next_slot_{0};
  int64_t next_recv_ = 0;              // index of the next buffer Recv returns (owner thread only)
  std::vector<float> actions_;         // num_envs x action_size, the last action sent to each env
  std::vector<uint8_t> in_flight_;     // per env, owner thread only
  int in_flight_count_ = 0;            // owner thread only
  std::vector<Queue> queues_;          // one for all threads; or, with env workers, one per thread
  std::condition_variable_any work_ready_;  // workers wait for jobs (or a stop request)
  std::condition_variable batch_ready_;     // Recv waits for a full buffer
  std::vector<Job> caller_jobs_;       // the owner's share inside Recv

  // Thread t >= 1's envs live in [t - 1]. Sync mode: driven by the owner,
  // with no worker threads; async: by worker thread t.
  std::vector<std::unique_ptr<EnvWorker>> env_workers_;
  std::vector<Job> worker_jobs_;       // sync mode: a worker's jobs, owner thread only
  std::vector<std::jthread> workers_;
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_ENV_POOL_H_
