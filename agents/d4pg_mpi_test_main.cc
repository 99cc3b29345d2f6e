// D4PG's model split over MPI ranks (learner.engine.collectives MPI), one
// replica per rank: `mpiexec -np K agents_d4pg_mpi_test_main MODE DIR`.
//
// MODE split_parameters (shard_state PARAMETERS, K=2): each rank keeps half
// of the networks, their targets and Adam's moments.
//  1. 20 clipped updates end where one replica with the whole model on the
//     whole batch ends (every rank trains that reference in this process):
//     the whole state, gathered by PrepareCheckpoint, within 1e-4; each
//     rank keeps about half of what the reference keeps.
//  2. The actors' policy after every Train call is the reference's (the
//     networks it reads gathered over the ranks then; not the ones made at
//     the start).
//  3. The chief's checkpoint holds the whole model: loaded split on both
//     ranks it gathers back exactly, and its policy is the saved one; loaded
//     by one unsplit replica it is the same state; 5 updates more end where
//     the reference's 5 more end.
//
// MODE split_critic (model_parallel 2, K=2 or 4: a 1x2 or 2x2 mesh): each
// rank keeps its part of the critic's first two layers.
//  1. 20 prioritized, clipped updates end where one replica on the whole
//     batch ends, whole state (the critic joined from the parts every rank
//     gathered along the model axis) within 1e-4, on every rank; each part 0
//     gives its copy's rows' priorities, the reference's, and the others none.
//  2. The chief's checkpoint holds the whole critic: loaded on the mesh it
//     gathers back exactly, and by one unsplit replica it is the same state;
//     5 updates more end where the reference's 5 more end.
// Prints each rank's worst differences; exits 0 when all hold.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/d4pg_agent.h"
#include "agents/d4pg_test_data.h"
#include "engine/engine_config.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/state_match.h"

