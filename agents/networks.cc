#include "agents/networks.h"

#include "engine/nn/ops.h"

namespace troupe::agents::internal {

nn::Var Weights::operator()(nn::Tape& tape, int index) const {
  if (trainable) return tape.Parameter(*set, index);
  return tape.Constant(set->value(index).data, set->info(index).shape);
}

Mlp Mlp::Declare(nn::ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes,
                 bool tanh_output) {
  TROUPE_CHECK(sizes.size() >= 2);
  Mlp m;
  m.tanh_output = tanh_output;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    m.layers.push_back(nn::LinearLayer::Create(params, name + "." + std::to_string(i), sizes[i], sizes[i + 1]));
  }
  return m;
}

nn::Var Mlp::PreTanh(nn::Tape& tape, Weights weights, nn::Var x) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    x = nn::Linear(x, weights(tape, layers[i].w), weights(tape, layers[i].b));
    if (i + 1 < layers.size()) x = nn::Relu(x);
  }
  return x;
}

nn::Var Mlp::operator()(nn::Tape& tape, Weights weights, nn::Var x) const {
  const nn::Var y = PreTanh(tape, weights, x);
  return tanh_output ? nn::Tanh(y) : y;
}

void ClippedOptimizer::Apply() {
  if (max_norm_ > 0) nn::ClipGradientsByGlobalNorm(parameters(), *backend_, max_norm_);
  inner()->Apply();
}

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a;
  for (uint64_t v : {b, c}) {
    x += 0x9e3779b97f4a7c15ull + v;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
  }
  return x;
}

}  // namespace troupe::agents::internal
