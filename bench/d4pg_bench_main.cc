// Measures D4PG learner updates/s on synthetic batches (no actors; replay with --replay):
//   d4pg_bench [--peers] [--rounds N] [--json PATH] [--per-execution N] [--no-overlap] [--replay HELD] [state|pixels] [batch] [threads] [updates] [conv_channels] [hidden] [device]
// state: cartpole-sized (5 floats, 1 action); pixels: 3 frames of 84x84.
// conv_channels and hidden (one size for both MLP layers) default to the config's defaults.
// device: cpu (default), cpu_strict, cuda or cuda-bf16 (bfloat16 matmul/conv inputs),
// pjrt (one compiled program per update) or pjrt-kernels (kernel at a time),
// both through the plugin $TROUPE_PJRT_PLUGIN names; pjrt also prints the
// executions per update, the host's milliseconds per update (wall time
// outside the waits, and the learner thread's CPU time, split into the
// plugin's calls and troupe's own: pjrt::CountPluginCpu) and the compile time,
// and what the host waited for results and the device idled between executions
// (--no-overlap: each execution's epilogue before the next is launched).
// Each update uploads its batch (uint8 pixels) as the learner does.
// --replay HELD (pixels): the learner's own input instead of one batch
// served again: an embedded replay of HELD transitions (bench/synthetic.h,
// written as an actor writes them), batch / 32 more inserted before each
// sample, sampled as frame references into the device frame table by the
// prefetching input thread (learner.device_frames, learner.prefetch_input);
// the warm-up passes over replay first (the frames put on the device), and
// it also prints what the updates waited for their input.
// --peers (pixels): also the same update in PyTorch 2.x (bench/peers/torch_d4pg.py:
// eager, torch.compile, and on a GPU torch.compile's reduce-overhead) and JAX
// (bench/peers/jax_d4pg.py, jax.jit), each a table row beside troupe's figure
// measured by the comparison protocol (bench/protocol.h: N rounds alternated,
// default 5 on the CPU, 3 on a GPU; medians and ranges; bench.h's Report: a
// peer that cannot run is "missing", never a ratio of 0), and with --json
// PATH written there as `troupe bench --json` writes. On the CPU they run
// from virtual environments under the build directory, made on first use
// (bench.h Peer); on a GPU with the machine's python3.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/synthetic.h"
#include "agents/d4pg_agent.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "replay/item.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace {

