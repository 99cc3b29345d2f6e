#include "launch/sweep_member.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/files.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "gan/run.h"
#include "launch/experiment.h"
#include "launch/launcher.h"
#include "launch/sweep_plan.h"

namespace troupe::launch {

namespace fs = std::filesystem;
using config::ExperimentConfig;

absl::Status RunSweepMember(const std::string& run_dir, const std::atomic<bool>* stop) {
  ASSIGN_OR_RETURN(ExperimentConfig config, LoadExperimentConfig(RunLayout(run_dir).config(), {}));
  RETURN_IF_ERROR(ValidateExperiment(config));
  const bool resume = SweepRunHasCheckpoint(run_dir, config.mode());
  std::error_code ec;
  if (resume) {
    std::fprintf(stderr, "sweep member %s: resuming from its checkpoint\n", run_dir.c_str());
  } else {
    // Afresh: what an attempt killed before its first checkpoint wrote goes.
    for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
      const std::string file = entry.path().filename().string();
      if (file != kConfigFile && file != "log.txt") fs::remove_all(entry.path(), ec);
    }
    std::fprintf(stderr, "sweep member %s: starting\n", run_dir.c_str());
  }
  if (config.mode() == ExperimentConfig::GAN) {
    RETURN_IF_ERROR(gan::RunGan(config, run_dir, resume, stop));
  } else if (config.mode() == ExperimentConfig::RL) {
    RETURN_IF_ERROR(RunRlExperiment(config, run_dir, resume, stop));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(RunLayout(run_dir).config(), ": mode ",
                                                   ExperimentConfig::Mode_Name(config.mode()), " is not swept"));
  }
  if (stop != nullptr && stop->load()) return absl::OkStatus();  // stopped: resumed by the next attempt
  return WriteFileAtomically(run_dir + "/" + kSweepDoneFile, "done\n");
}

}  // namespace troupe::launch
