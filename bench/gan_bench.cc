// `troupe bench gan`: TF-Replicator's large-batch GAN finding on this engine.
// For global batch 64, 256 and 1024 (replicas 1 and 2), trains the GAN mode
// for the same budget of real images seen (default 2,000,000; `--only
// images=N` lowers it, `--quick` uses 20,000) and reports the classifier-FID
// of the EMA generator (10,000 samples against the 10,000 test images) with
// its wall time and images/s; beside it the floor, the classifier-FID of
// 10,000 training images against the test images; and the generator +
// discriminator step's images/s against the same step in Debian's libtorch
// 1.13 (bench/peers/libtorch_gan_step.cc, compiled at run time when installed).
// `--only speed` gives only the step's figures: the libtorch comparison and
// the images/s at each batch and replica count of the batch study, next to
// batch 64 on 1 replica.
// Then troupe's classifier-FID after N images at batch 64 next to the
// libtorch reference GAN's (bench/gan_reference.h: the same GAN trained in
// libtorch from troupe's initial weights on the same images and noise),
// N = 300,000 by default (`--only reference_images=N`; `--quick` 5,000);
// `--only reference` or `--only reference_images=N` alone runs only that
// comparison (and the floor); `--only reference_threads=N` sets the
// reference's threads (default 1). The bar is troupe / reference <= 1.1.
// The FID here is a classifier-FID (gan/fid.h), not Inception-FID.
//
// The comparison is resumable (at 300,000 images it takes hours): it works
// in ROOT/images<N>-<hash of the key> (bench/gan_reference.h
// ReferenceComparisonDirectory; the key is N, the samples and the whole GAN
// config, so another N or config gets a directory of its own). ROOT is
// `--only reference_dir=DIR`, by default ~/.cache/troupe/gan_reference
// ($XDG_CACHE_HOME/troupe/gan_reference when set; common/files.h
// CacheDirectory), the same whatever the working directory. In it:
//   key.txt               the key, for a reader
//   initial_weights.ckpt  troupe's initial weights, exported once
//   troupe_checkpoint/    troupe's half, checkpointed every 5 minutes while
//                         it trains (GanTrainer::SaveCheckpoint; `--only
//                         reference_checkpoint_s=S` sets the interval), resumed
//   troupe_result.txt     troupe's half once finished (FID, losses, seconds,
//                         images, with the key): a rerun skips its training
//   reference_state.pt    the libtorch reference's state (every 500 steps,
//                         or N/10 when fewer, and at the end), resumed; once
//                         at step N a rerun only draws its samples
// A run killed at any point loses at most the minutes since the last save.
// `--only reference_dir=DIR` alone also runs only the comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/synthetic.h"
#include "bench/bench.h"
#include "bench/gan_reference.h"
#include "common/files.h"
#include "common/image.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "gan/data.h"
#include "gan/evaluator.h"
#include "gan/fid.h"
#include "gan/trainer.h"

