// The GAN trainer: K=2 with cross-replica batch norm equals K=1 on the whole
// batch; losses stay finite; a short run lowers classifier-FID from step 0;
// checkpoints round-trip; RunGan writes its run directory and resumes.
#include "gan/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "engine/engine_config.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/state_match.h"
#include "gan/evaluator.h"
#include "gan/fashion_classifier.h"
#include "gan/run.h"
#include "gan/trainer_test_configs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace troupe::gan {
namespace {

using testing::kEquivalenceSteps;
using testing::EquivalenceConfig;
using testing::RandomData;
using testing::TinyConfig;

double MaxDifference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max<double>(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// K=2 in-process replicas (cross-replica batch norm, gradients averaged)
// against K=1 on the whole batch: each replica's whole state (G, D, their
// Adam moments, which carry the gradients' size, the EMA, the power
// vectors, the step count) within 1e-5 relative after one step, each part
// moved by ten times that; the losses alike.
TEST(GanTrainerTest, TwoReplicasWithCrossReplicaBatchNormEqualOneReplicaOnTheWholeBatch) {
  const GanData data = RandomData(64);
  auto one = GanTrainer::Create(EquivalenceConfig(/*replicas=*/1), &data);
  auto two = GanTrainer::Create(EquivalenceConfig(/*replicas=*/2), &data);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  ASSERT_TRUE((*one)->Train(/*steps=*/1).ok());
  ASSERT_TRUE((*two)->Train(/*steps=*/1).ok());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "replica " << r);
    TROUPE_EXPECT_SAME_STATE(start, (*one)->CheckpointState(), (*two)->CheckpointState(r), .tolerance = 1e-5);
  }
  EXPECT_NEAR((*one)->discriminator_loss(), (*two)->discriminator_loss(), 1e-5);
  EXPECT_NEAR((*one)->generator_loss(), (*two)->generator_loss(), 1e-5);
}

config::GanConfig SplitConfig(int replicas, int model_parallel) {
  config::GanConfig c = EquivalenceConfig(replicas);
  c.mutable_engine()->set_model_parallel(model_parallel);
  return c;
}

// A generator split over M replicas (engine.model_parallel: its projection
// by output channel, its first transposed convolution by input channel) on
// a (K/M) x M mesh, against K=1 on the whole batch: after 20 steps every
// replica's whole state (the whole generator gathered from its copy's parts,
// with Adam's moments and the EMA; D and its moments; the power vectors;
// the step count) within 1e-5 relative, each part moved by ten times that;
// each replica holds its part of the generator only.
TEST(GanTrainerTest, AGeneratorSplitOverReplicasTrainsAsTheWholeOne) {
  const GanData data = RandomData(64);
  auto one = GanTrainer::Create(EquivalenceConfig(/*replicas=*/1), &data);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  ASSERT_TRUE((*one)->Train(kEquivalenceSteps).ok());
  const std::vector<nn::CheckpointTensor> want = (*one)->CheckpointState();
  for (const auto& [k, m] : {std::pair{2, 2}, {4, 2}, {4, 4}, {8, 8}}) {
    SCOPED_TRACE(::testing::Message() << k / m << " x " << m << " mesh");
    auto split = GanTrainer::Create(SplitConfig(k, m), &data);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_TRUE((*split)->Train(kEquivalenceSteps).ok());
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, want, (*split)->CheckpointState(r), .tolerance = 1e-5);
    }
    EXPECT_NEAR((*one)->discriminator_loss(), (*split)->discriminator_loss(), 1e-5);
    EXPECT_NEAR((*one)->generator_loss(), (*split)->generator_loss(), 1e-5);
    EXPECT_EQ((*split)->generator_floats(), (*one)->generator_floats());
    // The projection (8 x 8 x 49) and the first transposed convolution (8 x 4 x 16) split, the rest whole.
    EXPECT_EQ((*split)->generator_floats_per_replica(), (3136 + 16 + 512) / m + 8 + 64 + 1);
    std::printf("%d x %d mesh: a replica holds %lld of the generator's %lld floats (%.2fx)\n", k / m, m,
                static_cast<long long>((*split)->generator_floats_per_replica()),
                static_cast<long long>((*split)->generator_floats()),
                double((*split)->generator_floats_per_replica()) / double((*split)->generator_floats()));
  }
}

// The split generator on replicas that run each step as one compiled PJRT
// program (the CPU plugin's devices): the model's sums and the copies' means
// are all_reduce ops over each axis's replica groups, and 1x2 and 2x2 meshes
// end 20 steps within 1e-4 of one replica on the CPU, whole state (the 2x2
// mesh where the plugin has four devices).
TEST(GanTrainerTest, AGeneratorSplitOverPjrtReplicasTrainsAsTheWholeOne) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const GanData data = RandomData(64);
  auto one = GanTrainer::Create(EquivalenceConfig(/*replicas=*/1), &data);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  ASSERT_TRUE((*one)->Train(kEquivalenceSteps).ok());
  const std::vector<nn::CheckpointTensor> want = (*one)->CheckpointState();
  for (const auto& [k, m] : {std::pair{2, 2}, {4, 2}}) {
    SCOPED_TRACE(::testing::Message() << k / m << " x " << m << " mesh");
    config::GanConfig c = SplitConfig(k, m);
    c.mutable_engine()->set_device(config::EngineConfig::PJRT);
    c.mutable_engine()->set_pjrt_plugin(plugin);
    if (const absl::Status enough = engine::CheckDeviceAvailable(c.engine(), "gan"); !enough.ok()) {
      // Too few devices (the CUDA plugin on a one-GPU machine) skips;
      // anything else (the plugin not loading) fails.
      ASSERT_TRUE(absl::IsFailedPrecondition(enough)) << enough;
      GTEST_SKIP() << "the " << k << "-replica mesh needs a PJRT plugin with " << k << " devices: " << enough;
    }
    auto split = GanTrainer::Create(c, &data);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_TRUE((*split)->Train(kEquivalenceSteps).ok());
#ifdef TROUPE_HAVE_PJRT
    const auto* backend = dynamic_cast<const pjrt::PjrtBackend*>(&(*split)->generator_parameters(0).backend());
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->group_size(), k);
    EXPECT_THAT(backend->last_program(), ::testing::HasSubstr("replica_groups = dense<[[0, 1]"));
