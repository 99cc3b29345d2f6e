#include "agents/networks.h"

#include <algorithm>

#include "engine/nn/ops.h"

namespace troupe::agents::internal {

nn::Var Weights::operator()(nn::Tape& tape, int index) const {
  if (trainable) return tape.Parameter(*set, index);
  return tape.Constant(set->value(index).data, set->info(index).shape);
}

Mlp Mlp::Declare(nn::ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes,
                 bool tanh_output, int parts, int part) {
  TROUPE_CHECK(sizes.size() >= 2 && parts >= 1 && part >= 0 && part < parts);
  TROUPE_CHECK(parts == 1 || (sizes.size() >= 3 && sizes[1] % parts == 0));  // the pair, split evenly
  Mlp m;
  m.tanh_output = tanh_output;
  m.parts = parts;
  m.part = part;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const std::string layer = name + "." + std::to_string(i);
    if (parts > 1 && i == 0) {
      const auto column = nn::ColumnParallelLinear::Create(params, layer, sizes[0], sizes[1], parts);
      m.layers.push_back({column.w, column.b});
    } else if (parts > 1 && i == 1) {
      const auto row = nn::RowParallelLinear::Create(params, layer, sizes[1], sizes[2], parts, part);
      m.layers.push_back({row.w, row.b});
    } else {
      m.layers.push_back(nn::LinearLayer::Create(params, layer, sizes[i], sizes[i + 1]));
    }
  }
  return m;
}

nn::Var Mlp::PreTanh(nn::Tape& tape, Weights weights, nn::Var x, nn::CrossReplicaSum* group) const {
  TROUPE_CHECK(parts == 1 || group != nullptr);
  for (size_t i = 0; i < layers.size(); ++i) {
    if (parts > 1 && i == 0) x = nn::CopyToModelParallel(x, group);
    if (parts > 1 && i == 1) {
      // nn::RowParallelLinear's pass, with `weights` (trainable or
      // constants): the partial products, the bias once in their sum (part
      // 0's; the others' masked to zero).
      TROUPE_CHECK(bias_mask != nullptr);  // MakeBiasMask
      const nn::Var mask = tape.Constant(bias_mask, weights.set->info(layers[i].b).shape);
      x = nn::Linear(x, weights(tape, layers[i].w), nn::Mul(weights(tape, layers[i].b), mask));
      x = nn::ReduceFromModelParallel(x, group);
    } else {
      x = nn::Linear(x, weights(tape, layers[i].w), weights(tape, layers[i].b));
    }
    if (i + 1 < layers.size()) x = nn::Relu(x);
  }
  return x;
}

nn::DeviceBuffer Mlp::MakeBiasMask(nn::Backend& backend, const nn::ParameterSet& params) const {
  TROUPE_CHECK(parts > 1);
  const std::vector<float> mask(params.info(layers[1].b).shape.size(), part == 0 ? 1.0f : 0.0f);
  nn::DeviceBuffer buffer(backend, static_cast<int64_t>(mask.size()));
  backend.Upload(mask.data(), buffer.data(), sizeof(float) * mask.size());
  return buffer;
}

nn::Var Mlp::operator()(nn::Tape& tape, Weights weights, nn::Var x, nn::CrossReplicaSum* group) const {
  const nn::Var y = PreTanh(tape, weights, x, group);
  return tanh_output ? nn::Tanh(y) : y;
}

PartSlice Mlp::SliceOf(int layer, bool weight, const nn::ParameterSet& params) const {
  const nn::Shape& shape = params.info(weight ? layers[layer].w : layers[layer].b).shape;
  if (parts == 1 || layer > 1 || (layer == 1 && !weight)) return {};
  // Layer 0's outputs (the last axis of w and b), layer 1's inputs (w's first).
  const int64_t count = layer == 0 ? shape[shape.rank() - 1] : shape[0];
  return {layer == 0 ? PartSlice::kColumns : PartSlice::kRows, part * count, count};
}

namespace {
// Calls each(whole offset, part offset, floats) for the runs a slice's
// values make in the whole tensor (row-major) and in the part.
template <typename F>
void ForEachRun(const nn::Shape& whole, PartSlice slice, F each) {
  const int64_t size = whole.size();
  if (slice.kind == PartSlice::kWhole) return each(0, 0, size);
  const int64_t last = whole[whole.rank() - 1], row_floats = size / whole[0];
  if (slice.kind == PartSlice::kRows) return each(slice.begin * row_floats, 0, slice.count * row_floats);
  for (int64_t row = 0; row < size / last; ++row) each(row * last + slice.begin, row * slice.count, slice.count);
}
}  // namespace

void CopyPartFromWhole(std::span<const float> whole, const nn::Shape& whole_shape, PartSlice slice,
                       std::span<float> part) {
  TROUPE_CHECK(static_cast<int64_t>(whole.size()) == whole_shape.size());
  ForEachRun(whole_shape, slice, [&](int64_t from, int64_t to, int64_t n) {
    TROUPE_CHECK(to + n <= static_cast<int64_t>(part.size()));
    std::copy_n(whole.begin() + from, n, part.begin() + to);
  });
}

void CopyPartToWhole(std::span<const float> part, const nn::Shape& whole_shape, PartSlice slice,
                     std::span<float> whole) {
  TROUPE_CHECK(static_cast<int64_t>(whole.size()) == whole_shape.size());
  ForEachRun(whole_shape, slice, [&](int64_t to, int64_t from, int64_t n) {
    TROUPE_CHECK(from + n <= static_cast<int64_t>(part.size()));
    std::copy_n(part.begin() + from, n, whole.begin() + to);
  });
}

void ClippedOptimizer::Apply() {
  if (max_norm_ > 0) nn::ClipGradientsByGlobalNorm(parameters(), *backend_, max_norm_);
  inner()->Apply();
}

SplitClippedOptimizer::SplitClippedOptimizer(nn::Optimizer* inner, nn::Backend* backend, float max_norm,
                                             int64_t split_begin, int64_t split_end, int parts)
    : ForwardingOptimizer(inner),
      backend_(backend),
      max_norm_(max_norm),
      split_begin_(split_begin),
      split_end_(split_end),
      parts_(parts),
      norm_(*backend, 4) {}

void SplitClippedOptimizer::Apply() {
  if (max_norm_ > 0) {
    TROUPE_CHECK(group_ != nullptr);  // set_group first
    nn::ParameterSet& params = parameters();
    float* grads = params.device_grads();
    float* factor = norm_.data();
    float* rest = norm_.data() + 1;
    float* limit = norm_.data() + 2;
    float* before = norm_.data() + 3;
    // ||part||^2 + ||rest||^2 / M on each part, summed over the M parts.
    backend_->SquaredNorm(grads + split_begin_, split_end_ - split_begin_, factor);
    backend_->SquaredNorm(grads + split_end_, params.padded_floats() - split_end_, rest);
    backend_->Axpy(1.0f / static_cast<float>(parts_), rest, factor, 1);
    if (split_begin_ > 0) {
      backend_->SquaredNorm(grads, split_begin_, before);
      backend_->Axpy(1.0f / static_cast<float>(parts_), before, factor, 1);
    }
    group_->SumOnDevice(*backend_, factor, 1);
    nn::ClipBySquaredNorm(*backend_, max_norm_, factor, limit, grads, params.padded_floats());
  }
  inner()->Apply();
}

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) { return SplitMix64(SplitMix64(a + b) + c); }

}  // namespace troupe::agents::internal
