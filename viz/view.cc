#include "viz/view.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "actors/episode_recorder.h"
#include "common/grpc_security.h"
#include "common/image.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "common/video.h"
#include "viz/policies/checkpoint.h"
#include "viz/policies/scripted.h"
#include "viz/run_directory.h"
#include "viz/sources/live.h"
#include "viz/sources/policy_episodes.h"

namespace troupe::viz {
namespace {

// "HOST:PORT" with a port in 1..65535.
absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--live '", address, "' is not HOST:PORT (e.g. 127.0.0.1:7070, the evaluator's address)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ViewPlan> PlanView(const ViewRequest& request) {
  const int sources = !request.run_dir.empty() + !request.live.empty() + !request.task.empty();
  if (sources != 1) {
    return absl::InvalidArgumentError(
        sources == 0 ? "troupe view: give a run directory (troupe view runs/NAME-DATE-TIME), --task TASK "
                       "(e.g. --task cartpole.swingup) or --live HOST:PORT"
                     : "troupe view: give only one of a run directory, --task and --live");
  }
  if (!request.checkpoint.empty() && request.run_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint goes with a run directory: troupe view RUN_DIR --checkpoint PATH");
  }
  if (!request.policy.empty()) RETURN_IF_ERROR(actors::ParseScriptedPolicyKind(request.policy, "--policy").status());
  ViewPlan plan;

  // --live: the evaluator's stream.
  if (!request.live.empty()) {
    RETURN_IF_ERROR(CheckAddress(request.live));
    plan.mode = ViewPlan::Mode::kLive;
    plan.live_address = request.live;
    plan.security = request.security;
    return plan;
  }

  // --task: a local env and a scripted policy.
  if (!request.task.empty()) {
    plan.env.task = request.task;
    plan.env.seed = request.seed;
    RETURN_IF_ERROR(plan.env.Validate());
    if (!request.policy.empty()) plan.policy = request.policy;
    return plan;
  }

  // RUN_DIR: its task and wrappers from its config, its metrics files, and
  // its checkpoint unless a scripted policy was asked for.
  ASSIGN_OR_RETURN(RunDirectory run, OpenRunDirectory(request.run_dir));
  plan.run_dir = run.path;
  // A GAN run: its sample grids and FID curve, no env.
  if (run.config.mode() == config::ExperimentConfig::GAN) {
    if (!request.checkpoint.empty() || !request.policy.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          run.path, " is a GAN run (mode GAN): troupe view shows its samples and FID curve; "
                    "--checkpoint and --policy are for RL runs"));
    }
    plan.mode = ViewPlan::Mode::kGan;
    return plan;
  }
  ASSIGN_OR_RETURN(plan.env, envs::EnvOptions::FromConfig(run.config.env()));
  plan.env.seed = request.seed;
  namespace fs = std::filesystem;
  plan.curves.emplace_back(RunLayout(run.path).episodes_csv(), "frames", "return", "episodes");
  plan.curves.emplace_back(RunLayout(run.path).eval_csv(), "frames", "eval_return", "eval");
  if (!request.policy.empty()) {
    plan.policy = request.policy;
    return plan;
  }
  ASSIGN_OR_RETURN(plan.checkpoint, ChooseCheckpoint(run, request.checkpoint));
  plan.mode = ViewPlan::Mode::kCheckpoint;
  plan.config = run.config;
  return plan;
}

absl::StatusOr<std::unique_ptr<EpisodeSource>> MakeSource(const ViewPlan& plan) {
  switch (plan.mode) {
    case ViewPlan::Mode::kScripted: {
      ASSIGN_OR_RETURN(ScriptedKind kind, actors::ParseScriptedPolicyKind(plan.policy, "--policy"));
      ASSIGN_OR_RETURN(auto source,
                       PolicyEpisodes::Create(plan.env, std::make_unique<ScriptedPolicy>(kind, plan.env.seed)));
      return std::unique_ptr<EpisodeSource>(std::move(source));
    }
    case ViewPlan::Mode::kCheckpoint: {
      ASSIGN_OR_RETURN(auto policy, CheckpointPolicy::Load(plan.config, plan.checkpoint));
      ASSIGN_OR_RETURN(auto source, PolicyEpisodes::Create(plan.env, std::move(policy)));
      return std::unique_ptr<EpisodeSource>(std::move(source));
    }
    case ViewPlan::Mode::kGan:
      return absl::FailedPreconditionError(
          absl::StrCat(plan.run_dir, " is a GAN run: it has samples and an FID curve, not episodes"));
    case ViewPlan::Mode::kLive: {
      ASSIGN_OR_RETURN(const GrpcCredentials credentials, LoadGrpcCredentials(plan.security));
      ASSIGN_OR_RETURN(auto source, LiveEpisodes::Create(plan.live_address, absl::Seconds(10), credentials));
      return std::unique_ptr<EpisodeSource>(std::move(source));
    }
  }
  return absl::InternalError("unknown view mode");
}

