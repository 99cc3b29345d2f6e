#include "gan/run.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/event_writer.h"
#include "common/files.h"
#include "common/image.h"
#include "common/plot.h"
#include "common/run_layout.h"
#include "common/status_line.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "gan/evaluator.h"

namespace troupe::gan {
namespace {

void Log(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

// The evaluation history, kept in eval.csv (re-read on resume).
struct History {
  std::vector<double> images, fid;
};

History ReadHistory(const RunLayout& run) {
  History h;
  if (const absl::StatusOr<CsvTable> table = ReadCsvTable(run.eval_csv()); table.ok()) {
    for (const auto& [images, fid] : table->Points("images", "classifier_fid")) {
      h.images.push_back(images);
      h.fid.push_back(fid);
    }
  }
  return h;
}

}  // namespace

absl::Status RunGan(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                    const std::atomic<bool>* stop) {
  const config::GanConfig& gan = config.gan();
  RETURN_IF_ERROR(ValidateGanConfig(gan));
  using Clock = std::chrono::steady_clock;
  const RunLayout run(run_dir);
  const auto start = RunClockStart(run, resume);  // a resumed run's clock goes on

  // Data, the FID classifier (trained and cached on first use), the trainer.
  ASSIGN_OR_RETURN(GanData data, LoadGanData(gan.data_dir()));
  FidClassifier::Options classifier_options;
  classifier_options.checkpoint = gan.classifier_checkpoint();
  classifier_options.data_dir = gan.data_dir();
  classifier_options.threads = engine::EngineThreads(gan.engine());
  classifier_options.device = gan.engine().device();
  ASSIGN_OR_RETURN(std::unique_ptr<FidClassifier> classifier, FidClassifier::LoadOrTrain(classifier_options, Log));
  ASSIGN_OR_RETURN(std::unique_ptr<GanTrainer> trainer, GanTrainer::Create(gan, &data));
  const std::string checkpoint_dir = run.checkpoints();
  const bool chief = trainer->is_chief();
  if (chief && gan.engine().shard_state() == config::EngineConfig::OPTIMIZER) {
    Log(absl::StrFormat("optimizer state split over %d replicas (engine.shard_state OPTIMIZER): %.2f MB each",
                        trainer->num_replicas(), 1e-6 * trainer->optimizer_state_bytes()));
  }
  if (chief && gan.engine().shard_state() == config::EngineConfig::PARAMETERS) {
    Log(absl::StrFormat("networks and optimizer state split over %d replicas (engine.shard_state PARAMETERS): %.2f "
                        "MB of networks and %.2f MB of optimizer state each between steps",
                        trainer->num_replicas(), 1e-6 * trainer->parameter_state_bytes(),
                        1e-6 * trainer->optimizer_state_bytes()));
  }
  if (chief && trainer->generator_floats_per_replica() != trainer->generator_floats()) {
    Log(absl::StrFormat("generator split over %d replicas (engine.model_parallel): %.2f MB of its %.2f MB of "
                        "parameters on each (%.2fx), Adam's moments alike",
                        gan.engine().model_parallel(), 4e-6 * trainer->generator_floats_per_replica(),
                        4e-6 * trainer->generator_floats(),
                        double(trainer->generator_floats_per_replica()) / double(trainer->generator_floats())));
  }
  // A checkpoint passed over at resume, or the last one failed: said on the
  // status line until one commits.
  std::string checkpoint_note;
  if (resume) {
    std::vector<std::string> passed_over;
    ASSIGN_OR_RETURN(const std::string from, trainer->LoadCheckpoint(checkpoint_dir, &passed_over));
    if (chief) {
      for (const std::string& why : passed_over) Log(absl::StrCat("checkpoint passed over: ", why));
      Log(absl::StrFormat("resumed from %s: %d steps, %d images", from, trainer->steps(), trainer->images_seen()));
      if (!passed_over.empty()) {
        checkpoint_note = absl::StrCat(" | resumed from ", std::filesystem::path(from).filename().string(), ", ",
                                       passed_over.size(), " newer checkpoint(s) damaged or unfinished (see log)");
      }
    }
  }
  // The logs: a row that cannot be written (a full disk) is warned about,
  // and the run goes on.
  RowLog<GanEvalRow> eval_csv(run);
  RowLog<GanMetricsRow> metrics(run);
  if (resume && chief) {
    // The rows written after the checkpoint are written again from it.
    const double limit = static_cast<double>(trainer->images_seen());
    RETURN_IF_ERROR(eval_csv.DropRowsPast(limit).status());
    RETURN_IF_ERROR(metrics.DropRowsPast(limit).status());
    // The TensorBoard event files too (step = steps). A file that cannot be
    // rewritten costs its points' correctness, not the run.
    if (const absl::StatusOr<int64_t> events = DropEventsPast(run_dir, trainer->steps()); !events.ok()) {
      Log(absl::StrFormat("tensorboard: %s (its points past step %d stay)", events.status().message(),
                          trainer->steps()));
    }
  }
  // The TensorBoard event file (rank 0): the metrics and eval rows at step =
  // steps, and the sample grids. A write that fails is warned about once and
  // the run goes on; the CSV files have every number.
  std::unique_ptr<EventWriter> events;
  bool event_error_warned = false;
  auto warn_on_event_error = [&](const absl::Status& s) {
    if (s.ok() || event_error_warned) return;
    event_error_warned = true;
    Log(absl::StrFormat("tensorboard: %s (the run goes on; later TensorBoard errors are not shown; %s and %s have "
                        "every number)", s.message(), kMetricsCsvFile, kEvalCsvFile));
  };
  if (chief && config.tensorboard()) {
    absl::StatusOr<std::unique_ptr<EventWriter>> opened = EventWriter::Open(run_dir, resume ? trainer->steps() + 1 : 0);
    if (opened.ok()) events = std::move(*opened);
    warn_on_event_error(opened.status());
  }
  GanEvaluator evaluator(classifier.get(), data);
  History history = ReadHistory(run);

  // Evaluation: FID, classifier score, eval.csv, the curve and the sample grids.
  auto evaluate = [&]() -> absl::Status {
    // (A generator split over the ranks is gathered first, on every rank.)
    RETURN_IF_ERROR(trainer->PrepareCheckpoint());
    if (!chief) return absl::OkStatus();
    const Evaluation e = evaluator.Evaluate(*trainer, gan.eval_samples());
    const int64_t images = trainer->images_seen();
    eval_csv.Append({.images = images,
                     .steps = trainer->steps(),
                     .classifier_fid = e.fid,
                     .classifier_score = e.classifier_score,
                     .seconds = std::chrono::duration<double>(Clock::now() - start).count()});
    history.images.push_back(static_cast<double>(images));
    history.fid.push_back(e.fid);
    // The pictures: one that cannot be written (a full disk) is said, and the
    // run goes on.
    auto warn_on_png_error = [](const absl::Status& s) {
      if (!s.ok()) Log(absl::StrFormat("%s (the run goes on)", s.message()));
    };
    PlotSeries curve{"classifier-FID (EMA generator)", history.images, history.fid, {214, 39, 40}};
    warn_on_png_error(WritePng(run.fid_curve(),
                               PlotLines({curve}, PlotOptions{640, 400, config.name() + " classifier-FID",
                                                              "images seen", "FID (classifier features)"})));
    const Image grid = SampleGrid(*trainer);
    std::error_code ec;
    std::filesystem::create_directories(run.samples_folder(), ec);
    warn_on_png_error(WritePng(run.samples_at(images), grid));
    warn_on_png_error(WritePng(run.samples(), grid));
    if (events) {
      const EventWriter::Scalar scalars[] = {{"gan/fid", e.fid}, {"gan/classifier_score", e.classifier_score}};
      warn_on_event_error(events->AddScalars(trainer->steps(), scalars));
      warn_on_event_error(events->AddImage("gan/samples", trainer->steps(), grid));
    }
    Log(absl::StrFormat("eval at %d images: classifier-FID %.3f, classifier score %.3f (%.1f s)", images, e.fid,
                        e.classifier_score, e.seconds));
    return absl::OkStatus();
  };

  // Steps are counted, not timed, so every MPI rank runs the same chunks.
  const int64_t images_per_step = int64_t{gan.batch_size()} * gan.n_critic();
  const int64_t total_steps = (gan.total_images() + images_per_step - 1) / images_per_step;
  const int64_t eval_every_steps = std::max<int64_t>(1, gan.eval_every_images() / images_per_step);
  const int64_t chunk_steps = std::max<int64_t>(1, 4096 / images_per_step);
  if (!resume || history.images.empty()) RETURN_IF_ERROR(evaluate());

  StatusLine status;
  auto last_checkpoint = Clock::now();
  int64_t images_at_rate = trainer->images_seen();
  auto rate_time = Clock::now();
  double images_per_second = 0;
  // A checkpoint that fails (a full disk) leaves the last good one, is
  // said in the log and on the status line, and the run goes on; the next
  // one tries again. The final one's failure ends the run with the error.
  int checkpoint_failures = 0;
  auto checkpoint = [&]() -> absl::Status {
    const absl::Status saved = trainer->SaveCheckpoint(checkpoint_dir);
    if (saved.ok()) {
      if (checkpoint_failures > 0) {
        Log(absl::StrFormat("checkpoint at step %d committed after %d failed attempt(s)", trainer->steps(),
                            checkpoint_failures));
      }
      checkpoint_failures = 0;
      checkpoint_note.clear();
      return saved;
    }
    ++checkpoint_failures;
    Log(absl::StrFormat("checkpoint at step %d failed: %s; its partial generation was removed and the last good "
                        "checkpoint in %s stays; training goes on and tries again in %d s%s",
                        trainer->steps(), saved.message(), checkpoint_dir, gan.checkpoint_every_s(),
                        absl::IsResourceExhausted(saved) ? " (the disk is full: free space under the run directory)"
                                                         : ""));
    checkpoint_note = absl::StrCat(" | checkpoint FAILED (", checkpoint_failures,
                                   "x): ", absl::StatusCodeToString(saved.code()));
    return saved;
  };
  while (trainer->steps() < total_steps && !(stop != nullptr && stop->load())) {
    // A chunk of steps, never across an evaluation point.
    const int64_t next_eval = (trainer->steps() / eval_every_steps + 1) * eval_every_steps;
    const int64_t steps = std::min({chunk_steps, total_steps - trainer->steps(), next_eval - trainer->steps()});
    RETURN_IF_ERROR(trainer->Train(steps));
    if (!std::isfinite(trainer->discriminator_loss()) || !std::isfinite(trainer->generator_loss())) {
      return absl::InternalError(absl::StrFormat("GAN losses diverged at step %d: D %f, G %f", trainer->steps(),
                                                 trainer->discriminator_loss(), trainer->generator_loss()));
    }
    // Rate, metrics row, status line.
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - rate_time).count();
    if (dt > 0) images_per_second = (trainer->images_seen() - images_at_rate) / dt;
    images_at_rate = trainer->images_seen();
    rate_time = now;
    if (chief) {
      metrics.Append({.seconds = std::chrono::duration<double>(now - start).count(),
                      .images = trainer->images_seen(),
                      .steps = trainer->steps(),
                      .images_per_s = images_per_second,
                      .d_loss = trainer->discriminator_loss(),
                      .g_loss = trainer->generator_loss(),
                      .d_lr = trainer->DiscriminatorLearningRate(trainer->steps() - 1),
                      .g_lr = trainer->GeneratorLearningRate(trainer->steps() - 1)});
      if (events) {
        const EventWriter::Scalar scalars[] = {
            {"gan/images_seen", double(trainer->images_seen())},
            {"gan/d_loss", trainer->discriminator_loss()},
            {"gan/g_loss", trainer->generator_loss()},
            {"gan/d_learning_rate", trainer->DiscriminatorLearningRate(trainer->steps() - 1)},
            {"gan/g_learning_rate", trainer->GeneratorLearningRate(trainer->steps() - 1)},
            {"speed/images_per_second", images_per_second},
        };
        warn_on_event_error(events->AddScalars(trainer->steps(), scalars));
      }
      status.Update(absl::StrFormat("gan %s: %d/%d images (%.0f%%), %.0f images/s, D %.3f G %.3f, FID %s",
                                    config.name(), trainer->images_seen(), gan.total_images(),
                                    100.0 * trainer->steps() / total_steps, images_per_second,
                                    trainer->discriminator_loss(), trainer->generator_loss(),
                                    history.fid.empty() ? "-" : absl::StrFormat("%.2f", history.fid.back())) +
                    checkpoint_note);
    }
    if (trainer->steps() % eval_every_steps == 0 || trainer->steps() == total_steps) RETURN_IF_ERROR(evaluate());
    // The chief decides when; with the moments split over the ranks every
    // rank takes part (GanTrainer::PrepareCheckpoint).
    ASSIGN_OR_RETURN(const bool due, trainer->AgreeWithChief(
                                         chief && now - last_checkpoint >= std::chrono::seconds(gan.checkpoint_every_s())));
    if (due) {
      RETURN_IF_ERROR(trainer->PrepareCheckpoint());
      if (chief) (void)checkpoint();  // a failure is said; the run goes on
      last_checkpoint = Clock::now();
    }
  }
  RETURN_IF_ERROR(trainer->PrepareCheckpoint());
  if (chief) {
    if (const absl::Status saved = checkpoint(); !saved.ok()) {
      return absl::Status(saved.code(), absl::StrCat("final checkpoint failed: ", saved.message(),
                                                     "; the last good checkpoint in ", checkpoint_dir,
                                                     " stays (`troupe run --resume ", run_dir, "` goes on from it)"));
    }
    status.Update(absl::StrFormat("gan %s: %d images, %d steps in %.0f s; FID %s; run directory %s", config.name(),
                                  trainer->images_seen(), trainer->steps(),
                                  std::chrono::duration<double>(Clock::now() - start).count(),
                                  history.fid.empty() ? "-" : absl::StrFormat("%.3f", history.fid.back()), run_dir),
                  /*force=*/true);
  }
  return absl::OkStatus();
}

}  // namespace troupe::gan