#endif
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, want, (*split)->CheckpointState(r), .tolerance = 1e-4);
    }
  }
}

// A checkpoint holds the whole generator whatever the split: written by a
// 2 x 2 mesh, it resumes at K=1 (whole) and on a 1 x 4 mesh, and each then
// trains on as the mesh that wrote it does.
TEST(GanTrainerTest, ASplitGeneratorsCheckpointResumesAtAnyReplicaCountAndSplit) {
  const GanData data = RandomData(64);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("troupe_gan_split_ckpt_" + std::to_string(getpid()))).string();
  auto a = GanTrainer::Create(SplitConfig(4, 2), &data);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Train(2).ok());
  ASSERT_TRUE((*a)->SaveCheckpoint(dir).ok());
  const std::vector<nn::CheckpointTensor> saved = (*a)->CheckpointState();
  ASSERT_TRUE((*a)->Train(2).ok());
  const std::vector<nn::CheckpointTensor> want = (*a)->CheckpointState();
  for (const auto& [k, m] : {std::pair{1, 1}, {4, 4}}) {
    SCOPED_TRACE(::testing::Message() << "resumed at K=" << k << ", M=" << m);
    auto b = GanTrainer::Create(SplitConfig(k, m), &data);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE((*b)->LoadCheckpoint(dir).ok());
    EXPECT_EQ((*b)->steps(), 2);
    TROUPE_EXPECT_SAME_STATE(saved, saved, (*b)->CheckpointState(), .tolerance = 0);
    ASSERT_TRUE((*b)->Train(2).ok());
    TROUPE_EXPECT_SAME_STATE(saved, want, (*b)->CheckpointState(), .tolerance = 1e-5);
  }
  std::filesystem::remove_all(dir);
}

// The training state split over K replicas (engine.shard_state `state`):
// K=2 and 4 end 20 steps where one replica with Adam on the whole batch ends,
// whole state within 1e-5 (the checkpoint's state gathered whole from the
// parts), each replica keeping about 1/K of what is split; a checkpoint of
// K=4 resumes at K=1 unsplit and at K=2 split either way, and each trains
// on as K=4 does. Returns what a replica keeps at K=4 against one replica.
double ExpectShardedStateEqualsOneReplica(config::EngineConfig::ShardState state) {
  const GanData data = RandomData(64);
  auto sharded_config = [](int k, config::EngineConfig::ShardState shard_state) {
    config::GanConfig c = EquivalenceConfig(k);
    c.mutable_engine()->set_shard_state(shard_state);
    return c;
  };
  // What is split: the moments, or the networks too.
  const bool parameters = state == config::EngineConfig::PARAMETERS;
  auto kept = [parameters](const GanTrainer& t) {
    return t.optimizer_state_bytes() + (parameters ? t.parameter_state_bytes() : 0);
  };
  auto one = GanTrainer::Create(EquivalenceConfig(1), &data);
  EXPECT_TRUE(one.ok()) << one.status();
  if (!one.ok()) return 1;
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  EXPECT_TRUE((*one)->Train(kEquivalenceSteps).ok());
  const std::vector<nn::CheckpointTensor> want = (*one)->CheckpointState();
  double ratio = 1;
  for (int k : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "K=" << k);
    auto sharded = GanTrainer::Create(sharded_config(k, state), &data);
    EXPECT_TRUE(sharded.ok()) << sharded.status();
    if (!sharded.ok()) return 1;
    EXPECT_TRUE((*sharded)->Train(kEquivalenceSteps).ok());
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, want, (*sharded)->CheckpointState(r), .tolerance = 1e-5);
    }
    if (parameters) {
      // Evaluation's samples: the EMA generator's, assembled from the parts.
      std::vector<float> samples(4 * kPixels), want_samples(4 * kPixels);
      (*sharded)->Generate(/*stream=*/1, 0, 4, samples.data());
      (*one)->Generate(/*stream=*/1, 0, 4, want_samples.data());
      EXPECT_THAT(samples, ::testing::Pointwise(::testing::FloatNear(1e-4), want_samples));
    }
    ratio = double(kept(**sharded)) / double(kept(**one));
    EXPECT_GE(ratio, parameters ? 0.9 / k : 1.0 / k);
    EXPECT_LE(ratio, 1.0 / k + 0.02) << "1/K of it, and the padding to K parts";
    std::printf("K=%d, %s: a replica keeps %lld of %lld bytes (%.3fx)\n", k,
                config::EngineConfig::ShardState_Name(state).c_str(), static_cast<long long>(kept(**sharded)),
                static_cast<long long>(kept(**one)), ratio);
  }
  // A checkpoint across K, split either way and not.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("troupe_gan_sharded_ckpt_" + std::to_string(getpid()))).string();
  auto a = GanTrainer::Create(sharded_config(4, state), &data);
  EXPECT_TRUE((*a)->Train(2).ok());
  EXPECT_TRUE((*a)->SaveCheckpoint(dir).ok());
  const std::vector<nn::CheckpointTensor> saved = (*a)->CheckpointState();
  EXPECT_TRUE((*a)->Train(2).ok());
  const std::vector<nn::CheckpointTensor> then = (*a)->CheckpointState();
  for (const config::GanConfig& c : {EquivalenceConfig(1), sharded_config(2, config::EngineConfig::OPTIMIZER),
                                     sharded_config(2, config::EngineConfig::PARAMETERS)}) {
    SCOPED_TRACE(::testing::Message() << "resumed at K=" << c.engine().replicas() << ", "
                                      << config::EngineConfig::ShardState_Name(c.engine().shard_state()));
    auto b = GanTrainer::Create(c, &data);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) continue;
    EXPECT_TRUE((*b)->LoadCheckpoint(dir).ok());
    TROUPE_EXPECT_SAME_STATE(saved, saved, (*b)->CheckpointState(), .tolerance = 0);
    EXPECT_TRUE((*b)->Train(2).ok());
    TROUPE_EXPECT_SAME_STATE(saved, then, (*b)->CheckpointState(), .tolerance = 1e-5);
  }
  std::filesystem::remove_all(dir);
  return ratio;
}

