// The RL learner's logs in its run directory (rank 0; common/run_layout.h
// says where and what): metrics rows (metrics.csv, metrics.jsonl, and with
// config `tensorboard` the same scalars in a TensorBoard event file at step =
// env frames), evaluations (eval.csv, learning_curve.png, the event file)
// and evaluation videos' frame strips, and what a resume does to them: the
// rows, videos and events past the checkpoint go (they are made again), and
// the evaluations kept come back onto the curve.
//
// Threads: AppendMetrics on the learner thread, AppendEvaluation on the
// evaluator's, AddFrameStrip on the video recorder's; the three may run at
// once. A row, a picture or an event that cannot be written (a full disk)
// is warned about, and the run goes on.
#ifndef TROUPE_LEARNER_RUN_LOG_H_
#define TROUPE_LEARNER_RUN_LOG_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/event_writer.h"
#include "common/run_layout.h"
#include "proto/config.pb.h"

namespace troupe::learner {

class LearnerRunLog {
 public:
  // The logs of `run_dir`, metrics.csv with the agent's `agent_columns`
  // (Agent::metric_names); the plot is titled by config.env.task and the
  // event file is written when config.tensorboard (OpenEventFile).
  LearnerRunLog(const config::ExperimentConfig& config, const std::string& run_dir,
                const std::vector<std::string>& agent_columns);

  const RunLayout& layout() const { return layout_; }

  // What Resume found.
  struct Resumed {
    // The run's clock, going on from its last metrics row (the lost piece
    // after the checkpoint counted).
    std::chrono::steady_clock::time_point start;
    size_t metrics_dropped = 0, evaluations_dropped = 0;
    int64_t last_eval_frames = 0;  // 0 when no evaluation is kept
    double last_eval_return = -1;  // -1 when none is kept
  };
  // A run resumed from a checkpoint at `frames`: the rows of metrics.csv,
  // metrics.jsonl and eval.csv past it go, with their evaluation videos and
  // event file points (a file that cannot be rewritten is warned about);
  // the evaluations kept are the curve's. Call before the first append.
  // Errors: a log that cannot be rewritten, naming it.
  absl::StatusOr<Resumed> Resume(int64_t frames);

  // Opens the event file (config `tensorboard`; nothing otherwise) starting
  // at `start_step`; one that cannot be made is warned about, and the run
  // goes on without it. Call before any append.
  void OpenEventFile(int64_t start_step);
  bool has_event_file() const { return events_ != nullptr; }

  // One metrics row; its scalars also in the event file at step = frames.
  void AppendMetrics(const RlMetricsRow& row);
  // One evaluation: its eval.csv row, the curve (learning_curve.png) and
  // its scalars in the event file.
  void AppendEvaluation(const RlEvalRow& row);
  // The evaluation video at `path` (RunLayout::eval_video) as a strip of 5
  // frames in the event file at its frames.
  void AddFrameStrip(const std::string& path);

 private:
  // Warns about an event file error (the first of the run only).
  void WarnOnEventError(const absl::Status& status);

  const RunLayout layout_;
  const std::string title_;
  const bool tensorboard_;
  RowLog<RlMetricsRow> metrics_;  // learner thread
  const std::vector<std::string> agent_columns_;
  std::vector<std::string> agent_tags_;  // "train/NAME" of each
  // The event file (null when off or it could not be made); thread-safe.
  std::unique_ptr<EventWriter> events_;
  std::atomic<bool> event_error_warned_{false};
  absl::Mutex mutex_;  // the evaluator's appends
  RowLog<RlEvalRow> evaluations_ ABSL_GUARDED_BY(mutex_);
  std::vector<double> eval_frames_ ABSL_GUARDED_BY(mutex_), eval_returns_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_RUN_LOG_H_
