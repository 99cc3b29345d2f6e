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
// stepped by one thread at a time, so envs need no locks. Which thread
// steps which env, and when, is a scheduler's (envs/schedulers/); the pool
// picks one of three from its options:
// - sync mode: SyncThreadScheduler, a contiguous range of home envs per
//   thread, taken in chunks, the last ones stolen by idle threads;
// - async mode: AsyncQueueScheduler, env ids in FIFO queues, each result
//   in the next slot of a ring of batch buffers; Recv returns a buffer
//   once it is full;
// - sync mode with env worker processes: SyncProcessScheduler.
// Pixels: one process's llvmpipe rasterizes one scene at a time, so threads
// rendering in it would take turns. With T > 1 threads, envs past the
// caller's home range therefore live in T - 1 env worker processes
// (envs/env_worker.h), which step and render them, a request per batch:
// sync mode has no worker threads (SyncProcessScheduler: the caller's
// thread sends each process its share, steps its own share meanwhile, then
// collects the answers); in async mode env ids wait in a queue per thread,
// and worker thread t hands all of its queue to its process in one request.
// Without processes (pool.render_in_processes off) each worker thread
// renders in this process with a GL context of its own (envs/renderer.h).
#ifndef TROUPE_ENVS_ENV_POOL_H_
#define TROUPE_ENVS_ENV_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/env.h"
#include "envs/env_worker.h"
#include "envs/schedulers/async_queue.h"
#include "envs/schedulers/sync_processes.h"
#include "envs/schedulers/sync_threads.h"

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
  // Sync mode: runs envs [begin, end) of the batch in flight (row = env id).
  void RunSyncJobs(int32_t begin, int32_t end);
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
  // The first error recorded since the last call (OK if none), cleared.
  absl::Status TakeError();

  absl::StatusOr<EnvBatch> RunSyncBatch(bool reset, const float* actions);
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
  std::mutex error_mutex_;
  absl::Status first_error_;           // guarded by error_mutex_
  std::atomic<bool> failed_{false};    // first_error_ is set

  // Thread t's home envs are [home_[t], home_[t + 1]).
  std::vector<int32_t> home_;
  // The sync batch in flight: whether it resets its envs, and its actions
  // (the caller's, valid during Step); read by the threads that step it.
  bool batch_reset_ = false;
  const float* batch_actions_ = nullptr;

  // Sync mode writes ring_[0] in place. Async mode: a ring of buffers, as
  // the scheduler's slots say.
  std::vector<std::unique_ptr<Buffer>> ring_;
  std::vector<float> actions_;         // async: num_envs x action_size, the last action sent to each env
  std::vector<uint8_t> in_flight_;     // async: per env, owner thread only
  int in_flight_count_ = 0;            // owner thread only

  // Thread t >= 1's envs live in [t - 1]. Sync mode: driven by the owner,
  // with no worker threads; async: by worker thread t.
  std::vector<std::unique_ptr<EnvWorker>> env_workers_;
  // The one scheduler the options call for; last, so that their threads
  // are joined before anything they use goes.
  std::unique_ptr<SyncThreadScheduler> sync_threads_;
  std::unique_ptr<SyncProcessScheduler> sync_processes_;
  std::unique_ptr<AsyncQueueScheduler> async_;
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_ENV_POOL_H_