// engine.shard_state OPTIMIZER: each of K replicas keeps Adam's moments for
// 1/K of both networks (replicator::ShardedAdam: gradients reduce-scattered,
// parameters all-gathered), 1/K of the moments each.
TEST(GanTrainerTest, ReplicasWithShardedOptimizerStateEqualOneReplicaWithAdam) {
  ExpectShardedStateEqualsOneReplica(config::EngineConfig::OPTIMIZER);
}

// engine.shard_state PARAMETERS: the generator, the discriminator and the
// EMA split too (replicator::ShardedParameters, ZeRO stage 3: both networks
// gathered whole for a step, the discriminator again after each of its
// updates, freed after it; the EMA averaged on the parts), each replica
// keeping at most 0.35x of one replica's networks and moments at K=4 (the
// power vectors, a few floats, whole).
TEST(GanTrainerTest, ReplicasWithSplitParametersEqualOneReplicaWithTheWholeModel) {
  EXPECT_LE(ExpectShardedStateEqualsOneReplica(config::EngineConfig::PARAMETERS), 0.35);
}

// The same split of the moments on two replicas that run each step as one
// compiled PJRT program (the CPU plugin's devices): 20 steps end within 1e-4
// of one replica with Adam on the CPU, whole state.
TEST(GanTrainerTest, ShardedOptimizerStateOnPjrtReplicasEqualsOneReplicaWithAdam) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const GanData data = RandomData(64);
  config::GanConfig c = EquivalenceConfig(2);
  c.mutable_engine()->set_shard_state(config::EngineConfig::OPTIMIZER);
  c.mutable_engine()->set_device(config::EngineConfig::PJRT);
  c.mutable_engine()->set_pjrt_plugin(plugin);
  if (const absl::Status enough = engine::CheckDeviceAvailable(c.engine(), "gan"); !enough.ok()) {
    ASSERT_TRUE(absl::IsFailedPrecondition(enough)) << enough;  // the plugin loads
    GTEST_SKIP() << "two replicas need a PJRT plugin with two devices: " << enough;
  }
  auto one = GanTrainer::Create(EquivalenceConfig(1), &data);
  auto sharded = GanTrainer::Create(c, &data);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
  ASSERT_TRUE((*one)->Train(kEquivalenceSteps).ok());
  ASSERT_TRUE((*sharded)->Train(kEquivalenceSteps).ok());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "replica " << r);
    TROUPE_EXPECT_SAME_STATE(start, (*one)->CheckpointState(), (*sharded)->CheckpointState(r), .tolerance = 1e-4);
  }
}

// K=2 replicas on one device reducing on it (collectives SHARED_DEVICE: on a
// GPU, two threads with their own streams on GPU 0) against K=1 on the whole
// batch: each replica's whole state within 1e-5 relative on the CPU, and
// within 1e-4 on CUDA where a GPU answers (another summation order in its
// kernels), losses included.
TEST(GanTrainerTest, TwoReplicasSharingOneDeviceEqualOneReplicaOnTheWholeBatch) {
  const GanData data = RandomData(64);
  for (const auto device : {config::EngineConfig::CPU, config::EngineConfig::CUDA}) {
    config::EngineConfig probe;
    probe.set_device(device);
    if (!engine::CheckDeviceAvailable(probe, "gan").ok()) continue;  // no GPU here
    SCOPED_TRACE(config::EngineConfig::Device_Name(device));
    const double tolerance = device == config::EngineConfig::CPU ? 1e-5 : 1e-4;
    config::GanConfig one_config = EquivalenceConfig(/*replicas=*/1), two_config = EquivalenceConfig(/*replicas=*/2);
    one_config.mutable_engine()->set_device(device);
    two_config.mutable_engine()->set_device(device);
    two_config.mutable_engine()->set_collectives(config::EngineConfig::SHARED_DEVICE);
    auto one = GanTrainer::Create(one_config, &data);
    auto two = GanTrainer::Create(two_config, &data);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(two.ok()) << two.status();
    const std::vector<nn::CheckpointTensor> start = (*one)->CheckpointState();
    ASSERT_TRUE((*one)->Train(/*steps=*/2).ok());
    ASSERT_TRUE((*two)->Train(/*steps=*/2).ok());
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, (*one)->CheckpointState(), (*two)->CheckpointState(r), .tolerance = tolerance);
    }
    EXPECT_NEAR((*one)->discriminator_loss(), (*two)->discriminator_loss(), tolerance);
    EXPECT_NEAR((*one)->generator_loss(), (*two)->generator_loss(), tolerance);
  }
}

