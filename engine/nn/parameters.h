// A model's parameters in one contiguous buffer (llm.c's
// malloc_and_point_parameters): declare every tensor with a name, shape and
// initialiser, then Allocate() makes one value buffer and one gradient buffer
// with the same layout, and each parameter is a view into them. A checkpoint,
// a parameter broadcast and a gradient all-reduce are each one buffer.
//
// Not thread-safe; a ParameterSet belongs to one replica.
#ifndef TROUPE_ENGINE_NN_PARAMETERS_H_
#define TROUPE_ENGINE_NN_PARAMETERS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/nn/tensor.h"

namespace troupe::nn {

// How a parameter is filled by Allocate().
struct Init {
  enum Kind { kZeros, kConstant, kUniform, kNormal } kind = kZeros;
  float a = 0.0f;  // constant value, uniform bound (U(-a, a)) or normal stddev
  static Init Zeros() { return {kZeros, 0.0f}; }
  static Init Constant(float value) { return {kConstant, value}; }
  static Init Uniform(float bound) { return {kUniform, bound}; }
  static Init Normal(float stddev) { return {kNormal, stddev}; }
  // PyTorch's default for Linear/Conv weights and biases: U(-1/sqrt(fan_in), +).
  static Init FanIn(int64_t fan_in);
};

struct ParameterInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in floats, into values() and grads()
  Init init;
};

class ParameterSet {
 public:
  ParameterSet() = default;
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;
  ParameterSet(ParameterSet&&) = default;
  ParameterSet& operator=(ParameterSet&&) = default;

  // Declares a parameter before Allocate(); returns its index. Names must be
  // unique (checked). Offsets are 16-float aligned.
  int Add(std::string name, Shape shape, Init init);

  // Allocates values and gradients (zeroed) and runs every initialiser from
  // `seed`. Parameters may not be added afterwards. Same seed, same values.
  void Allocate(uint64_t seed);
  bool allocated() const { return !values_.empty(); }

  int size() const { return static_cast<int>(params_.size()); }
  const ParameterInfo& info(int i) const { return params_[i]; }
  const std::vector<ParameterInfo>& infos() const { return params_; }
  // Index of the parameter called `name`, or -1.
  int Find(const std::string& name) const;

  TensorView value(int i) { return {values_.data() + params_[i].offset, params_[i].shape}; }
  TensorView grad(int i) { return {grads_.data() + params_[i].offset, params_[i].shape}; }
  // The whole buffers (including alignment padding, which stays zero).
  std::span<float> values() { return values_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> values() const { return values_; }
  int64_t total_floats() const { return total_; }

  void ZeroGrad();
  // Copies another set's values; the layouts (names, shapes) must match.
  absl::Status CopyValuesFrom(const ParameterSet& other);
  // OK iff names and shapes match in order; otherwise says the first mismatch.
  absl::Status CheckSameLayout(const ParameterSet& other) const;

 private:
  std::vector<ParameterInfo> params_;
  int64_t total_ = 0;
  // Flat storage; std::vector<float> is enough alignment for Eigen's unaligned maps.
  std::vector<float> values_;
  std::vector<float> grads_;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_PARAMETERS_H_
