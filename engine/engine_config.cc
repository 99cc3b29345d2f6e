#include "engine/engine_config.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/shell.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/strict_cpu_backend.h"
#include "engine/replicator/in_process.h"
#ifdef TROUPE_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif
#ifdef TROUPE_HAVE_NCCL
#include "engine/cuda/nccl_collectives.h"
#endif
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace troupe::engine {

bool InProcessReplicas(const config::EngineConfig& engine) {
  return engine.collectives() == config::EngineConfig::IN_PROCESS || engine.collectives() == config::EngineConfig::NCCL ||
         engine.collectives() == config::EngineConfig::SHARED_DEVICE;
}

bool BuiltWithNccl() {
#ifdef TROUPE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

bool BuiltWithPjrt() {
#ifdef TROUPE_HAVE_PJRT
  return true;
#else
  return false;
#endif
}

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

// K replicas on one device (device 0), reducing on it.
bool SharedDevice(const config::EngineConfig& engine) {
  return engine.collectives() == config::EngineConfig::SHARED_DEVICE;
}

// What a build without CUDA says of `section`.engine.device CUDA.
// Devices the replicas of this process need: one per in-process replica
// (one for all on a shared device; one per MPI rank).
int DevicesNeeded(const config::EngineConfig& engine) {
  return SharedDevice(engine) ? 1 : InProcessReplicas(engine) ? engine.replicas() : 1;
}

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
  if (InProcessReplicas(engine) && batch_size % engine.replicas() != 0) {
    return bad(".batch_size ", batch_size, ": must be divisible by ", section, ".engine.replicas ", engine.replicas(),
               " (each replica takes an equal shard)");
  }
  const bool cuda = engine.device() == config::EngineConfig::CUDA;
  if (cuda && !BuiltWithCuda()) return NotBuiltWithCuda(section);
  // Device GPU becomes PJRT or CUDA on the machine that runs it (ResolveDevice).
  const bool gpu = engine.device() == config::EngineConfig::GPU;
  if (gpu && !BuiltWithCuda() && !BuiltWithPjrt()) {
    return bad(".engine.device GPU: this troupe was built with neither CUDA nor the PJRT backend");
  }
  const bool nccl = engine.collectives() == config::EngineConfig::NCCL ||
                    engine.collectives() == config::EngineConfig::NCCL_MPI;
  if (nccl && !cuda) {
    return bad(".engine.collectives ", config::EngineConfig::Collectives_Name(engine.collectives()),
               ": NCCL reduces between GPUs; it needs ", section, ".engine.device CUDA (not ",
               config::EngineConfig::Device_Name(engine.device()), ")");
  }
  if (nccl && !BuiltWithNccl()) {
    return bad(".engine.collectives ", config::EngineConfig::Collectives_Name(engine.collectives()),
               ": this troupe was built without NCCL (configure with NCCL_ROOT); collectives here: IN_PROCESS, MPI");
  }
  const bool pjrt = engine.device() == config::EngineConfig::PJRT;
  if (engine.collectives() == config::EngineConfig::SHARED_DEVICE && engine.device() != config::EngineConfig::CPU &&
      !cuda) {
    return bad(".engine.collectives SHARED_DEVICE: the replicas reduce each other's buffers on their one device, "
               "which needs a device whose replicas share memory: CPU or CUDA (not ",
               config::EngineConfig::Device_Name(engine.device()), ")");
  }
  if (pjrt && !BuiltWithPjrt()) {
    return bad(".engine.device PJRT: this troupe was built without the PJRT backend (TROUPE_PJRT=ON)");
  }
  if (pjrt && engine.pjrt_plugin().empty()) {
    return bad(".engine.pjrt_plugin: device PJRT needs the plugin's .so (libtpu.so, the XLA CUDA or CPU plugin)");
  }
  if (!pjrt && !gpu && !engine.pjrt_plugin().empty()) {
    return bad(".engine.pjrt_plugin \"", engine.pjrt_plugin(), "\": set, but engine.device is ",
               config::EngineConfig::Device_Name(engine.device()), " (the plugin is for device PJRT)");
  }
  if (!pjrt && !gpu && engine.has_pjrt_cache_dir()) {
    return bad(".engine.pjrt_cache_dir \"", engine.pjrt_cache_dir(), "\": set, but engine.device is ",
               config::EngineConfig::Device_Name(engine.device()), " (the cache is device PJRT's)");
  }
  if (!pjrt && !gpu && engine.has_pjrt_steps()) {
    return bad(".engine.pjrt_steps ", config::EngineConfig::PjrtSteps_Name(engine.pjrt_steps()),
               ": set, but engine.device is ", config::EngineConfig::Device_Name(engine.device()),
               " (compiled steps are device PJRT's)");
  }
  if (engine.shard_state() != config::EngineConfig::NONE) {
    const std::string state = config::EngineConfig::ShardState_Name(engine.shard_state());
    const auto c = engine.collectives();
    if (c == config::EngineConfig::SHARED_DEVICE) {
      return bad(".engine.shard_state ", state, ": each replica keeps a part of the training state; collectives "
                 "SHARED_DEVICE puts every replica on one device, where splitting it saves nothing: use IN_PROCESS, "
                 "NCCL or MPI");
    }
    if (engine.shard_state() == config::EngineConfig::PARAMETERS && (pjrt || gpu)) {
      return bad(".engine.shard_state PARAMETERS: device ", config::EngineConfig::Device_Name(engine.device()),
                 " runs a step as one compiled program, which keeps every buffer it reads for its life; gathering a "
                 "network's values for a part of the step and freeing them after is kernel at a time (device CPU, "
                 "CPU_STRICT or CUDA); with PJRT, shard_state OPTIMIZER");
    }
  }
  if (engine.straggler() == config::EngineConfig::DEADLINE) {
    if (InProcessReplicas(engine) && engine.replicas() < 2) {
      return bad(".engine.straggler DEADLINE: one replica has no one to leave behind (engine.replicas ",
                 engine.replicas(), ")");
    }
    if (pjrt || gpu) {
      return bad(".engine.straggler DEADLINE: device ", config::EngineConfig::Device_Name(engine.device()),
                 " runs a step as one compiled program for every replica, which cannot leave one out: use device "
                 "CPU or CUDA");
    }
    if (engine.shard_state() != config::EngineConfig::NONE) {
      return bad(".engine.straggler DEADLINE with shard_state ",
                 config::EngineConfig::ShardState_Name(engine.shard_state()),
                 ": a replica's part of the update is its own to compute; it cannot be left out");
    }
  }
  if (engine.model_parallel() < 0 || engine.model_parallel() > kMaxReplicas) {
    return bad(".engine.model_parallel ", engine.model_parallel(), ": must be in [0, ", kMaxReplicas,
               "] (0 or 1: each replica holds the whole model)");
  }
  if (engine.model_parallel() > 1) {
    const int m = engine.model_parallel();
    const auto c = engine.collectives();
    if (c != config::EngineConfig::IN_PROCESS && c != config::EngineConfig::MPI) {
      return bad(".engine.model_parallel ", m, ": a mesh of replicas needs collectives IN_PROCESS or MPI (groups "
                 "along each axis), not ", config::EngineConfig::Collectives_Name(c));
    }
    if (InProcessReplicas(engine) && engine.replicas() % m != 0) {
      return bad(".engine.model_parallel ", m, ": ", section, ".engine.replicas ", engine.replicas(),
                 " is not a multiple of it (replicas = model copies x model_parallel)");
    }
    if (engine.shard_state() != config::EngineConfig::NONE) {
      return bad(".engine.model_parallel ", m, " with shard_state ",
                 config::EngineConfig::ShardState_Name(engine.shard_state()), ": one or the other for now");
    }
    if (engine.straggler() != config::EngineConfig::WAIT) {
      return bad(".engine.model_parallel ", m, " with straggler ",
                 config::EngineConfig::Straggler_Name(engine.straggler()),
                 ": a model's part cannot be left out of its step");
    }
  }
  if (engine.device_memory_mib() < 0) {
    return bad(".engine.device_memory_mib ", engine.device_memory_mib(), ": must be >= 0 (0: no budget)");
  }
  if (!(engine.straggler_deadline() >= 1 && engine.straggler_deadline() <= 100)) {
    return bad(".engine.straggler_deadline ", engine.straggler_deadline(),
               ": must be in [1, 100] (multiples of the finishers' backward time)");
  }
  if (engine.pjrt_check_replay() < 0) {
    return bad(".engine.pjrt_check_replay ", engine.pjrt_check_replay(), ": must be >= 0 (0 = never checked)");
  }
  if (!(engine.gpu_memory_fraction() >= 0 && engine.gpu_memory_fraction() <= 1)) {
    return bad(".engine.gpu_memory_fraction ", engine.gpu_memory_fraction(), ": must be in [0, 1] (0 = on demand)");
  }
  if (!pjrt && !gpu && engine.has_gpu_memory_fraction()) {
    return bad(".engine.gpu_memory_fraction ", engine.gpu_memory_fraction(), ": set, but engine.device is ",
               config::EngineConfig::Device_Name(engine.device()), " (the fraction is a PJRT GPU client's)");
  }
  if (!cuda && !pjrt && !gpu && engine.precision() == config::EngineConfig::BFLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(section, ".engine.precision BFLOAT16: the ",
                                                   config::EngineConfig::Device_Name(engine.device()),
                                                   " device computes in FLOAT32 only (BFLOAT16 needs device CUDA, PJRT or GPU)"));
  }
  return absl::OkStatus();
}