// The strict CPU device (memory the host cannot touch between kernels, and
// no Download inside a step): GAN steps on one replica (no host round trip
// at all) and on two (cross-replica batch norm and the gradient all-reduce
// staged through the host, the one round trip a step may make) run on it,
// bit for bit the CPU's, the whole state compared.
TEST(GanTrainerTest, StepsOnTheStrictDeviceEqualTheCpuBitForBit) {
  const GanData data = RandomData(64);
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << replicas << " replica(s)");
    config::GanConfig strict_config = EquivalenceConfig(replicas);
    strict_config.mutable_engine()->set_device(config::EngineConfig::CPU_STRICT);
    auto cpu = GanTrainer::Create(EquivalenceConfig(replicas), &data);
    auto strict = GanTrainer::Create(strict_config, &data);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(strict.ok()) << strict.status();
    const std::vector<nn::CheckpointTensor> start = (*cpu)->CheckpointState();
    ASSERT_TRUE((*cpu)->Train(/*steps=*/2).ok());
    ASSERT_TRUE((*strict)->Train(/*steps=*/2).ok());
    for (int r = 0; r < replicas; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, (*cpu)->CheckpointState(r), (*strict)->CheckpointState(r), .tolerance = 0,
                               .moved_at_least = 1e-4);
    }
    EXPECT_EQ((*cpu)->discriminator_loss(), (*strict)->discriminator_loss());
    EXPECT_EQ((*cpu)->generator_loss(), (*strict)->generator_loss());
    EXPECT_NE((*cpu)->discriminator_loss(), 0.0) << "the losses were read back";
  }
}

// GAN steps on the PJRT backend (the XLA CPU plugin here; a TPU or GPU
// plugin runs the same programs), on one replica and on two (devices 0 and
// 1 of the plugin, one program for both whose all_reduce ops are the
// cross-replica batch norm and the gradient average): two steps from the
// same data end within float32 rounding of the CPU (2e-5 relative; 2.3e-6
// seen), the whole state of each replica compared (G, D, their Adam
// moments, the EMA, the power vectors, the step count), each part moved by
// ten times that; the losses alike.
TEST(GanTrainerTest, StepsOnPjrtMatchTheCpuOnOneAndTwoReplicas) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const GanData data = RandomData(64);
  for (int replicas : {1, 2}) {  // in this order: a plugin with one device skips the second only
    SCOPED_TRACE(::testing::Message() << replicas << " replica(s)");
    config::GanConfig pjrt_config = EquivalenceConfig(replicas);
    pjrt_config.mutable_engine()->set_device(config::EngineConfig::PJRT);
    pjrt_config.mutable_engine()->set_pjrt_plugin(plugin);
    if (const absl::Status enough = engine::CheckDeviceAvailable(pjrt_config.engine(), "gan"); !enough.ok()) {
      // The CUDA plugin on a one-GPU machine: one device, one replica. The
      // one-replica case (run first) has been checked; the two-replica one
      // is reported skipped, naming what is missing. Anything else (the
      // plugin not loading) fails.
      ASSERT_TRUE(replicas > 1 && absl::IsFailedPrecondition(enough)) << enough;
      GTEST_SKIP() << "the " << replicas << "-replica case needs a PJRT plugin with " << replicas
                   << " or more devices (the 1-replica case ran): " << enough;
    }
    auto cpu = GanTrainer::Create(EquivalenceConfig(replicas), &data);
    auto pjrt = GanTrainer::Create(pjrt_config, &data);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(pjrt.ok()) << pjrt.status();
    const std::vector<nn::CheckpointTensor> start = (*cpu)->CheckpointState();
    ASSERT_TRUE((*cpu)->Train(/*steps=*/2).ok());
#ifdef TROUPE_HAVE_PJRT
    // Each step (n_critic D updates and a G update, spectral norm, batch
    // norm, the EMA) is one compiled program, compiled once.
    const auto* backend = dynamic_cast<const pjrt::PjrtBackend*>(&(*pjrt)->generator_parameters(0).backend());
    ASSERT_NE(backend, nullptr);
    const pjrt::PjrtStats before = backend->stats();
#endif
    ASSERT_TRUE((*pjrt)->Train(/*steps=*/2).ok());
#ifdef TROUPE_HAVE_PJRT
    if (replicas == 1) {
      EXPECT_EQ(backend->stats().launches - before.launches, 2) << "executions in two compiled steps";
      EXPECT_EQ(backend->stats().step_compiles + backend->stats().step_cache_loads - before.step_compiles -
                    before.step_cache_loads,
                1);
      EXPECT_EQ(backend->stats().steps - before.steps, 2);
    } else {
      // Two replicas: one program for both (the gradient and batch-norm sums
      // are its all_reduce ops), one execution per step.
      EXPECT_EQ(backend->group_size(), 2);
      EXPECT_EQ(backend->stats().launches - before.launches, 2) << "executions in two compiled steps";
      EXPECT_THAT(backend->last_program(), ::testing::HasSubstr("\"stablehlo.all_reduce\""));
    }
#endif
    for (int r = 0; r < replicas; ++r) {
      SCOPED_TRACE(::testing::Message() << "replica " << r);
      TROUPE_EXPECT_SAME_STATE(start, (*cpu)->CheckpointState(r), (*pjrt)->CheckpointState(r), .tolerance = 2e-5);
    }
    EXPECT_NEAR((*cpu)->discriminator_loss(), (*pjrt)->discriminator_loss(), 1e-4);
    EXPECT_NEAR((*cpu)->generator_loss(), (*pjrt)->generator_loss(), 1e-4);
  }
}

