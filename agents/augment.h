// DrQ's random shift (Kostrikov et al. 2020), the image augmentation of
// D4PG from pixels: replicate-pad by `pad`, then crop back to h x w at an
// offset drawn per sample. A tape op of this agent's, not the engine's: on
// a backend whose memory the host addresses its kernels are host loops
// (nn::Backend::HostKernel); elsewhere they are composed from the core, the
// forward a gather along rows then one along columns, the backward their
// adjoint scatter-adds.
#ifndef TROUPE_AGENTS_AUGMENT_H_
#define TROUPE_AGENTS_AUGMENT_H_

#include <cstdint>
#include <random>

#include "engine/nn/backend.h"
#include "engine/nn/tape.h"

namespace troupe::agents {

// x [n, c, h, w] shifted by offsets drawn from `rng` (uploaded once).
nn::Var RandomShift(nn::Var x, int64_t pad, std::mt19937_64& rng);
// The offsets for `images` images (2 each: row, column, in [0, 2 * pad]),
// drawn on the host as RandomShift draws them; and the shift by offsets
// already in device memory (`shifts`: 2 * batch ints, alive as long as the
// tape's step: the backward reads them).
void RandomShiftOffsets(int64_t images, int64_t pad, std::mt19937_64& rng, int32_t* host);
// The same from a key instead of a generator (nothing to seed each
// update): offset i is splitmix64's i-th output from `key` (e.g.
// internal::MixSeed(seed, copy, update)) brought to [0, 2 * pad].
void RandomShiftOffsets(uint64_t key, int64_t images, int64_t pad, int32_t* host);
nn::Var RandomShiftBy(nn::Var x, int64_t pad, const int32_t* shifts);

// The kernels (shifts[2*i] = dy, shifts[2*i+1] = dx, each in [0, 2*pad]; all
// pointers the backend's memory; the backward accumulates into dx), and
// their composed forms alone (the tests hold them against the host loops).
void RandomShiftForward(nn::Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                        const int32_t* shifts, const float* x, float* y);
void RandomShiftBackward(nn::Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                         const int32_t* shifts, const float* dy, float* dx);
void ComposedRandomShiftForward(nn::Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                                const int32_t* shifts, const float* x, float* y);
void ComposedRandomShiftBackward(nn::Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                                 const int32_t* shifts, const float* dy, float* dx);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_AUGMENT_H_