absl::StatusOr<int64_t> RecordView(const ViewRequest& request) {
  ASSIGN_OR_RETURN(ViewPlan plan, PlanView(request));
  if (plan.mode == ViewPlan::Mode::kLive || plan.mode == ViewPlan::Mode::kGan) {
    return absl::InvalidArgumentError(
        "--record re-renders a run directory's checkpoint or a --task locally; a live stream or a GAN run has "
        "nothing to re-render (a run's evaluation videos are in its videos/ folder)");
  }
  if (request.record_episodes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--episodes ", request.record_episodes, ": must be >= 1"));
  }
  if (!request.strip.empty() && request.strip_frames < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--strip-frames ", request.strip_frames, ": must be >= 1"));
  }
  // The recorder first (a missing encoder or a bad size fails before any work).
  actors::RecorderOptions options;
  options.task = plan.env.task;
  options.action_repeat = plan.env.action_repeat;
  options.width = request.width;
  options.height = request.height;
  options.camera = plan.env.camera;
  options.max_queued_states = size_t(-1);  // recording is the whole job: never drop
  ASSIGN_OR_RETURN(auto recorder, actors::EpisodeRecorder::Create(options));
  ASSIGN_OR_RETURN(auto source, MakeSource(plan));
  // Every state of N episodes, one video.
  recorder->BeginVideo(request.record);
  for (int episode = 0; episode < request.record_episodes; ++episode) {
    ASSIGN_OR_RETURN(SourceStep step, source->ApplyReset());
    recorder->Record(source->data());
    while (step.step_type != envs::StepType::kLast) {
      RETURN_IF_ERROR(source->PrepareStep());
      ASSIGN_OR_RETURN(step, source->ApplyStep());
      if (!step.idle) recorder->Record(source->data());
    }
  }
  recorder->EndVideo();
  RETURN_IF_ERROR(recorder->Flush());
  const actors::EpisodeRecorder::Stats stats = recorder->stats();
  if (stats.videos_written != 1) {
    return absl::InternalError(absl::StrCat("--record ", request.record, ": the video was not written"));
  }
  if (!request.strip.empty()) {
    ASSIGN_OR_RETURN(std::vector<Image> frames, ReadVideoFrames(request.record, request.strip_frames));
    RETURN_IF_ERROR(WritePng(request.strip, HorizontalStrip(frames)));
  }
  return stats.frames_written;
}

absl::Status RunView(const ViewRequest& request) {
  if (!request.record.empty()) return RecordView(request).status();
  ASSIGN_OR_RETURN(ViewPlan plan, PlanView(request));
  RETURN_IF_ERROR(CheckDisplay());
  ViewerOptions options;
  options.width = request.width;
  options.height = request.height;
  // The live task is known once the stream greets (the HUD's policy line names it).
  options.task = plan.mode == ViewPlan::Mode::kGan ? "gan" : plan.mode == ViewPlan::Mode::kLive ? "" : plan.env.task;
  options.title = plan.mode == ViewPlan::Mode::kLive ? absl::StrCat("troupe view --live ", plan.live_address)
                  : plan.run_dir.empty()                ? absl::StrCat("troupe view: ", plan.env.task)
                                       : absl::StrCat("troupe view: ", plan.run_dir);
  options.screenshot_dir = request.screenshot_dir;
  options.curves = std::move(plan.curves);
  // The window first (see Viewer::Show), then the env and its physics thread.
  ASSIGN_OR_RETURN(auto viewer, Viewer::Create(std::move(options)));
  if (plan.mode == ViewPlan::Mode::kGan) {
    RETURN_IF_ERROR(viewer->ShowGan(std::make_unique<GanSamples>(plan.run_dir)));
  } else {
    ASSIGN_OR_RETURN(auto simulation, Simulation::Create([&plan] { return MakeSource(plan); },
                                                         {.start_paused = request.paused, .speed = request.speed}));
    RETURN_IF_ERROR(viewer->Show(std::move(simulation)));
  }
  if (request.quit_after_seconds <= 0) return viewer->Run();
  // A timed run: draw until the time is up, then the final screenshot.
  const absl::Time end = absl::Now() + absl::Seconds(request.quit_after_seconds);
  while (absl::Now() < end) {
    ASSIGN_OR_RETURN(bool running, viewer->RunFrames(1));
    if (!running) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (request.final_screenshot.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Image image, viewer->Screenshot());
  return WritePng(request.final_screenshot, image);
}

}  // namespace troupe::viz