TEST(GanTrainerTest, NonSaturatingLossTrainsWithFiniteLosses) {
  const GanData data = RandomData(64);
  auto trainer = GanTrainer::Create(TinyConfig(1, config::GanConfig::NON_SATURATING), &data);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Train(5).ok());
  EXPECT_TRUE(std::isfinite((*trainer)->discriminator_loss()));
  EXPECT_TRUE(std::isfinite((*trainer)->generator_loss()));
  EXPECT_EQ((*trainer)->images_seen(), 5 * 2 * 8);
}

// gan.optimizer LAMB / LARS: both networks step with it (the weights differ
// from Adam's after one step), on two replicas as on one, and its state
// checkpoints under its own names.
TEST(GanTrainerTest, LambAndLarsStepBothNetworksOnOneAndTwoReplicas) {
  const GanData data = RandomData(64);
  auto adam = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE(adam.ok()) << adam.status();
  ASSERT_TRUE((*adam)->Train(1).ok());
  for (auto optimizer : {config::GanConfig::LAMB, config::GanConfig::LARS}) {
    SCOPED_TRACE(config::GanConfig::Optimizer_Name(optimizer));
    config::GanConfig c1 = TinyConfig(1), c2 = TinyConfig(2);
    for (config::GanConfig* c : {&c1, &c2}) {
      c->set_optimizer(optimizer);
      if (optimizer == config::GanConfig::LARS) {  // LARS's global rate is ~1 (its trust coefficient is 0.001)
        c->set_generator_learning_rate(1.0f);
        c->set_discriminator_learning_rate(1.0f);
      }
    }
    auto one = GanTrainer::Create(c1, &data);
    auto two = GanTrainer::Create(c2, &data);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(two.ok()) << two.status();
    const std::vector<float> initial = (*one)->generator_parameters(0).DownloadValues();
    ASSERT_TRUE((*one)->Train(1).ok());
    ASSERT_TRUE((*two)->Train(1).ok());
    EXPECT_TRUE(std::isfinite((*one)->discriminator_loss()) && std::isfinite((*one)->generator_loss()));
    EXPECT_GT(MaxDifference(initial, (*one)->generator_parameters(0).DownloadValues()), 1e-7);
    EXPECT_GT(MaxDifference((*adam)->generator_parameters(0).DownloadValues(),
                            (*one)->generator_parameters(0).DownloadValues()),
              1e-7);
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT(MaxDifference((*one)->generator_parameters(0).DownloadValues(),
                              (*two)->generator_parameters(r).DownloadValues()),
                1e-5);
      EXPECT_LT(MaxDifference((*one)->discriminator_parameters(0).DownloadValues(),
                              (*two)->discriminator_parameters(r).DownloadValues()),
                1e-5);
    }
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("troupe_gan_opt_" + std::to_string(getpid()) + config::GanConfig::Optimizer_Name(optimizer)))
                                .string();
    ASSERT_TRUE((*one)->SaveCheckpoint(dir).ok());
    auto again = GanTrainer::Create(c1, &data);
    ASSERT_TRUE((*again)->LoadCheckpoint(dir).ok());
    ASSERT_TRUE((*one)->Train(2).ok());
    ASSERT_TRUE((*again)->Train(2).ok());
    EXPECT_EQ(MaxDifference((*one)->generator_parameters(0).DownloadValues(),
                            (*again)->generator_parameters(0).DownloadValues()),
              0.0);
    std::filesystem::remove_all(dir);
  }
}

TEST(GanTrainerTest, InvalidConfigNamesTheField) {
  const GanData data = RandomData(64);
  config::GanConfig c = TinyConfig(3);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.batch_size 8: must be divisible by gan.engine.replicas 3"));
  c = TinyConfig(1);
  c.mutable_engine()->set_threads(-1);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(), ::testing::HasSubstr("gan.engine.threads -1"));
  c = TinyConfig(1);
  c.set_n_critic(0);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(), ::testing::HasSubstr("gan.n_critic"));
  // A split generator: what cannot split, said before anything starts.
  c = SplitConfig(2, 3);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.engine.model_parallel 3: gan.engine.replicas 2 is not a multiple of it"));
  c = SplitConfig(3, 3);
  c.set_batch_size(9);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.engine.model_parallel: 3: the generator's 8 projected channels "
                                   "(2 x generator_channels) do not split into 3 parts"));
  c = SplitConfig(2, 2);
  c.set_optimizer(config::GanConfig::LAMB);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.optimizer: LAMB with engine.model_parallel 2"));
  c = SplitConfig(2, 2);
  c.mutable_engine()->set_collectives(config::EngineConfig::MPI);
  EXPECT_TRUE(ValidateGanConfig(c).ok()) << "a generator split over MPI ranks (GanTrainerMpi.split_generator)";
  c = SplitConfig(2, 2);
  c.mutable_engine()->set_collectives(config::EngineConfig::SHARED_DEVICE);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.engine.model_parallel 2: a mesh of replicas needs collectives IN_PROCESS or "
                                   "MPI"));
  // The parameters split: Adam (in this process or over MPI ranks).
  c = TinyConfig(2);
  c.mutable_engine()->set_shard_state(config::EngineConfig::PARAMETERS);
  c.set_optimizer(config::GanConfig::LARS);
  EXPECT_THAT(GanTrainer::Create(c, &data).status().message(),
              ::testing::HasSubstr("gan.engine.shard_state: PARAMETERS with optimizer LARS: the split optimizer is "
                                   "Adam's"));
  c.set_optimizer(config::GanConfig::ADAM);
  c.mutable_engine()->set_collectives(config::EngineConfig::MPI);
  EXPECT_TRUE(ValidateGanConfig(c).ok()) << "the parameters split over MPI ranks (GanTrainerMpi.split_parameters)";
}