// The PyTorch and JAX peers' rows for the pixel update at `batch` with the
// config's networks, on `device` and `threads` (d4pg_bench's), on the GPU
// where `gpu` (troupe's update ran on one: CUDA, or a PJRT plugin's GPU),
// each by the comparison protocol (bench/protocol.h; bench::GpuProtocol on a
// GPU): troupe's side trains `agent` on `sample` for each round's seconds.
absl::Status ReportPeers(const troupe::config::ExperimentConfig& config, const std::string& device, bool gpu,
                         int batch, int threads, troupe::agents::D4pgAgent& agent,
                         const troupe::agents::D4pgAgent::SampleFn& sample, const troupe::bench::Options& options,
                         const std::string& json) {
  using namespace troupe;
  const config::D4pgConfig& d4pg = config.d4pg();
  const std::vector<int64_t> hidden(d4pg.hidden().begin(), d4pg.hidden().end());
  // The peers take one hidden size for both layers; the default is 256.
  const int64_t hidden_size = hidden.empty() ? 256 : hidden.front();
  // BATCH SIZE FRAMES SECONDS MODE DEVICE KEY=VALUE... (torch_d4pg.py's usage);
  // the peer's device the one troupe's update ran on unless `on` names another.
  const auto peer_args = [&](const std::string& mode, std::string on = "") {
    if (on.empty()) on = gpu ? "cuda" : "cpu";
    return [=, &config](const bench::Round& round) {
      return absl::StrCat(batch, " 84 3 ", round.seconds, " ", mode, " ", on,
                          " channels=", d4pg.conv_channels(), " hidden=", hidden_size, " actions=1 atoms=",
                          d4pg.atoms(), " prioritized=", config.learner().prioritized() ? 1 : 0,
                          " precision=", device == "cuda-bf16" ? "bfloat16" : "float32");
    };
  };
  const bench::Side troupe_side = [&](const bench::Round& round) -> absl::StatusOr<double> {
    absl::Status error;
    const double rate = bench::MeasureRate(round.seconds, [&](long n) {
      if (error.ok()) error = agent.Train(n, sample);
    });
    RETURN_IF_ERROR(error);
    return rate;
  };
  const bench::ProtocolOptions protocol =
      gpu ? bench::GpuProtocol(options) : bench::DefaultProtocol(options, threads);
  bench::Report report;
  report.benchmark = "d4pg";
  const std::string name =
      absl::StrFormat("D4PG pixel update 3x84x84, batch %d, %s, %d threads", batch, device, threads);
  std::vector<std::string> modes = {"eager", "compile"};
  if (gpu) {
    modes.push_back("reduce-overhead");
  } else {
    std::printf("(PyTorch reduce-overhead: CUDA graphs, CUDA only; not run on the CPU)\n");
  }
  for (const std::string& mode : bench::PytorchPeerModes(modes)) {
    RETURN_IF_ERROR(bench::AddComparison(
                        report, name, "updates/s", absl::StrCat(gpu ? "PyTorch on the GPU, " : "PyTorch 2.5, ", mode),
                        troupe_side,
                        bench::PeerSide(gpu ? bench::Peer::kGpuPytorch : bench::Peer::kPytorch, "torch_d4pg",
                                        peer_args(mode), "updates_per_second"),
                        protocol)
                        .status());
  }
  RETURN_IF_ERROR(bench::AddComparison(report, name, "updates/s",
                                       gpu ? "JAX on the GPU, jax.jit" : "JAX 0.11.2 jax.jit", troupe_side,
                                       bench::PeerSide(gpu ? bench::Peer::kGpuJax : bench::Peer::kJax, "jax_d4pg",
                                                       peer_args("jit"), "updates_per_second"),
                                       protocol)
                      .status());
  if (device == "pjrt" && !gpu) {
    // JAX's jit on the plugin troupe's update ran on and on troupe's malloc:
    // the same compiler, runtime and allocator on both sides, the programs
    // alone (the row above also the plugin's build against jaxlib's, and
    // the allocators).
    const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");  // where troupe's update ran
    RETURN_IF_ERROR(bench::SetPeersPjrtPlugin(plugin != nullptr ? plugin : ""));
    RETURN_IF_ERROR(bench::AddComparison(report, name, "updates/s", "JAX 0.11.2 jax.jit on the same PJRT plugin and malloc",
                                         troupe_side,
                                         bench::PeerSide(bench::Peer::kJaxOnTroupesRuntime, "jax_d4pg", peer_args("jit", "pjrt"),
                                                         "updates_per_second"),
                                         protocol)
                        .status());
  }
  if (json.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(WriteFileAtomically(json, report.ToJson()));
  std::printf("wrote %s\n", json.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  // --peers and --rounds N, wherever they are, then the positional arguments.
  bool peers = false;
  bool overlap = true;
  int rounds = 0;
  int per_execution = 1;
  int replay_held = 0;
  std::string json;
  std::vector<char*> positional = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peers") == 0) {
      peers = true;
    } else if (std::strcmp(argv[i], "--no-overlap") == 0) {
      overlap = false;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--per-execution") == 0 && i + 1 < argc) {
      per_execution = std::atoi(argv[++i]);
      if (per_execution < 1 || per_execution > agents::kMaxUpdatesPerExecution) {
        std::fprintf(stderr, "d4pg_bench: --per-execution %s: want updates per execution in [1, %d]\n", argv[i],
                     agents::kMaxUpdatesPerExecution);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--replay") == 0 && i + 1 < argc) {
      replay_held = std::atoi(argv[++i]);
      if (replay_held < 1) {
        std::fprintf(stderr, "d4pg_bench: --replay %s: want the transitions replay holds, >= 1\n", argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1) {
        std::fprintf(stderr, "d4pg_bench: --rounds %s: want a number of rounds >= 1\n", argv[i]);
        return 2;
      }
    } else {
      positional.push_back(argv[i]);
    }
  }
  argc = static_cast<int>(positional.size());
  argv = positional.data();
  const std::string kind = argc > 1 ? argv[1] : "state";
  const int batch = argc > 2 ? std::atoi(argv[2]) : 256;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int updates = argc > 4 ? std::atoi(argv[4]) : (kind == "pixels" ? 5 : 200);
  if (replay_held > 0 && peers) {
    std::fprintf(stderr, "d4pg_bench: --replay with --peers: the peers are timed on one batch served again; "
                         "compare without --replay\n");
    return 2;
  }
  if (replay_held > 0 && kind != "pixels") {
    std::fprintf(stderr, "d4pg_bench: --replay feeds pixel updates; %s has no frames to reference\n", kind.c_str());
    return 2;
  }
  agents::ObservationSpec spec;
  if (kind == "pixels") {
    spec = bench::kSceneSpec;  // 3 frames of 84x84, as --replay's scene
  } else {
    spec = {.state_size = 5};
  }
  const int action_size = 1;
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(batch);
  config.mutable_learner()->set_updates_per_execution(per_execution);
  if (replay_held > 0) {  // the device frame table sized for that replay, as the learner sizes it
    config.mutable_learner()->set_replay_size(replay_held);
    config.mutable_learner()->set_min_replay_size(1);
  }
  config.mutable_learner()->mutable_engine()->set_threads(threads);
  if (argc > 5) config.mutable_d4pg()->set_conv_channels(std::atoi(argv[5]));
  if (argc > 6) {
    config.mutable_d4pg()->add_hidden(std::atoi(argv[6]));
    config.mutable_d4pg()->add_hidden(std::atoi(argv[6]));
  }
  const std::string device = argc > 7 ? argv[7] : "cpu";
  config::EngineConfig* engine = config.mutable_learner()->mutable_engine();
  if (device == "cpu_strict") {
    engine->set_device(config::EngineConfig::CPU_STRICT);
  } else if (device == "cuda" || device == "cuda-bf16") {
    engine->set_device(config::EngineConfig::CUDA);
    if (device == "cuda-bf16") engine->set_precision(config::EngineConfig::BFLOAT16);
  } else if (device == "pjrt" || device == "pjrt-kernels") {
    const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
    if (plugin == nullptr || *plugin == '\0') {
      std::fprintf(stderr, "d4pg_bench: device %s needs TROUPE_PJRT_PLUGIN=/path/to/plugin.so\n", device.c_str());
      return 2;
    }
    engine->set_device(config::EngineConfig::PJRT);
    engine->set_pjrt_plugin(plugin);
    engine->set_pjrt_cache_dir("");  // the compile time is a figure here
    if (device == "pjrt-kernels") engine->set_pjrt_steps(config::EngineConfig::KERNELS);
  } else if (device != "cpu") {
    std::fprintf(stderr, "d4pg_bench: unknown device '%s' (cpu, cpu_strict, cuda, cuda-bf16, pjrt, pjrt-kernels)\n",
                 device.c_str());
    return 2;
  }
  absl::Status usable = engine::ValidateEngineConfig(*engine, "learner", batch);
  if (usable.ok()) usable = engine::CheckDeviceAvailable(*engine, "learner");
  using ReplicatorOr = absl::StatusOr<std::unique_ptr<replicator::Replicator>>;
  ReplicatorOr replicator = usable.ok() ? engine::MakeReplicator(*engine) : ReplicatorOr(usable);
  if (!replicator.ok()) {
    std::fprintf(stderr, "d4pg_bench: %s\n", std::string(replicator.status().message()).c_str());
    return 1;
  }
  auto agent = agents::D4pgAgent::Create(config, spec, action_size, replicator->get());
  if (!agent.ok()) {
    std::fprintf(stderr, "%s\n", std::string(agent.status().message()).c_str());
    return 1;
  }
  (*agent)->set_overlap_epilogue(overlap);
  // One random batch, served every update; or (--replay) the learner's
  // input: frame references sampled from replay by the input thread.
  auto data = bench::RandomD4pgBatch(spec, action_size, config, batch, 1);
  TROUPE_CHECK(data.ok());
  agents::D4pgAgent::SampleFn sample = bench::ServeEveryUpdate(*data);
  bench::FilledReplay replay;
  std::unique_ptr<replay::Sampler> sampler;
  const int inserts_per_update = std::max(1, batch / 32);
  if (replay_held > 0) {
    if (!(*agent)->frame_references()) {
      std::fprintf(stderr, "d4pg_bench: --replay: this update keeps no device frame table to sample into\n");
      return 2;
    }
    auto filled = bench::FillTransitions(config, replay_held);
    auto made = filled.ok() ? filled->client->NewSampler({.table = agents::kTransitionTable,
                                                          .batch_size = batch,
                                                          .frame_references = true})
                            : absl::StatusOr<std::unique_ptr<replay::Sampler>>(filled.status());
    if (!made.ok()) {
      std::fprintf(stderr, "d4pg_bench: --replay: %s\n", made.status().ToString().c_str());
      return 1;
    }
    replay = std::move(*filled);
    sampler = std::move(*made);
    // The actors' inserts (a sample per 32 transitions' worth), then the
    // sample: both on the input thread.
    sample = [&replay, &sampler, inserts_per_update](int, int64_t, replay::SampledBatch* out) {
      RETURN_IF_ERROR(replay.stream->Write(inserts_per_update));
      return sampler->Next(out);
    };
    (*agent)->StartInput(sample);
  }
  const auto train = [&](int64_t n) { return replay_held > 0 ? (*agent)->Train(n) : (*agent)->Train(n, sample); };
  // Warm-up (arena, scratch; on PJRT the two recordings before replays;
  // with --replay, passes over replay that put its frames on the device, so
  // the timed updates upload only the frames inserted since the last).
  const int64_t warmup = replay_held > 0 ? std::max(2, 3 * replay_held / batch + 1) : 2;
  TROUPE_CHECK(train((warmup + per_execution - 1) / per_execution * per_execution).ok());
  (*agent)->metrics();  // the input waits of the timed updates only
#ifdef TROUPE_HAVE_PJRT
  const auto* pjrt_backend = dynamic_cast<const pjrt::PjrtBackend*>((*replicator)->backend(0).get());
  const pjrt::PjrtStats warm = pjrt_backend != nullptr ? pjrt_backend->stats() : pjrt::PjrtStats{};
  const int64_t warm_scatters = (*agent)->frame_stats().scatters;
  // The learner thread's CPU inside the plugin's calls, apart from troupe's own.
  pjrt::CountPluginCpu(pjrt_backend != nullptr);
  const double plugin_cpu_start = pjrt::PluginCpuSecondsOfThisThread();
#endif
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = bench::ThreadCpuSeconds();
  TROUPE_CHECK(train(updates).ok());
  const double learner_cpu = bench::ThreadCpuSeconds() - cpu_start;
#ifdef TROUPE_HAVE_PJRT
  const double plugin_cpu = pjrt::PluginCpuSecondsOfThisThread() - plugin_cpu_start;
  pjrt::CountPluginCpu(false);
#endif
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double input_wait = replay_held > 0 ? (*agent)->metrics().input_wait_s : 0.0;  // mean per update
  if (replay_held > 0) (*agent)->StopInput();
  std::printf("d4pg %s batch %d on %s, threads %d: %.2f updates/s (%.0f samples/s), %d updates in %.2f s\n",
              kind.c_str(), batch, device.c_str(), threads, updates / s, updates * batch / s, updates, s);
  if (replay_held > 0) {
    std::printf("replay of %d transitions, %d inserted per update, frame references into the device frame table: "
                "the updates waited %.3f ms each for their input\n",
                replay_held, inserts_per_update, 1e3 * input_wait);
  }
#ifdef TROUPE_HAVE_PJRT
  if (pjrt_backend != nullptr) {
    // The timed updates only (the warm-up's compile and first allocations apart).
    const pjrt::PjrtStats& stats = pjrt_backend->stats();
    if (stats.steps > warm.steps) {
      const double steps = updates;  // per update (an execution runs per_execution of them)
      // The frame table's uploads are steps too (a scatter each), counted apart.
      const double scatters = static_cast<double>((*agent)->frame_stats().scatters - warm_scatters);
      // Host time: the timed updates' wall time but the executions' (what
      // the host waits for) and, with --replay, the waits for input:
      // sampling, uploads, recording or binding, readouts.
      const double waited = stats.step_execute_seconds - warm.step_execute_seconds + stats.late_read_wait_seconds -
                            warm.late_read_wait_seconds;
      // The host's work itself: its thread's CPU time (waits for the
      // device or the input, and time the OS gave the plugin's threads
      // instead, not counted), where the one replica runs on this thread.
      if ((*replicator)->local_replicas().size() == 1) {
        std::printf("pjrt: the learner's thread used %.4f ms of CPU per update: %.4f ms in the plugin's calls "
                    "(copies, executions, reads, destroys), %.4f ms troupe's own\n",
                    1e3 * learner_cpu / steps, 1e3 * plugin_cpu / steps, 1e3 * (learner_cpu - plugin_cpu) / steps);
      }
      std::printf(
          "pjrt: %.2f program executions per update (and %.2f frame table scatters), %.0f%% of the steps "
          "replayed, %.3f ms of host time per update "
          "outside the executions (%.3f ms recording, %.3f ms binding a replay), compiled in %.1f s\n"
          "pjrt: epilogue %s: the host waited %.3f ms per update for results, the device idled %.3f ms per update "
          "between executions (%lld of %lld replays launched onto an idle device)\n",
          (stats.step_launches - warm.step_launches - scatters) / steps, scatters / steps,
          100.0 * static_cast<double>(stats.step_replays - warm.step_replays) /
              static_cast<double>(stats.steps - warm.steps),
          1e3 * (s - waited - input_wait * updates) / steps, 1e3 * (stats.step_host_seconds - warm.step_host_seconds) / steps,
          1e3 * (stats.replay_host_seconds - warm.replay_host_seconds) / steps, stats.compile_seconds,
          overlap ? "overlapped with the next execution (late reads)" : "after each execution (--no-overlap)",
          1e3 * waited / steps, 1e3 * (stats.device_idle_seconds - warm.device_idle_seconds) / steps,
          static_cast<long long>(stats.idle_launches - warm.idle_launches),
          static_cast<long long>(stats.step_replays - warm.step_replays));
    } else {
      std::printf("pjrt: %.1f kernel launches per update\n",
                  static_cast<double>(stats.launches - warm.launches) / std::max(1, updates));
    }
  }
#endif
  if (peers && kind != "pixels") {
    std::printf("--peers: the peers are of the pixel update only; none run for %s\n", kind.c_str());
  } else if (peers) {
    // Each round as long as troupe's updates took, 3 s at least.
    const std::string backend = (*replicator)->backend(0)->name();
    bench::Options options;
    options.seconds_per_figure = std::max(3.0, s);
    options.rounds = rounds;
    const absl::Status compared =
        ReportPeers(config, device, bench::MeasuredAsGpu(backend), batch, threads, **agent, sample, options, json);
    if (!compared.ok()) {
      std::fprintf(stderr, "d4pg_bench: %s\n", compared.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
