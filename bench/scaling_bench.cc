// `troupe bench scaling`: data-parallel scaling of the D4PG pixel learner
// and the GAN past what has run, on paper (bench/scaling_model.h), from
// figures measured in the same run:
//  1. the K = 1 step time of each (on --device cpu or cuda) and the bytes of
//     gradient it all-reduces per step;
//  2. this machine's K = 2 MPI fabric, fitted from a tiny and a large raw
//     MPI_Allreduce (latency, bus bandwidth), and the model checked against
//     it: the predicted all-reduce of each model's gradient next to the
//     measured one (raw, and through troupe's collectives), and (CPU) the
//     predicted K = 2 step next to whole K = 2 MPI steps
//     (bench/peers/mpi_step.cc, one engine thread per rank);
//  3. a projection for K = 1, 2, 4, ..., 256 on two published interconnects
//     (NVLink 4 throughout, as an NVLink Switch System; 8 GPUs per node on
//     NVLink with InfiniBand NDR between nodes), with and without bucket
//     overlap, written as scaling_DEVICE.csv and plotted (efficiency against
//     log2 K) as scaling_DEVICE.png in the working directory.
// The projection is a model, not a measurement: nothing here has run on more
// than the two MPI processes of step 2.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/synthetic.h"
#include "agents/d4pg_agent.h"
#include "bench/bench.h"
#include "bench/scaling_model.h"
#include "common/files.h"
#include "common/image.h"
#include "common/plot.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "gan/data.h"
#include "gan/trainer.h"
#include "replay/item.h"

