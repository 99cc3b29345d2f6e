// The GAN's state split over MPI ranks (gan.engine.collectives MPI), one
// replica per rank: `mpiexec -np K gan_trainer_mpi_test_main MODE DIR`.
// MODE sharded (shard_state OPTIMIZER, K=2): each rank keeps half of the
// moments. MODE split_parameters (shard_state PARAMETERS, K=2): half of the
// three networks' values (generator, discriminator, EMA) and of their
// moments. MODE split_generator (model_parallel 2, K=2 or 4: a 1x2 or 2x2
// mesh): each rank keeps its part of the generator.
//  1. 20 steps end where one replica with Adam on the whole batch ends (rank
//     0 trains that reference in this process): every rank's whole state,
//     gathered by PrepareCheckpoint, within 1e-5, every part of it moved;
//     the samples an evaluation draws are the reference's.
//  2. The checkpoint the chief writes after PrepareCheckpoint holds the
//     whole state: fresh trainers on every rank load it (each keeping its
//     part) and gather exactly the state that was saved, and 2 steps more
//     end where the reference's 2 more end.
//  3. Every rank takes the chief's wish, whatever its own (AgreeWithChief).
// Prints each rank's worst differences; exits 0 when all hold.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/state_match.h"
#include "gan/trainer.h"
#include "gan/trainer_test_configs.h"

namespace troupe::gan {
namespace {

enum class Split { kOptimizer, kParameters, kGenerator };

config::GanConfig SplitOverRanks(Split split) {
  config::GanConfig c = testing::EquivalenceConfig(1);
  c.mutable_engine()->set_collectives(config::EngineConfig::MPI);
  switch (split) {
    case Split::kOptimizer:
      c.mutable_engine()->set_shard_state(config::EngineConfig::OPTIMIZER);
      break;
    case Split::kParameters:
      c.mutable_engine()->set_shard_state(config::EngineConfig::PARAMETERS);
      break;
    case Split::kGenerator:
      c.mutable_engine()->set_model_parallel(2);
      break;
  }
  return c;
}

// Samples as an evaluation draws them (the EMA generator's, whole), within
// 1e-4 of the reference's.
::testing::AssertionResult SameSamples(GanTrainer& want, GanTrainer& got) {
  std::vector<float> w(4 * kPixels), g(4 * kPixels);
  want.Generate(/*stream=*/1, 0, 4, w.data());
  got.Generate(/*stream=*/1, 0, 4, g.data());
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(double(w[i]) - g[i]));
  if (!(worst <= 1e-4)) return ::testing::AssertionFailure() << "a sample differs by " << worst;
  return ::testing::AssertionSuccess() << "worst difference " << worst;
}

// Prints whether it holds, with SameState's margins or what failed.
bool Check(int rank, const ::testing::AssertionResult& result, const std::string& what) {
  std::printf("rank %d: %s: %s (%s)\n", rank, what.c_str(), result ? "holds" : "FAILS", result.message());
  return static_cast<bool>(result);
}

int Run(Split split, const std::string& dir) {
  const GanData data = testing::RandomData(64);
  auto trainer = GanTrainer::Create(SplitOverRanks(split), &data);
  if (!trainer.ok()) {
    std::fprintf(stderr, "split trainer: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  GanTrainer& t = **trainer;
  // (mpiexec's rank for the lines printed: the trainer says only whether it is the chief.)
  const char* launched = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = launched != nullptr ? std::atoi(launched) : (t.is_chief() ? 0 : 1);
  bool ok = t.state_split_across_processes();
  if (!ok) std::printf("rank %d: the state is not split across processes\n", rank);
  // Every rank trains the reference too (the same steps, in this process).
  auto one = GanTrainer::Create(testing::EquivalenceConfig(1), &data);
  if (!one.ok()) return 1;
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  if (!(*one)->Train(testing::kEquivalenceSteps).ok() || !t.Train(testing::kEquivalenceSteps).ok()) return 1;
  const std::vector<nn::CheckpointTensor> want = (*one)->CheckpointState();
  if (!t.PrepareCheckpoint().ok()) return 1;
  ok &= Check(rank, nn::SameState(start, want, t.CheckpointState(), {.tolerance = 1e-5}),
              absl::StrCat(testing::kEquivalenceSteps, " steps split over ", t.num_replicas(), " ranks = 1 replica with Adam, whole state within "
                           "1e-5"));
  ok &= Check(rank, SameSamples(**one, t), "an evaluation's samples are the reference's, within 1e-4");
  const std::vector<nn::CheckpointTensor> saved = t.CheckpointState();
  if (t.is_chief() && !t.SaveCheckpoint(dir).ok()) return 1;
  // (A collective: rank 1 reads the checkpoint only after the chief wrote it.)
  // Each rank passes its own wish; only the chief's counts.
  const absl::StatusOr<bool> chief_wants = t.AgreeWithChief(/*chief_wants=*/rank == 0);
  const absl::StatusOr<bool> chief_does_not = t.AgreeWithChief(/*chief_wants=*/rank != 0);
  const bool agreed = chief_wants.ok() && *chief_wants && chief_does_not.ok() && !*chief_does_not;
  ok &= agreed;
  std::printf("rank %d: every rank takes the chief's wish, not its own: %s\n", rank, agreed ? "holds" : "FAILS");

  auto resumed = GanTrainer::Create(SplitOverRanks(split), &data);
  if (!resumed.ok() || !(*resumed)->LoadCheckpoint(dir).ok()) return 1;
  if (!(*resumed)->PrepareCheckpoint().ok()) return 1;
  ok &= Check(rank, nn::SameState(saved, saved, (*resumed)->CheckpointState(), {.tolerance = 0}),
              "the chief's checkpoint, loaded split, gathers back exactly");
  if (!(*one)->Train(2).ok() || !(*resumed)->Train(2).ok() || !(*resumed)->PrepareCheckpoint().ok()) return 1;
  ok &= Check(rank, nn::SameState(saved, (*one)->CheckpointState(), (*resumed)->CheckpointState(), {.tolerance = 1e-5}),
              "resumed split, 2 steps more = the reference's 2 more");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace troupe::gan

int main(int argc, char** argv) {
  using troupe::gan::Split;
  const std::pair<const char*, Split> modes[] = {
      {"sharded", Split::kOptimizer}, {"split_parameters", Split::kParameters}, {"split_generator", Split::kGenerator}};
  for (const auto& [name, split] : modes) {
    if (argc == 3 && std::strcmp(argv[1], name) == 0) return troupe::gan::Run(split, argv[2]);
  }
  std::fprintf(stderr, "usage: mpiexec -np K %s sharded|split_parameters|split_generator CHECKPOINT_DIR\n", argv[0]);
  return 2;
}