TEST(GanTrainerTest, CheckpointRoundTripsAndTrainingContinuesIdentically) {
  const GanData data = RandomData(64);
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_gan_ckpt_" + std::to_string(getpid()))).string();
  auto a = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE((*a)->Train(3).ok());
  ASSERT_TRUE((*a)->SaveCheckpoint(dir).ok());
  auto b = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE((*b)->LoadCheckpoint(dir).ok());
  EXPECT_EQ((*b)->steps(), 3);
  ASSERT_TRUE((*a)->Train(2).ok());
  ASSERT_TRUE((*b)->Train(2).ok());
  EXPECT_EQ(MaxDifference((*a)->generator_parameters(0).DownloadValues(), (*b)->generator_parameters(0).DownloadValues()), 0.0);
  EXPECT_EQ(MaxDifference((*a)->generator_ema().DownloadValues(), (*b)->generator_ema().DownloadValues()), 0.0);
  std::filesystem::remove_all(dir);
}

// Checkpoints are generations (common/generations.h): the newest two kept,
// a damaged newest one passed over saying why, and a folder of the layout
// before generations (the files directly in it, or in DIR.new after a swap
// was killed) still resumes.
// gan.engine.device_memory_mib is each replica's device's memory: two
// replicas of a tiny GAN train within 64 MiB each (their peak counted), and
// with 1 MiB the process stops at the allocation past it, naming the sizes.
TEST(GanTrainerTest, ADeviceMemoryBudgetCapsEachReplicaAndAGanThatDoesNotFitStops) {
  const GanData data = RandomData(64);
  config::GanConfig fits = TinyConfig(/*replicas=*/2);
  fits.mutable_engine()->set_device_memory_mib(64);
  auto trainer = GanTrainer::Create(fits, &data);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Train(/*steps=*/2).ok());
  EXPECT_GT((*trainer)->peak_device_memory(), size_t{1} << 20);
  EXPECT_LE((*trainer)->peak_device_memory(), size_t{64} << 20);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  config::GanConfig tiny = fits;
  tiny.mutable_engine()->set_device_memory_mib(1);
  EXPECT_DEATH(
      {
        auto t = GanTrainer::Create(tiny, &data);
        TROUPE_CHECK(t.ok());
        (void)(*t)->Train(1);
      },
      "cpu backend: out of its memory budget: .* MiB asked with .* MiB in use, over the budget of 1.00 MiB");
}

TEST(GanTrainerTest, CheckpointsAreGenerationsAndADamagedNewestOneFallsBack) {
  const GanData data = RandomData(64);
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_gan_gen_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + ".new");
  auto a = GanTrainer::Create(TinyConfig(1), &data);
  for (int save = 0; save < 3; ++save) {
    ASSERT_TRUE((*a)->Train(1).ok());
    ASSERT_TRUE((*a)->SaveCheckpoint(dir, {{"note.txt", absl::StrCat("save ", save, "\n")}}).ok());
  }
  EXPECT_EQ(ListGenerations(dir).size(), 2u);  // gan.keep_checkpoints 2
  auto restored = [&](int64_t want_steps, std::vector<std::string>* why = nullptr) {
    auto b = GanTrainer::Create(TinyConfig(1), &data);
    absl::StatusOr<std::string> from = (*b)->LoadCheckpoint(dir, why);
    EXPECT_TRUE(from.ok()) << from.status();
    EXPECT_EQ((*b)->steps(), want_steps);
    return from.ok() ? *from : "";
  };
  EXPECT_THAT(restored(3), ::testing::EndsWith("generation-000000003"));
  // The newest's generator flipped by a byte: the one before, and why.
  const std::string newest = ListGenerations(dir).front().second;
  std::fstream file(newest + "/generator.ckpt", std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(100);
  file.put('\x55');
  file.close();
  std::vector<std::string> why;
  EXPECT_THAT(restored(2, &why), ::testing::EndsWith("generation-000000002"));
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0], ::testing::HasSubstr("generator.ckpt: checksum mismatch"));

  // The layout before generations: its files directly in the folder.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE((*a)->SaveCheckpoint(dir + "/old").ok());
  const std::string generation = ListGenerations(dir + "/old").front().second;
  for (const auto& entry : std::filesystem::directory_iterator(generation)) {
    if (entry.path().filename() != "MANIFEST") std::filesystem::rename(entry.path(), std::filesystem::path(dir) / entry.path().filename());
  }
  std::filesystem::remove_all(dir + "/old");
  EXPECT_EQ(restored(3), dir);
  // ...or, killed in its swap, in DIR.new.
  std::filesystem::rename(dir, dir + ".new");
  EXPECT_EQ(restored(3), dir + ".new");
  std::filesystem::rename(dir + ".new", dir);
  // A new checkpoint over it is a generation; once two are committed, the
  // old files go.
  ASSERT_TRUE((*a)->SaveCheckpoint(dir).ok());
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/", kCountersFile)));
  ASSERT_TRUE((*a)->SaveCheckpoint(dir).ok());
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/", kCountersFile)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/generator.ckpt"));
  // No checkpoint anywhere: NotFound naming the folder.
  std::filesystem::remove_all(dir);
  auto c = GanTrainer::Create(TinyConfig(1), &data);
  absl::StatusOr<std::string> none = (*c)->LoadCheckpoint(dir);
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr(dir));
  std::filesystem::remove_all(dir);
}

