// An engine config section (EngineConfig: learner.engine, gan.engine) made
// real: its validation, its compute threads, and the compute backend each
// replica runs on (the CPU backend, the strict CPU device, or the CUDA
// backend where this binary was built with CUDA). The one place that knows
// every backend, so that the models (the agents, the GAN) take a Backend and never
// name one.
#ifndef TROUPE_ENGINE_ENGINE_CONFIG_H_
#define TROUPE_ENGINE_ENGINE_CONFIG_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/backend.h"
#include "engine/replicator/replicator.h"
#include "proto/config.pb.h"

namespace troupe::engine {

// True when this binary has the CUDA backend, NCCL collectives, the PJRT backend.
bool BuiltWithCuda();
bool BuiltWithNccl();
bool BuiltWithPjrt();

// InvalidArgument naming the field ("learner.engine.replicas 0: must be >= 1")
// for an engine section `section` ("learner", "gan") cannot run: replicas or
// threads out of range; a device or precision this binary cannot give (CUDA
// in a build without it, BFLOAT16 on a CPU device; whether a GPU answers is
// known only when the backend is made); or a global `batch_size`
// (`section`.batch_size) its in-process replicas cannot split evenly. (Under
// MPI the replicas are the ranks mpirun starts; the batch is checked against
// them when the Replicator exists.)
absl::Status ValidateEngineConfig(const config::EngineConfig& engine, const std::string& section, int64_t batch_size);

// Compute threads of this process (engine.threads; 0 = all cores) and each of
// `local_replicas` replicas' share of them (at least 1).
int EngineThreads(const config::EngineConfig& engine);
int EngineThreadsPerReplica(const config::EngineConfig& engine, int local_replicas);

// FailedPrecondition when the section's device is not on this machine: for
// CUDA, fewer GPUs answer than the in-process replicas need (naming why: no
// driver, no device, driver too old); for PJRT, the plugin's error (missing
// file, not a plugin, an API version troupe does not speak) or fewer devices
// than the replicas need. OK for the CPU devices. Run before
// anything starts, so that a run asking for a GPU where there is none leaves
// nothing behind.
absl::Status CheckDeviceAvailable(const config::EngineConfig& engine, const std::string& section);

// What device GPU can use on this machine: an XLA PJRT plugin (its path, its
// platform and device count, or why there is none) and the CUDA backend's
// GPUs (or why none answers).
struct GpuPaths {
  std::string pjrt_found;     // the plugin looked at (engine.pjrt_plugin, or JAX's), "" when none
  std::string pjrt_api;       // its PJRT C API version ("0.115"), "" when it did not load
  std::string pjrt_plugin;    // pjrt_found when its client opened
  std::string pjrt_platform;
  int pjrt_devices = 0;
  std::string pjrt_device_kind;  // device 0's ("NVIDIA H200")
  std::string pjrt_memory;       // how its client took memory (pjrt::Client::memory)
  std::string pjrt_why_not;
  int cuda_devices = 0;       // GPUs the CUDA backend can use (answering, and covered by its kernels)
  std::vector<std::string> cuda_device_names;  // each answering GPU ("NVIDIA H200, compute capability 9.0")
  std::string cuda_built_for;  // "sm_80, sm_86, sm_89, sm_90 + PTX compute_90"
  std::string cuda_why_not;
};
// Looks: the plugin at engine.pjrt_plugin when set, else the XLA CUDA plugin
// JAX installs (python3 finds jax_plugins.xla_cuda13 or xla_cuda12), opened
// to count its devices; the CUDA backend's GPUs where built with CUDA.
GpuPaths FindGpuPaths(const config::EngineConfig& engine);
// Device GPU made concrete from `found`: PJRT with the plugin when it is a
// GPU plugin with the devices the in-process replicas need (compiled steps:
// the fast path), else CUDA when enough GPUs answer; `said` gets one line
// saying which and why. Other devices come back as they are. Errors:
// FailedPrecondition naming the section and why each path is out.
absl::StatusOr<config::EngineConfig> ChooseGpuPath(const config::EngineConfig& engine, const GpuPaths& found,
                                                   const std::string& section, std::string* said);
// What `found` says, a line per path, for `troupe devices`:
//   PJRT GPU plugin: PATH (PJRT API 0.115): platform cuda, 1 device(s) (NVIDIA H200)
//   CUDA backend: 1 GPU(s): NVIDIA H200, compute capability 9.0; kernels for sm_80, ...
std::string DescribeGpuPaths(const GpuPaths& found);
// ChooseGpuPath on this machine (FindGpuPaths), saying the choice on stderr.
absl::StatusOr<config::EngineConfig> ResolveDevice(const config::EngineConfig& engine, const std::string& section);

// The backend of the replica with node-local rank `local_index` (device
// `local_index` for CUDA and PJRT) with `threads` compute threads (CPU
// devices); `group`: what the K replicas of a PJRT Replicator share to run
// each step as one program (MakeReplicator passes it; null for one backend).
// Errors: ValidateEngineConfig's; FailedPrecondition from CUDA naming why no
// device answers (no driver, no device, driver too old).
absl::StatusOr<std::unique_ptr<nn::Backend>> MakeBackend(const config::EngineConfig& engine, int local_index,
                                                         int threads, std::shared_ptr<void> group = nullptr);

// True when the section's replicas are threads of this process (IN_PROCESS,
// NCCL), false when they are mpirun's ranks (MPI, NCCL_MPI).
bool InProcessReplicas(const config::EngineConfig& engine);

// The Replicator an engine section asks for: its collectives (in-process, MPI,
// or NCCL from this layer, which the Replicator does not know) and each local
// replica's backend (MakeBackend, replica r on device r, the section's
// threads split between them). `timeout` bounds each collective. Errors:
// MakeBackend's and the collectives'.
absl::StatusOr<std::unique_ptr<replicator::Replicator>> MakeReplicator(
    const config::EngineConfig& engine, std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));

}  // namespace troupe::engine

#endif  // TROUPE_ENGINE_ENGINE_CONFIG_H_
