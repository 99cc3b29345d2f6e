// Spectral normalisation (Miyato et al. 2018), the discriminator's: a tape
// op of the GAN's, not the engine's. On a backend whose memory the host
// addresses its kernels are host loops (nn::Backend::HostKernel); elsewhere
// they are composed from the core (two matrix-vector products a power
// iteration, a reduction for sigma, elementwise ops).
#ifndef TROUPE_GAN_SPECTRAL_NORM_H_
#define TROUPE_GAN_SPECTRAL_NORM_H_

#include <cstdint>

#include "engine/nn/backend.h"
#include "engine/nn/tape.h"

namespace troupe::gan {

// w / sigma(w), w viewed as [shape[0], rest]; u, v are the persistent
// power-iteration vectors, updated in place by `iterations` steps first (no
// gradient through them), as PyTorch's spectral_norm does in training.
// iterations = 0 keeps u, v as they are. u and v are the backend's memory
// (a ParameterSet's values, a DeviceBuffer).
nn::Var SpectralNorm(nn::Var w, float* u, float* v, int iterations = 1);

// The kernels, w viewed as [rows, cols], u [rows], v [cols], all the
// backend's memory:
// the power iteration (v = normalize(w^T u); u = normalize(w v), `iterations` times);
void SpectralNormPowerIteration(nn::Backend& b, int64_t rows, int64_t cols, const float* w, float* u, float* v,
                                int iterations);
// sigma[0] = u^T w v (u, v held constant) and y = w / sigma;
void SpectralNormForward(nn::Backend& b, int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                         float* y, float* sigma);
// dw += dy / sigma - (sum(dy * w) / sigma^2) u v^T (sigma on the device).
void SpectralNormBackward(nn::Backend& b, int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                          const float* sigma, const float* dy, float* dw);
// Their composed forms alone (the tests hold them against the host loops).
void ComposedSpectralNormPowerIteration(nn::Backend& b, int64_t rows, int64_t cols, const float* w, float* u,
                                        float* v, int iterations);
void ComposedSpectralNormForward(nn::Backend& b, int64_t rows, int64_t cols, const float* w, const float* u,
                                 const float* v, float* y, float* sigma);
void ComposedSpectralNormBackward(nn::Backend& b, int64_t rows, int64_t cols, const float* w, const float* u,
                                  const float* v, const float* sigma, const float* dy, float* dw);

}  // namespace troupe::gan

#endif  // TROUPE_GAN_SPECTRAL_NORM_H_
