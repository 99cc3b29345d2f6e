#include "agents/augment.h"

#include <algorithm>

#include "agents/networks.h"
#include "common/status_macros.h"

namespace troupe::agents {
namespace {

using nn::Backend;

// Index tables of the shift along one image axis of length `len`:
// out[i, k, r] = clamp(r + shifts[2*i + which] - pad, 0, len - 1) for i < n,
// k < planes (the rows of a sample the same shift moves), r < len.
void ShiftIndices(Backend& b, int64_t n, int64_t planes, int64_t len, int64_t pad, const int32_t* shifts, int which,
                  int32_t* out) {
  Backend::Temporaries t(b);
  float* both = t.Floats(2 * n);
  float* shift = t.Floats(n);
  float* positions = t.Floats(len);
  float* index = t.Floats(n * planes * len);
  b.Convert(nn::DType::kI32, shifts, nn::DType::kF32, both, 2 * n);
  b.CopyBlocks(n, 1, both, 2, which, shift, 1, 0, false);
  b.Fill(positions, len, static_cast<float>(-pad), 1.0f);
  b.BinaryBroadcast(nn::Binary::kAdd, {n, planes, len}, shift, nn::kOuterAxis, positions, nn::kInnerAxis, index);
  b.Unary(nn::UnaryOp::kClamp, 0.0f, static_cast<float>(len - 1), index, index, n * planes * len);
  b.Convert(nn::DType::kF32, index, nn::DType::kI32, out, n * planes * len);
}

// The gather tables for rows and for columns, and room for the image
// shifted along rows only. Replicate padding: each output row (column)
// reads the clamped source row (column).
struct ShiftTables {
  int32_t* rows;
  int32_t* columns;
  float* shifted_rows;
};
ShiftTables MakeShiftTables(Backend& b, Backend::Temporaries& t, int64_t n, int64_t c, int64_t h, int64_t w,
                            int64_t pad, const int32_t* shifts) {
  const ShiftTables tables{t.Ints(n * c * h), t.Ints(n * c * h * w), t.Floats(n * c * h * w)};
  ShiftIndices(b, n, c, h, pad, shifts, 0, tables.rows);
  ShiftIndices(b, n, c * h, w, pad, shifts, 1, tables.columns);
  return tables;
}

// The host loop's traversal: for samples [begin, end), every output pixel's
// offset `out` and the offset `in` of the input pixel it copies (replicate
// padding = the source coordinate clamped), in NCHW order.
template <typename Fn>
void ForEachShiftedPixel(int64_t begin, int64_t end, int64_t c, int64_t h, int64_t w, int64_t pad,
                         const int32_t* shifts, Fn fn) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t sy = shifts[2 * i] - pad, sx = shifts[2 * i + 1] - pad;
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t plane = (i * c + ch) * h * w;
      for (int64_t r = 0; r < h; ++r) {
        const int64_t iy = std::clamp<int64_t>(r + sy, 0, h - 1);
        for (int64_t q = 0; q < w; ++q) fn(plane + r * w + q, plane + iy * w + std::clamp<int64_t>(q + sx, 0, w - 1));
      }
    }
  }
}

void RandomShiftBackwardNode(nn::Tape& t, const nn::Node& n) {
  RandomShiftBackward(t.backend(), n.i[0], n.i[1], n.i[2], n.i[3], n.i[4], static_cast<const int32_t*>(n.ptr),
                      t.value(n.out).grad, t.value(n.in[0]).grad);
}

}  // namespace

void RandomShiftForward(Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts,
                        const float* x, float* y) {
  const bool on_host = b.HostKernel("RandomShiftForward", {shifts, x, y}, [&](const Backend::HostParallelFor& loop) {
    loop(n, 1, [&](int64_t begin, int64_t end) {
      ForEachShiftedPixel(begin, end, c, h, w, pad, shifts, [&](int64_t out, int64_t in) { y[out] = x[in]; });
    });
  });
  if (!on_host) ComposedRandomShiftForward(b, n, c, h, w, pad, shifts, x, y);
}

