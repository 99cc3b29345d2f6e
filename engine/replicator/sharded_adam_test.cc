// ShardedAdam (ZeRO stage 1): K in-process replicas with Adam's moments split
// across them train as one replica with Adam on the whole batch, the whole
// state compared (parameters, both moments, the step count); a checkpoint
// written at one K loads at another; each replica keeps 1/K of the moments.
#include "engine/replicator/sharded_adam.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/state_match.h"
#include "engine/nn/strict_cpu_backend.h"
#include "engine/replicator/in_process.h"
#include "engine/replicator/sharded_parameters.h"
#include "engine/replicator/test_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::replicator {
namespace {

using testing::MakeInProcess;

using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct Schedule {
  int k = 1;
  bool sharded = true;  // false: plain Adam (K must be 1)
  bool strict = false;  // each replica on the strict CPU device (collectives staged through the host)
  int steps = 20, first_step = 0;
  float max_norm = 0;
  std::string load, save;  // a checkpoint to start from, to write at the end
};

struct Trained {
  std::vector<nn::CheckpointTensor> state;  // replica 0's: parameters, whole moments, step count
  std::vector<std::vector<float>> params;   // every replica's parameters
  int64_t state_bytes = 0;                  // replica 0's optimizer state between updates
  int64_t total_floats = 0;
};

Trained Train(const Schedule& run) {
  auto replicator = MakeInProcess(run.k);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < run.k; ++i) {
    std::shared_ptr<nn::Backend> device;
    if (run.strict) {
      device = std::make_shared<nn::StrictCpuBackend>(1);
    } else {
      device = std::make_shared<nn::CpuBackend>(1);
    }
    models.push_back(std::make_unique<testing::TestModel>(device, ShardedAdam::PadMultiple(run.k)));
  }
  Trained out;
  absl::Status s = replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    testing::TestModel& model = *models[ctx.local_index()];
    std::unique_ptr<ShardedAdam> sharded;
    std::unique_ptr<nn::Adam> adam;
    std::unique_ptr<testing::ClippedAdam> clipped;
    nn::Optimizer* optimizer = nullptr;
    if (run.sharded) {
      ASSIGN_OR_RETURN(sharded, ShardedAdam::Create(&model.params, ctx.replica_id(), ctx.num_replicas(),
                                                    {.max_grad_norm = run.max_norm}));
      RETURN_IF_ERROR(sharded->set_context(&ctx));
      optimizer = sharded.get();
    } else {
      TROUPE_CHECK(run.k == 1);
      adam = std::make_unique<nn::Adam>(&model.params, model.backend.get());
      clipped = std::make_unique<testing::ClippedAdam>(adam.get(), run.max_norm);
      optimizer = clipped.get();
    }
    if (!run.load.empty()) {
      RETURN_IF_ERROR(nn::LoadCheckpoint(run.load, model.params, optimizer));
      if (sharded) sharded->KeepOwnPart();
    }
    RETURN_IF_ERROR(testing::TrainShard(ctx, model, run.steps, 1 << 20, /*batch_norm=*/true, optimizer, run.first_step));
    if (sharded) RETURN_IF_ERROR(sharded->GatherState());
    if (ctx.replica_id() == 0) {
      out.state = nn::CheckpointTensors(model.params, optimizer);
      if (!run.save.empty()) RETURN_IF_ERROR(nn::SaveCheckpoint(run.save, model.params, optimizer));
      out.state_bytes = sharded ? sharded->state_bytes() : int64_t{sizeof(float)} * adam->state_floats();
      out.total_floats = model.params.total_floats();
    }
    if (sharded) sharded->ReleaseWholeState();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  for (const auto& m : models) out.params.push_back(m->params.DownloadValues());
  return out;
}

constexpr double kTolerance = 1e-4;

std::vector<nn::CheckpointTensor> InitialState() {
  testing::TestModel fresh;
  nn::Adam adam(&fresh.params, fresh.backend.get());
  return nn::CheckpointTensors(fresh.params, &adam);
}

TEST(ShardedAdamTest, ReplicasWithSplitMomentsEqualOneReplicaWithAdamOnTheWholeBatch) {
  const Trained reference = Train({.k = 1, .sharded = false});
  for (const Schedule& run : {Schedule{.k = 2}, Schedule{.k = 4}, Schedule{.k = 2, .strict = true}, Schedule{.k = 1}}) {
    SCOPED_TRACE(absl::StrCat("K=", run.k, run.strict ? " on the strict device" : ""));
    const Trained sharded = Train(run);
    TROUPE_EXPECT_SAME_STATE(InitialState(), reference.state, sharded.state, .tolerance = kTolerance);
    for (int r = 1; r < run.k; ++r) EXPECT_EQ(sharded.params[r], sharded.params[0]) << "replica " << r;
  }
}