namespace troupe::bench {
namespace {

constexpr int kScalingThreads = 2;          // engine threads of the K = 1 steps on the CPU
constexpr int kMaxReplicas = 256;
constexpr double kBackwardShare = 2.0 / 3.0;  // of a step, the share bucketed all-reduces can hide behind
constexpr int64_t kGradientBucketFloats = 1 << 20;  // GradientReducer's default bucket

// One model's measured K = 1 step.
struct MeasuredStep {
  std::string model;        // "D4PG" or "GAN"
  std::string description;  // what was timed
  StepCost cost;
};

// The engine of the K = 1 steps: the CPU on kScalingThreads threads, or GPU 0.
absl::StatusOr<config::EngineConfig> StepEngine(const std::string& device) {
  config::EngineConfig engine;
  if (device == "cuda") {
    engine.set_device(config::EngineConfig::CUDA);
    RETURN_IF_ERROR(engine::CheckDeviceAvailable(engine, "bench"));
  } else {
    engine.set_threads(kScalingThreads);
  }
  return engine;
}

// The D4PG pixel update (3 x 84x84 frames, 1 action, the config's default
// networks) at `batch` on one replica, on a synthetic batch served every
// update (as d4pg_bench does).
absl::StatusOr<MeasuredStep> MeasureD4pg(const config::EngineConfig& engine, int64_t batch, double seconds) {
  const agents::ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  const int action_size = 1;
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(batch);
  *config.mutable_learner()->mutable_engine() = engine;
  ASSIGN_OR_RETURN(auto replicator, engine::MakeReplicator(engine));
  ASSIGN_OR_RETURN(auto agent, agents::D4pgAgent::Create(config, spec, action_size, replicator.get()));
  // One random batch, served every update.
  ASSIGN_OR_RETURN(const replay::SampledBatch data, bench::RandomD4pgBatch(spec, action_size, config, batch, 1));
  const agents::D4pgAgent::SampleFn sample = bench::ServeEveryUpdate(data);
  RETURN_IF_ERROR(agent->Train(2, sample));  // warm up: arena and scratch reach their size
  absl::Status failed;
  const double updates_per_second = MeasureRate(seconds, [&](long n) {
    if (failed.ok()) failed = agent->Train(n, sample);
  });
  RETURN_IF_ERROR(failed);
  MeasuredStep m;
  m.model = "D4PG";
  m.description = absl::StrFormat("D4PG pixel update (3x84x84, critic + actor), batch %d", batch);
  m.cost.compute_seconds = 1.0 / updates_per_second;
  m.cost.gradient_bytes = 4.0 * agent->gradient_floats();
  // Latency terms per update: the critic's and the actor's gradient buckets,
  // and the metrics' small all-reduce.
  const int64_t buckets = std::max<int64_t>(2, (agent->gradient_floats() + kGradientBucketFloats - 1) / kGradientBucketFloats);
  m.cost.all_reduce_calls = static_cast<int>(buckets) + 1;
  m.cost.batch_per_replica = batch;
  m.cost.backward_share = kBackwardShare;
  return m;
}

// The GAN's generator + discriminator step (the config's defaults, n_critic
// discriminator updates and one generator update) at `batch` on one replica.
absl::StatusOr<MeasuredStep> MeasureGan(const config::EngineConfig& engine, int64_t batch, double seconds) {
  const gan::GanData data = bench::RandomGanData();
  config::GanConfig c;
  c.set_batch_size(batch);
  c.set_base_batch_size(batch);
  *c.mutable_engine() = engine;
  ASSIGN_OR_RETURN(auto trainer, gan::GanTrainer::Create(c, &data));
  RETURN_IF_ERROR(trainer->Train(2));  // warm up
  absl::Status failed;
  const double steps_per_second = MeasureRate(seconds, [&](long n) {
    if (failed.ok()) failed = trainer->Train(n);
  });
  RETURN_IF_ERROR(failed);
  MeasuredStep m;
  m.model = "GAN";
  m.description = absl::StrFormat("GAN G+D step (n_critic %d), batch %d", c.n_critic(), batch);
  m.cost.compute_seconds = 1.0 / steps_per_second;
  const int64_t d = trainer->discriminator_parameters(0).total_floats();
  const int64_t g = trainer->generator_parameters(0).total_floats();
  m.cost.gradient_bytes = 4.0 * (c.n_critic() * d + g);
  // Latency terms per step (GanTrainer::Step at K > 1): one all-reduce per
  // discriminator and generator update, one for the losses, and the
  // generator's two cross-replica batch norms, each summed in every forward
  // (n_critic + 1) and in the generator update's backward.
  m.cost.all_reduce_calls = c.n_critic() + 1 + 1 + 2 * (c.n_critic() + 2);
  m.cost.batch_per_replica = batch;
  m.cost.backward_share = kBackwardShare;
  return m;
}

// Milliseconds of the fastest of `steps` steps of `model` ("d4pg" or "gan")
// on `replicas` MPI ranks, one engine thread each, batch `shard` per replica;
// with `side_by_side` > 1, that many independent one-rank runs at once (no
// collectives: the compute of as many replicas sharing this machine), the
// slowest of them (a synchronous step waits for its slowest replica).
absl::StatusOr<double> MeasureMpiStep(const std::string& model, int replicas, int shard, int steps,
                                      int side_by_side = 1) {
  auto run = [&](int ranks) {
    return absl::StrCat(TROUPE_MPIEXEC, " -np ", ranks, " --oversubscribe --allow-run-as-root --bind-to none ",
                        TROUPE_MPI_STEP_BIN, " ", model, " ", ranks, " ", shard, " ", steps);
  };
  std::string command;
  if (side_by_side > 1) {
    for (int i = 0; i < side_by_side; ++i) absl::StrAppend(&command, run(1), " & ");
    command = absl::StrCat("(", command, "wait)");
  } else {
    command = run(replicas);
  }
  ASSIGN_OR_RETURN(const std::string out, RunCommand(command + " 2>&1"));
  double slowest = 0;
  int found = 0;
  for (size_t at = out.find("step_ms "); at != std::string::npos; at = out.find("step_ms ", at + 1)) {
    double ms = 0;
    if (std::sscanf(out.c_str() + at, "step_ms %lf", &ms) == 1) {
      slowest = std::max(slowest, ms);
      ++found;
    }
  }
  if (found != std::max(1, side_by_side)) return absl::InternalError(absl::StrCat("mpi step peer printed: ", out));
  return slowest;
}

struct Line {
  std::string model;
  Interconnect interconnect;
  bool overlap = false;
  std::vector<Projection> projections;
};

std::string OverlapName(bool overlap) { return overlap ? "bucket overlap" : "no overlap"; }

// The CSV of every projection.
std::string ProjectionCsv(const std::vector<Line>& lines, const std::vector<MeasuredStep>& steps,
                          const std::string& device) {
  std::string csv =
      "model,interconnect,overlap,replicas,step_device,compute_ms,gradient_mb,all_reduce_ms,step_ms,efficiency,"
      "samples_per_second\n";
  for (const Line& line : lines) {
    const StepCost* cost = nullptr;
    for (const MeasuredStep& s : steps) {
      if (s.model == line.model) cost = &s.cost;
    }
    for (const Projection& p : line.projections) {
      absl::StrAppendFormat(&csv, "%s,%s,%s,%d,%s,%.4f,%.3f,%.4f,%.4f,%.5f,%.1f\n", line.model, line.interconnect.name,
                            line.overlap ? "yes" : "no", p.replicas, device, 1e3 * cost->compute_seconds,
                            cost->gradient_bytes / 1e6, 1e3 * p.all_reduce_seconds, 1e3 * p.step_seconds, p.efficiency,
                            p.samples_per_second);
    }
  }
  return csv;
}

// Efficiency against log2 K, one line per model, interconnect and overlap.
Image ProjectionPlot(const std::vector<Line>& lines, const std::string& device) {
  // One hue per model and interconnect; its overlap line in a second, distinct colour.
  static constexpr std::array<std::array<uint8_t, 3>, 8> kColors = {{{31, 119, 180},
                                                                      {23, 190, 207},
                                                                      {255, 127, 14},
                                                                      {140, 86, 75},
                                                                      {44, 160, 44},
                                                                      {188, 189, 34},
                                                                      {214, 39, 40},
                                                                      {148, 103, 189}}};
  std::vector<PlotSeries> series;
  for (size_t i = 0; i < lines.size(); ++i) {
    PlotSeries s;
    s.label = absl::StrCat(lines[i].model, ", ", lines[i].interconnect.name, lines[i].overlap ? ", overlap" : "");
    s.color = kColors[i % kColors.size()];
    for (const Projection& p : lines[i].projections) {
      s.x.push_back(std::log2(p.replicas));
      s.y.push_back(p.efficiency);
    }
    series.push_back(std::move(s));
  }
  return PlotLines(series, PlotOptions{800, 500,
                                       absl::StrCat("Projection: scaling efficiency, ", device, " step times"),
                                       "log2 K (replicas: 0 = 1, 8 = 256)", "efficiency (K=1 step / K step)"});
}

}  // namespace

absl::StatusOr<Report> RunScalingBenchmark(const Options& options) {
  Report report;
  const double seconds = std::max(options.seconds_per_figure, 1.0);
  const std::string& device = options.device;
  ASSIGN_OR_RETURN(const config::EngineConfig engine, StepEngine(device));
  const std::string on = device == "cuda" ? "on GPU 0" : absl::StrFormat("on the CPU, %d threads", kScalingThreads);

  // 1. The K = 1 steps and their gradients, on the device.
  const int64_t batch = options.quick ? 32 : 256;
  std::vector<MeasuredStep> steps;
  ASSIGN_OR_RETURN(MeasuredStep d4pg, MeasureD4pg(engine, batch, seconds));
  steps.push_back(d4pg);
  ASSIGN_OR_RETURN(MeasuredStep gan, MeasureGan(engine, batch, seconds));
  steps.push_back(gan);
  for (const MeasuredStep& s : steps) {
    report.Add(absl::StrCat(s.description, ", K=1 ", on), 1e3 * s.cost.compute_seconds, "ms", "(no reference)", 0);
    report.Add(absl::StrFormat("%s gradient all-reduced per step (%d all-reduce calls)", s.model,
                               s.cost.all_reduce_calls),
               s.cost.gradient_bytes / 1e6, "MB", "(no reference)", 0);
  }

  // 2. This machine's K = 2 MPI fabric, and the model checked against it.
  const int64_t large_floats = options.quick ? 1 << 20 : 1 << 24;
  auto tiny = MeasureMpiAllReduce(/*floats=*/1, /*reps=*/options.quick ? 200 : 2000);
  auto large = tiny.ok() ? MeasureMpiAllReduce(large_floats, /*reps=*/options.quick ? 5 : 10) : tiny.status();
  absl::StatusOr<Fabric> raw = absl::UnavailableError("not measured");
  if (!large.ok()) {
    // A relocated bundle carries no mpiexec: the model check is left out, saying why.
    std::printf("K=2 MPI calibration not measured: %s\n", large.status().ToString().c_str());
  } else {
    raw = FitFabricAtTwoReplicas("raw MPI_Allreduce, K=2", tiny->raw_ms / 1e3, large->raw_ms / 1e3, 4.0 * large_floats);
    auto troupe = FitFabricAtTwoReplicas("troupe's MPI collectives, K=2", tiny->troupe_ms / 1e3, large->troupe_ms / 1e3,
                                         4.0 * large_floats);
    if (!raw.ok()) return raw.status();
    if (!troupe.ok()) return troupe.status();
    // Ratios: troupe's collectives against the raw ones.
    report.Add("K=2 MPI latency per ring step (1-float all-reduce / 2), troupe's collectives", 1e6 * troupe->latency,
               "us", "raw MPI_Allreduce", 1e6 * raw->latency);
    report.Add(absl::StrFormat("K=2 MPI bus bandwidth (%.0f MB all-reduce), troupe's collectives", 4e-6 * large_floats),
               troupe->bus_bandwidth / 1e9, "GB/s", "raw MPI_Allreduce", raw->bus_bandwidth / 1e9);
    const Interconnect here{"this machine, MPI", *raw, 2, *raw};
    for (const MeasuredStep& s : steps) {
      const int64_t floats = static_cast<int64_t>(s.cost.gradient_bytes / 4);
      auto measured = MeasureMpiAllReduce(floats, /*reps=*/options.quick ? 5 : 20);
      if (!measured.ok()) return measured.status();
      const double predicted_ms = 1e3 * RingAllReduceSeconds(s.cost.gradient_bytes, 2, *raw);
      const std::string what = absl::StrFormat("K=2 MPI all-reduce of the %s gradient (%.1f MB, one call)", s.model,
                                               s.cost.gradient_bytes / 1e6);
      // ratio = model / measured: the model's error on the fabric it was fitted to.
      report.Add(absl::StrCat(what, ": model (fitted to raw MPI)"), predicted_ms, "ms", "raw MPI_Allreduce measured",
                 measured->raw_ms);
      // ratio = troupe / model: what troupe's collectives add over the fabric.
      report.Add(absl::StrCat(what, ": troupe's collectives measured"), measured->troupe_ms, "ms",
                 "model (fitted to raw MPI)", predicted_ms);
    }
    // The whole K = 2 step, on the CPU, one engine thread per rank. Its
    // compute is that of two K = 1 replicas side by side: on a 2-core
    // machine shared with other work, two replicas get less than twice one.
    if (device == "cpu") {
      const int shard = options.quick ? 8 : 64;
      const int mpi_steps = options.quick ? 3 : std::max(5, static_cast<int>(3 * seconds));
      for (const MeasuredStep& s : steps) {
        const std::string model = s.model == "D4PG" ? "d4pg" : "gan";
        ASSIGN_OR_RETURN(const double alone, MeasureMpiStep(model, 1, shard, mpi_steps));
        ASSIGN_OR_RETURN(const double side_by_side, MeasureMpiStep(model, 1, shard, mpi_steps, /*side_by_side=*/2));
        ASSIGN_OR_RETURN(const double two, MeasureMpiStep(model, 2, shard, mpi_steps));
        ASSIGN_OR_RETURN(const MpiAllReduceTimes gradient,
                         MeasureMpiAllReduce(static_cast<int64_t>(s.cost.gradient_bytes / 4), options.quick ? 5 : 20));
        StepCost compute = s.cost;
        compute.compute_seconds = side_by_side / 1e3;
        compute.batch_per_replica = shard;
        const std::string what = absl::StrFormat("%s step, batch %d per replica, 1 thread per MPI rank, best of %d",
                                                 s.model, shard, mpi_steps);
        report.Add(absl::StrCat(what, ", K=1 alone"), alone, "ms", "(no reference)", 0);
        report.Add(absl::StrCat(what, ", two K=1 side by side (no collectives)"), side_by_side, "ms",
                   "K=1 alone", alone);
        // ratio = measured / predicted.
        report.Add(absl::StrCat(what, ", K=2 measured"), two, "ms",
                   "model: side-by-side compute + all-reduce at the raw MPI fit (no overlap)",
                   1e3 * Project(compute, 2, here, /*overlap=*/false).step_seconds);
        report.Add(absl::StrCat(what, ", K=2 measured"), two, "ms",
                   "side-by-side compute + troupe's all-reduce of the gradient, measured", side_by_side + gradient.troupe_ms);
      }
    }
  }

  // 3. The projection, on published figures.
  std::vector<Line> lines;
  for (const MeasuredStep& s : steps) {
    for (const Interconnect& net : {NvlinkSwitchSystem(), NvlinkNodesOverInfiniband()}) {
      for (bool overlap : {false, true}) {
        lines.push_back({s.model, net, overlap, ProjectPowersOfTwo(s.cost, kMaxReplicas, net, overlap)});
      }
    }
  }
  for (const Line& line : lines) {
    for (const Projection& p : line.projections) {
      if (p.replicas != 8 && p.replicas != 64 && p.replicas != 256) continue;
      report.Add(absl::StrFormat("projection: %s (%s step), %s, %s, K=%d: efficiency [%.0f samples/s]", line.model,
                                 device, line.interconnect.name, OverlapName(line.overlap), p.replicas,
                                 p.samples_per_second),
                 p.efficiency, "x", "(no reference)", 0);
    }
  }
  for (const MeasuredStep& s : steps) {
    for (const Interconnect& net : {NvlinkSwitchSystem(), NvlinkNodesOverInfiniband()}) {
      for (bool overlap : {false, true}) {
        report.Add(absl::StrFormat("projection: %s, %s, %s: K=1 step time below which K=256 falls under 0.9", s.model,
                                   net.name, OverlapName(overlap)),
                   1e3 * ComputeSecondsForEfficiency(s.cost, kMaxReplicas, net, overlap, 0.9), "ms", "(no reference)",
                   0);
      }
    }
  }

  // The projection's files.
  const std::string csv_path = absl::StrCat("scaling_", device, ".csv");
  const std::string png_path = absl::StrCat("scaling_", device, ".png");
  RETURN_IF_ERROR(WriteFileAtomically(csv_path, ProjectionCsv(lines, steps, device)));
  RETURN_IF_ERROR(WritePng(png_path, ProjectionPlot(lines, device)));
  std::printf("wrote %s and %s (projection, K = 1..%d)\n", csv_path.c_str(), png_path.c_str(), kMaxReplicas);
  return report;
}

}  // namespace troupe::bench
