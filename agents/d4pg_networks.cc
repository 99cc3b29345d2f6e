#include "agents/d4pg_networks.h"

#include <array>
#include <cstring>
#include <string>

#include "agents/d4pg_policy.h"
#include "common/status_macros.h"
#include "engine/nn/ops.h"

namespace troupe::agents::internal {

Encoder Encoder::Declare(nn::ParameterSet& params, const ObservationSpec& spec, int channels, int features) {
  Encoder e;
  int64_t in = 3 * spec.frames, h = spec.height, w = spec.width;
  for (int i = 0; i < 4; ++i) {
    const int64_t stride = i == 0 ? 2 : 1;
    e.convs.push_back(nn::Conv2dLayer::Create(params, "encoder.conv" + std::to_string(i), in, channels,
                                              /*kernel=*/3, stride, /*pad=*/0));
    in = channels;
    h = (h - 3) / stride + 1;
    w = (w - 3) / stride + 1;
  }
  TROUPE_CHECK(h >= 1 && w >= 1);
  e.linear = nn::LinearLayer::Create(params, "encoder.linear", channels * h * w, features);
  e.norm = nn::LayerNormLayer::Create(params, "encoder.norm", features);
  e.features = features;
  return e;
}

nn::Var Encoder::operator()(nn::Tape& tape, Weights weights, nn::Var pixels) const {
  nn::Var h = pixels;
  // Convolutions with ReLU (fused into the kernel).
  for (const nn::Conv2dLayer& conv : convs) {
    h = nn::Conv2d(h, weights(tape, conv.w), weights(tape, conv.b), conv.stride, conv.pad, nn::FusedActivation::kRelu);
  }
  // Linear, layer norm, tanh (DrQ's trunk).
  h = nn::Linear(nn::Flatten(h), weights(tape, linear.w), weights(tape, linear.b));
  h = nn::LayerNorm(h, weights(tape, norm.gamma), weights(tape, norm.beta));
  return nn::Tanh(h);
}

std::vector<int64_t> HiddenSizes(const config::D4pgConfig& config) {
  if (config.hidden_size() == 0) return {256, 256};
  return std::vector<int64_t>(config.hidden().begin(), config.hidden().end());
}

Mlp DeclareActor(nn::ParameterSet& params, int64_t feature_size, const std::vector<int64_t>& hidden,
                 int action_size) {
  std::vector<int64_t> sizes = {feature_size};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(action_size);
  return Mlp::Declare(params, "actor", sizes, /*tanh_output=*/true);
}

Mlp DeclareCritic(nn::ParameterSet& params, int64_t feature_size, const std::vector<int64_t>& hidden,
                  int action_size, int atoms, int parts, int part) {
  std::vector<int64_t> sizes = {feature_size + action_size};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(atoms);
  return Mlp::Declare(params, "critic", sizes, /*tanh_output=*/false, parts, part);
}

nn::Var ApplyCritic(const Mlp& critic, nn::Tape& tape, Weights weights, nn::Var features, nn::Var action,
                    nn::CrossReplicaSum* group) {
  const std::array<nn::Var, 2> inputs = {features, action};
  return critic(tape, weights, nn::Concat(inputs, /*axis=*/1), group);
}

bool TrainedWithCritic(const std::string& policy_parameter) { return policy_parameter.starts_with("encoder."); }

std::string AgentCheckpointName(const std::string& policy_parameter) {
  return (TrainedWithCritic(policy_parameter) ? "critic/" : "actor/") + policy_parameter;
}

nn::Var PixelInput(nn::Tape& t, const uint8_t* pixels, int64_t batch, const ObservationSpec& spec) {
  const nn::Var frames = nn::ImagesToFloat(t, pixels, batch * spec.frames, spec.height, spec.width, /*channels=*/3,
                                           /*scale=*/1.0f / 255.0f);
  return nn::Reshape(frames, {batch, 3 * spec.frames, spec.height, spec.width});
}

}  // namespace troupe::agents::internal