TEST(ShardedAdamTest, ClippingByTheGlobalNormOfTheSplitGradientsEqualsClippingTheWhole) {
  const float max_norm = 0.05f;
  const Trained reference = Train({.k = 1, .sharded = false, .max_norm = max_norm});
  const Trained unclipped = Train({.k = 1, .sharded = false});
  // The norm clips (the runs differ), else this would test nothing.
  EXPECT_GT(nn::internal::RelativeDifference(reference.params[0], unclipped.params[0]), 100 * kTolerance);
  for (int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("K=", k));
    TROUPE_EXPECT_SAME_STATE(InitialState(), reference.state, Train({.k = k, .max_norm = max_norm}).state,
                             .tolerance = kTolerance);
  }
}

TEST(ShardedAdamTest, EachOfFourReplicasKeepsAQuarterOfTheMoments) {
  const Trained four = Train({.k = 4, .steps = 1});
  const int64_t unsharded = 2 * int64_t{sizeof(float)} * four.total_floats;
  const double ratio = double(four.state_bytes) / unsharded;
  std::printf("optimizer state per replica at K=4: %lld of %lld bytes unsharded (%.3fx)\n",
              static_cast<long long>(four.state_bytes), static_cast<long long>(unsharded), ratio);
  EXPECT_LE(ratio, 0.3);
  EXPECT_GE(ratio, 0.25);
}

// Written sharded at K=4 after 10 updates; resumed at K=2 sharded and at
// K=1 with plain Adam for 10 more: both equal 20 uninterrupted updates.
TEST(ShardedAdamTest, ACheckpointWrittenAtOneReplicaCountResumesAtAnother) {
  const std::string dir = ::testing::TempDir() + "/sharded_adam_checkpoint";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/k4.ckpt";
  Train({.k = 4, .steps = 10, .save = path});
  const Trained whole = Train({.k = 1, .sharded = false});
  for (const Schedule& run : {Schedule{.k = 2, .steps = 10, .first_step = 10, .load = path},
                         Schedule{.k = 1, .sharded = false, .steps = 10, .first_step = 10, .load = path}}) {
    SCOPED_TRACE(absl::StrCat("resumed at K=", run.k, run.sharded ? ", sharded" : ", plain Adam"));
    TROUPE_EXPECT_SAME_STATE(InitialState(), whole.state, Train(run).state, .tolerance = kTolerance);
  }
}

TEST(ShardedAdamTest, RefusesUnpaddedParametersAndReplicasSharingOneDevice) {
  // 576 floats: not a multiple of 16 x 5.
  auto replicator = MakeInProcess(5);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < 5; ++i) models.push_back(std::make_unique<testing::TestModel>());
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    absl::StatusOr<std::unique_ptr<ShardedAdam>> made =
        ShardedAdam::Create(&models[ctx.local_index()]->params, ctx.replica_id(), ctx.num_replicas(), {});
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(made.status().message(),
                HasSubstr(absl::StrCat("hold ", models[0]->params.padded_floats(), " floats, not a multiple of 80")));
    return absl::OkStatus();
  }).ok());

  auto shared = MakeInProcess(2, std::chrono::milliseconds(30000), /*on_device=*/true);
  std::vector<std::unique_ptr<testing::TestModel>> padded;
  for (int i = 0; i < 2; ++i) {
    padded.push_back(std::make_unique<testing::TestModel>(std::make_shared<nn::CpuBackend>(1), ShardedAdam::PadMultiple(2)));
  }
  ASSERT_TRUE(shared->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    absl::StatusOr<std::unique_ptr<ShardedAdam>> made =
        ShardedAdam::Create(&padded[ctx.local_index()]->params, ctx.replica_id(), ctx.num_replicas(), {});
    EXPECT_TRUE(made.ok()) << made.status();
    const absl::Status joined = (*made)->set_context(&ctx);
    EXPECT_EQ(joined.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(joined.message(), HasSubstr("sharing one device"));
    return absl::OkStatus();
  }).ok());
}

