// `troupe devices`: what engine.device GPU would use on this machine, and why
// each path is in or out: the XLA CUDA PJRT plugin (its path, PJRT API
// version, platform and devices, or the client's error) and the CUDA
// backend's GPUs (each with its compute capability, against the
// architectures its kernels were built for). Exit 0 when device GPU has a
// path here, 1 when it has none (the reason printed), 2 for bad arguments.
#include <cstdio>

#include "cli/commands.h"
#include "engine/engine_config.h"
#include "proto/config.pb.h"

namespace troupe::cli {

void AddDevicesCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string pjrt_plugin;
    int replicas = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "devices", "What engine.device GPU would use here: the XLA CUDA PJRT plugin, the CUDA backend's GPUs, and why");
  cmd->add_option("--pjrt-plugin", args->pjrt_plugin,
                  "A PJRT plugin's .so to look at (as engine.pjrt_plugin; default: the one JAX installs, found by "
                  "$TROUPE_PYTHON or python3)");
  cmd->add_option("--replicas", args->replicas, "In-process replicas the learner would run (devices needed)")
      ->check(CLI::Range(1, 256));
  cmd->callback([args, exit_code] {
    config::EngineConfig engine;
    engine.set_device(config::EngineConfig::GPU);
    engine.set_replicas(args->replicas);
    if (!args->pjrt_plugin.empty()) engine.set_pjrt_plugin(args->pjrt_plugin);
    const engine::GpuPaths found = engine::FindGpuPaths(engine);
    std::fputs(engine::DescribeGpuPaths(found).c_str(), stdout);
    std::string said;
    absl::StatusOr<config::EngineConfig> chosen = engine::ChooseGpuPath(engine, found, "learner", &said);
    std::printf("%s\n", chosen.ok() ? said.c_str() : std::string(chosen.status().message()).c_str());
    *exit_code = chosen.ok() ? 0 : 1;
  });
}

}  // namespace troupe::cli