namespace troupe::agents {
namespace {

using d4pg_test::Bandit;
using d4pg_test::MeshBandit;
using d4pg_test::ClippedConfig;

constexpr int kActions = 2;
const ObservationSpec kSpec{.state_size = 3};

config::ExperimentConfig CriticConfig() {
  config::ExperimentConfig c = ClippedConfig();
  c.mutable_learner()->set_prioritized(true);
  return c;
}

config::ExperimentConfig CriticSplitOverRanks() {
  config::ExperimentConfig c = CriticConfig();
  c.mutable_learner()->mutable_engine()->set_collectives(config::EngineConfig::MPI);
  c.mutable_learner()->mutable_engine()->set_model_parallel(2);
  return c;
}

config::ExperimentConfig SplitOverRanks() {
  config::ExperimentConfig c = ClippedConfig();
  c.mutable_learner()->mutable_engine()->set_collectives(config::EngineConfig::MPI);
  c.mutable_learner()->mutable_engine()->set_shard_state(config::EngineConfig::PARAMETERS);
  return c;
}

struct Learner {
  std::unique_ptr<replicator::Replicator> replicator;
  std::unique_ptr<D4pgAgent> agent;
};

absl::StatusOr<Learner> Make(const config::ExperimentConfig& c) {
  Learner l;
  ASSIGN_OR_RETURN(l.replicator, engine::MakeReplicator(c.learner().engine()));
  ASSIGN_OR_RETURN(l.agent, D4pgAgent::Create(c, kSpec, kActions, l.replicator.get()));
  return l;
}

// Updates [from, to) of the bandit's batches, one Train call each (`m`:
// the parts of a split critic, of which only part 0 samples).
absl::Status Train(D4pgAgent& agent, int from, int to, int m = 1) {
  for (int step = from; step < to; ++step) {
    const config::ExperimentConfig c = ClippedConfig();
    RETURN_IF_ERROR(agent.Train(1, m > 1 ? MeshBandit(kSpec, c, m, step) : Bandit(kSpec, kActions, c, step)));
  }
  return absl::OkStatus();
}

// Prints whether it holds, with SameState's margins or what failed.
bool Check(int rank, const ::testing::AssertionResult& result, const std::string& what) {
  std::printf("rank %d: %s: %s (%s)\n", rank, what.c_str(), result ? "holds" : "FAILS", result.message());
  return static_cast<bool>(result);
}

// The policies' floats within a tolerance relative to the reference's.
::testing::AssertionResult SamePolicy(const D4pgAgent& want, const D4pgAgent& got, double tolerance) {
  std::vector<float> w, g;
  want.PolicyParameters(&w);
  got.PolicyParameters(&g);
  if (w.size() != g.size()) return ::testing::AssertionFailure() << g.size() << " floats, not " << w.size();
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double off = std::fabs(double(g[i]) - w[i]) / (std::fabs(double(w[i])) + 1e-6);
    if (!(off <= tolerance)) {
      return ::testing::AssertionFailure() << "policy float " << i << ": " << g[i] << ", want " << w[i];
    }
    worst = std::max(worst, off);
  }
  return ::testing::AssertionSuccess() << "worst relative difference " << worst;
}

// Every rank waits here for every other (a collective).
absl::Status Barrier(replicator::Replicator& replicator) {
  return replicator.RunReplicas([](replicator::ReplicaContext& ctx) {
    float x = 0;
    return ctx.AllReduce({&x, 1}, replicator::ReduceOp::kSum);
  });
}

#define OR_FAIL(expr)                                                     \
  do {                                                                    \
    if (const absl::Status failed = (expr); !failed.ok()) {               \
      std::fprintf(stderr, "%s: %s\n", #expr, failed.ToString().c_str()); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

// This rank's last priorities against the reference's for the same keys.
::testing::AssertionResult SamePriorities(const D4pgAgent& want, const D4pgAgent& got, size_t count) {
  std::vector<uint64_t> keys, want_keys;
  std::vector<double> priorities, want_priorities;
  got.LastPriorities(&keys, &priorities);
  want.LastPriorities(&want_keys, &want_priorities);
  if (keys.size() != count) return ::testing::AssertionFailure() << keys.size() << " priorities, not " << count;
  std::map<uint64_t, double> by_key;
  for (size_t i = 0; i < want_keys.size(); ++i) by_key[want_keys[i]] = want_priorities[i];
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!by_key.contains(keys[i]) || !(std::fabs(priorities[i] - by_key[keys[i]]) <= 1e-4 * by_key[keys[i]])) {
      return ::testing::AssertionFailure() << "key " << keys[i] << ": " << priorities[i];
    }
  }
  return ::testing::AssertionSuccess() << count << " priorities";
}

// The chief saves `split`'s state (`saved`, gathered already); a fresh split
// agent (`split_config`) and a fresh unsplit one load it on every rank and
// hold it exactly; the split one and the reference train 5 updates more
// (batches for `m` parts) and end within 1e-4. Returns whether all held
// (Status errors: what stopped it).
absl::StatusOr<bool> ExpectCheckpointRoundTrip(int rank, Learner& split, const config::ExperimentConfig& split_config,
                                               const config::ExperimentConfig& whole_config, D4pgAgent& reference,
                                               const std::vector<nn::CheckpointTensor>& saved, int m,
                                               const std::string& dir) {
  const std::string path = dir + "/agent.ckpt";
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    RETURN_IF_ERROR(split.agent->Save(path));
  }
  RETURN_IF_ERROR(Barrier(*split.replicator));  // the others read the checkpoint only after rank 0 wrote it
  ASSIGN_OR_RETURN(Learner resumed, Make(split_config));
  ASSIGN_OR_RETURN(Learner unsplit, Make(whole_config));
  D4pgAgent& r = *resumed.agent;
  RETURN_IF_ERROR(r.Load(path));
  RETURN_IF_ERROR(unsplit.agent->Load(path));
  bool ok = true;
  if (m == 1) ok &= Check(rank, SamePolicy(*split.agent, r, 0), "the loaded policy is the saved one");
  RETURN_IF_ERROR(r.PrepareCheckpoint());
  ok &= Check(rank, nn::SameState(saved, saved, r.CheckpointState(), {.tolerance = 0}),
              "the chief's checkpoint, loaded split, gathers back exactly");
  ok &= Check(rank, nn::SameState(saved, saved, unsplit.agent->CheckpointState(), {.tolerance = 0}),
              "the chief's checkpoint, loaded by one unsplit replica, is the same state");
  RETURN_IF_ERROR(Train(reference, 20, 25));
  RETURN_IF_ERROR(Train(r, 20, 25, m));
  RETURN_IF_ERROR(r.PrepareCheckpoint());
  ok &= Check(rank, nn::SameState(saved, reference.CheckpointState(), r.CheckpointState(), {.tolerance = 1e-4}),
              "resumed split, 5 updates more = the reference's 5 more, within 1e-4");
  return ok;
}

int RunSplitCritic(const std::string& dir) {
  absl::StatusOr<Learner> mesh = Make(CriticSplitOverRanks());
  absl::StatusOr<Learner> one = Make(CriticConfig());
  if (!mesh.ok() || !one.ok()) {
    std::fprintf(stderr, "agents: %s %s\n", mesh.status().ToString().c_str(), one.status().ToString().c_str());
    return 1;
  }
  D4pgAgent& s = *mesh->agent;
  D4pgAgent& reference = *one->agent;
  const int rank = mesh->replicator->local_replicas()[0];
  const int k = mesh->replicator->num_replicas(), m = 2;
  bool ok = s.state_split_across_processes();
  if (!ok) std::printf("rank %d: the critic is not split across processes\n", rank);
  const std::vector<nn::CheckpointTensor> start = reference.CheckpointState();
  OR_FAIL(Train(reference, 0, 20));
  OR_FAIL(Train(s, 0, 20, m));
  // Part 0 of each copy: its copy's rows; the other parts none.
  ok &= Check(rank, SamePriorities(reference, s, rank % m == 0 ? 16 / (k / m) : 0),
              "the last update's priorities: part 0's are its copy's rows' and the reference's");
  OR_FAIL(s.PrepareCheckpoint());
  const std::vector<nn::CheckpointTensor> saved = s.CheckpointState();
  ok &= Check(rank, nn::SameState(start, reference.CheckpointState(), saved, {.tolerance = 1e-4}),
              absl::StrCat("20 updates on a ", k / m, "x", m, " mesh of ranks = 1 replica on the whole batch, whole "
                           "state within 1e-4"));
  const absl::StatusOr<bool> round_trip =
      ExpectCheckpointRoundTrip(rank, *mesh, CriticSplitOverRanks(), CriticConfig(), reference, saved, m, dir);
  OR_FAIL(round_trip.status());
  return ok && *round_trip ? 0 : 1;
}

int RunSplitParameters(const std::string& dir) {
  absl::StatusOr<Learner> split = Make(SplitOverRanks());
  absl::StatusOr<Learner> one = Make(ClippedConfig());
  if (!split.ok() || !one.ok()) {
    std::fprintf(stderr, "agents: %s %s\n", split.status().ToString().c_str(), one.status().ToString().c_str());
    return 1;
  }
  D4pgAgent& s = *split->agent;
  D4pgAgent& reference = *one->agent;
  const int rank = split->replicator->local_replicas()[0];
  bool ok = s.state_split_across_processes();
  if (!ok) std::printf("rank %d: the state is not split across processes\n", rank);

  const std::vector<nn::CheckpointTensor> start = reference.CheckpointState();
  ok &= Check(rank, SamePolicy(reference, s, 0), "the policy at the start is the whole model's");
  OR_FAIL(Train(reference, 0, 1));
  OR_FAIL(Train(s, 0, 1));
  ok &= Check(rank, SamePolicy(reference, s, 1e-4), "the policy after one update is the reference's, within 1e-4");
  OR_FAIL(Train(reference, 1, 20));
  OR_FAIL(Train(s, 1, 20));
  ok &= Check(rank, SamePolicy(reference, s, 1e-4), "the policy after 20 updates is the reference's, within 1e-4");
  OR_FAIL(s.PrepareCheckpoint());
  const std::vector<nn::CheckpointTensor> saved = s.CheckpointState();
  ok &= Check(rank, nn::SameState(start, reference.CheckpointState(), saved, {.tolerance = 1e-4}),
              "20 updates split over 2 ranks = 1 replica with the whole model, whole state within 1e-4");
  const double kept = double(s.parameter_state_bytes() + s.optimizer_state_bytes()) /
                      double(reference.parameter_state_bytes() + reference.optimizer_state_bytes());
  const bool half = kept <= 0.55;
  ok &= half;
  std::printf("rank %d: keeps %.3fx of one unsplit replica's state between updates: %s\n", rank, kept,
              half ? "holds" : "FAILS");

  const absl::StatusOr<bool> round_trip =
      ExpectCheckpointRoundTrip(rank, *split, SplitOverRanks(), ClippedConfig(), reference, saved, /*m=*/1, dir);
  OR_FAIL(round_trip.status());
  return ok && *round_trip ? 0 : 1;
}

}  // namespace
}  // namespace troupe::agents

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "split_parameters") == 0) return troupe::agents::RunSplitParameters(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "split_critic") == 0) return troupe::agents::RunSplitCritic(argv[2]);
  std::fprintf(stderr, "usage: mpiexec -np K %s split_parameters|split_critic CHECKPOINT_DIR\n", argv[0]);
  return 2;
}
