// `troupe bench learner`: the nn engine on a DrQ-style network (Kostrikov et
// al. 2020: 3 stacked RGB frames of 84x84 given as uint8 as replay holds them
// and made float planes in the step, four 3x3 convs of 32 channels, first stride 2,
// linear 50, layer norm, tanh, then a 2x1024 MLP), forward + backward + Adam,
// against (a) the same network in Debian's libtorch 1.13 at its best thread
// count, compiled and run as a separate peer program when libtorch-dev is
// installed (never a troupe dependency), and (b) Eigen's own float GEMM on
// this machine; and PyTorch 2.x (eager, torch.compile) and JAX (jax.jit)
// from virtual environments the bench makes. Also batch 128 at 64x64, and
// the all-reduce of the encoder's gradient buffer for K=2 over MPI against a
// raw MPI_Allreduce.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/strict_cpu_backend.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace troupe::bench {
namespace {

constexpr int kThreads = 2;
constexpr int64_t kFrames = 3;  // frames stacked per sample: 9 input channels

// The benchmark network on one ParameterSet.
struct DrqNetwork {
  nn::ParameterSet params;
  nn::Conv2dLayer c1, c2, c3, c4;
  nn::LinearLayer fc;
  nn::LayerNormLayer ln;
  nn::Mlp head;
  int64_t size, spatial;
  int encoder_params = 0;  // parameters [0, encoder_params) are the encoder's

  DrqNetwork(int64_t image_size, nn::Backend& backend) : size(image_size) {
    c1 = nn::Conv2dLayer::Create(params, "c1", 9, 32, 3, /*stride=*/2, /*pad=*/0);
    c2 = nn::Conv2dLayer::Create(params, "c2", 32, 32, 3, /*stride=*/1, /*pad=*/0);
    c3 = nn::Conv2dLayer::Create(params, "c3", 32, 32, 3, /*stride=*/1, /*pad=*/0);
    c4 = nn::Conv2dLayer::Create(params, "c4", 32, 32, 3, /*stride=*/1, /*pad=*/0);
    spatial = (size - 3) / 2 + 1 - 6;
    fc = nn::LinearLayer::Create(params, "fc", 32 * spatial * spatial, 50);
    ln = nn::LayerNormLayer::Create(params, "ln", 50);
    encoder_params = params.size();
    head = nn::Mlp::Create(params, "head", {50, 1024, 1024, 1});
    params.Allocate(backend, /*seed=*/1);
  }

  nn::Var Forward(nn::Tape& t, nn::Var x) {
    constexpr auto kRelu = nn::FusedActivation::kRelu;
    x = c1(t, params, x, kRelu);
    x = c2(t, params, x, kRelu);
    x = c3(t, params, x, kRelu);
    x = c4(t, params, x, kRelu);
    x = nn::Tanh(ln(t, params, fc(t, params, nn::Flatten(x))));
    return head(t, params, x);
  }

  int64_t EncoderFloats() const {
    return encoder_params < params.size() ? params.info(encoder_params).offset : params.total_floats();
  }

