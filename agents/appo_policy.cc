#include "agents/appo_policy.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agents/d4pg_policy.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/ops.h"

namespace troupe::agents {

absl::Status ValidateAppo(const config::AppoConfig& config, const ObservationSpec& spec, int action_size) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  RETURN_IF_ERROR(CheckObservationAndActions(spec, action_size));
  if (spec.pixels()) {
    if (spec.height < 15 || spec.width < 15) {
      return bad("observation spec (env.render): frames of ", spec.height, "x", spec.width,
                 " are too small for the encoder (at least 15x15)");
    }
    if (config.encoder_features() < 1 || config.encoder_features() > kMaxEncoderFeatures) {
      return bad("appo.encoder_features ", config.encoder_features(), ": must be in [1, ", kMaxEncoderFeatures, "]");
    }
    if (config.conv_channels() < 1 || config.conv_channels() > kMaxConvChannels) {
      return bad("appo.conv_channels ", config.conv_channels(), ": must be in [1, ", kMaxConvChannels, "]");
    }
    if (config.augment_pad() < 0 || config.augment_pad() > kMaxAugmentPad) {
      return bad("appo.augment_pad ", config.augment_pad(), ": must be in [0, ", kMaxAugmentPad, "]");
    }
  }
  if (config.hidden_size() > kMaxHiddenLayers) {
    return bad("appo.hidden: ", config.hidden_size(), " layers, at most ", kMaxHiddenLayers);
  }
  for (int i = 0; i < config.hidden_size(); ++i) {
    if (config.hidden(i) < 1 || config.hidden(i) > kMaxHiddenSize) {
      return bad("appo.hidden[", i, "] ", config.hidden(i), ": must be in [1, ", kMaxHiddenSize, "]");
    }
  }
  if (config.unroll_length() < 1 || config.unroll_length() > 4096) {
    return bad("appo.unroll_length ", config.unroll_length(), ": must be in [1, 4096]");
  }
  if (!(config.discount() > 0 && config.discount() <= 1)) return bad("appo.discount ", config.discount(), ": must be in (0, 1]");
  if (!(config.learning_rate() > 0) || std::isinf(config.learning_rate())) {
    return bad("appo.learning_rate ", config.learning_rate(), ": must be > 0");
  }
  if (config.epochs() < 1 || config.epochs() > 100) return bad("appo.epochs ", config.epochs(), ": must be in [1, 100]");
  if (config.minibatches() < 1) return bad("appo.minibatches ", config.minibatches(), ": must be >= 1");
  if (!(config.clip() > 0 && config.clip() < 1)) return bad("appo.clip ", config.clip(), ": must be in (0, 1)");
  const struct {
    const char* name;
    float value;
  } non_negative[] = {{"value_coef", config.value_coef()},
                      {"entropy_coef", config.entropy_coef()},
                      {"max_gradient_norm", config.max_gradient_norm()}};
  for (const auto& [name, value] : non_negative) {
    if (!(value >= 0) || std::isinf(value)) return bad("appo.", name, " ", value, ": must be finite and >= 0");
  }
  const struct {
    const char* name;
    float value;
  } positive[] = {{"vtrace_rho", config.vtrace_rho()}, {"vtrace_c", config.vtrace_c()}};
  for (const auto& [name, value] : positive) {
    if (!(value > 0) || std::isinf(value)) return bad("appo.", name, " ", value, ": must be finite and > 0");
  }
  if (!(config.vtrace_lambda() >= 0 && config.vtrace_lambda() <= 1)) {
    return bad("appo.vtrace_lambda ", config.vtrace_lambda(), ": must be in [0, 1]");
  }
  if (!(config.target_kl() >= 0) || std::isinf(config.target_kl())) {
    return bad("appo.target_kl ", config.target_kl(), ": must be finite and >= 0 (0 = off)");
  }
  if (config.max_policy_lag() < 1) return bad("appo.max_policy_lag ", config.max_policy_lag(), ": must be >= 1");
  if (!(config.reward_scale() > 0) || std::isinf(config.reward_scale())) {
    return bad("appo.reward_scale ", config.reward_scale(), ": must be finite and > 0");
  }
  if (!(std::abs(config.initial_log_std()) <= 5)) {
    return bad("appo.initial_log_std ", config.initial_log_std(), ": must be in [-5, 5]");
  }
  if (config.has_min_log_std() && !(std::abs(config.min_log_std()) <= 5)) {
    return bad("appo.min_log_std ", config.min_log_std(), ": must be in [-5, 5]");
  }
  return absl::OkStatus();
}