// A process killed (SIGKILL, by the crash injection) between two writes of
// a save resumes from the last committed generation, its steps matching its
// networks: the networks resumed train on exactly as the saved trainer did.
TEST(GanTrainerTest, ASaveKilledBetweenItsWritesResumesTheLastCommittedGeneration) {
  const GanData data = RandomData(64);
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_gan_crash_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  auto a = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE((*a)->Train(2).ok());
  ASSERT_TRUE((*a)->SaveCheckpoint(dir).ok());
  // The reference: the trainer at that save, trained on.
  auto reference = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE((*reference)->LoadCheckpoint(dir).ok());
  ASSERT_TRUE((*reference)->Train(1).ok());
  ASSERT_TRUE((*a)->Train(3).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Killed after the discriminator's file, before the manifest.
    setenv(kCheckpointCrashVariable, "added:discriminator.ckpt@2", 1);
    (void)(*a)->SaveCheckpoint(dir);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "not killed at the injected point";
  auto b = GanTrainer::Create(TinyConfig(1), &data);
  std::vector<std::string> why;
  absl::StatusOr<std::string> from = (*b)->LoadCheckpoint(dir, &why);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_THAT(*from, ::testing::EndsWith("generation-000000001"));
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0], ::testing::HasSubstr("not committed"));
  EXPECT_EQ((*b)->steps(), 2);
  ASSERT_TRUE((*b)->Train(1).ok());
  EXPECT_EQ(MaxDifference((*b)->generator_parameters(0).DownloadValues(),
                          (*reference)->generator_parameters(0).DownloadValues()),
            0.0);
  std::filesystem::remove_all(dir);
}

TEST(GanTrainerTest, ExportWeightsWritesEveryTensorByNameWithItsCurrentValues) {
  const GanData data = RandomData(64);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("troupe_gan_weights_" + std::to_string(getpid()))).string();
  auto trainer = GanTrainer::Create(TinyConfig(1), &data);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Train(2).ok());  // values that are not the initial ones
  ASSERT_TRUE((*trainer)->ExportWeights(path).ok());
  auto tensors = nn::ReadCheckpoint(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  // Generator, discriminator, then the 3 spectral norms' u and v.
  nn::ParameterSet& g = (*trainer)->generator_parameters(0);
  nn::ParameterSet& d = (*trainer)->discriminator_parameters(0);
  ASSERT_EQ(static_cast<int>(tensors->size()), g.size() + d.size() + 6);
  const std::vector<float> g_values = g.DownloadValues();
  for (int i = 0; i < g.size(); ++i) {
    const nn::CheckpointTensor& t = (*tensors)[i];
    EXPECT_EQ(t.name, g.info(i).name);
    EXPECT_EQ(t.shape, g.info(i).shape);
    EXPECT_EQ(MaxDifference(t.values, std::span<const float>(g_values).subspan(g.info(i).offset, t.values.size())), 0.0)
        << t.name;
  }
  EXPECT_EQ((*tensors)[g.size()].name, "d.c1.w");
  EXPECT_EQ(tensors->back().name, "d.fc.v");
  EXPECT_EQ(tensors->back().shape, nn::Shape({1}));
  // Unwritable: an error naming the path, nothing left behind.
  const absl::Status denied = (*trainer)->ExportWeights("/nonexistent-dir/weights.ckpt");
  EXPECT_FALSE(denied.ok());
  EXPECT_THAT(denied.message(), ::testing::HasSubstr("/nonexistent-dir/weights.ckpt"));
  std::filesystem::remove(path);
}

// Real data and a small classifier trained once for the suite (6,000 images,
// one epoch: ~80% accuracy, enough for FID to tell noise from clothes).
class GanShortRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::temp_directory_path() / ("troupe_gan_run_" + std::to_string(getpid()))).string());
    std::filesystem::create_directories(*dir_);
    auto data = LoadGanData(kFashionMnistDir);
    if (!data.ok() && absl::IsNotFound(data.status())) {
      // Debian's dataset-fashion-mnist is not installed (a relocatable bundle
      // on a GPU machine): each test skips, saying why.
      missing_data_ = new std::string(data.status().ToString());
      return;
    }
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = new GanData(std::move(*data));
    FidClassifier::Options options;
    options.checkpoint = *dir_ + "/classifier.ckpt";
    options.train.epochs = 1;
    options.train_images = 6000;
    auto classifier = FidClassifier::LoadOrTrain(options);
    ASSERT_TRUE(classifier.ok()) << classifier.status();
    classifier_ = classifier->release();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete classifier_;
    delete data_;
    delete dir_;
    delete missing_data_;
    missing_data_ = nullptr;
  }
  void SetUp() override {
    if (missing_data_ != nullptr) GTEST_SKIP() << *missing_data_;
  }
  static std::string* missing_data_;
  static std::string* dir_;
  static GanData* data_;
  static FidClassifier* classifier_;
};
std::string* GanShortRunTest::missing_data_ = nullptr;
std::string* GanShortRunTest::dir_ = nullptr;
GanData* GanShortRunTest::data_ = nullptr;
FidClassifier* GanShortRunTest::classifier_ = nullptr;

