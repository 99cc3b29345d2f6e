#include "agents/d4pg_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/cpu_backend.h"

namespace troupe::agents {
namespace {

// The smallest frame the encoder's four 3x3 convs (first stride 2) accept.
constexpr int kMinFrameSize = 15;

}  // namespace

absl::Status ValidateD4pg(const config::D4pgConfig& config, const ObservationSpec& spec, int action_size) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  RETURN_IF_ERROR(CheckObservationAndActions(spec, action_size));
  if (spec.state_size < 0) return bad("observation spec: state_size ", spec.state_size, " must be >= 0");
  if (spec.pixels() && (spec.height < kMinFrameSize || spec.width < kMinFrameSize)) {
    return bad("observation spec (env.render): frames of ", spec.height, "x", spec.width, " are too small for the encoder (at least ",
               kMinFrameSize, "x", kMinFrameSize, ")");
  }
  // The critic's support and the networks.
  if (config.atoms() < 2 || config.atoms() > kMaxAtoms) {
    return bad("d4pg.atoms ", config.atoms(), ": must be in [2, ", kMaxAtoms, "]");
  }
  if (!std::isfinite(config.v_min())) return bad("d4pg.v_min ", config.v_min(), ": must be finite");
  if (!std::isfinite(config.v_max())) return bad("d4pg.v_max ", config.v_max(), ": must be finite");
  if (!(config.v_max() > config.v_min())) {
    return bad("d4pg.v_max ", config.v_max(), " must be greater than d4pg.v_min ", config.v_min());
  }
  if (config.hidden_size() > kMaxHiddenLayers) {
    return bad("d4pg.hidden: ", config.hidden_size(), " layers, at most ", kMaxHiddenLayers);
  }
  for (int i = 0; i < config.hidden_size(); ++i) {
    if (config.hidden(i) < 1 || config.hidden(i) > kMaxHiddenSize) {
      return bad("d4pg.hidden[", i, "] ", config.hidden(i), ": must be in [1, ", kMaxHiddenSize, "]");
    }
  }
  if (!(config.discount() > 0 && config.discount() <= 1)) {
    return bad("d4pg.discount ", config.discount(), ": must be in (0, 1]");
  }
  if (config.n_step() < 1 || config.n_step() > kMaxNStep) {
    return bad("d4pg.n_step ", config.n_step(), ": must be in [1, ", kMaxNStep, "]");
  }
  if (!(config.actor_learning_rate() > 0) || std::isinf(config.actor_learning_rate())) {
    return bad("d4pg.actor_learning_rate ", config.actor_learning_rate(), ": must be > 0");
  }
  if (!(config.critic_learning_rate() > 0) || std::isinf(config.critic_learning_rate())) {
    return bad("d4pg.critic_learning_rate ", config.critic_learning_rate(), ": must be > 0");
  }
  if (!(config.target_tau() > 0 && config.target_tau() <= 1)) {
    return bad("d4pg.target_tau ", config.target_tau(), ": must be in (0, 1]");
  }
  if (!(config.actor_pre_tanh_bound() >= 0)) {
    return bad("d4pg.actor_pre_tanh_bound ", config.actor_pre_tanh_bound(), ": must be >= 0");
  }
  if (!(config.actor_pre_tanh_penalty() >= 0)) {
    return bad("d4pg.actor_pre_tanh_penalty ", config.actor_pre_tanh_penalty(), ": must be >= 0 (0 = off)");
  }
  if (!(config.max_gradient_norm() >= 0)) {
    return bad("d4pg.max_gradient_norm ", config.max_gradient_norm(), ": must be >= 0 (0 = no clipping)");
  }
  if (spec.pixels()) {
    if (config.encoder_features() < 1 || config.encoder_features() > kMaxEncoderFeatures) {
      return bad("d4pg.encoder_features ", config.encoder_features(), ": must be in [1, ", kMaxEncoderFeatures, "]");
    }
    if (config.conv_channels() < 1 || config.conv_channels() > kMaxConvChannels) {
      return bad("d4pg.conv_channels ", config.conv_channels(), ": must be in [1, ", kMaxConvChannels, "]");
    }
    if (config.augment_pad() < 0 || config.augment_pad() > kMaxAugmentPad) {
      return bad("d4pg.augment_pad ", config.augment_pad(), ": must be in [0, ", kMaxAugmentPad, "]");
    }
  }
  return absl::OkStatus();
}

float D4pgNoiseScale(const config::ActorsConfig& actors, int actor, int64_t frames) {
  const int count = std::max(actors.count(), 1);
  const float own = actors.noise_min() + (actors.noise_max() - actors.noise_min()) * actor / std::max(count - 1, 1);
  if (actors.noise_decay_frames() <= 0 || frames >= actors.noise_decay_frames()) return own;
  const float left = 1.0f - static_cast<float>(frames) / static_cast<float>(actors.noise_decay_frames());
  return own + (actors.noise_initial() - own) * left;
}

// --- D4pgPolicy -----------------------------------------------------------------