  // GEMM flops of one forward + backward per sample: convs and linears, dx
  // skipped for the first conv (its input needs no gradient).
  double FlopsPerSample() const {
    double f = 0;
    int64_t h = size;
    int64_t c = 9;
    for (int layer = 0; layer < 4; ++layer) {
      const int64_t stride = layer == 0 ? 2 : 1;
      const int64_t oh = (h - 3) / stride + 1;
      const double fwd = 2.0 * oh * oh * 32 * c * 9;
      f += fwd * (layer == 0 ? 2 : 3);
      h = oh;
      c = 32;
    }
    const double linear = 2.0 * (32 * spatial * spatial * 50 + 50 * 1024 + 1024 * 1024 + 1024);
    return f + 3 * linear;
  }
};

// samples/s of forward + backward + Adam at `batch` on `backend`;
// `after_warmup`, when given, runs between the warm-up step and the timed ones.
double MeasureTroupe(nn::Backend& backend, int64_t batch, int64_t size, double seconds,
                     const std::function<void()>& after_warmup = {}) {
  DrqNetwork net(size, backend);
  nn::Adam adam(&net.params, &backend);
  nn::Tape tape(&backend);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(0.0f, 1.0f);
  // The images as replay holds them and as every peer is handed them: uint8
  // [batch, kFrames, size, size, 3], each frame's colours interleaved; the
  // step turns them into float planes [batch, 9, size, size] / 255 as the
  // D4PG learner does (the peers into their own layouts, inside their steps).
  std::vector<uint8_t> frames(batch * kFrames * size * size * 3);
  for (uint8_t& v : frames) v = static_cast<uint8_t>(rng() >> 56);
  std::vector<float> y(batch);
  for (float& v : y) v = d(rng);
  // The batch on the device once, as the peers' tensors are made once.
  nn::DeviceBuffer x_device(backend, static_cast<int64_t>(frames.size() + 3) / 4), y_device(backend, batch);
  backend.Upload(frames.data(), x_device.data(), frames.size());
  y_device.Upload(y);
  // The step as RunStep takes it: Adam's per-step values on the device
  // first, then the kernels. On PJRT one program, recorded twice and then
  // replayed (the host no longer runs the tape); kernels elsewhere.
  const uint64_t signature = static_cast<uint64_t>(batch) << 32 | static_cast<uint64_t>(size);
  auto step = [&] {
    adam.Prepare(1e-4f);
    backend.RunStep(signature, [&] {
      tape.Reset();
      net.params.ZeroGrad();
      const nn::Var planes = nn::DeviceImagesToFloat(tape, reinterpret_cast<const uint8_t*>(x_device.data()),
                                                     batch * kFrames, size, size, /*channels=*/3, 1.0f / 255.0f);
      nn::Var loss = nn::MeanSquaredError(net.Forward(tape, nn::Reshape(planes, {batch, 3 * kFrames, size, size})),
                                          tape.Constant(y_device.data(), {batch, 1}));
      tape.Backward(loss);
      adam.Apply();
    });
  };
  step();  // warm up: arena and scratch reach their size (and cuDNN measures its algorithms)
  // Finished before the clock starts: an asynchronous backend (PJRT, CUDA)
  // would otherwise run the warm-up inside the first timed steps (where one
  // step outlasts a round, the round's one timed step counted two).
  backend.Synchronize();
  if (after_warmup) after_warmup();
  return batch * MeasureRate(seconds, [&](long n) {
           for (long i = 0; i < n; ++i) step();
           backend.Synchronize();  // queued kernels count (a GPU backend may run asynchronously)
         });
}

// Eigen's float GEMM (single-threaded Eigen, one 1024^3 product per thread,
// both threads at once): the machine's GEMM GFLOP/s on kThreads cores.
double MeasureEigenGemm(double seconds) {
  constexpr int kN = 1024;
  std::vector<Eigen::MatrixXf> a, b, c;
  for (int t = 0; t < kThreads; ++t) {
    a.push_back(Eigen::MatrixXf::Random(kN, kN));
    b.push_back(Eigen::MatrixXf::Random(kN, kN));
    c.push_back(Eigen::MatrixXf::Zero(kN, kN));
  }
  const double rate = MeasureRate(seconds, [&](long n) {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (long i = 0; i < n; ++i) c[t].noalias() = a[t] * b[t];
      });
    }
  });
  return rate * kThreads * 2.0 * kN * kN * kN / 1e9;
}

// A backend for `engine` made while the environment has name=value (the
// backends' switches for another path: TROUPE_CUDA_CONV, TROUPE_CUDA_ASYNC,
// TROUPE_PJRT_WEIGHT_GRADIENTS), the variable unset again after.
absl::StatusOr<std::unique_ptr<nn::Backend>> MakeBackendWithEnv(const config::EngineConfig& engine, const char* name,
                                                                const char* value) {
  setenv(name, value, /*overwrite=*/1);
  absl::StatusOr<std::unique_ptr<nn::Backend>> made = engine::MakeBackend(engine, /*local_index=*/0, 1);
  unsetenv(name);
  return made;
}

