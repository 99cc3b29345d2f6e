#include "launch/sweep_plan.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "gan/fid.h"
#include "launch/experiment.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using config::ExperimentConfig;

// "gan.batch_size=64" error prefixes from ApplyOverride say "--set"; a grid
// value is a --grid.
std::string AsGridMessage(absl::string_view message, absl::string_view assignment) {
  const std::string set = absl::StrCat("--set ", assignment);
  std::string text(message);
  if (absl::StartsWith(text, set)) text = absl::StrCat("--grid value ", assignment, text.substr(set.size()));
  return text;
}

// A value as it may appear in a directory name: [A-Za-z0-9.-], others '_'.
std::string PathSafe(absl::string_view value) {
  std::string out(value);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return out;
}

// The label each axis goes by in run names: the field's last component,
// or its whole path when two axes share the last component.
std::vector<std::string> AxisLabels(const std::vector<GridAxis>& grid) {
  std::vector<std::string> labels;
  std::map<std::string, int> counts;
  auto last_parts = [](const std::string& field) {
    std::vector<std::string> lasts;
    for (absl::string_view name : absl::StrSplit(field, ':')) lasts.emplace_back(name.substr(name.rfind('.') + 1));
    return absl::StrJoin(lasts, "-");
  };
  for (const GridAxis& axis : grid) ++counts[last_parts(axis.field)];
  for (const GridAxis& axis : grid) {
    const std::string last = last_parts(axis.field);
    labels.push_back(counts[last] > 1 ? PathSafe(axis.field) : last);
  }
  return labels;
}

// The config with its thread count cleared: what must match between a
// rerun's plan and a run directory's config (the threads follow --parallel).
ExperimentConfig WithoutThreads(ExperimentConfig config) {
  config.mutable_gan()->mutable_engine()->clear_threads();
  config.mutable_learner()->mutable_engine()->clear_threads();
  if (!config.gan().engine().ByteSizeLong()) config.mutable_gan()->clear_engine();
  if (!config.learner().engine().ByteSizeLong()) config.mutable_learner()->clear_engine();
  if (!config.gan().ByteSizeLong()) config.clear_gan();
  if (!config.learner().ByteSizeLong()) config.clear_learner();
  return config;
}

}  // namespace

absl::StatusOr<std::vector<GridAxis>> ParseGrid(const std::vector<std::string>& arguments) {
  std::vector<GridAxis> grid;
  std::set<std::string> fields;
  for (const std::string& argument : arguments) {
    const size_t equals = argument.find('=');
    if (equals == std::string::npos || equals == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grid ", argument, ": expected path.to.field=v1,v2,... (e.g. gan.batch_size=64,256)"));
    }
    GridAxis axis;
    axis.field = argument.substr(0, equals);
    const std::string list = argument.substr(equals + 1);
    if (list.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--grid ", argument, ": the list of values is empty"));
    }
    std::set<std::string> seen;
    for (absl::string_view value : absl::StrSplit(list, ',')) {
      if (value.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--grid ", argument, ": an empty value in the list (values are separated by single commas)"));
      }
      if (!seen.insert(std::string(value)).second) {
        return absl::InvalidArgumentError(absl::StrCat("--grid ", argument, ": value ", value, " is given twice"));
      }
      axis.values.emplace_back(value);
    }
    const std::vector<std::string> names = absl::StrSplit(axis.field, ':');
    for (const std::string& value : axis.values) {
      if (std::vector<std::string>(absl::StrSplit(value, ':')).size() != names.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--grid ", argument, ": value ", value,
                                                       " has not one part per field (", names.size(),
                                                       " fields, parts separated by ':')"));
      }
    }
    for (const std::string& name : names) {
      if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("--grid ", argument, ": an empty field name"));
      if (!fields.insert(name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("--grid ", argument, ": field ", name, " is already swept by another --grid"));
      }
    }
    grid.push_back(std::move(axis));
  }
  return grid;
}

std::vector<std::string> AxisAssignments(const GridAxis& axis, const std::string& value) {
  const std::vector<std::string> names = absl::StrSplit(axis.field, ':');
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  std::vector<std::string> assignments;
  for (size_t i = 0; i < names.size() && i < parts.size(); ++i) assignments.push_back(names[i] + "=" + parts[i]);
  return assignments;
}

