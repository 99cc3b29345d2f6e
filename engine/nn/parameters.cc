#include "engine/nn/parameters.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::nn {

Init Init::FanIn(int64_t fan_in) { return Uniform(1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(1, fan_in)))); }

int ParameterSet::Add(std::string name, Shape shape, Init init) {
  TROUPE_CHECK(!allocated());
  TROUPE_CHECK(Find(name) < 0);
  params_.push_back({std::move(name), shape, total_, init});
  total_ += (shape.size() + 15) / 16 * 16;
  return static_cast<int>(params_.size()) - 1;
}

int ParameterSet::Find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void ParameterSet::Allocate(Backend& backend, uint64_t seed, int64_t pad_multiple, bool gradients) {
  TROUPE_CHECK(!allocated() && pad_multiple >= 1);
  const int64_t floats = std::max<int64_t>((total_ + pad_multiple - 1) / pad_multiple * pad_multiple, 1);
  backend_ = &backend;
  padded_ = floats;
  gradients_ = gradients;
  AllocateBuffers();
  // Initialised on the host (the same values on every backend), uploaded once.
  std::vector<float> host(floats, 0.0f);
  std::mt19937_64 rng(seed);
  for (const ParameterInfo& p : params_) {
    float* v = host.data() + p.offset;
    const int64_t n = p.shape.size();
    switch (p.init.kind) {
      case Init::kZeros:
        break;
      case Init::kConstant:
        std::fill(v, v + n, p.init.a);
        break;
      case Init::kUniform: {
        std::uniform_real_distribution<float> d(-p.init.a, p.init.a);
        for (int64_t i = 0; i < n; ++i) v[i] = d(rng);
        break;
      }
      case Init::kNormal: {
        std::normal_distribution<float> d(0.0f, p.init.a);
        for (int64_t i = 0; i < n; ++i) v[i] = d(rng);
        break;
      }
    }
  }
  values_.Upload(host);
}

void ParameterSet::ReleaseBuffers() {
  values_ = DeviceBuffer();
  grads_ = DeviceBuffer();
}

void ParameterSet::AllocateBuffers() {
  TROUPE_CHECK(allocated());
  if (values_.empty()) values_ = DeviceBuffer(*backend_, padded_);
  if (gradients_ && grads_.empty()) {
    grads_ = DeviceBuffer(*backend_, padded_);
    backend_->Fill(grads_.data(), padded_, 0.0f);
  }
}

std::vector<float> ParameterSet::DownloadValues() const {
  TROUPE_CHECK(holds_buffers());
  std::vector<float> host(static_cast<size_t>(total_));
  values_.Download(host);
  return host;
}

absl::Status ParameterSet::UploadValues(std::span<const float> host) {
  TROUPE_CHECK(holds_buffers());
  if (static_cast<int64_t>(host.size()) != total_) {
    return absl::InvalidArgumentError(absl::StrCat("parameters: got ", host.size(), " floats, expected ", total_));
  }
  values_.Upload(host);
  return absl::OkStatus();
}

void ParameterSet::ZeroGrad() {
  if (!grads_.empty()) backend().Fill(grads_.data(), grads_.size(), 0.0f);
}

absl::Status ParameterSet::CheckSameLayout(const ParameterSet& other) const {
  const size_t n = std::min(params_.size(), other.params_.size());
  for (size_t i = 0; i < n; ++i) {
    if (params_[i].name != other.params_[i].name) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " is named '", other.params_[i].name,
                                                     "', expected '", params_[i].name, "'"));
    }
    if (params_[i].shape != other.params_[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", params_[i].name, "' has shape ",
                                                     other.params_[i].shape.ToString(), ", expected ",
                                                     params_[i].shape.ToString()));
    }
  }
  if (params_.size() != other.params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", other.params_.size(), " parameters, expected ",
                                                   params_.size()));
  }
  return absl::OkStatus();
}

absl::Status ParameterSet::CopyValuesFrom(const ParameterSet& other) {
  RETURN_IF_ERROR(CheckSameLayout(other));
  if (&other.backend() == &backend()) {
    backend().Copy(other.values_.data(), values_.data(), total_);
    return absl::OkStatus();
  }
  return UploadValues(other.DownloadValues());
}

}  // namespace troupe::nn