#ifdef TROUPE_HAVE_PJRT
namespace {
pjrt::ClientOptions ClientOptionsOf(const config::EngineConfig& engine) {
  return {.memory_fraction = engine.gpu_memory_fraction()};
}
}  // namespace
#endif

absl::Status CheckDeviceAvailable(const config::EngineConfig& engine, const std::string& section) {
  if (engine.device() == config::EngineConfig::GPU) {
    std::string said;
    ASSIGN_OR_RETURN(const config::EngineConfig chosen, ChooseGpuPath(engine, FindGpuPaths(engine), section, &said));
    return CheckDeviceAvailable(chosen, section);
  }
#ifdef TROUPE_HAVE_PJRT
  if (engine.device() == config::EngineConfig::PJRT) {
    // Loads the plugin and opens its client (shared with the backends made later).
    auto client = pjrt::Client::Shared(engine.pjrt_plugin(), ClientOptionsOf(engine));
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat(section, ".engine.pjrt_plugin: ", client.status().message()));
    }
    const int needed = DevicesNeeded(engine);
    if ((*client)->num_devices() < needed) {
      return absl::FailedPreconditionError(absl::StrCat(section, ".engine.device PJRT: ", needed, " device(s) needed, ",
                                                        (*client)->num_devices(), " on platform ",
                                                        (*client)->platform()));
    }
    return absl::OkStatus();
  }
