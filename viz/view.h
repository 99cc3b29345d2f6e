// `troupe view`: from the command line's request to a running viewer.
// PlanView checks the request (no display needed, so argument and run
// directory errors come first); RunView opens the window and runs it.
#ifndef TROUPE_VIZ_VIEW_H_
#define TROUPE_VIZ_VIEW_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "envs/env.h"
#include "proto/config.pb.h"
#include "viz/sources/interface.h"
#include "viz/viewer.h"

namespace troupe::viz {

struct ViewRequest {
  std::string run_dir;     // troupe view RUN_DIR
  std::string checkpoint;  // --checkpoint PATH (with RUN_DIR)
  std::string live;        // --live HOST:PORT
  config::SecurityConfig security;  // --live: TLS and the token (--certs, --token-file, --insecure)
  std::string task;        // --task TASK (no run directory)
  std::string policy;      // --policy controller|zero|random; "" = the mode's default
  uint64_t seed = 0;
  int width = 1280;
  int height = 720;
  bool paused = false;
  double speed = 1;
  std::string screenshot_dir = ".";
  // > 0: quit after this many wall seconds, first saving a screenshot to
  // `final_screenshot` if set (the pictures in docs/, smoke checks).
  double quit_after_seconds = 0;
  std::string final_screenshot;
  // --record FILE.mp4: no window; the first `record_episodes` episodes the
  // viewer would show are rendered offscreen at width x height (even, at most
  // the model's 512x512 offscreen buffer) into one MP4 (H.264; at most 30
  // frames per simulated second, as evaluation videos), then it exits.
  std::string record;
  int record_episodes = 1;
  // --strip FILE.png (with --record): `strip_frames` frames of the video,
  // evenly spaced from its first to its last, side by side in one PNG.
  std::string strip;
  int strip_frames = 6;
};

struct ViewPlan {
  enum class Mode { kScripted, kCheckpoint, kLive, kGan };
  Mode mode = Mode::kScripted;
  envs::EnvOptions env;
  std::string policy = "controller";  // kScripted
  std::string checkpoint;             // kCheckpoint
  std::string live_address;           // kLive
  config::SecurityConfig security;    // kLive: how to reach it
  std::string run_dir;                // "" for --task and --live
  config::ExperimentConfig config;    // the run's (kCheckpoint; empty otherwise)
  std::vector<CurveFile> curves;      // the run's metrics files
};

// A run directory whose config has mode GAN plans kGan (its samples and
// FID curve; --checkpoint and --policy do not apply: InvalidArgument).
// Errors: InvalidArgument for a request that names no source or several,
// a malformed HOST:PORT, an unknown policy; OpenRunDirectory's and
// ChooseCheckpoint's errors (each naming the directory and what is missing);
// EnvOptions::Validate's (an unknown task lists the known ones).
absl::StatusOr<ViewPlan> PlanView(const ViewRequest& request);

// The episodes `plan` shows. Scripted: a local env and a ScriptedPolicy.
// Checkpoint: a local env and the checkpoint's policy (CheckpointPolicy::Load's
// errors: a checkpoint of another task or architecture names what differs).
// kGan: FailedPrecondition (a GAN run has no episodes; RunView shows it).
// Live: the evaluator's episode stream (LoadGrpcCredentials' errors for
// plan.security; LiveEpisodes::Create's: Unavailable naming the address when
// nothing answers, FailedPrecondition beyond loopback without TLS).
absl::StatusOr<std::unique_ptr<EpisodeSource>> MakeSource(const ViewPlan& plan);

// Plans, checks the display, opens the window and runs until it closes.
// With request.record, RecordView instead.
absl::Status RunView(const ViewRequest& request);

// `troupe view ... --record FILE.mp4 --episodes N`: needs no display.
// Returns the video's frames. Errors: PlanView's and MakeSource's;
// InvalidArgument for --live or a GAN run (nothing to re-render locally:
// record the learner's own videos/ instead), N < 1 or a size the model
// cannot render; EpisodeRecorder's (no encoder: NotFound saying what to
// install); the source's and encoder's errors.
absl::StatusOr<int64_t> RecordView(const ViewRequest& request);

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_VIEW_H_