D4pgPolicy::D4pgPolicy(const ObservationSpec& spec, int action_size, std::unique_ptr<nn::Backend> backend)
    : spec_(spec), action_size_(action_size), backend_(std::move(backend)), tape_(backend_.get()) {}

absl::StatusOr<std::unique_ptr<D4pgPolicy>> D4pgPolicy::Create(const config::D4pgConfig& config,
                                                               const ObservationSpec& spec, int action_size,
                                                               int num_threads) {
  return Create(config, spec, action_size, std::make_unique<nn::CpuBackend>(std::max(1, num_threads)));
}

absl::StatusOr<std::unique_ptr<D4pgPolicy>> D4pgPolicy::Create(const config::D4pgConfig& config,
                                                               const ObservationSpec& spec, int action_size,
                                                               std::unique_ptr<nn::Backend> backend) {
  RETURN_IF_ERROR(ValidateD4pg(config, spec, action_size));
  std::unique_ptr<D4pgPolicy> policy(new D4pgPolicy(spec, action_size, std::move(backend)));
  // Encoder (pixels) then actor: the layout PolicyParameters writes.
  int64_t feature_size = spec.state_size;
  if (spec.pixels()) {
    policy->encoder_ =
        internal::Encoder::Declare(policy->params_, spec, config.conv_channels(), config.encoder_features());
    feature_size = config.encoder_features();
  }
  policy->actor_ = internal::DeclareActor(policy->params_, feature_size, internal::HiddenSizes(config), action_size);
  policy->params_.Allocate(*policy->backend_, /*seed=*/0, 1, /*gradients=*/false);  // inference only
  return policy;
}

absl::Status D4pgPolicy::SetParameters(std::span<const float> parameters) {
  if (static_cast<int64_t>(parameters.size()) != params_.total_floats()) {
    return absl::InvalidArgumentError(absl::StrCat("policy parameters: got ", parameters.size(), " floats, expected ",
                                                   params_.total_floats(),
                                                   " (is the learner's d4pg config the same as this policy's?)"));
  }
  return params_.UploadValues(parameters);
}

absl::StatusOr<int64_t> D4pgPolicy::LoadAgentCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> tensors, nn::ReadCheckpoint(path));
  // Check every parameter before setting any.
  std::vector<const nn::CheckpointTensor*> sources;
  for (int i = 0; i < params_.size(); ++i) {
    const nn::ParameterInfo& info = params_.info(i);
    ASSIGN_OR_RETURN(const nn::CheckpointTensor* t,
                     nn::FindCheckpointEntry(tensors, path,
                                             nn::kParameterEntryPrefix + internal::AgentCheckpointName(info.name),
                                             &info.shape));
    sources.push_back(t);
  }
  ASSIGN_OR_RETURN(const nn::CheckpointTensor* counters,
                   nn::FindCheckpointEntry(tensors, path,
                                           std::string(nn::kParameterEntryPrefix) + internal::kCheckpointCounters));
  if (counters->values.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": '", counters->name, "' has ", counters->values.size(),
                                                   " floats, expected at least 2"));
  }
  for (int i = 0; i < params_.size(); ++i) {
    backend_->Upload(sources[i]->values.data(), params_.value(i).data, sizeof(float) * sources[i]->values.size());
  }
  return nn::Int64sOf(*counters)[0];
}

absl::Status D4pgPolicy::Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint& at,
                                std::mt19937_64& rng, float* actions, float* log_probs) {
  if (log_probs != nullptr) {
    return absl::UnimplementedError("D4PG's clipped Gaussian exploration has no log-densities (its items are transitions)");
  }
  RETURN_IF_ERROR(Act(state, pixels, batch, actions));
  const float scale = D4pgNoiseScale(exploration_, at.actor, at.frames);
  for (int64_t i = 0; i < int64_t{batch} * action_size_; ++i) {
    actions[i] = std::clamp(actions[i] + scale * gaussian_(rng), -1.0f, 1.0f);
  }
  return absl::OkStatus();
}

std::string D4pgPolicy::DescribeExploration(const ExplorationPoint& at) const {
  return absl::StrFormat("noise %.2f", D4pgNoiseScale(exploration_, at.actor, at.frames));
}

absl::Status D4pgPolicy::Act(const float* state, const uint8_t* pixels, int batch, float* actions) {
  RETURN_IF_ERROR(CheckActInputs(spec_, state, pixels, batch));
  tape_.Reset();
  const internal::Weights weights{&params_, /*trainable=*/false};
  nn::Var features;
  if (spec_.pixels()) {
    features = encoder_(tape_, weights, internal::PixelInput(tape_, pixels, batch, spec_));
  } else {
    features = tape_.Input(state, {batch, spec_.state_size});
  }
  const nn::Var action = actor_(tape_, weights, features);
  backend_->Download(tape_.data(action).data, actions, sizeof(float) * batch * action_size_);
  return absl::OkStatus();
}

}  // namespace troupe::agents
