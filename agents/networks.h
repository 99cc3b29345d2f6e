// What every agent's networks are built from: a weights handle that reads a
// ParameterSet trainably or as constants (so one network definition serves
// training, targets and inference), an MLP, and the optimizer wrapper that
// clips the averaged gradients by global norm.
//
// Internal to agents/.
#ifndef TROUPE_AGENTS_NETWORKS_H_
#define TROUPE_AGENTS_NETWORKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
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

// Where a parameter of a model's part sits in the whole model's parameter
// of the same name: all of it (kWhole), a block of `count` of its last
// axis's entries from `begin` (kColumns), or of its first axis's (kRows).
struct PartSlice {
  enum Kind { kWhole, kColumns, kRows } kind = kWhole;
  int64_t begin = 0, count = 0;
};
// The part's values from the whole tensor (`whole_shape`), and back.
void CopyPartFromWhole(std::span<const float> whole, const nn::Shape& whole_shape, PartSlice slice,
                       std::span<float> part);
void CopyPartToWhole(std::span<const float> part, const nn::Shape& whole_shape, PartSlice slice,
                     std::span<float> whole);

// Linear layers, ReLU between them; `tanh_output` squashes the last one.
//
// Split over the `parts` replicas of a model-parallel group (Declare with
// parts > 1; this replica is part `part`, `group` the sum over the parts:
// ReplicaContext::model_axis()), the first two layers are Megatron-LM's
// pair: layer 0 column-parallel (the part's block of its outputs), layer 1
// row-parallel (the same block of its inputs; the partial products summed
// over the group, part 0 adding the bias), one sum forward and one
// backward, so a part holds 1/parts of their weights; the layers after them
// are whole on every part. Names and order are the whole MLP's; SliceOf
// says where each of a part's parameters sits in the whole one's.
struct Mlp {
  std::vector<nn::LinearLayer> layers;
  bool tanh_output = false;
  int parts = 1, part = 0;
  // Split (parts > 1): the row-parallel layer's bias enters the sum once,
  // part 0's, through this device vector of its outputs (MakeBiasMask: ones
  // on part 0, zeros on the others), so that every part runs the same
  // kernels on its own data (a PJRT step is one program for all replicas).
  // Required when parts > 1.
  const float* bias_mask = nullptr;
  nn::DeviceBuffer MakeBiasMask(nn::Backend& backend, const nn::ParameterSet& params) const;
  static Mlp Declare(nn::ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes,
                     bool tanh_output, int parts = 1, int part = 0);
  nn::Var operator()(nn::Tape& tape, Weights weights, nn::Var x, nn::CrossReplicaSum* group = nullptr) const;
  // The last layer's output before the tanh (tanh_output only).
  nn::Var PreTanh(nn::Tape& tape, Weights weights, nn::Var x, nn::CrossReplicaSum* group = nullptr) const;
  // Layer `layer`'s weight (or bias) in a part, against the whole MLP's
  // (layer 1's bias is whole on every part; part 0's is the one used).
  PartSlice SliceOf(int layer, bool weight, const nn::ParameterSet& params) const;
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

// ClippedOptimizer for a network split over a model-parallel group (Mlp's
// tensor-parallel pair in its set): the global norm is the whole network's,
// of which the gradient buffer's floats [split_begin, split_end) are this
// part's own (summed over the group: `group`, set per call) and the rest
// (an encoder before them, the layers after) the same on every part
// (counted once).
class SplitClippedOptimizer final : public nn::ForwardingOptimizer {
 public:
  SplitClippedOptimizer(nn::Optimizer* inner, nn::Backend* backend, float max_norm, int64_t split_begin,
                        int64_t split_end, int parts);
  void set_group(nn::CrossReplicaSum* group) { group_ = group; }
  void Apply() override;

 private:
  nn::Backend* backend_;
  float max_norm_;
  int64_t split_begin_, split_end_;
  int parts_;
  nn::CrossReplicaSum* group_ = nullptr;
  nn::DeviceBuffer norm_;  // the squared norms, then the clip's factor; its limit
};

// splitmix64 (Steele et al. 2014): the output of the generator's step from
// state x (x advanced by the golden gamma, then finalized). Inline: the
// random shifts draw four of these a batch row every update, in a loop the
// compiler vectorizes.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// A well-mixed seed from a few integers (splitmix64 steps).
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace troupe::agents::internal

#endif  // TROUPE_AGENTS_NETWORKS_H_