void RandomShiftBackward(Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts,
                         const float* dy, float* dx) {
  const bool on_host = b.HostKernel("RandomShiftBackward", {shifts, dy, dx}, [&](const Backend::HostParallelFor& loop) {
    loop(n, 1, [&](int64_t begin, int64_t end) {
      ForEachShiftedPixel(begin, end, c, h, w, pad, shifts, [&](int64_t out, int64_t in) { dx[in] += dy[out]; });
    });
  });
  if (!on_host) ComposedRandomShiftBackward(b, n, c, h, w, pad, shifts, dy, dx);
}

void ComposedRandomShiftForward(Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                                const int32_t* shifts, const float* x, float* y) {
  Backend::Temporaries t(b);
  const ShiftTables tables = MakeShiftTables(b, t, n, c, h, w, pad, shifts);
  b.Gather(n * c, h, w, h, x, tables.rows, tables.shifted_rows);
  b.Gather(n * c * h, w, 1, w, tables.shifted_rows, tables.columns, y);
}

void ComposedRandomShiftBackward(Backend& b, int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad,
                                 const int32_t* shifts, const float* dy, float* dx) {
  Backend::Temporaries t(b);
  const ShiftTables tables = MakeShiftTables(b, t, n, c, h, w, pad, shifts);
  b.Fill(tables.shifted_rows, n * c * h * w, 0.0f);
  b.Scatter(n * c * h, w, 1, w, tables.columns, dy, tables.shifted_rows, /*add=*/true);
  b.Scatter(n * c, h, w, h, tables.rows, tables.shifted_rows, dx, /*add=*/true);
}

void RandomShiftOffsets(int64_t images, int64_t pad, std::mt19937_64& rng, int32_t* host) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(2 * pad));
  for (int64_t i = 0; i < 2 * images; ++i) host[i] = d(rng);
}

void RandomShiftOffsets(uint64_t key, int64_t images, int64_t pad, int32_t* host) {
  const uint64_t range = static_cast<uint64_t>(2 * pad + 1);
  uint64_t state = key;
  for (int64_t i = 0; i < 2 * images; ++i, state += 0x9e3779b97f4a7c15ull) {
    // splitmix64's i-th output from key, its high 32 bits scaled to the
    // range (Lemire 2019; bias < range / 2^32).
    host[i] = static_cast<int32_t>(((internal::SplitMix64(state) >> 32) * range) >> 32);
  }
}

nn::Var RandomShift(nn::Var x, int64_t pad, std::mt19937_64& rng) {
  nn::Tape& t = *x.tape;
  const nn::Shape& s = t.value(x).shape;
  TROUPE_CHECK(s.rank() == 4 && pad >= 0);
  // Offsets drawn on the host, uploaded once.
  int32_t* host = t.HostInts(2 * s[0]);
  RandomShiftOffsets(s[0], pad, rng, host);
  int32_t* shifts = t.AllocateInts(2 * s[0]);
  t.backend().Upload(host, shifts, sizeof(int32_t) * 2 * s[0]);
  return RandomShiftBy(x, pad, shifts);
}

nn::Var RandomShiftBy(nn::Var x, int64_t pad, const int32_t* shifts) {
  nn::Tape& t = *x.tape;
  const nn::Shape& s = t.value(x).shape;
  TROUPE_CHECK(s.rank() == 4 && pad >= 0);
  nn::Var y = t.NewValue(s, t.value(x).requires_grad);
  RandomShiftForward(t.backend(), s[0], s[1], s[2], s[3], pad, shifts, t.value(x).data, t.value(y).data);
  nn::Node n;
  n.backward = RandomShiftBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = s[0], n.i[1] = s[1], n.i[2] = s[2], n.i[3] = s[3], n.i[4] = pad;
  n.ptr = shifts;
  t.Record(n);
  return y;
}

}  // namespace troupe::agents
