// A pool's pixel envs stepped in a worker process of their own, a batch at a
// time.
//
// Why: Mesa's llvmpipe rasterizes the scenes of every context of a screen
// one at a time (under the screen's rasterizer lock), and a process gets
// exactly one surfaceless EGL display, hence one screen. Two threads that
// render 84x84 frames therefore take turns. A process of its own has its own
// display and rasterizer, so envs stepped there render in parallel with
// those of the pool's own process.
//
// Why a batch at a time: waking a process that sleeps in the kernel costs a
// sizeable share of an 84x84 render (docs/design.md, "Measured costs"). Handing
// over whole batches (the worker owns its envs: physics, rendering, frame
// stacks, SubprocVecEnv style) pays that once per batch instead of once per
// step.
//
// How: `troupe_env_worker` (env_worker_main.cc) reads the env options from
// shared memory (a memfd mapped by both), makes envs [first, first + count)
// of the pool (seeded as the pool seeds them, EnvPool::SeedFor) and its EGL
// and MuJoCo contexts, and serves requests. A request is a list of jobs
// (env, reset or step) with the envs' actions, in the shared memory; the
// worker runs them in order and writes each env's result (timestep, episode
// step, observation, and its physics state for EnvPool::data) back there.
// One byte over a socketpair each way says "request ready" and "done"; the
// socket also tells each side that the other has gone (EOF), so a killed
// worker is an error at the next request, never a hang.
//
// The results are byte-identical to stepping the same envs in this process:
// same model file, same seeds, same code.
//
// Threading: one EnvWorker serves one thread at a time (the pool gives each
// of its worker threads its own).
#ifndef TROUPE_ENVS_ENV_WORKER_H_
#define TROUPE_ENVS_ENV_WORKER_H_

#include <mujoco/mujoco.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/env.h"

namespace troupe::envs {

class EnvWorker {
 public:
  // A unit of a request: reset or step env `env_id` (a pool index).
  struct Job {
    int32_t env_id;
    bool reset;
  };
  // Env `env_id`'s result of its last job, in the shared memory.
  struct Result {
    TimeStep timestep;
    int32_t episode_step;
    const float* state;     // spec.state_size floats
    const uint8_t* pixels;  // spec.pixel_bytes() bytes (null without pixels)
  };

  // Starts a worker process that makes envs [first, first + count) of a pool
  // with `options` (env i seeded EnvPool::SeedFor(options.seed, i)) and
  // waits until they and its render contexts exist. `spec` and `model` are
  // the pool's, for the sizes the worker's envs must have. The binary is
  // $TROUPE_ENV_WORKER if set, else one beside this binary (a relocated
  // bundle), else the one this build made. Errors:
  // InvalidArgument for a task or camera name too long to pass; Unavailable
  // if the process cannot be started or exits during start-up; the worker's
  // own error if it cannot make its envs (e.g. MuJoCo's message for a bad
  // model file, Unavailable for no EGL display), each naming the worker.
  static absl::StatusOr<std::unique_ptr<EnvWorker>> Start(const EnvOptions& options, const EnvSpec& spec,
                                                          const mjModel* model, int first, int count);
  // Closes the socket (the worker exits on EOF) and reaps the process,
  // killing it if it has not exited within a second.
  ~EnvWorker();
  EnvWorker(const EnvWorker&) = delete;
  EnvWorker& operator=(const EnvWorker&) = delete;

  pid_t pid() const { return pid_; }
  int first() const { return first_; }
  int count() const { return count_; }

  // Runs `jobs` (env ids in [first, first + count), each at most once) in
  // order; the action of env e is actions[e * action_size ...] (pool ids;
  // unread for resets). Every job runs, as EnvPool runs them (AdvanceEnv).
  // Errors: the first error an env returned (its result is then kLast; the
  // others are valid); InvalidArgument for an env id outside the worker's
  // range (nothing runs); Unavailable if the worker has died (naming its
  // pid and how it ended; no result is valid, and every later call fails
  // the same way); DeadlineExceeded if it does not answer within a minute.
  absl::Status Run(std::span<const Job> jobs, const float* actions);
  // Run in two halves, so that one thread can keep several workers busy
  // and work meanwhile: Send hands the jobs over and returns at once (its
  // errors are Run's, found before the worker answers); Wait returns the
  // answer (Run's other errors). After a failed Send, Wait returns at once:
  // the same error if the worker has died, else FailedPrecondition (nothing
  // was sent), as it does when called twice.
  absl::Status Send(std::span<const Job> jobs, const float* actions);
  absl::Status Wait();

  // Env `env_id`'s result of its last job. Valid until the next Run.
  Result result(int32_t env_id) const;

  // Writes env `env_id`'s physics state after its last job (qpos, qvel,
  // act, mocap poses, time) into `data` of the same model. Derived
  // quantities are the caller's (mj_forward).
  void CopyPhysicsState(int32_t env_id, mjData* data) const;

  // Physics blow-ups over the worker's envs, as of the last answer.
  int64_t physics_errors() const { return physics_errors_.load(std::memory_order_relaxed); }

 private:
  EnvWorker(pid_t pid, int socket, void* shared, size_t shared_bytes, std::string task, int first, int count);
  // "env worker (pid P) for TASK envs [first, first + count)", for messages.
  std::string Name() const;
  // After the socket reports EOF or an error: reaps the worker and records why it ended.
  absl::Status WorkerGone(const char* when);

  pid_t pid_;
  int socket_;
  void* shared_;
  size_t shared_bytes_;
  const std::string task_;
  const int first_, count_;
  bool sent_ = false;  // a request awaits Wait
  std::atomic<int64_t> physics_errors_{0};
  absl::Status dead_;  // set once the worker is gone
};

// The worker's side (troupe_env_worker's main): makes the envs the shared
// memory at file descriptor `shared_fd` describes and serves requests on
// the socket `socket_fd` until it closes. Returns the process exit code.
int RunEnvWorker(int shared_fd, int socket_fd);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_ENV_WORKER_H_
