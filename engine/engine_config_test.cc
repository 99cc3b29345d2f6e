// An engine section: its validation names the field, its threads, and the
// backend each device gives (CUDA refused, saying why, where it cannot be had).
#include "engine/engine_config.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::engine {
namespace {

using ::testing::HasSubstr;

config::EngineConfig Engine(config::EngineConfig::Device device,
                            config::EngineConfig::Precision precision = config::EngineConfig::FLOAT32) {
  config::EngineConfig engine;
  engine.set_device(device);
  engine.set_precision(precision);
  return engine;
}

TEST(ValidateEngineConfigTest, NamesTheSectionFieldAndValue) {
  config::EngineConfig engine;
  EXPECT_TRUE(ValidateEngineConfig(engine, "learner", /*batch_size=*/64).ok());
  engine.set_replicas(0);
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 64).message(), HasSubstr("learner.engine.replicas 0"));
  engine.set_replicas(3);
  EXPECT_THAT(ValidateEngineConfig(engine, "gan", 64).message(),
              HasSubstr("gan.batch_size 64: must be divisible by gan.engine.replicas 3"));
  engine.set_collectives(config::EngineConfig::MPI);  // the ranks mpirun starts split the batch
  EXPECT_TRUE(ValidateEngineConfig(engine, "gan", 64).ok());
  engine.set_threads(-1);
  EXPECT_THAT(ValidateEngineConfig(engine, "gan", 64).message(), HasSubstr("gan.engine.threads -1"));
}

TEST(ValidateEngineConfigTest, BFloat16IsForCudaOnly) {
  const absl::Status status =
      ValidateEngineConfig(Engine(config::EngineConfig::CPU, config::EngineConfig::BFLOAT16), "learner", 8);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("learner.engine.precision BFLOAT16: the CPU device computes in FLOAT32"));
}

TEST(ValidateEngineConfigTest, NcclIsForCudaDevicesInABuildWithIt) {
  for (const auto collectives : {config::EngineConfig::NCCL, config::EngineConfig::NCCL_MPI}) {
    config::EngineConfig engine = Engine(config::EngineConfig::CPU);
    engine.set_collectives(collectives);
    const std::string name = config::EngineConfig::Collectives_Name(collectives);
    EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
                HasSubstr("learner.engine.collectives " + name + ": NCCL reduces between GPUs; it needs "
                          "learner.engine.device CUDA (not CPU)"));
    engine.set_device(config::EngineConfig::CUDA);
    const absl::Status status = ValidateEngineConfig(engine, "learner", 8);
    if (!BuiltWithCuda()) {
      EXPECT_THAT(status.message(), HasSubstr("built without CUDA"));
    } else if (!BuiltWithNccl()) {
      EXPECT_THAT(status.message(), HasSubstr("built without NCCL"));
    } else {
      EXPECT_TRUE(status.ok()) << status;
    }
  }
  // In-process NCCL replicas split the batch as threads do.
  config::EngineConfig engine = Engine(config::EngineConfig::CUDA);
  engine.set_collectives(config::EngineConfig::NCCL);
  engine.set_replicas(3);
  EXPECT_TRUE(InProcessReplicas(engine));
  if (BuiltWithCuda()) {
    EXPECT_THAT(ValidateEngineConfig(engine, "gan", 64).message(), HasSubstr("divisible"));
  }
}

// K replicas sharing one device reduce each other's buffers: only on devices
// whose replicas share an address space (the CPU; one GPU).
TEST(ValidateEngineConfigTest, SharedDeviceCollectivesNeedADeviceWhoseReplicasShareMemory) {
  for (const auto device : {config::EngineConfig::CPU_STRICT, config::EngineConfig::PJRT}) {
    config::EngineConfig engine = Engine(device);
    engine.set_collectives(config::EngineConfig::SHARED_DEVICE);
    engine.set_pjrt_plugin(device == config::EngineConfig::PJRT ? "/x.so" : "");
    EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
                HasSubstr("learner.engine.collectives SHARED_DEVICE: the replicas reduce each other's buffers"));
  }
  config::EngineConfig engine = Engine(config::EngineConfig::CPU);
  engine.set_collectives(config::EngineConfig::SHARED_DEVICE);
  engine.set_replicas(2);
  EXPECT_TRUE(ValidateEngineConfig(engine, "learner", 8).ok());
  EXPECT_TRUE(InProcessReplicas(engine));
  auto replicator = MakeReplicator(engine);
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  ASSERT_TRUE((*replicator)->RunReplicas([&](replicator::ReplicaContext& ctx) {
    EXPECT_TRUE(ctx.ReducesOnDevice());
    EXPECT_EQ(ctx.collectives().local_rank(), 0);
    return absl::OkStatus();
  }).ok());
}

