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
  auto security = std::make_shared<SecurityFlags>();
  security->AddTo(cmd);
  cmd->callback([request, security, exit_code] {
    security->ApplyTo(&request->security);
    const absl::Status status = viz::RunView(*request);
    if (!status.ok()) {
      std::fprintf(stderr, "troupe view: %s\n", std::string(status.message()).c_str());
      *exit_code = status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace troupe::cli