#endif
  if (engine.device() != config::EngineConfig::CUDA) return absl::OkStatus();
#ifdef TROUPE_HAVE_CUDA
  std::string why;
  const int devices = cuda::DeviceCount(&why);
  const int needed = DevicesNeeded(engine);
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

namespace {

// Replicas of this process that run each step as one program: device PJRT,
// compiled steps, K > 1 replicas as threads (null otherwise).
std::shared_ptr<void> MakeReplicaGroup(const config::EngineConfig& engine) {
#ifdef TROUPE_HAVE_PJRT
  if (engine.device() == config::EngineConfig::PJRT && engine.pjrt_steps() != config::EngineConfig::KERNELS &&
      InProcessReplicas(engine) && engine.replicas() > 1) {
    return std::make_shared<pjrt::PjrtReplicaGroup>(engine.replicas());
  }
#endif
  return nullptr;
}

}  // namespace

namespace {

// The XLA CUDA plugin JAX installs (jax-cuda13-pjrt or -cuda12), as the
// machine's python3 ($TROUPE_PYTHON) finds it without importing JAX; "" and
// *why_not when there is none.
std::string JaxCudaPlugin(std::string* why_not) {
  const char* env = std::getenv("TROUPE_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  const std::string program =
      "import importlib.util, os\n"
      "for name in ('jax_plugins.xla_cuda13', 'jax_plugins.xla_cuda12'):\n"
      "    try:\n"
      "        spec = importlib.util.find_spec(name)\n"
      "    except Exception:\n"
      "        spec = None\n"
      "    for folder in (spec.submodule_search_locations or []) if spec else []:\n"
      "        path = os.path.join(folder, 'xla_cuda_plugin.so')\n"
      "        if os.path.exists(path):\n"
      "            print(path)\n"
      "            raise SystemExit(0)\n";
  std::string path;
  if (FILE* pipe = popen(absl::StrCat("timeout 30 ", ShellQuote(python), " -c ", ShellQuote(program), " 2>/dev/null").c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) path += buffer;
    pclose(pipe);
  }
  path = std::string(absl::StripAsciiWhitespace(path));
  if (path.empty()) {
    *why_not = absl::StrCat("engine.pjrt_plugin is unset and ", python,
                            " finds no XLA CUDA plugin (jax_plugins.xla_cuda13 or xla_cuda12, from jax[cuda13])");
  }
  return path;
}

}  // namespace

GpuPaths FindGpuPaths(const config::EngineConfig& engine) {
  GpuPaths found;
#ifdef TROUPE_HAVE_PJRT
  found.pjrt_found = engine.pjrt_plugin().empty() ? JaxCudaPlugin(&found.pjrt_why_not) : engine.pjrt_plugin();
  if (!found.pjrt_found.empty()) {
    // The plugin's own checks first (a file, a PJRT plugin, an API version
    // troupe speaks), then its client (which finds the devices).
    if (auto plugin = pjrt::Plugin::Load(found.pjrt_found); plugin.ok()) {
      found.pjrt_api = absl::StrCat((*plugin)->major_version(), ".", (*plugin)->minor_version());
    }
    auto client = pjrt::Client::Shared(found.pjrt_found, ClientOptionsOf(engine));
    if (client.ok()) {
      found.pjrt_memory = (*client)->memory();
      found.pjrt_plugin = found.pjrt_found;
      found.pjrt_platform = (*client)->platform();
      found.pjrt_devices = (*client)->num_devices();
      found.pjrt_device_kind = (*client)->device_kind(0);
    } else {
      found.pjrt_why_not = std::string(client.status().message());
    }
  }
#else
  found.pjrt_why_not = "this troupe was built without the PJRT backend";
#endif
#ifdef TROUPE_HAVE_CUDA
  found.cuda_built_for = cuda::DescribeCudaArchitectures(cuda::BuiltArchitectures());
  const int answering = cuda::DeviceCount(&found.cuda_why_not);
  for (int d = 0; d < answering; ++d) {
    absl::StatusOr<std::string> covered = cuda::CheckDeviceArchitecture(d);
    if (covered.ok()) {
      found.cuda_device_names.push_back(*covered);
      ++found.cuda_devices;
    } else {
      found.cuda_device_names.push_back(absl::StrCat("not usable: ", covered.status().message()));
      if (found.cuda_why_not.empty()) found.cuda_why_not = std::string(covered.status().message());
    }
  }
#else
  found.cuda_why_not = "this troupe was built without CUDA";
#endif
  return found;
}

std::string DescribeGpuPaths(const GpuPaths& found) {
  std::string said = "PJRT GPU plugin: ";
  if (found.pjrt_found.empty()) {
    absl::StrAppend(&said, "none: ", found.pjrt_why_not, "\n");
  } else {
    absl::StrAppend(&said, found.pjrt_found, " (PJRT API ", found.pjrt_api.empty() ? "not read" : found.pjrt_api, "): ");
    if (!found.pjrt_plugin.empty()) {
      absl::StrAppend(&said, "platform ", found.pjrt_platform, ", ", found.pjrt_devices, " device(s) (",
                      found.pjrt_device_kind, "), memory ", found.pjrt_memory, "\n");
    } else {
      absl::StrAppend(&said, "no client: ", found.pjrt_why_not, "\n");
    }
  }
  if (!BuiltWithCuda()) {
    absl::StrAppend(&said, "CUDA backend: not built (", found.cuda_why_not, ")\n");
    return said;
  }
  absl::StrAppend(&said, "CUDA backend: ", found.cuda_devices, " GPU(s)");
  if (found.cuda_device_names.empty()) absl::StrAppend(&said, " (", found.cuda_why_not, ")");
  absl::StrAppend(&said, "; kernels for ", found.cuda_built_for, "\n");
  for (size_t d = 0; d < found.cuda_device_names.size(); ++d) {
    absl::StrAppend(&said, "  GPU ", d, ": ", found.cuda_device_names[d], "\n");
  }
  return said;
}

absl::StatusOr<config::EngineConfig> ChooseGpuPath(const config::EngineConfig& engine, const GpuPaths& found,
                                                   const std::string& section, std::string* said) {
  if (engine.device() != config::EngineConfig::GPU) return engine;
  const int needed = DevicesNeeded(engine);
  std::string pjrt_why = found.pjrt_why_not;
  if (!found.pjrt_plugin.empty()) {
    if (found.pjrt_platform == "cpu") {
      pjrt_why = absl::StrCat(found.pjrt_plugin, " is a CPU plugin");
    } else if (found.pjrt_devices < needed) {
      pjrt_why = absl::StrCat(found.pjrt_plugin, ": ", needed, " device(s) needed, ", found.pjrt_devices, " on ",
                              found.pjrt_platform);
    } else {
      config::EngineConfig chosen = engine;
      chosen.set_device(config::EngineConfig::PJRT);
      chosen.set_pjrt_plugin(found.pjrt_plugin);
      // A step the plugin refuses runs kernel at a time instead (said then).
      if (!engine.has_pjrt_steps()) chosen.set_pjrt_steps(config::EngineConfig::COMPILED_ELSE_KERNELS);
      *said = absl::StrCat(section, ".engine.device GPU: one compiled program per step through the PJRT plugin ",
                           found.pjrt_plugin, " (", found.pjrt_platform, ", ", found.pjrt_devices, " device(s))");
      return chosen;
    }
  }
  const std::string cuda_why =
      found.cuda_devices >= needed
          ? std::string()
          : absl::StrCat(needed, " GPU(s) needed, ", found.cuda_devices, " found",
                         found.cuda_why_not.empty() ? "" : absl::StrCat(" (", found.cuda_why_not, ")"));
  if (cuda_why.empty()) {
    config::EngineConfig chosen = engine;
    chosen.set_device(config::EngineConfig::CUDA);
    chosen.clear_pjrt_plugin();
    chosen.clear_pjrt_cache_dir();
    chosen.clear_pjrt_steps();
    *said = absl::StrCat(section, ".engine.device GPU: the CUDA backend (", found.cuda_devices,
                         " GPU(s)); no PJRT GPU plugin: ", pjrt_why);
    return chosen;
  }
  return absl::FailedPreconditionError(absl::StrCat(section, ".engine.device GPU: no GPU path here. PJRT: ",
                                                    absl::StripSuffix(pjrt_why, "."), ". CUDA: ", cuda_why));
}

absl::StatusOr<config::EngineConfig> ResolveDevice(const config::EngineConfig& engine, const std::string& section) {
  if (engine.device() != config::EngineConfig::GPU) return engine;
  std::string said;
  ASSIGN_OR_RETURN(config::EngineConfig chosen, ChooseGpuPath(engine, FindGpuPaths(engine), section, &said));
  std::fprintf(stderr, "troupe: %s\n", said.c_str());
  return chosen;
}

absl::StatusOr<std::unique_ptr<nn::Backend>> MakeBackend(const config::EngineConfig& engine, int local_index,
                                                         int threads, std::shared_ptr<void> group) {
  switch (engine.device()) {
    case config::EngineConfig::GPU: {
      ASSIGN_OR_RETURN(const config::EngineConfig chosen, ResolveDevice(engine, "engine"));
      return MakeBackend(chosen, local_index, threads, std::move(group));
    }
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
    case config::EngineConfig::PJRT: {
#ifdef TROUPE_HAVE_PJRT
      pjrt::PjrtBackendOptions options;
      options.plugin = engine.pjrt_plugin();
      options.device = local_index;
      options.bfloat16 = engine.precision() == config::EngineConfig::BFLOAT16;
      options.compile_steps = engine.pjrt_steps() != config::EngineConfig::KERNELS;
      options.fall_back_to_kernels = engine.pjrt_steps() == config::EngineConfig::COMPILED_ELSE_KERNELS;
      options.check_replay_every = engine.pjrt_check_replay();
      options.group = std::static_pointer_cast<pjrt::PjrtReplicaGroup>(group);
      options.cache_dir = engine.has_pjrt_cache_dir() ? engine.pjrt_cache_dir() : pjrt::DefaultPjrtCacheDir();
      options.client = ClientOptionsOf(engine);
      auto backend = pjrt::PjrtBackend::Create(options);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<nn::Backend>(std::move(*backend));
#else
      return absl::InvalidArgumentError("engine.device PJRT: this troupe was built without the PJRT backend");
#endif
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("engine.device ", int(engine.device()), ": unknown"));
}

absl::StatusOr<std::unique_ptr<replicator::Replicator>> MakeReplicator(const config::EngineConfig& requested,
                                                                       std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(const config::EngineConfig engine, ResolveDevice(requested, "engine"));
  replicator::ReplicatorOptions options;
  options.backend = InProcessReplicas(engine) ? replicator::ReplicatorOptions::Backend::kInProcess
                                              : replicator::ReplicatorOptions::Backend::kMpi;
  options.num_replicas = engine.replicas();
  options.model_parallel = std::max(1, engine.model_parallel());
  options.timeout = timeout;
  std::shared_ptr<void> group = MakeReplicaGroup(engine);
  options.make_backend = [engine, group](const replicator::Collectives& collectives, int local_replicas) {
    auto backend =
        MakeBackend(engine, collectives.local_rank(), EngineThreadsPerReplica(engine, local_replicas), group);
    // A device of device_memory_mib: every allocation beyond it refused.
    if (backend.ok()) (*backend)->set_memory_budget(static_cast<size_t>(engine.device_memory_mib()) << 20);
    return backend;
  };
  if (SharedDevice(engine)) {
    // K threads on device 0 (local_rank 0 for all), reducing on it.
    options.make_collectives = [](int replicas, std::chrono::milliseconds timeout)
        -> absl::StatusOr<replicator::LocalCollectives> {
      auto group = std::make_shared<replicator::InProcessGroup>(replicas, timeout);
      replicator::LocalCollectives local;
      for (int id = 0; id < replicas; ++id) local.members.push_back(group->Member(id, /*on_device=*/true));
      local.shared = std::move(group);
      return local;
    };
  }
#ifdef TROUPE_HAVE_NCCL
  if (engine.collectives() == config::EngineConfig::NCCL) {
    options.make_collectives = [](int replicas, std::chrono::milliseconds timeout)
        -> absl::StatusOr<replicator::LocalCollectives> {
      std::vector<int> devices(replicas);
      for (int r = 0; r < replicas; ++r) devices[r] = r;  // replica r on GPU r, as MakeBackend
      ASSIGN_OR_RETURN(auto group, cuda::NcclCollectives::CreateGroup(devices, timeout));
      replicator::LocalCollectives local;
      for (auto& member : group) local.members.push_back(std::move(member));
      return local;
    };
  } else if (engine.collectives() == config::EngineConfig::NCCL_MPI) {
    options.make_collectives = [](int, std::chrono::milliseconds timeout)
        -> absl::StatusOr<replicator::LocalCollectives> {
      ASSIGN_OR_RETURN(auto member, cuda::NcclCollectives::CreateWithMpi(timeout));
      replicator::LocalCollectives local;
      local.members.push_back(std::move(member));
      return local;
    };
  }
#endif
  return replicator::Replicator::Create(options);
}

}  // namespace troupe::engine
