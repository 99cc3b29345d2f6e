// Videos of episodes, made off the stepping thread: whoever steps the env
// hands the recorder each physics state (a copy of qpos/qvel/act/mocap/time,
// a few hundred bytes), and the recorder's own thread sets them into its own
// mjData, renders them at viewer size on its own EGL context and encodes an
// MP4 (common/video.h). The evaluator records its first episode this way
// (videos/eval-FRAMES.mp4 in the run directory); `troupe view --record` too.
//
// Never blocks the caller beyond a short lock: states wait in a queue of at
// most max_queued_states; a state that finds it full drops its whole video
// (the states of it still queued too; no truncated file is written;
// stats().videos_dropped counts it).
#ifndef TROUPE_ACTORS_EPISODE_RECORDER_H_
#define TROUPE_ACTORS_EPISODE_RECORDER_H_

#include <mujoco/mujoco.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/video.h"
#include "envs/model.h"

namespace troupe::actors {

struct RecorderOptions {
  std::string task;         // e.g. "cartpole.swingup"
  int action_repeat = 1;    // one frame per agent step: frame time = control timestep x action_repeat
  // At most this many frames per simulated second: every k-th state is kept
  // (k the smallest that fits; cartpole's 100 agent steps/s become 25 fps),
  // which bounds the cost of a video. 0: every state.
  double max_fps = 30;
  int width = 480;          // even, at most the model's offscreen buffer (512 for troupe's models)
  int height = 480;
  // Viewer quality (the agent's pixels go without both); each costs frames/s
  // on a CPU rasterizer (docs/running.md, "Videos and reports").
  bool shadows = true;
  bool multisample = false;
  std::string camera;       // "" = the task's pixel camera
  std::string encoder;      // VideoOptions::encoder ("" = the best available)
  size_t max_queued_states = 20000;
  // Tests: runs on the recorder's thread before each frame (a slow encoder).
  std::function<void()> before_frame;
  // Runs on the recorder's thread after each video is written, with its
  // path (the learner makes its TensorBoard frame strip); Flush waits for it.
  std::function<void(const std::string& path)> on_video_written;
};

class EpisodeRecorder {
 public:
  struct Stats {
    int64_t videos_written = 0;
    int64_t videos_dropped = 0;  // the queue was full: the recorder fell behind
    int64_t frames_written = 0;
  };

  // Checks everything a video needs before the first one: the encoder
  // (FindVideoEncoder's NotFound says what to install), the task's model
  // (NotFound listing the tasks), the camera, the size (InvalidArgument).
  // Starts the recorder's thread; the EGL context is made there on the first
  // frame (Unavailable then, from Flush, if no EGL display opens).
  static absl::StatusOr<std::unique_ptr<EpisodeRecorder>> Create(const RecorderOptions& options);
  // Abandons queued videos (their partial files are removed) and joins.
  ~EpisodeRecorder();

  // Starts a video written to `path` (its folder is made): the states
  // recorded until EndVideo are its frames. Ends an unended one first.
  void BeginVideo(const std::string& path);
  // Queues a copy of `data`'s state as the next frame. `data` must be of a
  // model with the task's sizes. Never waits for encoding.
  void Record(const mjData* data);
  // The current video is complete; the recorder writes it when it gets there.
  void EndVideo();
  // Waits until every queued video is written or dropped. Returns the first
  // error since the last Flush (encoder, file or renderer), else OK.
  absl::Status Flush();
  Stats stats() const;
  // Simulated seconds per frame (agent steps per frame x control timestep x action repeat).
  double frame_seconds() const { return frame_seconds_; }
  // States recorded per frame kept.
  int stride() const { return stride_; }

 private:
  struct Item {
    enum class Kind { kBegin, kState, kEnd } kind;
    std::string path;           // kBegin
    std::vector<double> state;  // kState
    bool complete = true;       // kEnd: false if states were dropped
  };
  EpisodeRecorder(const RecorderOptions& options, std::shared_ptr<const envs::Model> model, int camera,
                  double frame_seconds, int stride);
  void Run();
  bool HasWorkOrStop() const ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return stopping_ || !queue_.empty(); }
  bool IdleOrStop() const ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return stopping_ || (queue_.empty() && !busy_); }
  absl::Status RenderState(const std::vector<double>& state, Mp4Writer& writer, mjData* data,
                           std::vector<uint8_t>& rgb);

  const RecorderOptions options_;
  const std::shared_ptr<const envs::Model> model_;
  const int camera_;
  const double frame_seconds_;
  const int stride_;
  mutable absl::Mutex mutex_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mutex_);
  size_t queued_states_ ABSL_GUARDED_BY(mutex_) = 0;
  bool in_video_ ABSL_GUARDED_BY(mutex_) = false;  // between BeginVideo and EndVideo
  int64_t recorded_ ABSL_GUARDED_BY(mutex_) = 0;   // states given to the current video (kept or not)
  bool dropping_ ABSL_GUARDED_BY(mutex_) = false;  // the current video overflowed
  bool busy_ ABSL_GUARDED_BY(mutex_) = false;      // the thread holds an item
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mutex_);
  Stats stats_ ABSL_GUARDED_BY(mutex_);
  std::jthread thread_;  // last: joined before the members it uses go
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_EPISODE_RECORDER_H_