absl::StatusOr<SweepPlan> PlanSweep(const SweepOptions& options) {
  if (options.seeds < 1) return absl::InvalidArgumentError(absl::StrCat("--seeds ", options.seeds, ": must be >= 1"));
  if (options.first_seed < 0 || options.first_seed > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("--first-seed ", options.first_seed, ": must be 0..1000000"));
  }
  if (options.parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--parallel ", options.parallel, ": must be >= 1"));
  }
  // The base config with --set, checked on its own first.
  ASSIGN_OR_RETURN(LoadedConfig base, LoadExperimentConfigWithSource(options.config_path, options.overrides));
  const ExperimentConfig::Mode mode = base.config.mode();
  if (mode != ExperimentConfig::GAN && mode != ExperimentConfig::RL) {
    return absl::InvalidArgumentError(absl::StrCat(options.config_path, ": mode ", ExperimentConfig::Mode_Name(mode),
                                                   " has no metric to sweep (sweeps run mode GAN or RL)"));
  }
  // Every value of every axis applied alone: an unknown field or a value that
  // does not parse is refused naming the --grid.
  for (const GridAxis& axis : options.grid) {
    for (const std::string& value : axis.values) {
      for (const std::string& assignment : AxisAssignments(axis, value)) {
        ExperimentConfig copy = base.config;
        if (absl::Status s = ApplyOverride(assignment, &copy); !s.ok()) {
          return absl::InvalidArgumentError(AsGridMessage(s.message(), assignment));
        }
      }
    }
  }

  SweepPlan plan;
  plan.mode = mode;
  plan.grid = options.grid;
  plan.seeds = options.seeds;
  plan.first_seed = options.first_seed;
  plan.sweep_dir = options.sweep_dir.empty() ? absl::StrCat(base.config.runs_dir(), "/", base.config.name(), "-sweep")
                                             : options.sweep_dir;
  const int cores = options.cores > 0 ? options.cores : std::max(1u, std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / options.parallel);
  const std::vector<std::string> labels = AxisLabels(options.grid);

  // The cross product, last axis fastest, seeds innermost.
  size_t points = 1;
  for (const GridAxis& axis : options.grid) points *= axis.values.size();
  std::set<std::string> names;
  for (size_t p = 0; p < points; ++p) {
    std::vector<std::string> assignments, name_parts;
    size_t rest = p;
    for (size_t a = options.grid.size(); a-- > 0;) {
      const GridAxis& axis = options.grid[a];
      const std::string& value = axis.values[rest % axis.values.size()];
      rest /= axis.values.size();
      const std::vector<std::string> axis_assignments = AxisAssignments(axis, value);
      assignments.insert(assignments.begin(), axis_assignments.begin(), axis_assignments.end());
      name_parts.insert(name_parts.begin(), absl::StrCat(labels[a], "-", PathSafe(value)));
    }
    for (int seed = options.first_seed; seed < options.first_seed + options.seeds; ++seed) {
      SweepRun run;
      run.assignments = assignments;
      run.point = assignments.empty() ? "base" : absl::StrJoin(assignments, ",");
      run.seed = seed;
      std::vector<std::string> parts = name_parts;
      parts.push_back(absl::StrCat("seed-", seed));
      run.name = absl::StrJoin(parts, "__");
      if (run.name.size() > kMaxRunNameBytes || !names.insert(run.name).second) {
        run.name = absl::StrCat("point-", p, "__seed-", seed);
        names.insert(run.name);
      }
      run.run_dir = absl::StrCat(plan.sweep_dir, "/", run.name);
      // The run's config: base, --set, the point; then seed and threads.
      std::vector<std::string> overrides = options.overrides;
      overrides.insert(overrides.end(), assignments.begin(), assignments.end());
      ASSIGN_OR_RETURN(LoadedConfig loaded, LoadExperimentConfigWithSource(options.config_path, overrides));
      ExperimentConfig& c = loaded.config;
      config::EngineConfig* engine =
          mode == ExperimentConfig::GAN ? c.mutable_gan()->mutable_engine() : c.mutable_learner()->mutable_engine();
      engine->set_seed(engine->seed() + seed);
      if (mode == ExperimentConfig::RL) c.mutable_env()->set_seed(c.env().seed() + seed);
      if (engine->threads() == 0) engine->set_threads(threads);
      if (absl::Status valid = ValidateExperiment(c); !valid.ok()) {
        std::string message = loaded.source.Locate(valid.message());
        for (const std::string& assignment : assignments) message = AsGridMessage(message, assignment);
        return absl::Status(valid.code(), absl::StrCat("grid point ", run.point, " seed ", seed, ": ", message));
      }
      // A run directory from an earlier sweep must hold this run's config.
      if (RunLayout(run.run_dir).HasConfig()) {
        auto existing = LoadExperimentConfig(RunLayout(run.run_dir).config(), {});
        if (!existing.ok() || !google::protobuf::util::MessageDifferencer::Equals(WithoutThreads(*existing),
                                                                                  WithoutThreads(c))) {
          return absl::FailedPreconditionError(absl::StrCat(
              run.run_dir, " holds a run of another config than this sweep's ", run.point, " seed ", seed,
              " (a changed config, --set or grid): give the sweep another --dir, or remove that directory"));
        }
      }
      run.config = std::move(c);
      plan.runs.push_back(std::move(run));
    }
  }
  return plan;
}