TEST_F(GanShortRunTest, LossesStayFiniteAndFidFallsFromStepZero) {
  ASSERT_NE(classifier_, nullptr);
  config::GanConfig c;
  c.set_batch_size(32);
  c.set_base_batch_size(32);
  c.set_generator_learning_rate(2e-4);
  c.set_generator_channels(16);
  c.set_discriminator_channels(16);
  c.set_noise_size(32);
  c.set_warmup_images(0);
  c.set_ema_half_life_images(2000);
  c.mutable_engine()->set_threads(2);
  auto trainer = GanTrainer::Create(c, data_);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  GanEvaluator evaluator(classifier_, *data_, /*real_samples=*/2000);
  const double floor = evaluator.RealAgainstRealFid(*data_, 2000);
  const Evaluation start = evaluator.Evaluate(**trainer, /*samples=*/2000);
  const auto t0 = std::chrono::steady_clock::now();
  for (int chunk = 0; chunk < 50; ++chunk) {
    ASSERT_TRUE((*trainer)->Train(20).ok());
    ASSERT_TRUE(std::isfinite((*trainer)->discriminator_loss())) << "step " << (*trainer)->steps();
    ASSERT_TRUE(std::isfinite((*trainer)->generator_loss())) << "step " << (*trainer)->steps();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Evaluation end = evaluator.Evaluate(**trainer, 2000);
  std::printf("classifier-FID %.2f at step 0 -> %.2f after %ld images (%.1f s, %.0f images/s); real-vs-real %.2f; "
              "classifier score %.2f -> %.2f\n",
              start.fid, end.fid, long((*trainer)->images_seen()), seconds, (*trainer)->images_seen() / seconds, floor,
              start.classifier_score, end.classifier_score);
  EXPECT_LT(end.fid, 0.5 * start.fid);
  EXPECT_LT(floor, end.fid);
}

TEST_F(GanShortRunTest, RunGanWritesTheRunDirectoryAndResumes) {
  ASSERT_NE(classifier_, nullptr);
  const std::string run_dir = *dir_ + "/run";
  std::filesystem::create_directories(run_dir);
  config::ExperimentConfig config;
  config.set_name("gan_test");
  config.set_mode(config::ExperimentConfig::GAN);
  config::GanConfig& c = *config.mutable_gan();
  c.set_batch_size(16);
  c.set_generator_channels(8);
  c.set_discriminator_channels(8);
  c.set_noise_size(16);
  c.set_total_images(320);
  c.set_eval_every_images(160);
  c.set_eval_samples(200);
  c.set_classifier_checkpoint(*dir_ + "/classifier.ckpt");
  ASSERT_TRUE(RunGan(config, run_dir, /*resume=*/false, nullptr).ok());
  const RunLayout run(run_dir);
  for (const std::string& path :
       {run.samples(), run.fid_curve(), run.eval_csv(), run.metrics_csv(), run.samples_at(160)}) {
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
  }
  // The checkpoint: a committed generation.
  EXPECT_THAT(RunLayout(run_dir).NewestCheckpoint(/*gan=*/true),
              ::testing::EndsWith("checkpoints/generation-000000001/counters.txt"));
  // As a run killed after its checkpoint leaves them: an evaluation and a
  // metrics row past it (100 s later), and a row cut off mid-write.
  const double seconds_before = LastRunSeconds(RunLayout(run_dir).metrics_csv());
  ASSERT_GT(seconds_before, 0);
  std::ofstream(RunLayout(run_dir).eval_csv(), std::ios::app) << "999999,9999,1.0,1.0,1.0\n";
  std::ofstream(RunLayout(run_dir).metrics_csv(), std::ios::app)
      << seconds_before + 100 << ",999999,9999,1,0,0,0,0\n" << seconds_before + 101 << ",9999";
  // Resume with a larger budget: continues from 320 images, its clock from
  // the last whole metrics row (the lost piece counts), and the rows past the
  // checkpoint go.
  c.set_total_images(480);
  ASSERT_TRUE(RunGan(config, run_dir, /*resume=*/true, nullptr).ok());
  std::ifstream evals(RunLayout(run_dir).eval_csv());
  std::string eval_row, last_eval;
  while (std::getline(evals, eval_row)) {
    EXPECT_EQ(eval_row.find("999999"), std::string::npos) << eval_row;
    last_eval = eval_row;
  }
  EXPECT_EQ(last_eval.substr(0, last_eval.find(',')), "480");
  std::ifstream metrics(RunLayout(run_dir).metrics_csv());
  std::string row;
  std::getline(metrics, row);  // header
  double previous = 0;
  int rows = 0;
  while (std::getline(metrics, row)) {
    const double seconds = std::stod(row.substr(0, row.find(',')));
    EXPECT_GE(seconds, previous) << "row " << rows << ": " << row;
    previous = seconds;
    ++rows;
  }
  // A row per chunk of steps; chunks stop at every evaluation (10 steps):
  // 2 before the resume, 1 after.
  EXPECT_EQ(rows, 3);
  EXPECT_GT(previous, seconds_before + 100);
  std::ifstream counters(RunLayout(run_dir).NewestCheckpoint(/*gan=*/true));
  std::string key;
  int64_t steps = 0;
  counters >> key >> steps;
  EXPECT_EQ(steps, 30);  // 480 images / 16 per step
}

}  // namespace
}  // namespace troupe::gan