// The GPU peers' rows for the DrQ step at 84x84, `batch`, `dtype`
// ("float32", "bfloat16") on `backend`: PyTorch (the machine's python3)
// eager, and compiled at batch 256, and JAX's jax.jit, each by the protocol
// for GPU peers (GpuProtocol).
absl::Status AddGpuPeerRows(Report& report, const std::string& name, nn::Backend& backend, int64_t batch,
                            const char* dtype, const Options& options, double seconds) {
  const Side troupe = [&](const Round& round) -> absl::StatusOr<double> {
    return MeasureTroupe(backend, batch, 84, round.seconds);
  };
  const ProtocolOptions protocol = GpuProtocol(options, seconds);
  const auto args = [batch, dtype](std::string tail) {
    return [=](const Round& round) { return absl::StrCat(batch, " 84 ", round.seconds, " ", tail, " ", dtype); };
  };
  for (const std::string& mode : GpuPeerModes(batch)) {
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s", absl::StrCat("PyTorch on the GPU, ", mode), troupe,
                                  PeerSide(Peer::kGpuPytorch, "torch_drq", args(mode + " cuda"), "samples_per_second"),
                                  protocol)
                        .status());
  }
  // The machine's JAX: the whole step as one XLA program.
  return AddComparison(report, name, "samples/s", "JAX on the GPU, jax.jit", troupe,
                       PeerSide(Peer::kGpuJax, "jax_drq", args("jit cuda"), "samples_per_second"), protocol)
      .status();
}

}  // namespace

// --device cuda: the DrQ step on GPU 0 at batch 256 and 1024, float32 and
// bfloat16, against PyTorch (the machine's python3) eager and compiled, and
// JAX (jax.jit, the machine's JAX), on the same GPU in the same run; and the host<->device copies a D4PG step makes.
absl::StatusOr<Report> RunLearnerBenchmarkOnCuda(const Options& options) {
  Report report;
  const double seconds = DeviceFigureSeconds(options, 2.0);
  for (const auto precision : {config::EngineConfig::FLOAT32, config::EngineConfig::BFLOAT16}) {
    config::EngineConfig engine;
    engine.set_device(config::EngineConfig::CUDA);
    engine.set_precision(precision);
    RETURN_IF_ERROR(engine::CheckDeviceAvailable(engine, "bench"));
    ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> gpu, engine::MakeBackend(engine, /*local_index=*/0, /*threads=*/1));
    const bool bf16 = precision == config::EngineConfig::BFLOAT16;
    const char* dtype = bf16 ? "bfloat16" : "float32";
    for (const int64_t batch : options.quick ? std::vector<int64_t>{32} : std::vector<int64_t>{256, 1024}) {
      RETURN_IF_ERROR(AddGpuPeerRows(
          report, absl::StrFormat("DrQ 9x84x84 fwd+bwd+Adam on %s, %s, batch %d", gpu->name(), dtype, batch), *gpu,
          batch, dtype, options, seconds));
    }
    if (bf16) break;
    // The same step on the backend's other paths, each next to the default
    // in the same run: convolutions by im2col + cuBLAS (TROUPE_CUDA_CONV=
    // im2col, what the backend takes without cuDNN), and kernels queued
    // without a wait after each call (TROUPE_CUDA_ASYNC=1).
    if (!options.quick) {
      const ProtocolOptions protocol = GpuProtocol(options, seconds);
      const auto step_on = [](nn::Backend& b) -> Side {
        return [&b](const Round& round) -> absl::StatusOr<double> { return MeasureTroupe(b, 256, 84, round.seconds); };
      };
      ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> im2col, MakeBackendWithEnv(engine, "TROUPE_CUDA_CONV", "im2col"));
      RETURN_IF_ERROR(AddComparison(report,
                                    "DrQ 9x84x84 fwd+bwd+Adam on cuda, float32, batch 256: the default convolutions "
                                    "(cuDNN)",
                                    "samples/s", "troupe with im2col + cuBLAS convolutions", step_on(*gpu),
                                    step_on(*im2col), protocol)
                          .status());
      im2col.reset();
      ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> async, MakeBackendWithEnv(engine, "TROUPE_CUDA_ASYNC", "1"));
      RETURN_IF_ERROR(AddComparison(report, "DrQ 9x84x84 fwd+bwd+Adam on cuda, float32, batch 256: asynchronous kernels",
                                    "samples/s", "troupe, a wait after every call (default)", step_on(*async),
                                    step_on(*gpu), protocol)
                          .status());
    }
    // What a D4PG pixel step moves between host and GPU: its batch in (uint8
    // observations and next observations, 3 frames of 84x84x3 each, at batch
    // 256) and the policy's parameters out, each once per step.
    const int64_t pixel_bytes = 2 * int64_t{256} * 3 * 84 * 84 * 3;
    std::vector<uint8_t> host(pixel_bytes);
    void* device = gpu->Allocate(pixel_bytes);
    const double uploads = MeasureRate(seconds, [&](long n) {
      for (long i = 0; i < n; ++i) gpu->Upload(host.data(), device, pixel_bytes);
      gpu->Synchronize();
    });
    gpu->Free(device);
    report.Add("upload of a D4PG pixel batch (2 x 256 x 3 x 84x84x3 bytes)", 1000.0 / uploads, "ms", "(no reference)", 0);
    DrqNetwork net(84, *gpu);
    std::vector<float> parameters(net.params.total_floats());
    const double downloads = MeasureRate(seconds, [&](long n) {
      for (long i = 0; i < n; ++i) gpu->Download(net.params.device_values(), parameters.data(), 4 * parameters.size());
    });
    report.Add(absl::StrFormat("download of the DrQ network's parameters (%.1f MB)", 4e-6 * parameters.size()),
               1000.0 / downloads, "ms", "(no reference)", 0);
  }
  return report;
}

