#include "viz/run_directory.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "common/status_macros.h"

namespace troupe::viz {
namespace fs = std::filesystem;

absl::StatusOr<RunDirectory> OpenRunDirectory(const std::string& path) {
  // The directory itself: present, a directory, readable.
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::PermissionDeniedError(absl::StrCat("cannot read run directory ", path, ": ", ec.message()));
  }
  if (!fs::exists(status)) return absl::NotFoundError(absl::StrCat("run directory ", path, " does not exist"));
  if (!fs::is_directory(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a directory; troupe view takes a run directory "
                                                         "(runs/NAME-DATE-TIME, printed by troupe run)"));
  }
  fs::directory_iterator probe(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot read run directory ", path, ": ", ec.message()));

  // Its config.
  RunDirectory run;
  run.path = path;
  const RunLayout layout(path);
  const std::string config_path = layout.config();
  if (!fs::exists(config_path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a run directory: it has no ", kConfigFile,
                                                   " (troupe run writes one into every run directory)"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));  // (PermissionDenied "cannot read PATH: ...")
  RETURN_IF_ERROR(ParseTextConfig(text, config_path, &run.config));

  // Its checkpoints, oldest first.
  const fs::path checkpoint_dir = layout.checkpoints();
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  if (fs::is_directory(checkpoint_dir, ec)) {
    for (const auto& entry : fs::directory_iterator(checkpoint_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file(ec) && name.starts_with("agent") && entry.path().extension() == ".ckpt") {
        found.emplace_back(entry.last_write_time(ec), entry.path().string());
      }
    }
    // The learner's generations: each committed one's agent.ckpt.
    for (const auto& [number, folder] : ListGenerations(checkpoint_dir.string())) {
      const fs::path agent = fs::path(folder) / kAgentCheckpointFile;
      if (fs::exists(fs::path(folder) / "MANIFEST", ec) && fs::is_regular_file(agent, ec)) {
        found.emplace_back(fs::last_write_time(agent, ec), agent.string());
      }
    }
    if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot read ", checkpoint_dir.string(), ": ", ec.message()));
  }
  std::sort(found.begin(), found.end());
  for (auto& [time, file] : found) run.checkpoints.push_back(std::move(file));
  return run;
}

absl::StatusOr<std::string> ChooseCheckpoint(const RunDirectory& run, const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(explicit_path, ec)) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", explicit_path, " does not exist or is not a file"));
    }
    return explicit_path;
  }
  if (run.checkpoints.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run directory ", run.path, " has no checkpoint: no ", RunLayout(run.path).checkpoints(), "/",
        kAgentCheckpointFile, " (a scripted `troupe run` writes none; a run with a learner writes it as it trains). "
        "Pass --checkpoint PATH, or watch the task's scripted controller with this run's curve: "
        "troupe view ",
        run.path, " --policy controller"));
  }
  return run.latest_checkpoint();
}

}  // namespace troupe::viz
