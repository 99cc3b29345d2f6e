// The GAN's Adam moments split over MPI ranks (gan.engine.collectives MPI,
// shard_state OPTIMIZER): run as `mpiexec -np 2 gan_trainer_mpi_test_main
// DIR`, each rank one replica keeping half of the moments.
//  1. 3 steps end where one replica with Adam on the whole batch ends (rank
//     0 trains that reference in this process): every rank's whole state,
//     its moments gathered by PrepareCheckpoint, within 1e-5, every part of
//     it moved.
//  2. The checkpoint the chief writes after PrepareCheckpoint holds the
//     whole moments: fresh trainers on both ranks load it (each keeping its
//     part) and gather exactly the state that was saved, and 2 steps more
//     end where the reference's 2 more end.
//  3. Every rank takes the chief's wish, whatever its own (AgreeWithChief).
// Prints each rank's worst differences; exits 0 when all hold.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/state_match.h"
#include "gan/trainer.h"
#include "gan/trainer_test_configs.h"

namespace troupe::gan {
namespace {

config::GanConfig SplitOverRanks() {
  config::GanConfig c = testing::EquivalenceConfig(1);
  c.mutable_engine()->set_collectives(config::EngineConfig::MPI);
  c.mutable_engine()->set_shard_state(config::EngineConfig::OPTIMIZER);
  return c;
}

// Prints whether it holds, with SameState's margins or what failed.
bool Check(int rank, const ::testing::AssertionResult& result, const std::string& what) {
  std::printf("rank %d: %s: %s (%s)\n", rank, what.c_str(), result ? "holds" : "FAILS", result.message());
  return static_cast<bool>(result);
}

int Run(const std::string& dir) {
  const GanData data = testing::RandomData(64);
  auto split = GanTrainer::Create(SplitOverRanks(), &data);
  if (!split.ok()) {
    std::fprintf(stderr, "split trainer: %s\n", split.status().ToString().c_str());
    return 1;
  }
  GanTrainer& t = **split;
  const int rank = t.is_chief() ? 0 : 1;
  bool ok = t.state_split_across_processes();
  if (!ok) std::printf("rank %d: the state is not split across processes\n", rank);
  // Every rank trains the reference too (the same steps, in this process).
  auto one = GanTrainer::Create(testing::EquivalenceConfig(1), &data);
  if (!one.ok()) return 1;
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  if (!(*one)->Train(3).ok() || !t.Train(3).ok()) return 1;
  const std::vector<nn::CheckpointTensor> want = (*one)->CheckpointState();
  if (!t.PrepareCheckpoint().ok()) return 1;
  ok &= Check(rank, nn::SameState(start, want, t.CheckpointState(), {.tolerance = 1e-5}),
              "3 steps split over 2 ranks = 1 replica with Adam, whole state within 1e-5");
  const std::vector<nn::CheckpointTensor> saved = t.CheckpointState();
  if (t.is_chief() && !t.SaveCheckpoint(dir).ok()) return 1;
  // (A collective: rank 1 reads the checkpoint only after the chief wrote it.)
  // Each rank passes its own wish; only the chief's counts.
  const absl::StatusOr<bool> chief_wants = t.AgreeWithChief(/*chief_wants=*/rank == 0);
  const absl::StatusOr<bool> chief_does_not = t.AgreeWithChief(/*chief_wants=*/rank != 0);
  const bool agreed = chief_wants.ok() && *chief_wants && chief_does_not.ok() && !*chief_does_not;
  ok &= agreed;
  std::printf("rank %d: every rank takes the chief's wish, not its own: %s\n", rank, agreed ? "holds" : "FAILS");

  auto resumed = GanTrainer::Create(SplitOverRanks(), &data);
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
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpiexec -np 2 %s CHECKPOINT_DIR\n", argv[0]);
    return 2;
  }
  return troupe::gan::Run(argv[1]);
}
