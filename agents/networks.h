// What every agent's networks are built from: a weights handle that reads a
// ParameterSet trainably or as constants (so one network definition serves
// training, targets and inference), an MLP, and the optimizer wrapper that
// clips the averaged gradients by global norm.
//
// Internal to agents/.
#ifndef TROUPE_AGENTS_NETWORKS_H_
#define TROUPE_AGENTS_NETWORKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/nn/layers.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"

namespace troupe::agents::internal {

// Where a pass reads a network's weights from.
struct Weights {
  nn::ParameterSet* set = nullptr;
  // true: tape parameters (gradients accumulate into set->grads());
  // false: constants (no gradient, no recorded nodes).
  bool trainable = false;
  nn::Var operator()(nn::Tape& tape, int index) const;
};

// Linear layers, ReLU between them; `tanh_output` squashes the last one.
struct Mlp {
  std::vector<nn::LinearLayer> layers;
  bool tanh_output = false;
  static Mlp Declare(nn::ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes,
                     bool tanh_output);
  nn::Var operator()(nn::Tape& tape, Weights weights, nn::Var x) const;
  // The last layer's output before the tanh (tanh_output only).
  nn::Var PreTanh(nn::Tape& tape, Weights weights, nn::Var x) const;
};

// Clips the (already averaged) gradients by global norm (max_norm 0: not
// at all), then steps the inner optimizer: a replicator::ReplicatedOptimizer
// around it reduces first, so every replica clips the same averaged gradient.
class ClippedOptimizer final : public nn::ForwardingOptimizer {
 public:
  ClippedOptimizer(nn::Optimizer* inner, nn::Backend* backend, float max_norm)
      : ForwardingOptimizer(inner), backend_(backend), max_norm_(max_norm) {}
  void Apply() override;

 private:
  nn::Backend* backend_;
  float max_norm_;
};

// splitmix64 (Steele et al. 2014): a well-mixed seed from a few integers.
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace troupe::agents::internal

#endif  // TROUPE_AGENTS_NETWORKS_H_
