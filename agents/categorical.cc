#include "agents/categorical.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace troupe::agents {

using nn::Backend;
using nn::Binary;
using nn::Reduction;
using nn::UnaryOp;
using nn::View3;

void CategoricalProjectionRow(std::span<const float> probabilities, float reward, float discount, float v_min,
                              float v_max, std::span<float> out) {
  const int n = static_cast<int>(probabilities.size());
  TROUPE_CHECK(n >= 2 && out.size() == probabilities.size());
  const float dz = (v_max - v_min) / static_cast<float>(n - 1);
  std::fill(out.begin(), out.end(), 0.0f);
  for (int j = 0; j < n; ++j) {
    // Algorithm 1: Tz_j clipped, then split between the atoms below (l) and
    // above (u) it.
    const float tz = std::clamp(reward + discount * (v_min + j * dz), v_min, v_max);
    const float b = std::clamp((tz - v_min) / dz, 0.0f, static_cast<float>(n - 1));
    const int l = static_cast<int>(std::floor(b));
    const int u = static_cast<int>(std::ceil(b));
    if (l == u) {
      out[l] += probabilities[j];
    } else {
      out[l] += probabilities[j] * (static_cast<float>(u) - b);
      out[u] += probabilities[j] * (b - static_cast<float>(l));
    }
  }
}

void CategoricalProjection(Backend& backend, int64_t rows, int64_t atoms, float v_min, float v_max,
                           const float* probabilities, const float* reward, const float* discount, float* out) {
  const bool on_host = backend.HostKernel(
      "CategoricalProjection", {probabilities, reward, discount, out}, [&](const Backend::HostParallelFor& loop) {
        loop(rows, 16, [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            CategoricalProjectionRow({probabilities + r * atoms, static_cast<size_t>(atoms)}, reward[r],
                                     discount[r], v_min, v_max, {out + r * atoms, static_cast<size_t>(atoms)});
          }
        });
      });
  if (!on_host) ComposedCategoricalProjection(backend, rows, atoms, v_min, v_max, probabilities, reward, discount, out);
}

void ComposedCategoricalProjection(Backend& b, int64_t rows, int64_t atoms, float v_min, float v_max,
                                   const float* probabilities, const float* reward, const float* discount,
                                   float* out) {
  TROUPE_CHECK(atoms >= 2);
  const float dz = (v_max - v_min) / static_cast<float>(atoms - 1);
  Backend::Temporaries t(b);
  float* support = t.Floats(atoms);
  float* position = t.Floats(rows * atoms);
  float* step = t.Floats(1);
  float* weight = t.Floats(rows * atoms * atoms);
  const View3 flat = nn::Flat(rows * atoms);
  // position[r, j] = clamp((clamp(reward + discount * z_j, v_min, v_max) - v_min) / dz, 0, atoms - 1).
  b.Fill(support, atoms, v_min, dz);
  b.Fill(step, 1, dz);
  const View3 rows_by_atoms{rows, 1, atoms};
  b.BinaryBroadcast(Binary::kMul, rows_by_atoms, discount, nn::kOuterAxis, support, nn::kInnerAxis, position);
  b.BinaryBroadcast(Binary::kAdd, rows_by_atoms, reward, nn::kOuterAxis, position, nn::kAllAxes, position);
  b.Unary(UnaryOp::kClamp, v_min, v_max, position, position, rows * atoms);
  b.Unary(UnaryOp::kAffine, 1.0f, -v_min, position, position, rows * atoms);
  b.BinaryBroadcast(Binary::kDiv, flat, position, nn::kAllAxes, step, nn::kScalarAxes, position);
  b.Unary(UnaryOp::kClamp, 0.0f, static_cast<float>(atoms - 1), position, position, rows * atoms);
  // weight[r, j, i] = p[r, j] * max(0, 1 - |position[r, j] - i|), summed over j.
  float* targets = support;
  b.Fill(targets, atoms, 0.0f, 1.0f);
  const View3 dense{rows, atoms, atoms};
  b.BinaryBroadcast(Binary::kSub, dense, position, nn::kOuterAxis | nn::kMidAxis, targets, nn::kInnerAxis, weight);
  b.Unary(UnaryOp::kAbs, 0, 0, weight, weight, dense.size());
  b.Unary(UnaryOp::kAffine, -1.0f, 1.0f, weight, weight, dense.size());
  b.Unary(UnaryOp::kRelu, 0, 0, weight, weight, dense.size());
  b.BinaryBroadcast(Binary::kMul, dense, weight, nn::kAllAxes, probabilities, nn::kOuterAxis | nn::kMidAxis, weight);
  b.Reduce(Reduction::kSum, dense, 1.0f, weight, out);
}

}  // namespace troupe::agents