// pjrt_steps (compiled steps or kernels) and pjrt_cache_dir are device PJRT's only.
TEST(ValidateEngineConfigTest, PjrtFieldsOnAnotherDeviceAreRefusedNamingThem) {
  config::EngineConfig engine = Engine(config::EngineConfig::CPU);
  engine.set_pjrt_steps(config::EngineConfig::KERNELS);
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
              HasSubstr("learner.engine.pjrt_steps KERNELS: set, but engine.device is CPU"));
  engine.clear_pjrt_steps();
  EXPECT_TRUE(ValidateEngineConfig(engine, "learner", 8).ok());
  engine.set_pjrt_cache_dir("/tmp/x");
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
              HasSubstr("learner.engine.pjrt_cache_dir \"/tmp/x\": set, but engine.device is CPU"));
}

// engine.shard_state PARAMETERS: a device per replica (in this process or
// over MPI ranks) and kernels at a time, each refusal naming the field and
// what to use instead.
TEST(ValidateEngineConfigTest, SplitParametersNeedADeviceEachAndKernelsAtATime) {
  config::EngineConfig engine = Engine(config::EngineConfig::CPU);
  engine.set_replicas(4);
  engine.set_shard_state(config::EngineConfig::PARAMETERS);
  EXPECT_TRUE(ValidateEngineConfig(engine, "learner", 8).ok());
  engine.set_collectives(config::EngineConfig::MPI);
  engine.set_replicas(1);
  EXPECT_TRUE(ValidateEngineConfig(engine, "learner", 8).ok());
  engine.set_collectives(config::EngineConfig::SHARED_DEVICE);
  engine.set_replicas(4);
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
              HasSubstr("learner.engine.shard_state PARAMETERS: each replica keeps a part of the training state"));
  engine.set_collectives(config::EngineConfig::IN_PROCESS);
  engine.set_device(config::EngineConfig::PJRT);
  engine.set_pjrt_plugin("/nonexistent/plugin.so");
  const std::string pjrt = std::string(ValidateEngineConfig(engine, "learner", 8).message());
  if (BuiltWithPjrt()) {
    EXPECT_THAT(pjrt, HasSubstr("learner.engine.shard_state PARAMETERS: device PJRT runs a step as one compiled "
                                "program"));
  } else {
    EXPECT_THAT(pjrt, HasSubstr("built without the PJRT backend"));
  }
}

// engine.model_parallel: a mesh where its collectives and device can make
// one, refused naming the field otherwise; MakeReplicator builds it.
TEST(ValidateEngineConfigTest, ModelParallelNeedsAMeshItsCollectivesAndDeviceCanMake) {
  config::EngineConfig engine = Engine(config::EngineConfig::CPU);
  engine.set_replicas(4);
  engine.set_model_parallel(2);
  EXPECT_TRUE(ValidateEngineConfig(engine, "gan", 8).ok());
  auto replicator = MakeReplicator(engine);
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  EXPECT_EQ((*replicator)->model_parallel(), 2);
  engine.set_model_parallel(3);
  EXPECT_THAT(ValidateEngineConfig(engine, "gan", 12).message(),
              HasSubstr("gan.engine.model_parallel 3: gan.engine.replicas 4 is not a multiple of it"));
  engine.set_model_parallel(-1);
  EXPECT_THAT(ValidateEngineConfig(engine, "gan", 8).message(), HasSubstr("gan.engine.model_parallel -1: must be in"));
  engine.set_model_parallel(2);
  engine.set_collectives(config::EngineConfig::SHARED_DEVICE);
  EXPECT_THAT(ValidateEngineConfig(engine, "gan", 8).message(),
              HasSubstr("gan.engine.model_parallel 2: a mesh of replicas needs collectives IN_PROCESS or MPI"));
  engine.set_collectives(config::EngineConfig::IN_PROCESS);
  engine.set_shard_state(config::EngineConfig::OPTIMIZER);
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
              HasSubstr("learner.engine.model_parallel 2 with shard_state OPTIMIZER"));
  engine.set_shard_state(config::EngineConfig::NONE);
  engine.set_straggler(config::EngineConfig::DEADLINE);
  EXPECT_THAT(ValidateEngineConfig(engine, "learner", 8).message(),
              HasSubstr("learner.engine.model_parallel 2 with straggler DEADLINE"));
}

