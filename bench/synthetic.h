// Synthetic inputs for the benchmarks' learner steps (a step's cost does not
// depend on what the data shows): one random D4PG batch served on every
// update, a replay of D4PG pixel transitions written as an actor writes
// them, and random GAN training images.
#ifndef TROUPE_BENCH_SYNTHETIC_H_
#define TROUPE_BENCH_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/d4pg_agent.h"
#include "gan/data.h"
#include "proto/config.pb.h"
#include "replay/client.h"
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

// The frames of the replay below: 84x84 RGB, stacked 3.
constexpr int kSceneSide = 84, kSceneStack = 3;
constexpr int64_t kSceneFrameBytes = int64_t{kSceneSide} * kSceneSide * 3;
constexpr agents::ObservationSpec kSceneSpec{.frames = kSceneStack, .height = kSceneSide, .width = kSceneSide};

// A frame like a rendered one: a fixed textured floor (compresses poorly on
// its own) and a block that moves with t.
std::vector<uint8_t> SceneFrame(int t);

// An actor's stream of D4PG pixel transitions (agents::kTransitionTable,
// one action): frame t+5 appended, then transition t (observation frames
// t..t+2, next observation t+3..t+5), so transitions share frames as an
// actor's n-step transitions do.
class TransitionStream {
 public:
  explicit TransitionStream(replay::Writer* writer) : writer_(writer) {}
  // `count` more transitions, flushed.
  absl::Status Write(int count);
  // Frames appended so far.
  int64_t frames() const { return static_cast<int64_t>(keys_.size()); }

 private:
  replay::Writer* writer_;
  std::vector<uint64_t> keys_;
  int next_ = 0;
};

// An embedded replay of `held` transitions written by a TransitionStream
// into D4PG's transition table for kSceneSpec and one action (sized by
// `config`'s learner.replay_size and its sampling settings), and the
// stream, which goes on inserting into it (from one thread at a time).
struct FilledReplay {
  std::unique_ptr<replay::Replay> replay;
  std::unique_ptr<replay::ReplayClient> client;
  std::unique_ptr<replay::Writer> writer;
  std::unique_ptr<TransitionStream> stream;
};
absl::StatusOr<FilledReplay> FillTransitions(const config::ExperimentConfig& config, int held);

// `count` 28x28 training images, uniform in [-1, 1].
gan::GanData RandomGanData(int64_t count = 8192);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_SYNTHETIC_H_
