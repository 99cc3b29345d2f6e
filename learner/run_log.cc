#include "learner/run_log.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "common/image.h"
#include "common/plot.h"
#include "agents/policies.h"
#include "common/status_macros.h"
#include "common/video.h"

namespace troupe::learner {

LearnerRunLog::LearnerRunLog(const config::ExperimentConfig& config, const std::string& run_dir,
                             const std::vector<std::string>& agent_columns)
    : layout_(run_dir),
      title_(config.env().task() + " " + agents::AgentName(config)),
      tensorboard_(config.tensorboard()),
      metrics_(layout_, RlMetricsRow::Schema(agent_columns)),
      agent_columns_(agent_columns),
      evaluations_(layout_) {
  for (const std::string& name : agent_columns_) agent_tags_.push_back("train/" + name);
}

absl::StatusOr<LearnerRunLog::Resumed> LearnerRunLog::Resume(int64_t frames) {
  Resumed resumed;
  // The run's clock goes on from the last metrics row, lost piece included.
  resumed.start = RunClockStart(layout_, /*resume=*/true);
  // The rows written after the checkpoint (the run went on until it was
  // stopped) are written again from it: they go, with their videos, so the
  // logs go on from the checkpoint without a step back.
  const double limit = static_cast<double>(frames);
  absl::MutexLock lock(&mutex_);
  ASSIGN_OR_RETURN(const std::vector<double> evals, evaluations_.DropRowsPast(limit));
  for (const double at : evals) {
    if (std::isfinite(at)) std::filesystem::remove(layout_.eval_video(static_cast<int64_t>(at)));
  }
  ASSIGN_OR_RETURN(const std::vector<double> rows, metrics_.DropRowsPast(limit));
  resumed.metrics_dropped = rows.size();
  resumed.evaluations_dropped = evals.size();
  // The TensorBoard event files too (step = frames). A file that cannot be
  // rewritten costs its points' correctness, not the run.
  if (const absl::StatusOr<int64_t> events = DropEventsPast(layout_.dir(), frames); !events.ok()) {
    std::fprintf(stderr, "tensorboard: %s (its points past %ld frames stay)\n",
                 std::string(events.status().message()).c_str(), static_cast<long>(frames));
  }
  // Evaluations so far stay on the curve.
  if (const absl::StatusOr<CsvTable> table = ReadCsvTable(layout_.eval_csv()); table.ok()) {
    for (const auto& [frames_at, value] : table->Points("frames", "eval_return")) {
      eval_frames_.push_back(frames_at);
      eval_returns_.push_back(value);
      resumed.last_eval_frames = static_cast<int64_t>(frames_at);
      resumed.last_eval_return = value;
    }
  }
  return resumed;
}

void LearnerRunLog::OpenEventFile(int64_t start_step) {
  if (!tensorboard_) return;
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Open(layout_.dir(), start_step);
  if (!writer.ok()) {
    WarnOnEventError(writer.status());
    return;
  }
  events_ = std::move(*writer);
}

void LearnerRunLog::WarnOnEventError(const absl::Status& status) {
  if (status.ok() || event_error_warned_.exchange(true)) return;
  std::fprintf(stderr, "tensorboard: %s (the run goes on; later TensorBoard errors are not shown; %s and %s have every "
               "number)\n", std::string(status.message()).c_str(), kMetricsCsvFile, kEvalCsvFile);
}

void LearnerRunLog::AppendMetrics(const RlMetricsRow& given) {
  // A value for each of the agent's columns (0 for one not given).
  RlMetricsRow row = given;
  row.agent.resize(agent_columns_.size(), 0.0);
  metrics_.Append(row);
  // The same row in the event file, at step = frames (eval_return comes
  // from the evaluations themselves, at theirs).
  if (!events_) return;
  std::vector<EventWriter::Scalar> scalars = {
      {"train/updates", double(row.updates)},
      {"train/parameter_version", double(row.parameter_version)},
      {"speed/updates_per_second", row.updates_per_s},
      {"speed/frames_per_second", row.frames_per_s},
      {"replay/size", double(row.replay_size)},
      {"replay/samples_per_insert", row.samples_per_insert},
  };
  // The agent's own, train/NAME.
  for (size_t i = 0; i < agent_tags_.size(); ++i) {
    scalars.push_back({agent_tags_[i], row.agent[i]});
  }
  WarnOnEventError(events_->AddScalars(row.frames, scalars));
}

void LearnerRunLog::AppendEvaluation(const RlEvalRow& row) {
  absl::MutexLock lock(&mutex_);
  evaluations_.Append(row);
  eval_frames_.push_back(double(row.frames));
  eval_returns_.push_back(row.eval_return);
  if (events_) {
    const EventWriter::Scalar scalars[] = {{"eval/return", row.eval_return},
                                           {"eval/actions_at_bound", row.actions_at_bound}};
    WarnOnEventError(events_->AddScalars(row.frames, scalars));
  }
  // The curve so far.
  PlotSeries curve{"eval return", eval_frames_, eval_returns_, {31, 119, 180}};
  (void)WritePng(layout_.learning_curve(),
                 PlotLines({curve}, PlotOptions{640, 400, title_, "env frames", "eval return"}));
}

void LearnerRunLog::AddFrameStrip(const std::string& path) {
  if (!events_) return;  // off, or it could not be made
  const std::optional<int64_t> frames = EvalVideoFrames(path);
  if (!frames.has_value()) return;
  // Five frames from first to last, at half the video's size, side by side.
  absl::StatusOr<std::vector<Image>> images = ReadVideoFrames(path, /*count=*/5);
  if (!images.ok()) {
    WarnOnEventError(images.status());
    return;
  }
  for (Image& image : *images) image = Downscale(image, /*factor=*/2);
  WarnOnEventError(events_->AddImage("eval/frames", *frames, HorizontalStrip(*images)));
}

}  // namespace troupe::learner
