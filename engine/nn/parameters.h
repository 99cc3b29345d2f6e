// A model's parameters in one contiguous buffer (llm.c's
// malloc_and_point_parameters): declare every tensor with a name, shape and
// initialiser, then Allocate() makes one value buffer and one gradient buffer
// with the same layout in a backend's memory, and each parameter is a view
// into them. A checkpoint, a parameter broadcast and a gradient all-reduce
// are each one buffer. The buffers are device memory (backend.h): kernels
// use them, the host reads and writes them only through DownloadValues and
// UploadValues.
//
// Not thread-safe; a ParameterSet belongs to one replica.
#ifndef TROUPE_ENGINE_NN_PARAMETERS_H_
#define TROUPE_ENGINE_NN_PARAMETERS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/nn/backend.h"
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

  // Allocates values and gradients (zeroed) in `backend`'s memory, runs every
  // initialiser from `seed` on the host and uploads the values. Parameters
  // may not be added afterwards. Same seed, same values, on every backend.
  // `backend` must outlive the set. `pad_multiple`: the buffers are made
  // padded_floats() long, total_floats() rounded up to a multiple of it,
  // the padding zero (K equal parts for a sharded optimizer's collectives).
  // `gradients` false: no gradient buffer (a set no tape differentiates,
  // such as a target network: grad() and device_grads() are then not to be
  // used, and ZeroGrad does nothing).
  void Allocate(Backend& backend, uint64_t seed, int64_t pad_multiple = 1, bool gradients = true);
  bool allocated() const { return backend_ != nullptr; }
  Backend& backend() const { return *backend_; }

  // Parameters split across replicas (ZeRO stage 3,
  // replicator::ShardedParameters): the whole buffers exist only while a
  // step uses them. ReleaseBuffers frees both (ReleaseGradients the
  // gradients alone); AllocateBuffers makes them again at their length,
  // values uninitialised and gradients zero. The layout, the padding and
  // allocated() stay; views taken before a release dangle after it.
  void ReleaseBuffers();
  void ReleaseGradients() { grads_ = DeviceBuffer(); }
  void AllocateBuffers();
  bool holds_buffers() const { return !values_.empty(); }
  bool has_gradients() const { return gradients_; }  // Allocate's `gradients`

  int size() const { return static_cast<int>(params_.size()); }
  const ParameterInfo& info(int i) const { return params_[i]; }
  const std::vector<ParameterInfo>& infos() const { return params_; }
  // Index of the parameter called `name`, or -1.
  int Find(const std::string& name) const;

  // Views of parameter i in device memory (for kernels and the tape).
  TensorView value(int i) const { return {values_.data() + params_[i].offset, params_[i].shape}; }
  TensorView grad(int i) const {
    TROUPE_CHECK(!grads_.empty());  // a set allocated without gradients
    return {grads_.data() + params_[i].offset, params_[i].shape};
  }
  // The whole buffers in device memory (total_floats() long, alignment
  // padding included, which stays zero).
  float* device_values() const { return values_.data(); }
  float* device_grads() const { return grads_.data(); }
  int64_t total_floats() const { return total_; }
  // The buffers' length: total_floats() and Allocate's padding (zero).
  int64_t padded_floats() const { return padded_; }

  // A host copy of the whole value buffer (one Download of total_floats()),
  // and the values set from the host (one Upload; InvalidArgument naming
  // both sizes unless `host` has total_floats() floats).
  std::vector<float> DownloadValues() const;
  absl::Status UploadValues(std::span<const float> host);

  // Gradients to zero, with a backend kernel.
  void ZeroGrad();
  // Copies another set's values (a kernel on one backend, a download and an
  // upload across two); the layouts (names, shapes) must match.
  absl::Status CopyValuesFrom(const ParameterSet& other);
  // OK iff names and shapes match in order; otherwise says the first mismatch.
  absl::Status CheckSameLayout(const ParameterSet& other) const;

 private:
  std::vector<ParameterInfo> params_;
  int64_t total_ = 0;
  int64_t padded_ = 0;
  Backend* backend_ = nullptr;  // Allocate's
  bool gradients_ = false;      // Allocate's
  DeviceBuffer values_;
  DeviceBuffer grads_;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_PARAMETERS_H_