// --device pjrt: the DrQ step through a PJRT plugin as ONE compiled program
// per step, all in one run. On a GPU plugin: at batch 256 and 1024, float32
// and bfloat16, against PyTorch eager (and compiled at 256) and JAX's
// jax.jit on the same GPU. On the CPU plugin: against JAX's jax.jit on its
// CPU backend (the same XLA: this measures troupe's lowering), by the
// comparison protocol (bench/protocol.h), on the same threads. Then, at one
// batch in float32, next to the same step kernel at a time (one program per
// kernel call) and troupe's own backend for that device (the CPU backend, or
// the CUDA backend where built), with the launches per step, the host's
// milliseconds per compiled step and its compile time.
absl::StatusOr<Report> RunLearnerBenchmarkOnPjrt(const Options& options) {
#ifndef TROUPE_HAVE_PJRT
  return absl::InvalidArgumentError("--device pjrt: this troupe was built without the PJRT backend (TROUPE_PJRT=ON)");
#else
  Report report;
  const double seconds = DeviceFigureSeconds(options, 2.0);
  config::EngineConfig engine;
  engine.set_device(config::EngineConfig::PJRT);
  engine.set_pjrt_plugin(options.pjrt_plugin);
  engine.set_pjrt_cache_dir("");  // the compile time is a figure here
  RETURN_IF_ERROR(engine::ValidateEngineConfig(engine, "bench", 1));
  RETURN_IF_ERROR(engine::CheckDeviceAvailable(engine, "bench"));
  ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> compiled, engine::MakeBackend(engine, /*local_index=*/0, 1));
  config::EngineConfig kernels_engine = engine;
  kernels_engine.set_pjrt_steps(config::EngineConfig::KERNELS);
  ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> kernels, engine::MakeBackend(kernels_engine, 0, 1));
  const bool on_cpu = !MeasuredAsGpu(compiled->name());
  if (!on_cpu) {
    // On a GPU, the bars' grid: one program per step at batch 256 and 1024,
    // float32 and bfloat16, against PyTorch eager (and compiled) and JAX.
    for (const auto precision : {config::EngineConfig::FLOAT32, config::EngineConfig::BFLOAT16}) {
      config::EngineConfig grid_engine = engine;
      grid_engine.set_precision(precision);
      ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> b, engine::MakeBackend(grid_engine, 0, 1));
      const char* dtype = precision == config::EngineConfig::BFLOAT16 ? "bfloat16" : "float32";
      for (const int64_t grid_batch : options.quick ? std::vector<int64_t>{32} : std::vector<int64_t>{256, 1024}) {
        RETURN_IF_ERROR(AddGpuPeerRows(report,
                                       absl::StrFormat("DrQ 9x84x84 fwd+bwd+Adam on %s, one program per step, %s, "
                                                       "batch %d",
                                                       b->name(), dtype, grid_batch),
                                       *b, grid_batch, dtype, options, seconds));
      }
    }
  }
  // The CPU plugin gets the CPU rows' smaller configuration.
  const int64_t size = on_cpu ? 64 : 84;
  const int64_t batch = options.quick ? 16 : on_cpu ? 128 : 256;
  const std::string name = absl::StrFormat("DrQ 9x%dx%d fwd+bwd+Adam on %s, one program per step, float32, batch %d",
                                           size, size, compiled->name(), batch);
  auto& backend = static_cast<pjrt::PjrtBackend&>(*compiled);
  pjrt::PjrtStats warm;  // after the first step (its compile, the arena's first allocation)
  MeasureTroupe(backend, batch, size, seconds, [&] { warm = backend.stats(); });
  const pjrt::PjrtStats stats = backend.stats();
  const double timed_steps = static_cast<double>(std::max<int64_t>(1, stats.steps - warm.steps));

  // Every comparison below by the protocol (bench/protocol.h): a warm-up
  // round each, then rounds alternated troupe, peer, troupe, ... of
  // `seconds` each; the medians and their ratio. On the CPU plugin the same
  // threads for both: its pools span every CPU this process may run on, and
  // a peer is given as many (jax_drq.py confines itself to that many of the
  // same CPUs: all of them). On a GPU, the GPU peers' protocol.
  const ProtocolOptions protocol =
      on_cpu ? DefaultProtocol(options, SchedulableCpus(), seconds) : GpuProtocol(options, seconds);
  // Each troupe round makes the network afresh and steps it once untimed,
  // as each peer round is a fresh process that warms up untimed; troupe's
  // program is compiled already (the backend keeps it).
  const Side troupe_round = [&](const Round& round) -> absl::StatusOr<double> {
    return MeasureTroupe(backend, batch, size, round.seconds);
  };
  if (on_cpu) {
    // JAX's jit of the same network: the same XLA compiler, so this
    // measures troupe's lowering, not XLA.
    const auto jax_on = [&](const std::string& device) -> Side {
      return PeerSide(
          device == "pjrt" ? Peer::kJaxOnTroupesRuntime : Peer::kJax, "jax_drq",
          [=](const Round& round) {
            return absl::StrCat(batch, " ", size, " ", round.seconds, " jit ", device, " float32");
          },
          "samples_per_second");
    };
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s", "JAX 0.11.2 jax.jit on its CPU backend", troupe_round,
                                  jax_on("cpu"), protocol)
                        .status());
    // JAX's jit on the plugin troupe loads and on troupe's malloc: the same
    // compiler, runtime and allocator on both sides, so this row measures
    // the programs alone (the row above also the plugin's build against
    // jaxlib's, and the allocators).
    RETURN_IF_ERROR(SetPeersPjrtPlugin(options.pjrt_plugin));
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s", "JAX 0.11.2 jax.jit on the same PJRT plugin and malloc",
                                  troupe_round, jax_on("pjrt"), protocol)
                        .status());
  }
  // troupe's other paths for the same step, by the same protocol.
  const auto same_step_on = [&](nn::Backend& other) -> Side {
    return [&other, batch, size](const Round& round) -> absl::StatusOr<double> {
      return MeasureTroupe(other, batch, size, round.seconds);
    };
  };
  RETURN_IF_ERROR(AddComparison(report, name, "samples/s", "the same step kernel at a time on the same plugin",
                                troupe_round, same_step_on(*kernels), protocol)
                      .status());
  if (on_cpu) {
    nn::CpuBackend cpu(kThreads);
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s",
                                  absl::StrFormat("troupe's CPU backend, %d threads, same step", kThreads),
                                  troupe_round, same_step_on(cpu), protocol)
                        .status());
    // The same step with each convolution's weight gradient one
    // convolution over the batch (PjrtBackendOptions::split_weight_gradients),
    // where troupe splits it on the CPU plugin. Not on a GPU, which takes
    // the one convolution (the split's compile and rounds would come out
    // of a lease's few minutes).
    ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> one,
                     MakeBackendWithEnv(engine, "TROUPE_PJRT_WEIGHT_GRADIENTS", "one"));
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s",
                                  "the same step, each weight gradient one convolution over the batch", troupe_round,
                                  same_step_on(*one), protocol)
                        .status());
  } else {
    config::EngineConfig cuda;
    cuda.set_device(config::EngineConfig::CUDA);
    if (engine::CheckDeviceAvailable(cuda, "bench").ok()) {
      ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> reference, engine::MakeBackend(cuda, 0, 1));
      RETURN_IF_ERROR(AddComparison(report, name, "samples/s", "troupe's CUDA backend, same step", troupe_round,
                                    same_step_on(*reference), protocol)
                          .status());
    }
  }

  // What a compiled step costs besides its execution.
  report.Add("program executions per compiled step", (stats.step_launches - warm.step_launches) / timed_steps,
             "launches", "(no reference)", 0);
  report.Add("compiled steps replayed (not recorded) of those timed",
             static_cast<double>(stats.step_replays - warm.step_replays) / timed_steps, "fraction", "(no reference)", 0);
  report.Add("host time per compiled step (record or bind, find the program, inputs)",
             1e3 * (stats.step_host_seconds + stats.replay_host_seconds - warm.step_host_seconds -
                    warm.replay_host_seconds) /
                 timed_steps,
             "ms", "(no reference)", 0);
  report.Add("  of which the program's text and its lookup",
             1e3 * (stats.step_program_seconds - warm.step_program_seconds) / timed_steps, "ms", "(no reference)", 0);
  report.Add("compile time of the step's program", stats.compile_seconds, "s", "(no reference)", 0);
  auto& by_kernel = static_cast<pjrt::PjrtBackend&>(*kernels);
  const int64_t kernel_launches = by_kernel.stats().launches;
  const uint64_t kernel_steps = by_kernel.steps_begun();
  MeasureTroupe(by_kernel, batch, size, 0.0);
  report.Add("kernel launches per step, kernel at a time",
             static_cast<double>(by_kernel.stats().launches - kernel_launches) /
                 static_cast<double>(by_kernel.steps_begun() - kernel_steps),
             "launches", "(no reference)", 0);
  return report;
