#include "viz/policies/checkpoint.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agents/policies.h"
#include "common/config.h"
#include "common/files.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "envs/env.h"

namespace troupe::viz {
namespace fs = std::filesystem;
namespace {

// The run directory a checkpoint at DIR/checkpoints/NAME belongs to, or ""
// when its grandparent holds no config.textproto.
std::string OwningRunDirectory(const std::string& checkpoint_path) {
  fs::path dir = fs::path(checkpoint_path).parent_path();
  // A generation's: DIR/checkpoints/generation-N/agent.ckpt.
  if (dir.filename().string().starts_with("generation-")) dir = dir.parent_path();
  if (dir.filename() != kCheckpointsFolder) return "";
  const fs::path run = dir.parent_path();
  return RunLayout(run.string()).HasConfig() ? run.string() : "";
}

// Frames from the learner's counters.txt beside the checkpoint, -1 if none.
int64_t ReadFrames(const std::string& checkpoint_path) {
  int64_t frames = 0;
  const std::string path = (fs::path(checkpoint_path).parent_path() / kCountersFile).string();
  return absl::SimpleAtoi(ReadKeyValues(path)["frames"], &frames) ? frames : -1;
}

std::string Age(std::chrono::seconds age) {
  const int64_t s = std::max<int64_t>(age.count(), 0);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m ", s % 60, "s");
  return absl::StrCat(s / 3600, "h ", (s % 3600) / 60, "m");
}

}  // namespace

absl::Status CheckCheckpointConfig(const config::ExperimentConfig& config, const config::ExperimentConfig& trained,
                                   const std::string& checkpoint_path) {
  std::vector<std::string> differences;
  // One line per differing field: "field: checkpoint A, run B".
  auto compare = [&](const std::string& field, const std::string& checkpoint, const std::string& run) {
    if (checkpoint != run) differences.push_back(absl::StrCat(field, ": checkpoint ", checkpoint, ", run ", run));
  };
  auto quoted = [](const std::string& s) { return absl::StrCat("'", s, "'"); };
  const config::EnvConfig& a = trained.env();
  const config::EnvConfig& b = config.env();
  compare("mode", config::ExperimentConfig::Mode_Name(trained.mode()), config::ExperimentConfig::Mode_Name(config.mode()));
  compare("env.task", quoted(a.task()), quoted(b.task()));
  compare("env.observation", config::EnvConfig::Observation_Name(a.observation()),
          config::EnvConfig::Observation_Name(b.observation()));
  compare("env.action_repeat", absl::StrCat(a.action_repeat()), absl::StrCat(b.action_repeat()));
  if (a.observation() == config::EnvConfig::PIXELS && b.observation() == config::EnvConfig::PIXELS) {
    compare("env.frame_stack", absl::StrCat(a.frame_stack()), absl::StrCat(b.frame_stack()));
    compare("env.render (height x width)", absl::StrCat(a.render().height(), "x", a.render().width()),
            absl::StrCat(b.render().height(), "x", b.render().width()));
  }
  for (std::string& d : agents::ArchitectureDifferences(trained, config)) differences.push_back(std::move(d));
  if (differences.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("checkpoint ", checkpoint_path,
                                                 " was trained for another task or architecture than this run: ",
                                                 absl::StrJoin(differences, "; ")));
}

absl::StatusOr<std::unique_ptr<CheckpointPolicy>> CheckpointPolicy::Load(const config::ExperimentConfig& config,
                                                                         const std::string& checkpoint_path) {
  if (config.mode() != config::ExperimentConfig::RL) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", checkpoint_path, ": the run's config has mode ",
                                                   config::ExperimentConfig::Mode_Name(config.mode()),
                                                   ", but only mode RL runs have a policy"));
  }
  // The checkpoint's own run, when it is another one: compare configs first,
  // which names the difference better than a parameter shape does.
  const std::string owner = OwningRunDirectory(checkpoint_path);
  if (!owner.empty()) {
    const std::string owner_config = RunLayout(owner).config();
    const absl::StatusOr<std::string> text = ReadFile(owner_config);
    config::ExperimentConfig trained;
    if (text.ok() && ParseTextConfig(*text, owner_config, &trained).ok()) {
      RETURN_IF_ERROR(CheckCheckpointConfig(config, trained, checkpoint_path));
    }
  }

  // The policy of this run's task and architecture.
  std::unique_ptr<CheckpointPolicy> policy(new CheckpointPolicy(config, checkpoint_path));
  ASSIGN_OR_RETURN(const envs::EnvSpec env_spec, envs::DescribeEnv(config.env()));
  policy->spec_ = agents::ObservationSpecOf(env_spec);
  ASSIGN_OR_RETURN(policy->policy_, agents::CreatePolicy(config, policy->spec_, env_spec.action_size));
  RETURN_IF_ERROR(policy->Reload());
  return policy;
}