namespace troupe::bench {
namespace {

constexpr int kGanThreads = 2;


void Log(const std::string& line) { std::printf("%s\n", line.c_str()); std::fflush(stdout); }

// In how many steps per Train call troupe's half of the reference comparison
// checks whether a checkpoint is due.
constexpr int64_t kTroupeStepsPerCall = 20;
// How often (in steps) the libtorch reference saves its state at most: a
// short run saves 10 times.
constexpr int64_t kReferenceSaveEvery = 500;

// troupe's half of the reference comparison: `steps` steps of config `c` from
// its checkpoint in `dir` if there is one (exporting the initial weights to
// `weights` first if they are missing), checkpointed every
// `checkpoint_seconds`; then its classifier-FID, written with `key` to
// dir/troupe_result.txt, and the checkpoint removed.
absl::StatusOr<TroupeHalf> TrainTroupeHalf(const gan::GanData& data, gan::GanEvaluator& evaluator,
                                           const config::GanConfig& c, int64_t steps, int64_t samples,
                                           const std::string& dir, const std::string& key,
                                           const std::string& weights, double checkpoint_seconds) {
  ASSIGN_OR_RETURN(std::unique_ptr<gan::GanTrainer> trainer, gan::GanTrainer::Create(c, &data));
  if (!std::filesystem::exists(weights)) RETURN_IF_ERROR(trainer->ExportWeights(weights));
  // Resume from the checkpoint, if any.
  const std::string checkpoint = dir + "/troupe_checkpoint";
  double earlier_seconds = 0;
  if (absl::StatusOr<double> resumed = LoadTroupeCheckpoint(*trainer, checkpoint); resumed.ok()) {
    earlier_seconds = *resumed;
    Log(absl::StrFormat("reference comparison: troupe's half resumes at step %d of %d (%s, %.0f s trained before)",
                        trainer->steps(), steps, checkpoint, earlier_seconds));
  } else if (absl::IsNotFound(resumed.status())) {
    Log(absl::StrFormat("reference comparison: troupe trains %d steps at batch 64 (checkpoint every %.0f s in %s) ...",
                        steps, checkpoint_seconds, checkpoint));
  } else {
    return resumed.status();
  }
  // Train, checkpointing every checkpoint_seconds (not after the last step: the result file follows).
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t first_step = trainer->steps();
  auto piece_seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  double last_save = 0;
  while (trainer->steps() < steps) {
    RETURN_IF_ERROR(trainer->Train(std::min(kTroupeStepsPerCall, steps - trainer->steps())));
    if (trainer->steps() < steps && piece_seconds() - last_save >= checkpoint_seconds) {
      RETURN_IF_ERROR(SaveTroupeCheckpoint(*trainer, checkpoint, earlier_seconds + piece_seconds()));
      last_save = piece_seconds();
      Log(absl::StrFormat("  troupe: step %d of %d, images/s %.1f, checkpoint saved", trainer->steps(), steps,
                          (trainer->steps() - first_step) * c.batch_size() * c.n_critic() / last_save));
    }
  }
  TroupeHalf half;
  half.seconds = earlier_seconds + piece_seconds();
  half.fid = evaluator.Evaluate(*trainer, samples).fid;
  half.images = trainer->images_seen();
  half.discriminator_loss = trainer->discriminator_loss();
  half.generator_loss = trainer->generator_loss();
  RETURN_IF_ERROR(WriteTroupeHalf(dir + "/troupe_result.txt", key, half));
  std::error_code ignored;
  std::filesystem::remove_all(checkpoint, ignored);
  std::filesystem::remove_all(checkpoint + ".new", ignored);
  return half;
}

// troupe's classifier-FID after `images` images at batch 64 (config `c`)
// next to the libtorch reference's from the same initial weights, images and
// noise, one after the other, resumable in a directory under `root` (the
// header comment): troupe on kGanThreads threads, the reference on
// `reference_threads` (1 by default: libtorch's OpenMP threads spin while
// they wait, and on cores shared with other work 2 threads ran 3.5x slower
// than 1; the threads change the wall time, not the FID). A reference that
// cannot run (no libtorch-dev, a state it refuses) is reported as missing,
// saying why.
absl::Status AddReferenceComparison(const gan::GanData& data, gan::GanEvaluator& evaluator, config::GanConfig c,
                                    int64_t images, int64_t samples, int reference_threads, const std::string& root,
                                    double checkpoint_seconds, Report& report) {
  c.set_batch_size(64);
  const int64_t steps = (images + c.batch_size() * c.n_critic() - 1) / (c.batch_size() * c.n_critic());
  // The comparison's directory, named for its key.
  const std::string key = ReferenceComparisonKey(c, images, samples);
  const std::string dir = ReferenceComparisonDirectory(root, images, key);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/key.txt", key + "\n"));
  Log(absl::StrFormat("reference comparison: %d images, work directory %s", images, dir));
  const std::string weights = dir + "/initial_weights.ckpt";
  // troupe's half: read back when done earlier, else trained (or resumed).
  absl::StatusOr<TroupeHalf> troupe = ReadTroupeHalf(dir + "/troupe_result.txt", key);
  if (troupe.ok()) {
    Log(absl::StrFormat("reference comparison: troupe's half done earlier (FID %.2f after %d images, %.0f s), skipped",
                        troupe->fid, troupe->images, troupe->seconds));
    if (!std::filesystem::exists(weights)) {  // the reference starts from them
      ASSIGN_OR_RETURN(std::unique_ptr<gan::GanTrainer> trainer, gan::GanTrainer::Create(c, &data));
      RETURN_IF_ERROR(trainer->ExportWeights(weights));
    }
  } else if (absl::IsNotFound(troupe.status())) {
    troupe = TrainTroupeHalf(data, evaluator, c, steps, samples, dir, key, weights, checkpoint_seconds);
    if (!troupe.ok()) return troupe.status();
    Log(absl::StrFormat("  troupe: FID %.2f after %.0f s (D %.3f G %.3f)", troupe->fid, troupe->seconds,
                        troupe->discriminator_loss, troupe->generator_loss));
  } else {
    return troupe.status();
  }
  // The reference's half, from its state when there is one.
  GanReferenceOptions options;
  options.weights = weights;
  options.steps = steps;
  options.samples = samples;
  options.threads = reference_threads;
  options.state_path = dir + "/reference_state.pt";
  options.save_every = std::clamp<int64_t>(steps / 10, 1, kReferenceSaveEvery);
  options.progress = [steps](const std::string& line) {
    long long step;
    if (std::sscanf(line.c_str(), "resumed at step %lld", &step) == 1) {
      Log(step == steps ? absl::StrFormat("reference comparison: the libtorch reference finished earlier (%s); "
                                          "drawing its samples",
                                          line)
                        : absl::StrFormat("reference comparison: the libtorch reference %s", line));
    } else {
      Log("  libtorch reference: " + line);
    }
  };
  if (!std::filesystem::exists(options.state_path)) {
    Log(absl::StrFormat("reference comparison: the libtorch reference trains %d steps (state saved every %d steps "
                        "to %s) ...",
                        steps, options.save_every, options.state_path));
  }
  absl::StatusOr<GanReferenceRun> reference = RunLibtorchGanReference(c, options);
  double reference_fid = 0;  // 0: missing
  std::string timing = absl::StrFormat("troupe %.0f s", troupe->seconds);
  if (reference.ok()) {
    reference_fid = evaluator.EvaluateImages(reference->samples.data(), samples).fid;
    absl::StrAppendFormat(&timing, ", reference %.0f s", reference->train_seconds);
  } else {
    std::printf("libtorch reference GAN unavailable: %s\n", reference.status().ToString().substr(0, 600).c_str());
  }
  report.Add(absl::StrFormat("classifier-FID after %d images, batch 64 [%s]", troupe->images, timing), troupe->fid,
             "FID", reference.ok() ? "reference (libtorch, same run; bar <= 1.1)" : "reference (libtorch: missing)",
             reference_fid);
  return absl::OkStatus();
}

// The (global batch, replicas) points this benchmark compares.
constexpr std::pair<int, int> kBatchPoints[] = {{64, 1}, {256, 1}, {256, 2}, {1024, 1}, {1024, 2}};

// Images/s of the G+D step of config `c`, after 2 warm-up steps, over
// `seconds` of whole steps.
// troupe's side of a G+D step comparison (bench/protocol.h): the trainer is
// made and warmed by two steps at the first round and kept (a PJRT program is
// compiled once, as a peer's is per process); each round returns its
// images/s over round.seconds.
Side StepSide(const gan::GanData& data, const config::GanConfig& c) {
  auto trainer = std::make_shared<std::unique_ptr<gan::GanTrainer>>();
  return [&data, c, trainer](const Round& round) -> absl::StatusOr<double> {
    if (*trainer == nullptr) {
      ASSIGN_OR_RETURN(*trainer, gan::GanTrainer::Create(c, &data));
      RETURN_IF_ERROR((*trainer)->Train(2));
    }
    absl::Status error;
    const double steps_per_s = MeasureRate(round.seconds, [&](long n) {
      if (error.ok()) error = (*trainer)->Train(n);
    });
    RETURN_IF_ERROR(error);
    return steps_per_s * c.batch_size();
  };
}

absl::StatusOr<double> StepImagesPerSecond(const gan::GanData& data, const config::GanConfig& c, double seconds) {
  return StepSide(data, c)(Round{.seconds = seconds});
}

// The G+D step at batch 64 against the same step in libtorch
// (bench/peers/libtorch_gan_step.cc), by the comparison protocol, both on
// kGanThreads threads.
absl::Status AddLibtorchStepComparison(const gan::GanData& data, const config::GanConfig& base,
                                       const Options& options, double seconds, Report& report) {
  config::GanConfig c = base;
  c.set_batch_size(64);
  const auto args = [&c](const Round& round) {
    return absl::StrCat(64, " ", c.generator_channels(), " ", c.noise_size(), " ", round.seconds);
  };
  return AddComparison(report, absl::StrFormat("G+D step (n_critic 1), batch 64, %d threads", kGanThreads), "images/s",
                       "libtorch 1.13", StepSide(data, c),
                       PeerSide(Peer::kLibtorch, "libtorch_gan_step", args, "images_per_second"),
                       DefaultProtocol(options, kGanThreads, seconds))
      .status();
}

// The G+D step's images/s at each point of kBatchPoints, next to batch 64
// on 1 replica in the same run: what a bigger batch costs or saves per
// image, apart from what it does to quality (`--only speed`).
absl::Status AddStepSpeeds(const gan::GanData& data, const config::GanConfig& base, double seconds, Report& report) {
  double batch64 = 0;
  for (auto [batch, replicas] : kBatchPoints) {
    config::GanConfig c = base;
    c.set_batch_size(batch);
    c.mutable_engine()->set_replicas(replicas);
    ASSIGN_OR_RETURN(const double images_per_s, StepImagesPerSecond(data, c, seconds));
    if (batch == 64 && replicas == 1) batch64 = images_per_s;
    report.Add(absl::StrFormat("G+D step, batch %d, %d replica(s), %d threads", batch, replicas, kGanThreads),
               images_per_s, "images/s", "batch 64, 1 replica, same run", batch64);
  }
  return absl::OkStatus();
}

}  // namespace

// --device cuda or pjrt: the G+D step (n_critic 1) on synthetic images on
// GPU 0 (the CUDA backend, or one compiled program per step through the PJRT
// plugin --pjrt-plugin names) at batch 256 and 4096, float32 and bfloat16,
// against PyTorch (the machine's python3) eager and with the generator step
// compiled, on the same GPU. On a CPU PJRT plugin: batch 256, float32,
// against troupe's CPU backend in the same run.
absl::StatusOr<Report> RunGanBenchmarkOnDevice(const Options& options) {
  Report report;
  const double seconds = DeviceFigureSeconds(options, 3.0);
  const gan::GanData data = bench::RandomGanData();
  config::EngineConfig engine;
  const bool pjrt = options.device == "pjrt";
  engine.set_device(pjrt ? config::EngineConfig::PJRT : config::EngineConfig::CUDA);
  if (pjrt) {
    engine.set_pjrt_plugin(options.pjrt_plugin);
    engine.set_pjrt_cache_dir("");  // compiled anew, as the peers' are
    RETURN_IF_ERROR(engine::ValidateEngineConfig(engine, "bench", 1));
  }
  RETURN_IF_ERROR(engine::CheckDeviceAvailable(engine, "gan"));
  std::string device_name;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> probe, engine::MakeBackend(engine, /*local_index=*/0, 1));
    device_name = probe->name();
  }
  const bool on_cpu = !MeasuredAsGpu(device_name);
  const std::string where = pjrt ? absl::StrCat(device_name, ", one program per step") : std::string("CUDA");
  std::vector<config::EngineConfig::Precision> precisions = {config::EngineConfig::FLOAT32};
  if (!on_cpu) precisions.push_back(config::EngineConfig::BFLOAT16);
  const std::vector<int64_t> batches = options.quick ? std::vector<int64_t>{64}
                                       : on_cpu      ? std::vector<int64_t>{256}
                                                     : std::vector<int64_t>{256, 4096};
  for (const auto precision : precisions) {
    const char* dtype = precision == config::EngineConfig::BFLOAT16 ? "bfloat16" : "float32";
    for (const int64_t batch : batches) {
      config::GanConfig c;
      c.set_batch_size(batch);
      c.set_base_batch_size(batch);
      *c.mutable_engine() = engine;
      c.mutable_engine()->set_precision(precision);
      const std::string name = absl::StrFormat("G+D step (n_critic 1) on %s, %s, batch %d", where, dtype, batch);
      const Side troupe = StepSide(data, c);
      if (on_cpu) {
        config::GanConfig cpu = c;
        *cpu.mutable_engine() = config::EngineConfig();  // the CPU backend
        cpu.mutable_engine()->set_precision(precision);
        RETURN_IF_ERROR(AddComparison(report, name, "images/s", "troupe's CPU backend, same step", troupe,
                                      StepSide(data, cpu), DefaultProtocol(options, kGanThreads, seconds))
                            .status());
        continue;
      }
      for (const std::string& mode : GpuPeerModes(batch)) {
        const auto args = [&c, batch, mode, dtype](const Round& round) {
          return absl::StrCat(batch, " ", c.generator_channels(), " ", c.noise_size(), " ", round.seconds, " ", mode,
                              " cuda ", dtype);
        };
        RETURN_IF_ERROR(AddComparison(report, name, "images/s", absl::StrCat("PyTorch on the GPU, ", mode), troupe,
                                      PeerSide(Peer::kGpuPytorch, "torch_gan", args, "images_per_second"),
                                      GpuProtocol(options, seconds))
                            .status());
      }
    }
  }
  return report;
}

