#include "gan/networks.h"

#include <algorithm>

#include "common/status_macros.h"
#include "gan/spectral_norm.h"

namespace troupe::gan {
namespace {

// A parameter as a trainable leaf, or as a constant (no gradient, no backward work).
nn::Var Param(nn::Tape& tape, nn::ParameterSet& params, int index, bool trainable) {
  if (trainable) return tape.Parameter(params, index);
  return tape.Constant(params.value(index).data, params.info(index).shape);
}

}  // namespace

Generator::Generator(nn::ParameterSet& params, int noise_size, int channels, int parts)
    : noise_size_(noise_size), channels_(channels), parts_(parts) {
  TROUPE_CHECK(parts >= 1 && (2 * channels) % parts == 0);
  const int64_t c = channels, split = 2 * c / parts;  // a part's projected channels
  fc_w_ = params.Add("g.fc.w", {noise_size, split * 49}, nn::Init::FanIn(noise_size));
  bn0_gamma_ = params.Add("g.bn0.gamma", {split}, nn::Init::Constant(1.0f));
  bn0_beta_ = params.Add("g.bn0.beta", {split}, nn::Init::Zeros());
  up1_w_ = params.Add("g.up1.w", {split, c, 4, 4}, nn::Init::FanIn(2 * c * 4));
  bn1_gamma_ = params.Add("g.bn1.gamma", {c}, nn::Init::Constant(1.0f));
  bn1_beta_ = params.Add("g.bn1.beta", {c}, nn::Init::Zeros());
  up2_w_ = params.Add("g.up2.w", {c, 1, 4, 4}, nn::Init::FanIn(c * 4));
  up2_b_ = params.Add("g.up2.b", {1}, nn::Init::Zeros());
}

nn::Var Generator::Forward(nn::Tape& tape, nn::ParameterSet& params, nn::Var z, bool trainable,
                           nn::CrossReplicaSum* cross_replica, nn::CrossReplicaSum* model) const {
  TROUPE_CHECK(parts_ == 1 || model != nullptr);
  const int64_t c = channels_;
  const int64_t n = tape.value(z).shape[0];
  const nn::BatchNormState no_running_stats{};
  // Project and reshape to [n, 2c, 7, 7] (a part: its 2c/M channels, a
  // column-parallel layer).
  if (parts_ > 1) z = nn::CopyToModelParallel(z, model);
  nn::Var h = nn::Linear(z, Param(tape, params, fc_w_, trainable), nn::Var{});
  h = nn::Reshape(h, {n, 2 * c / parts_, 7, 7});
  h = nn::Relu(nn::BatchNorm(h, Param(tape, params, bn0_gamma_, trainable), Param(tape, params, bn0_beta_, trainable),
                             no_running_stats, /*training=*/true, 1e-5f, cross_replica));
  // 7x7 -> 14x14 (a part: from its channels, the parts' outputs summed, a
  // row-parallel layer; no bias).
  h = nn::ConvTranspose2d(h, Param(tape, params, up1_w_, trainable), nn::Var{}, /*stride=*/2, /*pad=*/1);
  if (parts_ > 1) h = nn::ReduceFromModelParallel(h, model);
  h = nn::Relu(nn::BatchNorm(h, Param(tape, params, bn1_gamma_, trainable), Param(tape, params, bn1_beta_, trainable),
                             no_running_stats, /*training=*/true, 1e-5f, cross_replica));
  // 14x14 -> 28x28 in [-1, 1].
  h = nn::ConvTranspose2d(h, Param(tape, params, up2_w_, trainable), Param(tape, params, up2_b_, trainable),
                          /*stride=*/2, /*pad=*/1);
  return nn::Tanh(h);
}

Generator::Split Generator::split(int index) const {
  if (index == fc_w_) return Split::kColumns;
  if (index == bn0_gamma_ || index == bn0_beta_ || index == up1_w_) return Split::kRows;
  return Split::kWhole;
}

void Generator::CopyPart(const nn::ParameterSet& whole, std::span<float> whole_buffer,
                         const nn::ParameterSet& part_set, std::span<float> part_buffer, int part,
                         bool to_whole) const {
  TROUPE_CHECK(whole.size() == part_set.size() && part >= 0 && part < parts_);
  for (int i = 0; i < whole.size(); ++i) {
    const nn::Shape& shape = whole.info(i).shape;
    float* w = whole_buffer.data() + whole.info(i).offset;
    float* p = part_buffer.data() + part_set.info(i).offset;
    const int64_t n = part_set.info(i).shape.size();
    TROUPE_CHECK(whole.info(i).offset + shape.size() <= static_cast<int64_t>(whole_buffer.size()) &&
                 part_set.info(i).offset + n <= static_cast<int64_t>(part_buffer.size()));
    // The part's floats as (rows, block) of the whole's (rows, columns).
    int64_t rows = 1, block = n, columns = n, first = 0;
    switch (split(i)) {
      case Split::kWhole:
        break;
      case Split::kRows:
        first = part * n;  // a block of the leading dimension is contiguous
        columns = block = n;
        break;
      case Split::kColumns:
        rows = shape[0];
        columns = shape.size() / rows;
        block = columns / parts_;
        first = part * block;
        break;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* at_whole = w + r * columns + first;
      float* at_part = p + r * block;
      if (to_whole) {
        std::copy(at_part, at_part + block, at_whole);
      } else {
        std::copy(at_whole, at_whole + block, at_part);
      }
    }
  }
}

Discriminator::Discriminator(nn::ParameterSet& params, nn::ParameterSet& power_vectors, int channels)
    : channels_(channels) {
  const int64_t c = channels;
  auto sn = [&](const std::string& name, nn::Shape shape, int64_t fan_in) {
    SnWeight w;
    w.w = params.Add(name + ".w", shape, nn::Init::FanIn(fan_in));
    const int64_t rows = shape[0], cols = shape.size() / rows;
    w.u = power_vectors.Add(name + ".u", {rows}, nn::Init::Normal(1.0f));
    w.v = power_vectors.Add(name + ".v", {cols}, nn::Init::Normal(1.0f));
    return w;
  };
  c1_ = sn("d.c1", {c, 1, 4, 4}, 16);
  c1_b_ = params.Add("d.c1.b", {c}, nn::Init::FanIn(16));
  c2_ = sn("d.c2", {2 * c, c, 4, 4}, c * 16);
  c2_b_ = params.Add("d.c2.b", {2 * c}, nn::Init::FanIn(c * 16));
  fc_ = sn("d.fc", {2 * c * 49, 1}, 2 * c * 49);
  fc_b_ = params.Add("d.fc.b", {1}, nn::Init::FanIn(2 * c * 49));
}

nn::Var Discriminator::Weight(nn::Tape& tape, nn::ParameterSet& params, nn::ParameterSet& power_vectors,
                              const SnWeight& w, bool trainable, int power_iterations) const {
  return SpectralNorm(Param(tape, params, w.w, trainable), power_vectors.value(w.u).data,
                      power_vectors.value(w.v).data, power_iterations);
}

nn::Var Discriminator::Forward(nn::Tape& tape, nn::ParameterSet& params, nn::ParameterSet& power_vectors, nn::Var x,
                               bool trainable, int power_iterations) const {
  // 28x28 -> 14x14 -> 7x7 -> one score.
  nn::Var h = nn::Conv2d(x, Weight(tape, params, power_vectors, c1_, trainable, power_iterations),
                         Param(tape, params, c1_b_, trainable), /*stride=*/2, /*pad=*/1);
  h = nn::LeakyRelu(h, 0.2f);
  h = nn::Conv2d(h, Weight(tape, params, power_vectors, c2_, trainable, power_iterations),
                 Param(tape, params, c2_b_, trainable), /*stride=*/2, /*pad=*/1);
  h = nn::LeakyRelu(h, 0.2f);
  return nn::Linear(nn::Flatten(h), Weight(tape, params, power_vectors, fc_, trainable, power_iterations),
                    Param(tape, params, fc_b_, trainable));
}

}  // namespace troupe::gan
