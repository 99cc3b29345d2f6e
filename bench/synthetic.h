// Synthetic inputs for the benchmarks' learner steps (a step's cost does not
// depend on what the data shows): one random D4PG batch served on every
// update, and random GAN training images.
#ifndef TROUPE_BENCH_SYNTHETIC_H_
#define TROUPE_BENCH_SYNTHETIC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "agents/d4pg_agent.h"
#include "gan/data.h"
#include "proto/config.pb.h"
#include "replay/replay.h"

namespace troupe::bench {

// A batch of `batch` items shaped as D4PG's transition table for `spec`:
// uint8 fields random bytes, float fields uniform in [-1, 1], from `seed`.
absl::StatusOr<replay::SampledBatch> RandomD4pgBatch(const agents::ObservationSpec& spec, int action_size,
                                                     const config::ExperimentConfig& config, int64_t batch,
                                                     uint32_t seed);

// A sampler that hands `data` to each replica once and then lets it keep it
// (every update trains on the same batch). `data` must outlive the sampler.
agents::D4pgAgent::SampleFn ServeEveryUpdate(const replay::SampledBatch& data);

// `count` 28x28 training images, uniform in [-1, 1].
gan::GanData RandomGanData(int64_t count = 8192);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_SYNTHETIC_H_
