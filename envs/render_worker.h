// Rendering in a worker process, for pools whose threads would otherwise
// queue for one rasterizer.
//
// Why: Mesa's llvmpipe rasterizes the scenes of every context of a screen
// one at a time (under the screen's rasterizer lock), and a process gets
// exactly one surfaceless EGL display, hence one screen. Two threads that
// render 84x84 frames therefore take turns. A process of its own has its own
// display and rasterizer, so a pool thread that hands its renders to a
// worker process renders in parallel with the others.
//
// How: `troupe_render_worker` (render_worker_main.cc) loads the same MJCF
// model, makes its EGL and MuJoCo contexts, and serves requests. A request
// is the state that positions the scene (qpos, mocap poses) and the camera
// and render options, written into shared memory (a memfd mapped by both);
// the worker runs MuJoCo's position stage (mj_fwdPosition) on its own
// mjData, renders with RenderPixels, and writes the pixels back into the
// shared memory. One byte over a socketpair each way says "request ready" and
// "done"; the socket also tells each side that the other has gone (EOF), so
// a killed worker is an error at the next render, never a hang.
//
// The images are byte-identical to rendering in this process: the worker
// computes the same poses from the same qpos with the same model.
//
// Threading: one RenderWorker serves one thread at a time (the pool gives
// each of its worker threads its own).
#ifndef TROUPE_ENVS_RENDER_WORKER_H_
#define TROUPE_ENVS_RENDER_WORKER_H_

#include <mujoco/mujoco.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/model.h"
#include "envs/renderer.h"

namespace troupe::envs {

class RenderWorker {
 public:
  // Starts a worker process for `model` (loaded from model->path() with the
  // same `multisample`) and waits until it has made its contexts. The
  // worker binary is $TROUPE_RENDER_WORKER if set, else the one this build
  // made. Errors: Unavailable if it cannot be started or exits during
  // start-up (with its message, e.g. no EGL display).
  static absl::StatusOr<std::unique_ptr<RenderWorker>> Start(std::shared_ptr<const Model> model, bool multisample);
  // Closes the socket (the worker exits on EOF) and reaps the process,
  // killing it if it has not exited within a second.
  ~RenderWorker();
  RenderWorker(const RenderWorker&) = delete;
  RenderWorker& operator=(const RenderWorker&) = delete;

  uint64_t model_id() const { return model_->id(); }
  pid_t pid() const { return pid_; }

  // RenderPixels' contract, done by the worker. The worker computes the
  // poses from data->qpos and the mocap poses, so they must be current (as
  // after mj_forward or mj_step1, which is how the envs leave their data).
  // Errors: RenderPixels' own
  // (from the worker, same messages); Unavailable if the worker has died
  // (naming its pid and how it ended); every later call fails the same way.
  absl::Status Render(const mjData* data, int camera_id, const RenderOptions& options, uint8_t* out);

 private:
  RenderWorker(std::shared_ptr<const Model> model, pid_t pid, int socket, void* shared, size_t shared_bytes);
  // After the socket reports EOF or an error: reaps the worker and records why it ended.
  absl::Status WorkerGone(const char* when);

  std::shared_ptr<const Model> model_;
  pid_t pid_;
  int socket_;
  void* shared_;
  size_t shared_bytes_;
  absl::Status dead_;  // set once the worker is gone
};

// The worker's side (troupe_render_worker's main): serves requests on the
// shared memory at file descriptor `shared_fd` and the socket `socket_fd`
// until the socket closes. Returns the process exit code.
int RunRenderWorker(const std::string& model_path, bool multisample, int shared_fd, int socket_fd);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_RENDER_WORKER_H_
