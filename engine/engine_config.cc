#include "engine/engine_config.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/strict_cpu_backend.h"
#ifdef TROUPE_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace troupe::engine {

bool BuiltWithCuda() {
#ifdef TROUPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// Bounds of an engine section: far above any machine's, below what would
// exhaust one (a thread and a replica's networks each).
constexpr int kMaxReplicas = 256;
constexpr int kMaxThreads = 1024;

// What a build without CUDA says of `section`.engine.device CUDA.
absl::Status NotBuiltWithCuda(const std::string& section) {
  return absl::InvalidArgumentError(absl::StrCat(
      section, ".engine.device CUDA: this troupe was built without CUDA (configure with the CUDA toolkit, "
               "TROUPE_CUDA=ON); devices here: CPU, CPU_STRICT"));
}

}  // namespace

absl::Status ValidateEngineConfig(const config::EngineConfig& engine, const std::string& section, int64_t batch_size) {
  auto bad = [&](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(section, parts...)); };
  if (engine.replicas() < 1 || engine.replicas() > kMaxReplicas) {
    return bad(".engine.replicas ", engine.replicas(), ": must be in [1, ", kMaxReplicas, "]");
  }
  if (engine.threads() < 0 || engine.threads() > kMaxThreads) {
    return bad(".engine.threads ", engine.threads(), ": must be in [0, ", kMaxThreads, "] (0 = all cores)");
  }
  if (batch_size < 1) return bad(".batch_size ", batch_size, ": must be >= 1");
  if (engine.collectives() == config::EngineConfig::IN_PROCESS && batch_size % engine.replicas() != 0) {
    return bad(".batch_size ", batch_size, ": must be divisible by ", section, ".engine.replicas ", engine.replicas(),
               " (each replica takes an equal shard)");
  }
  const bool cuda = engine.device() == config::EngineConfig::CUDA;
  if (cuda && !BuiltWithCuda()) return NotBuiltWithCuda(section);
  if (!cuda && engine.precision() == config::EngineConfig::BFLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(section, ".engine.precision BFLOAT16: the ",
                                                   config::EngineConfig::Device_Name(engine.device()),
                                                   " device computes in FLOAT32 only (BFLOAT16 needs device CUDA)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDeviceAvailable(const config::EngineConfig& engine, const std::string& section) {
  if (engine.device() != config::EngineConfig::CUDA) return absl::OkStatus();
#ifdef TROUPE_HAVE_CUDA
  std::string why;
  const int devices = cuda::DeviceCount(&why);
  const int needed = engine.collectives() == config::EngineConfig::IN_PROCESS ? engine.replicas() : 1;
  if (devices < needed) {
    return absl::FailedPreconditionError(absl::StrCat(section, ".engine.device CUDA: ", needed, " GPU(s) needed, ",
                                                      devices, " found", why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  return absl::OkStatus();
#else
  return NotBuiltWithCuda(section);
#endif
}

int EngineThreads(const config::EngineConfig& engine) {
  return engine.threads() > 0 ? engine.threads() : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int EngineThreadsPerReplica(const config::EngineConfig& engine, int local_replicas) {
  return std::max(1, EngineThreads(engine) / std::max(1, local_replicas));
}

absl::StatusOr<std::unique_ptr<nn::Backend>> MakeBackend(const config::EngineConfig& engine, int local_index,
                                                         int threads) {
  switch (engine.device()) {
    case config::EngineConfig::CPU:
      return std::make_unique<nn::CpuBackend>(threads);
    case config::EngineConfig::CPU_STRICT:
      return std::make_unique<nn::StrictCpuBackend>(threads);
    case config::EngineConfig::CUDA: {
#ifdef TROUPE_HAVE_CUDA
      cuda::CudaBackendOptions options;
      options.device = local_index;
      options.gemm_precision = engine.precision() == config::EngineConfig::BFLOAT16
                                   ? cuda::GemmPrecision::kBfloat16
                                   : cuda::GemmPrecision::kFloat32;
      auto backend = cuda::CudaBackend::Create(options);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<nn::Backend>(std::move(*backend));
#else
      return NotBuiltWithCuda("engine");
#endif
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("engine.device ", int(engine.device()), ": unknown"));
}

}  // namespace troupe::engine
