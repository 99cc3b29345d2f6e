// The C51 projection (Bellemare et al. 2017, Algorithm 1), D4PG's
// distributional target: a kernel of this agent's, not the engine's.
// On a backend whose memory the host addresses it runs as a host loop over
// rows (nn::Backend::HostKernel); elsewhere (CUDA, PJRT) it is composed from
// the engine's core kernels, densely:
//   out[r, i] = sum_j p[r, j] * max(0, 1 - |b[r, j] - i|),
// b the shifted atom's position in atom units, so a compiled step holds it
// as a few elementwise ops and one reduction.
#ifndef TROUPE_AGENTS_CATEGORICAL_H_
#define TROUPE_AGENTS_CATEGORICAL_H_

#include <cstdint>
#include <span>

#include "engine/nn/backend.h"

namespace troupe::agents {

// One distribution: projects `probabilities` over the support z_j = v_min +
// j * dz, shifted to reward + discount * z_j and clipped to [v_min, v_max],
// back onto the same support: each atom's mass splits between its two
// neighbouring atoms in proportion to closeness. Writes
// probabilities.size() floats to `out` (host memory; the reference).
void CategoricalProjectionRow(std::span<const float> probabilities, float reward, float discount, float v_min,
                              float v_max, std::span<float> out);

// Each row of `probabilities` [rows, atoms] projected as above (reward and
// discount [rows]); writes out [rows, atoms]. All pointers are `backend`'s
// memory; no gradient.
void CategoricalProjection(nn::Backend& backend, int64_t rows, int64_t atoms, float v_min, float v_max,
                           const float* probabilities, const float* reward, const float* discount, float* out);

// The composed form alone, whatever the backend offers (the tests hold it
// against the host loop).
void ComposedCategoricalProjection(nn::Backend& backend, int64_t rows, int64_t atoms, float v_min, float v_max,
                                   const float* probabilities, const float* reward, const float* discount,
                                   float* out);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_CATEGORICAL_H_
