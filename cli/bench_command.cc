#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "bench/bench.h"
#include "cli/commands.h"
#include "common/files.h"

namespace troupe::cli {

void AddBenchCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string name;
    std::string json;
    std::vector<std::string> filter;
    double seconds = 1.0;
    bool quick = false;
    int rounds = 0;
    std::string device = "cpu";
    std::string pjrt_plugin;
  };
  auto args = std::make_shared<Args>();
  std::vector<std::string> names;
  for (const auto& b : bench::Benchmarks()) names.push_back(b.name);
  CLI::App* cmd = app.add_subcommand("bench", "Run a benchmark: troupe's figure, a reference measured in the same run, the ratio");
  cmd->add_option("name", args->name, "Benchmark: " + absl::StrJoin(names, ", "))->required();
  cmd->add_option("--json", args->json, "Also write the figures as JSON to this path");
  cmd->add_option("--only", args->filter, "Restrict to these items (e.g. task names)");
  cmd->add_option("--seconds", args->seconds, "Measurement time per figure")->check(CLI::PositiveNumber);
  cmd->add_flag("--quick", args->quick, "Small sizes (smoke test)");
  cmd->add_option("--rounds", args->rounds,
                  "Measured rounds per side of each comparison with a peer (bench/protocol.h; default 5 on the CPU, 3 "
                  "on a GPU, fewer with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", args->device,
                  "Where the learner and GAN steps (also scaling's K=1 steps) run: cpu, cuda (GPU 0), or pjrt (the "
                  "learner and GAN steps, one program per step, on device 0 of --pjrt-plugin)")
      ->check(CLI::IsMember({"cpu", "cuda", "pjrt"}));
  cmd->add_option("--pjrt-plugin", args->pjrt_plugin,
                  "--device pjrt: the PJRT plugin's .so (default: $TROUPE_PJRT_PLUGIN)");
  cmd->callback([args, exit_code, names] {
    const bench::Benchmark* found = nullptr;
    for (const auto& b : bench::Benchmarks()) {
      if (b.name == args->name) found = &b;
    }
    if (!found) {
      std::fprintf(stderr, "troupe bench: unknown benchmark '%s'; known: %s\n", args->name.c_str(),
                   absl::StrJoin(names, ", ").c_str());
      *exit_code = 2;
      return;
    }
    // The benchmarks with a device step: learner, gan, and scaling (its K = 1 steps).
    const bool has_device_step = found->name == "learner" || found->name == "gan" || found->name == "scaling";
    if (args->device != "cpu" && !has_device_step) {
      std::fprintf(stderr,
                   "troupe bench %s: --device %s: only the learner, gan and scaling benchmarks run on a device\n",
                   found->name.c_str(), args->device.c_str());
      *exit_code = 2;
      return;
    }
    if (args->device == "pjrt" && found->name != "learner" && found->name != "gan") {
      std::fprintf(stderr, "troupe bench %s: --device pjrt: only the learner and gan benchmarks run on a PJRT plugin\n",
                   found->name.c_str());
      *exit_code = 2;
      return;
    }
    std::string plugin = args->pjrt_plugin;
    if (plugin.empty() && std::getenv("TROUPE_PJRT_PLUGIN") != nullptr) plugin = std::getenv("TROUPE_PJRT_PLUGIN");
    if (args->device == "pjrt" && plugin.empty()) {
      std::fprintf(stderr, "troupe bench %s: --device pjrt needs --pjrt-plugin PATH (or TROUPE_PJRT_PLUGIN)\n",
                   found->name.c_str());
      *exit_code = 2;
      return;
    }
    std::printf("troupe bench %s: %s\n", found->name.c_str(), found->description.c_str());
    auto report = found->run(bench::Options{args->seconds, args->filter, args->quick, args->device, plugin, args->rounds});
    if (!report.ok()) {
      std::fprintf(stderr, "troupe bench %s: %s\n", found->name.c_str(), report.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    report->benchmark = found->name;
    if (!args->json.empty()) {
      if (auto status = WriteFileAtomically(args->json, report->ToJson()); !status.ok()) {
        std::fprintf(stderr, "troupe bench: %s\n", status.ToString().c_str());
        *exit_code = 1;
        return;
      }
      std::printf("wrote %s\n", args->json.c_str());
    }
  });
}

}  // namespace troupe::cli
