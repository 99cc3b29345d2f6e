// `troupe bench gan`: TF-Replicator's large-batch GAN finding on this engine.
// For global batch 64, 256 and 1024 (replicas 1 and 2), trains the GAN mode
// for the same budget of real images seen (default 2,000,000; `--only
// images=N` lowers it, `--quick` uses 20,000) and reports the classifier-FID
// of the EMA generator (10,000 samples against the 10,000 test images) with
// its wall time and images/s; beside it the floor, the classifier-FID of
// 10,000 training images against the test images; and the generator +
// discriminator step's images/s against the same step in Debian's libtorch
// 1.13 (bench/peers/libtorch_gan.cc, compiled at run time when installed).
// The FID here is a classifier-FID (gan/fid.h), not Inception-FID.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/synthetic.h"
#include "bench/bench.h"
#include "common/image.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "gan/data.h"
#include "gan/evaluator.h"
#include "gan/fid.h"
#include "gan/trainer.h"

namespace troupe::bench {
namespace {

constexpr int kThreads = 2;

// The libtorch peer's images/s (best of 1 and 2 threads); NotFound without libtorch-dev.
absl::StatusOr<double> LibtorchGanRate(int64_t batch, const config::GanConfig& c, double seconds) {
  return RunLibtorchPeer("libtorch_gan", absl::StrCat(batch, " ", c.generator_channels(), " ", c.noise_size(), " ", seconds),
                         "images_per_second");
}

void Log(const std::string& line) { std::printf("%s\n", line.c_str()); std::fflush(stdout); }

}  // namespace

// --device cuda: the G+D step (n_critic 1) on GPU 0 at batch 256 and 4096,
// float32 and bfloat16, on synthetic images, against PyTorch (the machine's
// python3) eager and with the generator step compiled, on the same GPU.
absl::StatusOr<Report> RunGanBenchmarkOnCuda(const Options& options) {
  Report report;
  const double seconds = std::max(options.seconds_per_figure, 3.0);
  const gan::GanData data = bench::RandomGanData();
  for (const auto precision : {config::EngineConfig::FLOAT32, config::EngineConfig::BFLOAT16}) {
    const char* dtype = precision == config::EngineConfig::BFLOAT16 ? "bfloat16" : "float32";
    for (const int64_t batch : options.quick ? std::vector<int64_t>{64} : std::vector<int64_t>{256, 4096}) {
      config::GanConfig c;
      c.set_batch_size(batch);
      c.set_base_batch_size(batch);
      c.mutable_engine()->set_device(config::EngineConfig::CUDA);
      c.mutable_engine()->set_precision(precision);
      RETURN_IF_ERROR(engine::CheckDeviceAvailable(c.engine(), "gan"));
      ASSIGN_OR_RETURN(std::unique_ptr<gan::GanTrainer> trainer, gan::GanTrainer::Create(c, &data));
      RETURN_IF_ERROR(trainer->Train(2));  // warm up
      const double steps_per_s = MeasureRate(seconds, [&](long n) { (void)trainer->Train(n); });
      const std::string name = absl::StrFormat("G+D step (n_critic 1) on CUDA, %s, batch %d", dtype, batch);
      for (const char* mode : {"eager", "compile"}) {
        auto pytorch = RunGpuPytorchPeer(
            "torch_gan",
            absl::StrCat(batch, " ", c.generator_channels(), " ", c.noise_size(), " ", seconds, " ", mode, " cuda ", dtype),
            "images_per_second");
        if (!pytorch.ok()) std::printf("PyTorch peer (%s) unavailable: %s\n", mode, pytorch.status().ToString().c_str());
        report.Add(name, steps_per_s * batch, "images/s", absl::StrCat("PyTorch on the GPU, ", mode),
                   pytorch.ok() ? *pytorch : 0);
      }
    }
  }
  return report;
}

absl::StatusOr<Report> RunGanBenchmark(const Options& options) {
  if (options.device == "cuda") return RunGanBenchmarkOnCuda(options);
  Report report;
  int64_t budget = options.quick ? 20000 : 2000000;
  for (const std::string& f : options.filter) {
    if (f.rfind("images=", 0) == 0) budget = std::stoll(f.substr(7));
  }
  auto data = gan::LoadGanData(gan::kFashionMnistDir);
  if (!data.ok()) return data.status();
  gan::FidClassifier::Options classifier_options;  // cached in ~/.cache/troupe, trained on first use
  classifier_options.threads = kThreads;
  auto classifier = gan::FidClassifier::LoadOrTrain(classifier_options, Log);
  if (!classifier.ok()) return classifier.status();
  gan::GanEvaluator evaluator(classifier->get(), *data);
  const int64_t samples = options.quick ? 2000 : 10000;

  // The floor: real against real.
  const double floor = evaluator.RealAgainstRealFid(*data, samples);
  report.Add(absl::StrFormat("classifier-FID floor: %d train vs %d test images", samples, samples), floor, "FID",
             "(itself)", floor);

  // Step throughput against libtorch at batch 64.
  config::GanConfig base;
  base.mutable_engine()->set_threads(kThreads);
  base.set_eval_samples(samples);
  {
    config::GanConfig c = base;
    c.set_batch_size(64);
    auto trainer = gan::GanTrainer::Create(c, &*data);
    if (!trainer.ok()) return trainer.status();
    if (absl::Status s = (*trainer)->Train(2); !s.ok()) return s;  // warm up
    const double seconds = std::max(options.seconds_per_figure, 3.0);
    const double steps_per_s = MeasureRate(seconds, [&](long n) { (void)(*trainer)->Train(n); });
    auto torch = LibtorchGanRate(64, c, seconds);
    if (!torch.ok()) std::printf("libtorch peer unavailable: %s\n", torch.status().ToString().c_str());
    report.Add(absl::StrFormat("G+D step (n_critic 1), batch 64, %d threads", kThreads), steps_per_s * 64, "images/s",
               torch.ok() ? "libtorch 1.13, best of 1/2 threads" : "libtorch (not installed)", torch.ok() ? *torch : 0);
  }

  // Equal images seen at growing global batch, 1 and 2 replicas.
  for (auto [batch, replicas] : {std::pair{64, 1}, {256, 1}, {256, 2}, {1024, 1}, {1024, 2}}) {
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
