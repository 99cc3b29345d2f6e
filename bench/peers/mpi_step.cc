// Run by `troupe bench scaling` under `mpiexec -np K`: times whole training
// steps of K replicas, one per MPI rank on one engine thread each, every
// replica with the same batch SHARD (weak scaling: the global batch is
// K x SHARD), gradients averaged by troupe's MPI collectives:
//   troupe_mpi_step d4pg K SHARD STEPS   the D4PG pixel update (3 x 84x84
//                                        frames, synthetic transitions)
//   troupe_mpi_step gan K SHARD STEPS    the GAN G+D step (synthetic images)
// After two warm-up steps, each of STEPS steps is timed alone and rank 0
// prints "step_ms BEST mean_ms MEAN gradient_floats N": the fastest step
// (a busy neighbour on a shared machine only ever slows a step down) and the
// mean.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "bench/synthetic.h"
#include "agents/d4pg_agent.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "gan/data.h"
#include "gan/trainer.h"
#include "replay/item.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

config::EngineConfig OneThreadPerRank(int replicas) {
  config::EngineConfig engine;
  engine.set_collectives(config::EngineConfig::MPI);
  engine.set_replicas(replicas);
  engine.set_threads(1);
  return engine;
}

// Times `steps` calls of `step` (one training step each): (fastest, mean) in ms.
absl::StatusOr<std::pair<double, double>> TimeSteps(int steps, const std::function<absl::Status()>& step) {
  double best = 1e300, total = 0;
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    RETURN_IF_ERROR(step());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    best = std::min(best, ms);
    total += ms;
  }
  return std::make_pair(best, total / steps);
}

void Print(bool chief, std::pair<double, double> ms, int64_t gradient_floats) {
  if (chief) {
    std::printf("step_ms %.3f mean_ms %.3f gradient_floats %lld\n", ms.first, ms.second,
                static_cast<long long>(gradient_floats));
  }
}

absl::Status D4pgSteps(int replicas, int shard, int steps) {
  const agents::ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  const int action_size = 1;
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(int64_t{shard} * replicas);
  *config.mutable_learner()->mutable_engine() = OneThreadPerRank(replicas);
  ASSIGN_OR_RETURN(auto replicator, engine::MakeReplicator(config.learner().engine()));
  ASSIGN_OR_RETURN(auto agent, agents::D4pgAgent::Create(config, spec, action_size, replicator.get()));
  // One random batch, served every update.
  ASSIGN_OR_RETURN(const replay::SampledBatch data, bench::RandomD4pgBatch(spec, action_size, config, shard, replicator->local_replicas()[0]));
  const agents::D4pgAgent::SampleFn sample = bench::ServeEveryUpdate(data);
  RETURN_IF_ERROR(agent->Train(2, sample));  // warm up (arena, scratch, collectives)
  ASSIGN_OR_RETURN(const auto ms, TimeSteps(steps, [&] { return agent->Train(1, sample); }));
  Print(replicator->local_replicas()[0] == 0, ms, agent->gradient_floats());
  return absl::OkStatus();
}

absl::Status GanSteps(int replicas, int shard, int steps) {
  const gan::GanData data = bench::RandomGanData();
  config::GanConfig c;
  c.set_batch_size(int64_t{shard} * replicas);
  c.set_base_batch_size(c.batch_size());
  *c.mutable_engine() = OneThreadPerRank(replicas);
  ASSIGN_OR_RETURN(auto trainer, gan::GanTrainer::Create(c, &data));
  RETURN_IF_ERROR(trainer->Train(2));  // warm up
  ASSIGN_OR_RETURN(const auto ms, TimeSteps(steps, [&] { return trainer->Train(1); }));
  const int64_t floats =
      trainer->generator_parameters(0).total_floats() + c.n_critic() * trainer->discriminator_parameters(0).total_floats();
  Print(trainer->is_chief(), ms, floats);
  return absl::OkStatus();
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: mpiexec -np K %s d4pg|gan K SHARD STEPS\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1];
  const int replicas = std::atoi(argv[2]), shard = std::atoi(argv[3]), steps = std::atoi(argv[4]);
  if ((model != "d4pg" && model != "gan") || replicas < 1 || shard < 1 || steps < 1) {
    std::fprintf(stderr, "troupe_mpi_step: bad arguments (model d4pg or gan, K, SHARD and STEPS >= 1)\n");
    return 2;
  }
  const absl::Status s = model == "d4pg" ? troupe::D4pgSteps(replicas, shard, steps)
                                         : troupe::GanSteps(replicas, shard, steps);
  if (!s.ok()) {
    std::fprintf(stderr, "troupe_mpi_step %s: %s\n", model.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}
