// Measures D4PG learner updates/s on synthetic batches (no replay, no actors):
//   d4pg_bench [state|pixels] [batch] [threads] [updates] [conv_channels] [hidden] [device]
// state: cartpole-sized (5 floats, 1 action); pixels: 3 frames of 84x84.
// conv_channels and hidden (one size for both MLP layers) default to the config's defaults.
// device: cpu (default), cpu_strict, cuda or cuda-bf16 (bfloat16 matmul/conv inputs).
// Each update uploads its batch (uint8 pixels) as the learner does.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "bench/synthetic.h"
#include "agents/d4pg_agent.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "replay/item.h"

int main(int argc, char** argv) {
  using namespace troupe;
  const std::string kind = argc > 1 ? argv[1] : "state";
  const int batch = argc > 2 ? std::atoi(argv[2]) : 256;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int updates = argc > 4 ? std::atoi(argv[4]) : (kind == "pixels" ? 5 : 200);
  agents::ObservationSpec spec;
  if (kind == "pixels") {
    spec = {.frames = 3, .height = 84, .width = 84};
  } else {
    spec = {.state_size = 5};
  }
  const int action_size = 1;
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(batch);
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
  } else if (device != "cpu") {
    std::fprintf(stderr, "d4pg_bench: unknown device '%s' (cpu, cpu_strict, cuda, cuda-bf16)\n", device.c_str());
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
  // One random batch, served every update.
  auto data = bench::RandomD4pgBatch(spec, action_size, config, batch, 1);
  TROUPE_CHECK(data.ok());
  const agents::D4pgAgent::SampleFn sample = bench::ServeEveryUpdate(*data);
  TROUPE_CHECK((*agent)->Train(2, sample).ok());  // warm-up (arena, scratch)
  const auto start = std::chrono::steady_clock::now();
  TROUPE_CHECK((*agent)->Train(updates, sample).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("d4pg %s batch %d on %s, threads %d: %.2f updates/s (%.0f samples/s), %d updates in %.2f s\n",
              kind.c_str(), batch, device.c_str(), threads, updates / s, updates * batch / s, updates, s);
  return 0;
}