namespace internal {

AppoNetworks AppoNetworks::Declare(nn::ParameterSet& params, const config::AppoConfig& config,
                                   const ObservationSpec& spec, int action_size) {
  const std::vector<int64_t> hidden = AppoHiddenSizes(config);
  AppoNetworks n;
  n.pixels = spec.pixels();
  if (n.pixels) n.encoder = Encoder::Declare(params, spec, config.conv_channels(), config.encoder_features());
  const int64_t input = n.pixels ? config.encoder_features() : spec.state_size;
  auto sizes = [&](int64_t out) {
    std::vector<int64_t> s = {input};
    s.insert(s.end(), hidden.begin(), hidden.end());
    s.push_back(out);
    return s;
  };
  n.policy = Mlp::Declare(params, "policy", sizes(action_size), /*tanh_output=*/false);
  n.log_std = params.Add("policy.log_std", {1, action_size}, nn::Init::Constant(config.initial_log_std()));
  n.value = Mlp::Declare(params, "value", sizes(1), /*tanh_output=*/false);
  return n;
}

nn::Var AppoNetworks::Features(nn::Tape& tape, Weights weights, nn::Var observation) const {
  return pixels ? encoder(tape, weights, observation) : observation;
}

nn::Var AppoNetworks::Mean(nn::Tape& tape, Weights weights, nn::Var features) const {
  return nn::Scale(nn::Tanh(nn::Scale(policy(tape, weights, features), 1.0f / kMeanBound)), kMeanBound);
}

std::vector<int64_t> AppoHiddenSizes(const config::AppoConfig& config) {
  if (config.hidden_size() == 0) return {64, 64};
  return std::vector<int64_t>(config.hidden().begin(), config.hidden().end());
}

float PreSquash(float action) {
  constexpr float kBound = 1.0f - 1e-6f;
  return std::atanh(std::clamp(action, -kBound, kBound));
}

double GaussianLogDensity(const float* u, const float* mean, const float* log_std, int n) {
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    const double z = (double(u[j]) - mean[j]) * std::exp(-double(log_std[j]));
    sum += -0.5 * z * z - log_std[j] - 0.5 * std::log(2 * std::numbers::pi);
  }
  return sum;
}

float ObservationStd(double variance) { return static_cast<float>(std::sqrt(variance + 1e-8)); }

void NormalizeObservations(const float* x, int64_t rows, int64_t size, const float* mean, const float* std,
                           float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < size; ++j) {
      out[r * size + j] = std::clamp((x[r * size + j] - mean[j]) / std[j], -kObservationClip, kObservationClip);
    }
  }
}

std::string AppoModelEntry(const std::string& parameter) {
  return absl::StrCat(nn::kParameterEntryPrefix, "model/", parameter);
}

}  // namespace internal

// --- AppoPolicy ------------------------------------------------------------------

AppoPolicy::AppoPolicy(const config::AppoConfig& config, const ObservationSpec& spec, int action_size,
                       std::unique_ptr<nn::Backend> backend)
    : config_(config), spec_(spec), action_size_(action_size), backend_(std::move(backend)), tape_(backend_.get()) {}

absl::StatusOr<std::unique_ptr<AppoPolicy>> AppoPolicy::Create(const config::AppoConfig& config,
                                                               const ObservationSpec& spec, int action_size,
                                                               int num_threads) {
  RETURN_IF_ERROR(ValidateAppo(config, spec, action_size));
  std::unique_ptr<AppoPolicy> policy(
      new AppoPolicy(config, spec, action_size, std::make_unique<nn::CpuBackend>(std::max(1, num_threads))));
  policy->networks_ = internal::AppoNetworks::Declare(policy->params_, config, spec, action_size);
  policy->params_.Allocate(*policy->backend_, /*seed=*/0, 1, /*gradients=*/false);  // inference only
  policy->mean_.assign(spec.state_size, 0.0f);
  policy->std_.assign(spec.state_size, 1.0f);
  policy->ReadLogStd();
  return policy;
}

int64_t AppoPolicy::num_parameters() const { return params_.total_floats() + 2 * spec_.state_size; }