absl::StatusOr<std::vector<const SweepRun*>> PrepareSweep(const SweepPlan& plan,
                                                          const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  fs::create_directories(plan.sweep_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot make the sweep directory ", plan.sweep_dir, ": ",
                                                          ec.message()));
  // sweep.txt: what was swept; each new run's config.
  std::string text = "# troupe sweep\n";
  for (const GridAxis& axis : plan.grid) {
    absl::StrAppend(&text, "grid ", axis.field, "=", absl::StrJoin(axis.values, ","), "\n");
  }
  absl::StrAppend(&text, "seeds ", plan.seeds, plan.first_seed > 0 ? absl::StrCat(" from ", plan.first_seed) : "",
                  "\n");
  for (const SweepRun& run : plan.runs) {
    absl::StrAppend(&text, "run ", run.name, " ", run.point, " seed ", run.seed, "\n");
  }
  RETURN_IF_ERROR(WriteFileAtomically(plan.sweep_dir + "/sweep.txt", text));
  std::vector<const SweepRun*> pending;
  for (const SweepRun& run : plan.runs) {
    if (SweepRunDone(run.run_dir)) {
      log(absl::StrCat("skip ", run.name, ": done"));
      continue;
    }
    fs::create_directories(run.run_dir, ec);
    std::string config_text;
    google::protobuf::TextFormat::PrintToString(run.config, &config_text);
    RETURN_IF_ERROR(WriteFileAtomically(RunLayout(run.run_dir).config(), config_text));
    pending.push_back(&run);
  }

  // The FID classifier every GAN run loads, trained here once if missing,
  // so that parallel runs do not each train (and write) it.
  if (plan.mode == ExperimentConfig::GAN && !pending.empty()) {
    std::set<std::string> classifiers;
    for (const SweepRun* run : pending) {
      const config::GanConfig& gan = run->config.gan();
      const std::string path = gan.classifier_checkpoint().empty() ? gan::DefaultClassifierPath()
                                                                  : gan.classifier_checkpoint();
      if (!classifiers.insert(path).second || fs::exists(path, ec)) continue;
      log(absl::StrCat("training the FID classifier ", path, " once for every run"));
      gan::FidClassifier::Options options;
      options.checkpoint = path;
      options.data_dir = gan.data_dir();
      options.threads = std::max(1u, std::thread::hardware_concurrency());
      options.device = gan.engine().device();
      RETURN_IF_ERROR(gan::FidClassifier::LoadOrTrain(options).status());
    }
  }

  return pending;
}

bool SweepRunDone(const std::string& run_dir) {
  std::error_code ec;
  return fs::exists(run_dir + "/" + kSweepDoneFile, ec);
}

bool SweepRunHasCheckpoint(const std::string& run_dir, ExperimentConfig::Mode mode) {
  // A committed generation, or the one file of the layout before them.
  return !RunLayout(run_dir).NewestCheckpoint(mode == ExperimentConfig::GAN).empty();
}

}  // namespace troupe::launch