// Each replica's backend comes from the Replicator: replica r on device r,
// the section's threads split between them.
TEST(MakeReplicatorTest, EveryLocalReplicaGetsABackendOfTheSectionsDevice) {
  config::EngineConfig engine = Engine(config::EngineConfig::CPU_STRICT);
  engine.set_replicas(2);
  engine.set_threads(4);
  auto replicator = MakeReplicator(engine);
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  ASSERT_EQ((*replicator)->local_replicas().size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ((*replicator)->backend(k)->name(), "cpu_strict");
    EXPECT_EQ((*replicator)->backend(k)->num_threads(), 2);
  }
  EXPECT_NE((*replicator)->backend(0), (*replicator)->backend(1));
  std::vector<std::string> seen(2);
  ASSERT_TRUE((*replicator)->RunReplicas([&](replicator::ReplicaContext& ctx) {
    seen[ctx.replica_id()] = ctx.backend() == (*replicator)->backend(ctx.local_index()) ? "own" : "other";
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"own", "own"}));
}

TEST(MakeBackendTest, EachCpuDeviceGivesItsBackend) {
  auto cpu = MakeBackend(Engine(config::EngineConfig::CPU), /*local_index=*/0, /*threads=*/2);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_EQ((*cpu)->num_threads(), 2);
  auto strict = MakeBackend(Engine(config::EngineConfig::CPU_STRICT), 0, 1);
  ASSERT_TRUE(strict.ok()) << strict.status();
  EXPECT_EQ((*strict)->name(), "cpu_strict");
  EXPECT_TRUE(CheckDeviceAvailable(Engine(config::EngineConfig::CPU_STRICT), "learner").ok());
}

// Here there is no GPU: a build without CUDA refuses the device in
// validation; a build with it refuses when no device answers, saying why.
TEST(MakeBackendTest, CudaWithoutAGpuIsRefusedSayingWhy) {
  const config::EngineConfig cuda = Engine(config::EngineConfig::CUDA);
  const absl::Status available = CheckDeviceAvailable(cuda, "learner");
  if (!BuiltWithCuda()) {
    EXPECT_THAT(ValidateEngineConfig(cuda, "learner", 8).message(), HasSubstr("built without CUDA"));
    EXPECT_THAT(available.message(), HasSubstr("built without CUDA"));
    EXPECT_FALSE(MakeBackend(cuda, 0, 1).ok());
    return;
  }
  EXPECT_TRUE(ValidateEngineConfig(cuda, "learner", 8).ok());
  if (available.ok()) GTEST_SKIP() << "a CUDA device answers here";
  EXPECT_EQ(available.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(available.message(), HasSubstr("learner.engine.device CUDA: 1 GPU(s) needed, 0 found"));
  EXPECT_FALSE(MakeBackend(cuda, 0, 1).ok());
}

// Device GPU picks the fastest path present: compiled PJRT steps through a
// GPU plugin with enough devices, else the CUDA backend, else a refusal that
// says why each is out; the choice is said in one line.
TEST(ChooseGpuPathTest, CompiledPjrtFirstThenCudaElseWhyNeither) {
  config::EngineConfig gpu = Engine(config::EngineConfig::GPU, config::EngineConfig::BFLOAT16);
  GpuPaths both{.pjrt_plugin = "/x/xla_cuda_plugin.so", .pjrt_platform = "cuda", .pjrt_devices = 1, .cuda_devices = 1};
  std::string said;
  auto chosen = ChooseGpuPath(gpu, both, "learner", &said);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->device(), config::EngineConfig::PJRT);
  EXPECT_EQ(chosen->pjrt_plugin(), "/x/xla_cuda_plugin.so");
  EXPECT_EQ(chosen->precision(), config::EngineConfig::BFLOAT16);
  EXPECT_THAT(said, HasSubstr("learner.engine.device GPU: one compiled program per step through the PJRT plugin "
                              "/x/xla_cuda_plugin.so (cuda, 1 device(s))"));
  EXPECT_TRUE(ValidateEngineConfig(*chosen, "learner", 8).ok());
  // A step the plugin refuses runs kernel at a time, unless pjrt_steps says otherwise.
  EXPECT_EQ(chosen->pjrt_steps(), config::EngineConfig::COMPILED_ELSE_KERNELS);
  config::EngineConfig strict = gpu;
  strict.set_pjrt_steps(config::EngineConfig::COMPILED);
  auto strict_chosen = ChooseGpuPath(strict, both, "learner", &said);
  ASSERT_TRUE(strict_chosen.ok());
  EXPECT_EQ(strict_chosen->pjrt_steps(), config::EngineConfig::COMPILED);

  // A CPU plugin is no GPU; two in-process replicas need two devices.
  GpuPaths cpu_plugin = both;
  cpu_plugin.pjrt_platform = "cpu";
  chosen = ChooseGpuPath(gpu, cpu_plugin, "learner", &said);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->device(), config::EngineConfig::CUDA);
  EXPECT_FALSE(chosen->has_pjrt_plugin());
  EXPECT_THAT(said, HasSubstr("the CUDA backend (1 GPU(s)); no PJRT GPU plugin: /x/xla_cuda_plugin.so is a CPU plugin"));
  EXPECT_TRUE(ValidateEngineConfig(*chosen, "learner", 8).ok() || !BuiltWithCuda());
  gpu.set_replicas(2);
  auto refused = ChooseGpuPath(gpu, both, "learner", &said);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("learner.engine.device GPU: no GPU path here. PJRT: /x/xla_cuda_plugin.so: 2 device(s) needed, "
                        "1 on cuda. CUDA: 2 GPU(s) needed, 1 found"));

  // Other devices pass through as they are.
  chosen = ChooseGpuPath(Engine(config::EngineConfig::CPU), both, "learner", &said);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(chosen->device(), config::EngineConfig::CPU);
}

