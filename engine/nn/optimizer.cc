#include "engine/nn/optimizer.h"

#include <algorithm>
#include <cfloat>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::nn {
namespace {

// Adam's and LAMB's moment settings; `name` prefixes each message.
absl::Status ValidateMoments(const char* name, float beta1, float beta2, float eps, float weight_decay) {
  for (const auto& [which, beta] : {std::pair{"beta1", beta1}, std::pair{"beta2", beta2}}) {
    if (!(beta >= 0 && beta < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " ", which, " ", beta, " not in [0, 1)"));
    }
  }
  if (!(eps > 0)) return absl::InvalidArgumentError(absl::StrCat(name, " eps ", eps, " must be > 0"));
  if (!(weight_decay >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " weight_decay ", weight_decay, " < 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamOptions::Validate() const { return ValidateMoments("adam", beta1, beta2, eps, weight_decay); }

absl::Status SgdOptions::Validate() const {
  if (!(momentum >= 0 && momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("sgd momentum ", momentum, " not in [0, 1)"));
  }
  if (!(weight_decay >= 0)) return absl::InvalidArgumentError(absl::StrCat("sgd weight_decay ", weight_decay, " < 0"));
  return absl::OkStatus();
}

absl::Status LambOptions::Validate() const { return ValidateMoments("lamb", beta1, beta2, eps, weight_decay); }

absl::Status LarsOptions::Validate() const {
  if (!(momentum >= 0 && momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("lars momentum ", momentum, " not in [0, 1)"));
  }
  if (!(weight_decay >= 0)) return absl::InvalidArgumentError(absl::StrCat("lars weight_decay ", weight_decay, " < 0"));
  if (!(trust_coefficient > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("lars trust_coefficient ", trust_coefficient, " must be > 0"));
  }
  return absl::OkStatus();
}

namespace {

// A state buffer with the parameters' layout, zeroed on the device.
DeviceBuffer Zeroed(Backend& backend, int64_t floats) {
  DeviceBuffer buffer(backend, std::max<int64_t>(floats, 1));
  backend.Fill(buffer.data(), buffer.size(), 0.0f);
  return buffer;
}

DeviceBuffer ZeroedLike(const ParameterSet& params, Backend& backend) { return Zeroed(backend, params.total_floats()); }

// beta^step by squaring (a product of beta's powers of two, in double): a
// function of (beta, step) alone, so a loaded optimizer goes on with the
// values a run that never stopped has, without libm's pow, whose tables
// came cold every update (docs/benchmarks/learner.md).
double PowSteps(double beta, int64_t step) {
  double result = 1.0;
  for (double power = beta; step > 0; step >>= 1, power *= power) {
    if (step & 1) result *= power;
  }
  return result;
}

// Adam's bias corrections at `step` (Kingma & Ba 2015): 1 - beta1^step, 1 - beta2^step.
std::array<float, 2> BiasCorrections(float beta1, float beta2, int64_t step) {
  return {1.0f - static_cast<float>(PowSteps(beta1, step)), 1.0f - static_cast<float>(PowSteps(beta2, step))};
}

}  // namespace

Adam::Adam(ParameterSet* params, Backend* backend, AdamOptions options, int64_t part_begin, int64_t part_floats)
    : params_(params), backend_(backend), options_(options), part_begin_(part_begin) {
  TROUPE_CHECK(params->allocated() && &params->backend() == backend);
  if (part_floats < 0) {
    TROUPE_CHECK(part_begin == 0);
    part_floats = params->total_floats();
  }
  TROUPE_CHECK(part_begin >= 0 && part_begin + part_floats <= params->padded_floats());
  m_ = Zeroed(*backend, part_floats);
  v_ = Zeroed(*backend, part_floats);
}

std::array<float, 3> Adam::Hyper(float learning_rate, int64_t step) const {
  const auto [c1, c2] = BiasCorrections(options_.beta1, options_.beta2, step);
  return {learning_rate, c1, c2};
}

void Adam::Prepare(float learning_rate, StepStaging* staging) {
  ++steps_;
  Prepared p{.learning_rate = learning_rate,
             .step = steps_,
             .on_device = backend_->replays_steps() && !backend_->in_step()};
  if (p.on_device && staging != nullptr) {
    // With the step's other inputs: no upload of its own.
    const std::array<float, 3> values = Hyper(learning_rate, steps_);
    p.staging = staging;
    p.offset = staging->Append(values.data(), sizeof(values));
  }
  // A new step's first update: the last step ran (its Applies, or a replay
  // of them that called none), or every update prepared was applied.
  if (backend_->steps_begun() != prepared_for_ || applied_ == prepared_.size()) {
    prepared_.clear();
    applied_ = 0;
    prepared_for_ = backend_->steps_begun();
  }
  const size_t slot = prepared_.size();
  prepared_.push_back(p);
  if (!p.on_device || p.staging != nullptr) return;
  // One upload a step: its first update uploads every slot's values as the
  // step's later updates will have them (the same rate, the next steps);
  // a later update of another rate, or a slot beyond the buffer (a step of
  // more updates than before: it grows), uploads again.
  if (slot > 0 && slot < hyper_for_.size() && hyper_for_[slot] == p) return;
  if (slot >= hyper_for_.size()) {
    hyper_for_.resize(slot + 1);
    hyper_host_.resize(3 * (slot + 1));
    hyper_ = DeviceBuffer(*backend_, static_cast<int64_t>(hyper_host_.size()));
  }
  for (size_t k = slot; k < hyper_for_.size(); ++k) {
    hyper_for_[k] = p;
    hyper_for_[k].step = steps_ + static_cast<int64_t>(k - slot);
    const std::array<float, 3> values = Hyper(learning_rate, hyper_for_[k].step);
    std::copy(values.begin(), values.end(), hyper_host_.begin() + static_cast<std::ptrdiff_t>(3 * k));
  }
  backend_->Upload(hyper_host_.data(), hyper_.data(), sizeof(float) * hyper_host_.size());
}

void Adam::Apply() {
  TROUPE_CHECK(applied_ < prepared_.size());  // an Apply without its Prepare
  const size_t slot = applied_++;
  const Prepared& p = prepared_[slot];
  if (p.on_device) {
    TROUPE_CHECK(p.staging == nullptr || p.staging->device != nullptr);  // its staging uploaded before the step
    const float* hyper = p.staging != nullptr ? p.staging->device + p.offset : hyper_.data() + 3 * slot;
    backend_->AdamUpdateFromDevice(m_.size(), hyper, options_.beta1, options_.beta2, options_.eps,
                                   options_.weight_decay, params_->device_grads() + part_begin_,
                                   params_->device_values() + part_begin_, m_.data(), v_.data());
    return;
  }
  backend_->NotReplayable("Adam's learning rate and bias corrections from the host (Prepare inside the step)");
  const std::array<float, 3> hyper = Hyper(p.learning_rate, p.step);
  backend_->AdamUpdate(m_.size(), hyper[0], options_.beta1, options_.beta2, options_.eps, options_.weight_decay,
                       hyper[1], hyper[2], params_->device_grads() + part_begin_,
                       params_->device_values() + part_begin_, m_.data(), v_.data());
}

std::vector<OptimizerState> Adam::State() { return {{"adam.m", m_.data()}, {"adam.v", v_.data()}}; }

Sgd::Sgd(ParameterSet* params, Backend* backend, SgdOptions options)
    : params_(params), backend_(backend), options_(options) {
  TROUPE_CHECK(params->allocated() && &params->backend() == backend);
  momentum_ = ZeroedLike(*params, *backend);
}

void Sgd::Prepare(float learning_rate, StepStaging*) {
  ++steps_;
  learning_rates_.Push(learning_rate);
}

void Sgd::Apply() {
  const float learning_rate = learning_rates_.Pop();
  backend_->NotReplayable("SGD's learning rate from the host");
  backend_->SgdUpdate(momentum_.size(), learning_rate, options_.momentum, options_.weight_decay,
                      params_->device_grads(), params_->device_values(), momentum_.data());
}

std::vector<OptimizerState> Sgd::State() { return {{"sgd.momentum", momentum_.data()}}; }

Lamb::Lamb(ParameterSet* params, Backend* backend, LambOptions options)
    : params_(params), backend_(backend), options_(options) {
  TROUPE_CHECK(params->allocated() && &params->backend() == backend);
  m_ = ZeroedLike(*params, *backend);
  v_ = ZeroedLike(*params, *backend);
  update_ = ZeroedLike(*params, *backend);
  norms_ = DeviceBuffer(*backend, 3 * params->size());
}

void Lamb::Prepare(float learning_rate, StepStaging*) {
  ++steps_;
  prepared_.Push({learning_rate, steps_});
}

void Lamb::Apply() {
  const auto [learning_rate, step] = prepared_.Pop();
  backend_->NotReplayable("LAMB's learning rate and bias corrections from the host");
  const auto [c1, c2] = BiasCorrections(options_.beta1, options_.beta2, step);
  // update = -(m_hat / (sqrt(v_hat) + eps)): Adam at rate 1 from zero (moments updated).
  backend_->Fill(update_.data(), update_.size(), 0.0f);
  backend_->AdamUpdate(m_.size(), /*lr=*/1.0f, options_.beta1, options_.beta2, options_.eps, /*weight_decay=*/0.0f,
                       c1, c2, params_->device_grads(), update_.data(), m_.data(), v_.data());
  // update = -r = -(adam + lambda * x).
  if (options_.weight_decay > 0) {
    backend_->Axpy(-options_.weight_decay, params_->device_values(), update_.data(), params_->total_floats());
  }
  // Per tensor: x += lr * (||x|| / ||r||) * update.
  for (int i = 0; i < params_->size(); ++i) {
    const ParameterInfo& info = params_->info(i);
    const int64_t n = info.shape.size();
    float* x = params_->device_values() + info.offset;
    float* u = update_.data() + info.offset;
    float* norms = norms_.data() + 3 * i;
    backend_->SquaredNorm(x, n, norms);
    backend_->SquaredNorm(u, n, norms + 1);
    backend_->TrustRatio(norms, norms + 1, /*coefficient=*/1.0f, /*weight_decay=*/0.0f, norms + 2);
    backend_->ScaleByScalar(learning_rate, norms + 2, u, n);
    backend_->Axpy(1.0f, u, x, n);
  }
}

std::vector<OptimizerState> Lamb::State() { return {{"lamb.m", m_.data()}, {"lamb.v", v_.data()}}; }

Lars::Lars(ParameterSet* params, Backend* backend, LarsOptions options)
    : params_(params), backend_(backend), options_(options) {
  TROUPE_CHECK(params->allocated() && &params->backend() == backend);
  momentum_ = ZeroedLike(*params, *backend);
  norms_ = DeviceBuffer(*backend, 3 * params->size());
}

void Lars::Prepare(float learning_rate, StepStaging*) {
  ++steps_;
  learning_rates_.Push(learning_rate);
}

void Lars::Apply() {
  const float learning_rate = learning_rates_.Pop();
  backend_->NotReplayable("LARS's learning rate from the host");
  for (int i = 0; i < params_->size(); ++i) {
    const ParameterInfo& info = params_->info(i);
    const int64_t n = info.shape.size();
    float* w = params_->device_values() + info.offset;
    float* g = params_->device_grads() + info.offset;
    // The local rate from this tensor's norms, on the device.
    float* norms = norms_.data() + 3 * i;
    backend_->SquaredNorm(w, n, norms);
    backend_->SquaredNorm(g, n, norms + 1);
    backend_->TrustRatio(norms, norms + 1, options_.trust_coefficient, options_.weight_decay, norms + 2);
    // g = gamma * local * (g + beta * w); v = m * v + g; w -= v.
    if (options_.weight_decay > 0) backend_->Axpy(options_.weight_decay, w, g, n);
    backend_->ScaleByScalar(learning_rate, norms + 2, g, n);
    backend_->SgdUpdate(n, /*lr=*/1.0f, options_.momentum, /*weight_decay=*/0.0f, g, w, momentum_.data() + info.offset);
  }
}

std::vector<OptimizerState> Lars::State() { return {{"lars.momentum", momentum_.data()}}; }

void ClipGradientsByGlobalNorm(ParameterSet& params, Backend& backend, float max_norm, float* norm) {
  backend.ClipByNorm(params.device_grads(), params.total_floats(), max_norm, norm);
}

void ClipBySquaredNorm(Backend& backend, float max_norm, float* squared_norm, float* limit, float* x, int64_t n) {
  float* factor = squared_norm;
  backend.Unary(UnaryOp::kSqrt, 0, 0, factor, factor, 1);
  backend.Unary(UnaryOp::kClamp, std::max(max_norm, FLT_MIN), std::numeric_limits<float>::infinity(), factor, factor,
                1);
  // A division, as the whole-buffer clip's: exactly 1 below the limit.
  backend.Fill(limit, 1, max_norm);
  backend.BinaryBroadcast(Binary::kDiv, Flat(1), limit, kAllAxes, factor, kAllAxes, factor);
  backend.ScaleByScalar(1.0f, factor, x, n);
}

absl::Status PolyakUpdate(const ParameterSet& online, ParameterSet& target, Backend& backend, float tau) {
  RETURN_IF_ERROR(target.CheckSameLayout(online));
  if (!(tau >= 0 && tau <= 1)) return absl::InvalidArgumentError(absl::StrCat("polyak tau ", tau, " not in [0, 1]"));
  backend.Polyak(online.total_floats(), tau, online.device_values(), target.device_values());
  return absl::OkStatus();
}

}  // namespace troupe::nn