absl::Status CheckpointPolicy::Reload() {
  std::error_code ec;
  const fs::file_time_type modified = fs::last_write_time(path_, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read checkpoint ", path_, ": ", ec.message()));
  // The file's names and shapes are checked against this run's policy.
  absl::StatusOr<int64_t> updates = policy_->LoadAgentCheckpoint(path_);
  if (!updates.ok()) {
    if (updates.status().code() != absl::StatusCode::kInvalidArgument) return updates.status();
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path_, " does not fit this run's agent (task ", config_.env().task(), ", observation ",
        config::EnvConfig::Observation_Name(config_.env().observation()), ", ", agents::DescribeArchitecture(config_),
        "): it was written for another task or architecture: ", updates.status().message()));
  }
  updates_ = *updates;
  frames_ = ReadFrames(path_);
  modified_ = modified;
  return absl::OkStatus();
}

std::string CheckpointPolicy::Describe() const {
  return absl::StrCat(agents::AgentName(config_), " checkpoint ", fs::path(path_).filename().string(), " (no exploration)");
}

std::string CheckpointPolicy::Version() const {
  const auto age = std::chrono::duration_cast<std::chrono::seconds>(fs::file_time_type::clock::now() - modified_);
  return absl::StrCat("version ", updates_, " (updates)", frames_ >= 0 ? absl::StrCat(", ", frames_, " frames") : "",
                      ", saved ", Age(age), " ago");
}

void CheckpointPolicy::BeginEpisode() {
  std::error_code ec;
  const fs::file_time_type modified = fs::last_write_time(path_, ec);
  if (ec || modified == modified_) return;
  // A failed reload (a file being replaced) keeps the loaded policy.
  if (!Reload().ok()) modified_ = modified;
}

absl::Status CheckpointPolicy::Act(const envs::Environment& env, const Observation& observation,
                                   std::span<float> action) {
  // From state: the env's state vector as is.
  if (!spec_.pixels()) {
    if (int(observation.state.size()) != spec_.state_size) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint policy: state has ", observation.state.size(),
                                                     " floats, the agent expects ", spec_.state_size));
    }
    return policy_->Act(observation.state.data(), nullptr, 1, action.data());
  }
  // From pixels: the env's [H, W, 3k] (frames oldest first along channels)
  // to the policy's [k, H, W, 3].
  const size_t pixels = size_t(spec_.height) * spec_.width;
  const size_t channels = size_t(spec_.frames) * 3;
  if (observation.pixels.size() != pixels * channels) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint policy: pixel observation has ",
                                                   observation.pixels.size(), " bytes, the agent expects ",
                                                   pixels * channels, " (", spec_.frames, " frames of ", spec_.height,
                                                   "x", spec_.width, ")"));
  }
  stacked_.resize(pixels * channels);
  for (int k = 0; k < spec_.frames; ++k) {
    uint8_t* out = stacked_.data() + size_t(k) * pixels * 3;
    for (size_t i = 0; i < pixels; ++i) std::copy_n(observation.pixels.data() + i * channels + 3 * k, 3, out + 3 * i);
  }
  return policy_->Act(nullptr, stacked_.data(), 1, action.data());
}

}  // namespace troupe::viz