absl::StatusOr<Report> RunGanBenchmark(const Options& options) {
  if (options.device == "cuda" || options.device == "pjrt") return RunGanBenchmarkOnDevice(options);
  Report report;
  int64_t budget = options.quick ? 20000 : 2000000;
  int64_t reference_images = options.quick ? 5000 : 300000;
  int64_t reference_threads = 1, checkpoint_seconds = 300;
  std::string reference_root = CacheDirectory() + "/gan_reference";
  bool reference_only = false, budget_set = false, speed_only = false;
  for (const std::string& f : options.filter) {
    int64_t* number = nullptr;
    if (f.rfind("reference_dir=", 0) == 0) {
      reference_root = f.substr(f.find('=') + 1);
      reference_only = true;
      if (reference_root.empty()) return absl::InvalidArgumentError("--only reference_dir=: want a directory");
    }
    if (f.rfind("images=", 0) == 0) number = &budget, budget_set = true;
    if (f.rfind("reference_images=", 0) == 0) number = &reference_images, reference_only = true;
    if (f.rfind("reference_threads=", 0) == 0) number = &reference_threads;
    if (f.rfind("reference_checkpoint_s=", 0) == 0) number = &checkpoint_seconds;
    if (f == "reference") reference_only = true;
    if (f == "speed") speed_only = true;
    if (number != nullptr && (!absl::SimpleAtoi(f.substr(f.find('=') + 1), number) || *number < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("--only ", f, ": want a positive number"));
    }
  }
  reference_only = reference_only && !budget_set;
  auto data = gan::LoadGanData(gan::kFashionMnistDir);
  if (!data.ok()) return data.status();
  config::GanConfig base;
  base.mutable_engine()->set_threads(kGanThreads);
  base.set_data_dir(gan::kFashionMnistDir);
  const double step_seconds = DeviceFigureSeconds(options, 3.0);
  if (speed_only) {
    RETURN_IF_ERROR(AddLibtorchStepComparison(*data, base, options, step_seconds, report));
    RETURN_IF_ERROR(AddStepSpeeds(*data, base, step_seconds, report));
    return report;
  }
  gan::FidClassifier::Options classifier_options;  // cached in ~/.cache/troupe, trained on first use
  classifier_options.threads = kGanThreads;
  auto classifier = gan::FidClassifier::LoadOrTrain(classifier_options, Log);
  if (!classifier.ok()) return classifier.status();
  gan::GanEvaluator evaluator(classifier->get(), *data);
  const int64_t samples = options.quick ? 2000 : 10000;

  // The floor: real against real.
  const double floor = evaluator.RealAgainstRealFid(*data, samples);
  report.Add(absl::StrFormat("classifier-FID floor: %d train vs %d test images", samples, samples), floor, "FID",
             "(itself)", floor);

  base.set_eval_samples(samples);
  // troupe against the reference implementation, at equal images.
  RETURN_IF_ERROR(AddReferenceComparison(*data, evaluator, base, reference_images, samples,
                                         static_cast<int>(std::min<int64_t>(reference_threads, 64)), reference_root,
                                         static_cast<double>(checkpoint_seconds), report));
  if (reference_only) return report;

  RETURN_IF_ERROR(AddLibtorchStepComparison(*data, base, options, step_seconds, report));

  // Equal images seen at growing global batch, 1 and 2 replicas.
  for (auto [batch, replicas] : kBatchPoints) {
    config::GanConfig c = base;
    c.set_batch_size(batch);
    c.mutable_engine()->set_replicas(replicas);
    auto trainer = gan::GanTrainer::Create(c, &*data);
    if (!trainer.ok()) return trainer.status();
    const int64_t steps = (budget + batch - 1) / batch;
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = (*trainer)->Train(steps); !s.ok()) return s;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const gan::Evaluation e = evaluator.Evaluate(**trainer, samples);
    const std::string grid = absl::StrFormat("%s/gan_bench_samples_b%d_k%d.png",
                                             std::filesystem::temp_directory_path().string(), batch, replicas);
    (void)WritePng(grid, gan::SampleGrid(**trainer));
    report.Add(absl::StrFormat("classifier-FID at %d images, batch %d, %d replica(s) [%.0f s, %.0f images/s; "
                               "score %.2f; D %.3f G %.3f]",
                               (*trainer)->images_seen(), batch, replicas, seconds,
                               (*trainer)->images_seen() / seconds, e.classifier_score,
                               (*trainer)->discriminator_loss(), (*trainer)->generator_loss()),
               e.fid, "FID", "real-vs-real floor (ratio = FID / floor; bar <= 5)", floor);
    std::printf("  samples: %s\n", grid.c_str());
  }
  return report;
}

}  // namespace troupe::bench
