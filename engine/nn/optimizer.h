// Optimizers over a ParameterSet's flat gradient buffer: one kernel call per
// step over the whole buffer, state buffers with the parameters' layout (so a
// checkpoint can name each parameter's state). Also gradient clipping by
// global norm and Polyak-averaged target copies.
//
// Not thread-safe; one optimizer per replica's ParameterSet.
#ifndef TROUPE_ENGINE_NN_OPTIMIZER_H_
#define TROUPE_ENGINE_NN_OPTIMIZER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "engine/nn/step_staging.h"

namespace troupe::nn {

// A named state buffer with the ParameterSet's layout (total_floats() long),
// in the parameters' backend's memory (a checkpoint downloads it).
struct OptimizerState {
  std::string name;  // "adam.m"
  float* data = nullptr;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of the parameters from their current gradients at
  // `learning_rate`: Prepare, then Apply.
  void Step(float learning_rate) {
    Prepare(learning_rate);
    Apply();
  }
  // The update's two parts, for a step the backend may replay
  // (Backend::RunStep): Prepare is the host's, before the step (it counts
  // the update and, where the backend replays steps, puts the per-step
  // values on the device: into `staging`, the step's other inputs' upload,
  // when the caller gives one and uploads it before the step, else with an
  // upload of its own); Apply issues the update's kernels, inside the
  // step. Several updates in one step: N Prepares, then N Applies, in
  // order (each Apply takes the oldest Prepare not applied). An optimizer
  // whose kernels take per-step values from the host says so in Apply
  // (Backend::NotReplayable): its steps record every time.
  void Prepare(float learning_rate) { Prepare(learning_rate, nullptr); }
  virtual void Prepare(float learning_rate, StepStaging* staging) = 0;
  virtual void Apply() = 0;
  // Updates taken so far (restored by checkpoints).
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;
  virtual std::vector<OptimizerState> State() = 0;
  virtual std::string name() const = 0;
  virtual ParameterSet& parameters() = 0;
};

// An optimizer that wraps another (averages or clips its gradients first):
// everything forwards to the inner one (a decorator overrides Apply, or
// Prepare), whose state and step count
// are the decorator's. `inner` must outlive it.
class ForwardingOptimizer : public Optimizer {
 public:
  explicit ForwardingOptimizer(Optimizer* inner) : inner_(inner) {}
  using Optimizer::Prepare;
  void Prepare(float learning_rate, StepStaging* staging) override { inner_->Prepare(learning_rate, staging); }
  void Apply() override { inner_->Apply(); }
  int64_t steps() const override { return inner_->steps(); }
  void set_steps(int64_t steps) override { inner_->set_steps(steps); }
  std::vector<OptimizerState> State() override { return inner_->State(); }
  std::string name() const override { return inner_->name(); }
  ParameterSet& parameters() override { return inner_->parameters(); }

 protected:
  Optimizer* inner() const { return inner_; }

 private:
  Optimizer* inner_;
};

// What an optimizer's Prepares left for its Applies, oldest first (N
// Prepares, then N Applies, within a step).
template <typename T>
class PreparedQueue {
 public:
  void Push(T value) { values_.push_back(std::move(value)); }
  T Pop() {
    TROUPE_CHECK(!values_.empty());  // an Apply without its Prepare
    T value = std::move(values_.front());
    values_.pop_front();
    return value;
  }

 private:
  std::deque<T> values_;
};

struct AdamOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW) when > 0
  absl::Status Validate() const;
};

// Adam (Kingma & Ba 2015) / AdamW (Loshchilov & Hutter 2019).
class Adam final : public Optimizer {
 public:
  // Over the whole buffer, or over floats [part_begin, part_begin +
  // part_floats) of it only (a sharded optimizer's part, padding included:
  // replicator::ShardedAdam), its moments then part_floats long.
  Adam(ParameterSet* params, Backend* backend, AdamOptions options = {}, int64_t part_begin = 0,
       int64_t part_floats = -1);
  // Where the backend replays steps and Prepare runs outside a step, the
  // learning rate and bias corrections go to the device (AdamUpdateFromDevice):
  // three floats appended to `staging`, or without one in a buffer of its own.
  using Optimizer::Prepare;
  void Prepare(float learning_rate, StepStaging* staging) override;
  void Apply() override;
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t steps) override { steps_ = steps; }
  std::vector<OptimizerState> State() override;
  std::string name() const override { return "adam"; }
  ParameterSet& parameters() override { return *params_; }
  // Floats of state it keeps (both moments).
  int64_t state_floats() const { return m_.size() + v_.size(); }

 private:
  // Update `step`'s lr, c1, c2 (the bias corrections 1 - beta^step).
  std::array<float, 3> Hyper(float learning_rate, int64_t step) const;
  ParameterSet* params_;
  Backend* backend_;
  AdamOptions options_;
  int64_t part_begin_ = 0;
  int64_t steps_ = 0;
  DeviceBuffer m_, v_;  // zeroed by a kernel
  // Prepared updates not yet applied, by slot (the k-th Prepare of a step
  // in slot k): the rate and step, their lr, c1, c2 on the device when
  // on_device (else Apply computes them).
  struct Prepared {
    float learning_rate = 0;
    int64_t step = 0;
    bool on_device = false;
    // Where on_device: in `staging` at `offset` (else in hyper_).
    const StepStaging* staging = nullptr;
    int64_t offset = 0;
    bool operator==(const Prepared&) const = default;
  };
  std::vector<Prepared> prepared_;
  // Slot k's lr, c1, c2 at floats [3k, 3k + 3) on the device, uploaded
  // whole from hyper_host_ (Prepare: once a step where the rate holds),
  // for the update hyper_for_[k] (a later slot that matches uploads nothing).
  DeviceBuffer hyper_;
  std::vector<float> hyper_host_;
  std::vector<Prepared> hyper_for_;  // (its size: the slots the buffer holds)
  size_t applied_ = 0;               // slots of prepared_ applied so far
  uint64_t prepared_for_ = 0;        // the backend's steps_begun() when prepared_ began
};