// ShardedParameters (ZeRO stage 3's parts): four replicas given distinct
// parts of one whole (SetPartFromHost) gather exactly that whole on every
// replica, with gradients zero; between uses a replica's device holds its
// part (a quarter of the values, and of the gradients) and not the whole,
// which Gather makes and Release frees; the host assembles the whole from
// all four parts and refuses three; Polyak on the parts is the whole
// average bit for bit.
TEST(ShardedParametersTest, PartsGatherIntoTheWholeOnEveryReplicaAndFreeItBetweenUses) {
  constexpr int kReplicas = 4;
  auto replicator = MakeInProcess(kReplicas);
  std::vector<std::unique_ptr<testing::TestModel>> online, target;
  for (int i = 0; i < kReplicas; ++i) {
    online.push_back(std::make_unique<testing::TestModel>(std::make_shared<nn::CpuBackend>(1),
                                                          ShardedAdam::PadMultiple(kReplicas)));
    target.push_back(std::make_unique<testing::TestModel>(std::make_shared<nn::CpuBackend>(1),
                                                          ShardedAdam::PadMultiple(kReplicas)));
  }
  const int64_t padded = online[0]->params.padded_floats();
  std::vector<float> whole(padded), target_whole(padded);
  for (int64_t i = 0; i < padded; ++i) {
    whole[i] = 0.001f * static_cast<float>(i) - 0.3f;
    target_whole[i] = std::sin(static_cast<float>(i));
  }
  std::vector<std::unique_ptr<ShardedParameters>> parts(kReplicas), target_parts(kReplicas);
  std::vector<std::vector<float>> gathered(kReplicas), gradients(kReplicas);
  std::vector<size_t> kept(kReplicas), holding(kReplicas), released(kReplicas);
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    const int r = ctx.replica_id();
    nn::Backend& device = *online[r]->backend;
    const size_t before = device.memory_in_use();
    ASSIGN_OR_RETURN(parts[r], ShardedParameters::Create(&online[r]->params, r, kReplicas));
    ASSIGN_OR_RETURN(target_parts[r], ShardedParameters::Create(&target[r]->params, r, kReplicas));
    EXPECT_FALSE(online[r]->params.holds_buffers());
    kept[r] = before - device.memory_in_use();
    parts[r]->SetPartFromHost(whole);
    target_parts[r]->SetPartFromHost(target_whole);
    RETURN_IF_ERROR(parts[r]->Gather(ctx));
    holding[r] = device.memory_in_use();
    gathered[r].resize(padded);
    gradients[r].resize(padded);
    device.Download(online[r]->params.device_values(), gathered[r].data(), sizeof(float) * padded);
    device.Download(online[r]->params.device_grads(), gradients[r].data(), sizeof(float) * padded);
    parts[r]->Release();
    released[r] = device.memory_in_use();
    target_parts[r]->Polyak(*parts[r], 0.3f);
    return absl::OkStatus();
  }).ok());
  const size_t whole_bytes = 2 * sizeof(float) * padded;  // values and gradients
  for (int r = 0; r < kReplicas; ++r) {
    SCOPED_TRACE(absl::StrCat("replica ", r));
    EXPECT_EQ(gathered[r], whole);
    EXPECT_EQ(gradients[r], std::vector<float>(padded, 0.0f));
    EXPECT_EQ(parts[r]->part_bytes(), int64_t(whole_bytes / kReplicas));
    EXPECT_EQ(holding[r] - released[r], whole_bytes);
  }
  // Create freed the whole values and gradients, less the part it keeps.
  for (int r = 0; r < kReplicas; ++r) EXPECT_EQ(kept[r], whole_bytes - whole_bytes / kReplicas) << "replica " << r;

  std::vector<const ShardedParameters*> all;
  for (const auto& p : parts) all.push_back(p.get());
  std::vector<float> host;
  ASSERT_TRUE(ShardedParameters::GatherLocalToHost(all, &host).ok());
  EXPECT_EQ(host, whole);
  const absl::Status three = ShardedParameters::GatherLocalToHost(std::span(all).first(3), &host);
  EXPECT_EQ(three.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(three.message(), HasSubstr("3 of their parts are in this process"));

  // Polyak on the parts against the whole average on one set.
  testing::TestModel reference_online(std::make_shared<nn::CpuBackend>(1), ShardedAdam::PadMultiple(kReplicas));
  testing::TestModel reference_target(std::make_shared<nn::CpuBackend>(1), ShardedAdam::PadMultiple(kReplicas));
  const int64_t total = reference_online.params.total_floats();
  ASSERT_TRUE(reference_online.params.UploadValues(std::span(whole).first(total)).ok());
  ASSERT_TRUE(reference_target.params.UploadValues(std::span(target_whole).first(total)).ok());
  ASSERT_TRUE(nn::PolyakUpdate(reference_online.params, reference_target.params, *reference_online.backend, 0.3f).ok());
  std::vector<const ShardedParameters*> targets;
  for (const auto& p : target_parts) targets.push_back(p.get());
  ASSERT_TRUE(ShardedParameters::GatherLocalToHost(targets, &host).ok());
  host.resize(total);
  EXPECT_EQ(host, reference_target.params.DownloadValues());
}

TEST(ShardedParametersTest, RefusesASetNotPaddedToEqualParts) {
  testing::TestModel model;  // 576 floats: not a multiple of 16 x 5
  const auto made = ShardedParameters::Create(&model.params, 0, 5);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(made.status().message(),
              HasSubstr(absl::StrCat("hold ", model.params.padded_floats(), " floats, not a multiple of 80")));
  EXPECT_TRUE(model.params.holds_buffers()) << "a refused split leaves the set as it was";
}

}  // namespace
}  // namespace troupe::replicator