absl::Status AppoPolicy::SetParameters(std::span<const float> parameters) {
  if (static_cast<int64_t>(parameters.size()) != num_parameters()) {
    return absl::InvalidArgumentError(absl::StrCat("policy parameters: got ", parameters.size(), " floats, expected ",
                                                   num_parameters(),
                                                   " (is the learner's appo config the same as this policy's?)"));
  }
  const int64_t model = params_.total_floats(), s = spec_.state_size;
  for (int64_t j = 0; j < s; ++j) {
    if (!(parameters[model + s + j] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy parameters: observation standard deviation ", j, " is ", parameters[model + s + j]));
    }
  }
  RETURN_IF_ERROR(params_.UploadValues(parameters.subspan(0, model)));
  mean_.assign(parameters.begin() + model, parameters.begin() + model + s);
  std_.assign(parameters.begin() + model + s, parameters.end());
  ReadLogStd();
  return absl::OkStatus();
}

std::vector<float> AppoPolicy::DownloadParameters() const {
  std::vector<float> all = params_.DownloadValues();
  all.insert(all.end(), mean_.begin(), mean_.end());
  all.insert(all.end(), std_.begin(), std_.end());
  return all;
}

void AppoPolicy::ReadLogStd() {
  log_std_.resize(action_size_);
  backend_->Download(params_.value(networks_.log_std).data, log_std_.data(), sizeof(float) * action_size_);
}

absl::StatusOr<int64_t> AppoPolicy::LoadAgentCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> tensors, nn::ReadCheckpoint(path));
  auto find = [&](const std::string& name, const nn::Shape& shape) {
    return nn::FindCheckpointEntry(tensors, path, name, &shape);
  };
  // Everything checked before anything is set.
  std::vector<const nn::CheckpointTensor*> sources;
  for (int i = 0; i < params_.size(); ++i) {
    ASSIGN_OR_RETURN(const nn::CheckpointTensor* t,
                     find(internal::AppoModelEntry(params_.info(i).name), params_.info(i).shape));
    sources.push_back(t);
  }
  // The observation normaliser (state only).
  const nn::Shape state{spec_.state_size};
  const nn::CheckpointTensor *mean = nullptr, *var = nullptr;
  if (!spec_.pixels()) {
    ASSIGN_OR_RETURN(mean, find(internal::kAppoNormalizerMean, state));
    ASSIGN_OR_RETURN(var, find(internal::kAppoNormalizerVar, state));
  }
  ASSIGN_OR_RETURN(const nn::CheckpointTensor* counters, find(internal::kAppoCounters, nn::Shape{6}));
  for (int i = 0; i < params_.size(); ++i) {
    backend_->Upload(sources[i]->values.data(), params_.value(i).data, sizeof(float) * sources[i]->values.size());
  }
  if (mean != nullptr) {
    mean_ = mean->values;
    std_.resize(spec_.state_size);
    for (int64_t j = 0; j < spec_.state_size; ++j) std_[j] = internal::ObservationStd(var->values[j]);
  }
  ReadLogStd();
  return nn::Int64sOf(*counters)[0];
}

nn::Var AppoPolicy::Input(const float* state, const uint8_t* pixels, int batch) {
  const internal::Weights weights{&params_, false};
  if (spec_.pixels()) return networks_.Features(tape_, weights, internal::PixelInput(tape_, pixels, batch, spec_));
  normalized_.resize(size_t(batch) * spec_.state_size);
  internal::NormalizeObservations(state, batch, spec_.state_size, mean_.data(), std_.data(), normalized_.data());
  return tape_.Input(normalized_.data(), {batch, spec_.state_size});
}

absl::Status AppoPolicy::DownloadMeans(const float* state, const uint8_t* pixels, int batch) {
  RETURN_IF_ERROR(CheckActInputs(spec_, state, pixels, batch));
  tape_.Reset();
  const nn::Var mean = networks_.Mean(tape_, internal::Weights{&params_, false}, Input(state, pixels, batch));
  host_mean_.resize(size_t(batch) * action_size_);
  backend_->Download(tape_.data(mean).data, host_mean_.data(), sizeof(float) * host_mean_.size());
  return absl::OkStatus();
}

absl::Status AppoPolicy::Act(const float* state, const uint8_t* pixels, int batch, float* actions) {
  RETURN_IF_ERROR(DownloadMeans(state, pixels, batch));
  for (size_t i = 0; i < host_mean_.size(); ++i) actions[i] = std::tanh(host_mean_[i]);
  return absl::OkStatus();
}

absl::Status AppoPolicy::Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint&,
                                 std::mt19937_64& rng, float* actions, float* log_probs) {
  RETURN_IF_ERROR(DownloadMeans(state, pixels, batch));
  host_u_.resize(action_size_);
  for (int b = 0; b < batch; ++b) {
    const float* m = &host_mean_[size_t(b) * action_size_];
    float* a = actions + size_t(b) * action_size_;
    for (int j = 0; j < action_size_; ++j) {
      a[j] = std::tanh(m[j] + std::exp(log_std_[j]) * gaussian_(rng));
      host_u_[j] = internal::PreSquash(a[j]);
    }
    if (log_probs != nullptr) {
      log_probs[b] = static_cast<float>(internal::GaussianLogDensity(host_u_.data(), m, log_std_.data(), action_size_));
    }
  }
  return absl::OkStatus();
}

absl::Status AppoPolicy::Values(const float* state, const uint8_t* pixels, int batch, float* values) {
  RETURN_IF_ERROR(CheckActInputs(spec_, state, pixels, batch));
  tape_.Reset();
  const nn::Var v = networks_.value(tape_, internal::Weights{&params_, false}, Input(state, pixels, batch));
  backend_->Download(tape_.data(v).data, values, sizeof(float) * batch);
  for (int b = 0; b < batch; ++b) values[b] /= config_.reward_scale();
  return absl::OkStatus();
}

std::string AppoPolicy::DescribeExploration(const ExplorationPoint&) const {
  double sum = 0;
  for (float l : log_std_) sum += std::exp(l);
  return absl::StrFormat("std %.2f", sum / std::max(1, action_size_));
}

}  // namespace troupe::agents