#endif
}

absl::StatusOr<Report> RunLearnerBenchmark(const Options& options) {
  if (options.device == "cuda") return RunLearnerBenchmarkOnCuda(options);
  if (options.device == "pjrt") return RunLearnerBenchmarkOnPjrt(options);
  Report report;
  const double seconds = DeviceFigureSeconds(options, 2.0);
  const int64_t batch = options.quick ? 32 : 256;
  nn::CpuBackend cpu(kThreads);
  DrqNetwork shape_only(84, cpu);

  // Eigen GEMM first: the reference for the engine's GFLOP/s.
  const double gemm = MeasureEigenGemm(seconds);
  // Every peer by the comparison protocol (bench/protocol.h): rounds
  // alternated with troupe's, the same time per round, both on kThreads
  // threads (the peer told as many), medians and ranges.
  const ProtocolOptions protocol = DefaultProtocol(options, kThreads, seconds);
  const auto troupe_at = [&](int64_t b, int64_t image) -> Side {
    return [&cpu, b, image](const Round& round) -> absl::StatusOr<double> {
      return MeasureTroupe(cpu, b, image, round.seconds);
    };
  };
  const auto peer_args = [](int64_t b, int64_t image, const std::string& tail) {
    return [=](const Round& round) { return absl::StrCat(b, " ", image, " ", round.seconds, tail); };
  };
  const std::string name = absl::StrFormat("DrQ 9x84x84 fwd+bwd+Adam, batch %d, %d threads", batch, kThreads);
  ASSIGN_OR_RETURN(const double troupe,
                   AddComparison(report, name, "samples/s", "libtorch 1.13", troupe_at(batch, 84),
                                 PeerSide(Peer::kLibtorch, "libtorch_drq", peer_args(batch, 84, ""),
                                          "samples_per_second"),
                                 protocol));
  // What a user would pick instead today: PyTorch 2.x, eager and compiled.
  for (const std::string mode : {"eager", "compile"}) {
    RETURN_IF_ERROR(AddComparison(report, name, "samples/s",
                                  mode == "eager" ? "PyTorch 2.5 eager" : "PyTorch 2.5 torch.compile",
                                  troupe_at(batch, 84),
                                  PeerSide(Peer::kPytorch, "torch_drq", peer_args(batch, 84, " " + mode),
                                           "samples_per_second"),
                                  protocol)
                        .status());
  }
  // And JAX: the whole step as one XLA program (jax.jit), on the XLA release
  // of the PJRT CPU plugin troupe's PJRT backend loads.
  RETURN_IF_ERROR(AddComparison(report, name, "samples/s", "JAX 0.11.2 jax.jit", troupe_at(batch, 84),
                                PeerSide(Peer::kJax, "jax_drq", peer_args(batch, 84, " jit cpu float32"),
                                         "samples_per_second"),
                                protocol)
                      .status());
  report.Add("engine GEMM throughput on that step", troupe * shape_only.FlopsPerSample() / 1e9, "GFLOP/s",
             absl::StrFormat("Eigen float GEMM 1024^3, %d threads", kThreads), gemm);

  // The smaller configuration.
  const int64_t small_batch = options.quick ? 16 : 128;
  const std::string name64 = absl::StrFormat("DrQ 9x64x64 fwd+bwd+Adam, batch %d, %d threads", small_batch, kThreads);
  ASSIGN_OR_RETURN(const double troupe64,
                   AddComparison(report, name64, "samples/s", "libtorch 1.13", troupe_at(small_batch, 64),
                                 PeerSide(Peer::kLibtorch, "libtorch_drq", peer_args(small_batch, 64, ""),
                                          "samples_per_second"),
                                 protocol));

  // The strict CPU device (tests only): the same kernels with the arena
  // opened and closed around each call.
  nn::StrictCpuBackend strict(kThreads);
  report.Add("the same 64x64 step on the strict CPU device (tests only)",
             MeasureTroupe(strict, small_batch, 64, seconds), "samples/s", "the CPU backend, same step", troupe64);

  // The encoder's gradient buffer across two MPI processes.
  const int64_t encoder_floats = shape_only.EncoderFloats();
  auto mpi = MeasureMpiAllReduce(encoder_floats, /*reps=*/20);
  if (!mpi.ok()) {
    // A relocated bundle carries no mpirun: the row is left out, saying why.
    std::printf("K=2 MPI all-reduce not measured: %s\n", mpi.status().ToString().c_str());
    return report;
  }
  // Times: ratio = troupe / raw (lower is better here).
  report.Add(absl::StrFormat("all-reduce of encoder grads (%.1f MB), K=2 MPI", encoder_floats * 4 / 1e6),
             mpi->troupe_ms, "ms", "raw MPI_Allreduce, same buffer", mpi->raw_ms);
  return report;
}

}  // namespace troupe::bench