// This machine has no GPU: device GPU is accepted by validation (with the
// PJRT fields and BFLOAT16) but refused before anything starts, naming why
// each path is out; pointed at the CPU plugin, it says that is no GPU.
TEST(ChooseGpuPathTest, NoGpuHereIsRefusedBeforeAnythingStarts) {
  config::EngineConfig gpu = Engine(config::EngineConfig::GPU, config::EngineConfig::BFLOAT16);
  gpu.set_pjrt_steps(config::EngineConfig::COMPILED);
  ASSERT_TRUE(ValidateEngineConfig(gpu, "learner", 8).ok());
  const absl::Status available = CheckDeviceAvailable(gpu, "learner");
  if (available.ok()) GTEST_SKIP() << "a GPU path answers here";
  EXPECT_EQ(available.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(available.message(), HasSubstr("learner.engine.device GPU: no GPU path here. PJRT: "));
  EXPECT_THAT(available.message(), HasSubstr(". CUDA: "));
  EXPECT_FALSE(MakeReplicator(gpu).ok());
}

TEST(ChooseGpuPathTest, APjrtCpuPluginIsNoGpu) {
  const char* cpu_plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (cpu_plugin == nullptr || !std::filesystem::exists(cpu_plugin) || !BuiltWithPjrt()) {
    GTEST_SKIP() << "no PJRT CPU plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh fetches one from PyPI)";
  }
  config::EngineConfig gpu = Engine(config::EngineConfig::GPU);
  gpu.set_pjrt_plugin(cpu_plugin);
  const GpuPaths found = FindGpuPaths(gpu);
  EXPECT_EQ(found.pjrt_plugin, cpu_plugin);
  EXPECT_EQ(found.pjrt_platform, "cpu");
  const absl::Status available = CheckDeviceAvailable(gpu, "learner");
  if (available.ok()) GTEST_SKIP() << "a CUDA GPU answers here";
  EXPECT_THAT(available.message(), HasSubstr(std::string(cpu_plugin) + " is a CPU plugin"));
}

// GPU cannot take NCCL collectives (they need device CUDA, said plainly).
TEST(ChooseGpuPathTest, NcclWantsCudaNotGpu) {
  config::EngineConfig gpu = Engine(config::EngineConfig::GPU);
  gpu.set_collectives(config::EngineConfig::NCCL);
  EXPECT_THAT(ValidateEngineConfig(gpu, "learner", 8).message(), HasSubstr("needs learner.engine.device CUDA (not GPU)"));
}

}  // namespace
}  // namespace troupe::engine
