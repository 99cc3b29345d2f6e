#include <cstdio>

#include "cli/commands.h"
#include "cli/security_flags.h"
#include "viz/view.h"

namespace troupe::cli {

void AddViewCommand(CLI::App& app, int* exit_code) {
  auto request = std::make_shared<viz::ViewRequest>();
  CLI::App* cmd = app.add_subcommand(
      "view", "Watch an agent in an SDL2 window: a run directory's policy, a task's scripted controller, or a live run");
  cmd->add_option("run_dir", request->run_dir, "Run directory (runs/NAME-DATE-TIME, printed by troupe run)");
  cmd->add_option("--checkpoint", request->checkpoint, "Checkpoint to load instead of the run's latest");
  cmd->add_option("--task", request->task, "Watch this task without a run, e.g. cartpole.swingup");
  cmd->add_option("--live", request->live, "Follow a running experiment's evaluator at HOST:PORT");
  cmd->add_option("--policy", request->policy,
                  "Scripted policy instead of a checkpoint: controller (the task's own, else random), zero, random");
  cmd->add_option("--seed", request->seed, "Seed of the viewed env's episodes");
  cmd->add_option("--width", request->width, "Window width")->check(CLI::PositiveNumber);
  cmd->add_option("--height", request->height, "Window height")->check(CLI::PositiveNumber);
  cmd->add_option("--speed", request->speed, "Simulated seconds per second (]/[ change it)")->check(CLI::PositiveNumber);
  cmd->add_flag("--paused", request->paused, "Start paused (space resumes, right arrow steps)");
  cmd->add_option("--screenshot-dir", request->screenshot_dir, "Where p saves PNG screenshots");
  cmd->add_option("--quit-after", request->quit_after_seconds, "Quit after this many seconds (0: run until closed)");
  cmd->add_option("--final-screenshot", request->final_screenshot, "With --quit-after: save the last frame here (PNG)");
  cmd->add_option("--record", request->record,
                  "Record the episodes to this MP4 file instead of opening a window (no display needed); "
                  "--width/--height default to 480x480");
  cmd->add_option("--strip", request->strip,
                  "With --record: also this PNG, --strip-frames frames of the video side by side");
  cmd->add_option("--strip-frames", request->strip_frames, "With --strip: how many frames, evenly spaced")
      ->capture_default_str();
  cmd->add_option("--episodes", request->record_episodes, "With --record: how many episodes")
      ->check(CLI::PositiveNumber);
  auto security = std::make_shared<SecurityFlags>();
  security->AddTo(cmd);
  cmd->callback([request, security, exit_code, cmd] {
    security->ApplyTo(&request->security);
    absl::Status status;
    if (!request->strip.empty() && request->record.empty()) {
      status = absl::InvalidArgumentError("--strip needs --record FILE.mp4 (the strip is made from that video)");
    } else if (!request->record.empty()) {
      // A video's size: 480x480 unless asked (the window's 1280x720 exceeds the models' offscreen buffer).
      if (cmd->get_option("--width")->count() == 0) request->width = 480;
      if (cmd->get_option("--height")->count() == 0) request->height = 480;
      auto frames = viz::RecordView(*request);
      status = frames.status();
      if (frames.ok()) {
        std::printf("troupe view: recorded %d episode(s), %ld frames, %dx%d, to %s\n", request->record_episodes,
                    long(*frames), request->width, request->height, request->record.c_str());
        if (!request->strip.empty()) std::printf("troupe view: frame strip %s\n", request->strip.c_str());
      }
    } else {
      status = viz::RunView(*request);
    }
    if (!status.ok()) {
      std::fprintf(stderr, "troupe view: %s\n", std::string(status.message()).c_str());
      *exit_code = status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace troupe::cli