struct SgdOptions {
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // L2, added to the gradient
  absl::Status Validate() const;
};

// SGD with (heavy-ball) momentum, PyTorch's form.
class Sgd final : public Optimizer {
 public:
  Sgd(ParameterSet* params, Backend* backend, SgdOptions options = {});
  using Optimizer::Prepare;
  void Prepare(float learning_rate, StepStaging* staging) override;
  // Its learning rate is a kernel argument from the host: not replayable.
  void Apply() override;
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t steps) override { steps_ = steps; }
  std::vector<OptimizerState> State() override;
  std::string name() const override { return "sgd"; }
  ParameterSet& parameters() override { return *params_; }

 private:
  ParameterSet* params_;
  Backend* backend_;
  SgdOptions options_;
  int64_t steps_ = 0;
  PreparedQueue<float> learning_rates_;
  DeviceBuffer momentum_;
  DeviceBuffer norms_;  // scratch: per tensor ||w||^2, ||g||^2, the local rate
};

struct LambOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.0f;  // lambda, added to the Adam direction before the trust ratio
  absl::Status Validate() const;
};

// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning:
// Training BERT in 76 minutes", Algorithm 2, phi the identity): per
// parameter tensor, with Adam's bias-corrected moments,
//   r = m_hat / (sqrt(v_hat) + eps) + lambda * x
//   x -= lr * (||x|| / ||r||) * r        (ratio 1 when either norm is 0).
// Built from existing kernels (AdamUpdate into a zeroed scratch buffer gives
// -m_hat / (sqrt(v_hat) + eps)); the norms and the ratio of each tensor stay
// on the device (TrustRatio, ScaleByScalar): no host round trip.
class Lamb final : public Optimizer {
 public:
  Lamb(ParameterSet* params, Backend* backend, LambOptions options = {});
  using Optimizer::Prepare;
  void Prepare(float learning_rate, StepStaging* staging) override;
  // Its learning rate is a kernel argument from the host: not replayable.
  void Apply() override;
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t steps) override { steps_ = steps; }
  std::vector<OptimizerState> State() override;
  std::string name() const override { return "lamb"; }
  ParameterSet& parameters() override { return *params_; }

 private:
  ParameterSet* params_;
  Backend* backend_;
  LambOptions options_;
  int64_t steps_ = 0;
  PreparedQueue<std::pair<float, int64_t>> prepared_;  // (learning rate, step)
  DeviceBuffer m_, v_;
  DeviceBuffer update_;  // scratch: -r, not state
  DeviceBuffer norms_;   // scratch: per tensor ||x||^2, ||r||^2, the trust ratio
};

struct LarsOptions {
  float momentum = 0.9f;
  float weight_decay = 0.0f;        // beta
  float trust_coefficient = 0.001f;  // eta
  absl::Status Validate() const;
};

// LARS (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional
// Networks", Algorithm 1): per parameter tensor, with global rate gamma,
//   local = eta * ||w|| / (||g|| + beta * ||w||)   (1 when ||w|| or ||g|| is 0)
//   v = m * v + gamma * local * (g + beta * w);   w -= v.
// Built from existing kernels (the gradient is scaled in place, then
// SgdUpdate at rate 1); the norms and the local rate stay on the device.
// Leaves the gradient buffer changed.
class Lars final : public Optimizer {
 public:
  Lars(ParameterSet* params, Backend* backend, LarsOptions options = {});
  using Optimizer::Prepare;
  void Prepare(float learning_rate, StepStaging* staging) override;
  // Its learning rate is a kernel argument from the host: not replayable.
  void Apply() override;
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t steps) override { steps_ = steps; }
  std::vector<OptimizerState> State() override;
  std::string name() const override { return "lars"; }
  ParameterSet& parameters() override { return *params_; }

 private:
  ParameterSet* params_;
  Backend* backend_;
  LarsOptions options_;
  int64_t steps_ = 0;
  PreparedQueue<float> learning_rates_;
  DeviceBuffer momentum_;
  DeviceBuffer norms_;  // scratch: per tensor ||w||^2, ||g||^2, the local rate
};

// Scales all gradients so their global L2 norm is at most `max_norm`, on the
// device (no host round trip); `norm` (device memory, may be null) gets the
// norm before clipping.
void ClipGradientsByGlobalNorm(ParameterSet& params, Backend& backend, float max_norm, float* norm = nullptr);
// The same clip where the squared global norm was summed by the caller (over
// a model's parts or the replicas' parts of a buffer): x *= max_norm /
// max(sqrt(*squared_norm), max_norm), exactly 1 below the limit.
// *squared_norm becomes that factor; *limit is scratch (device memory both).
void ClipBySquaredNorm(Backend& backend, float max_norm, float* squared_norm, float* limit, float* x, int64_t n);

// target = (1 - tau) * target + tau * online over the whole buffer (Polyak
// averaging, as deterministic policy gradients' targets). Layouts must match.
absl::Status PolyakUpdate(const ParameterSet& online, ParameterSet& target, Backend& backend, float tau);

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_OPTIMIZER_H_
