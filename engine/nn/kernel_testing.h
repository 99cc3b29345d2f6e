// Helpers of kernel tests (not linked into anything else): a kernel run on
// a backend over host buffers, and a composed kernel held against a fused
// one (the CPU's, or an owner's host loop) on the same inputs.
#ifndef TROUPE_ENGINE_NN_KERNEL_TESTING_H_
#define TROUPE_ENGINE_NN_KERNEL_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {

using Buffers = std::vector<std::vector<float>>;
using Kernel = std::function<void(Backend&, const std::vector<float*>&)>;

// The buffers after `kernel` ran on a backend, each uploaded to its memory first.
inline Buffers RunOn(Backend& backend, const Buffers& buffers, const Kernel& kernel) {
  std::vector<float*> device;
  for (const auto& host : buffers) {
    float* p = backend.AllocateFloats(std::max<int64_t>(1, static_cast<int64_t>(host.size())));
    backend.Upload(host.data(), p, sizeof(float) * host.size());
    device.push_back(p);
  }
  kernel(backend, device);
  Buffers out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.emplace_back(buffers[i].size());
    backend.Download(device[i], out.back().data(), sizeof(float) * buffers[i].size());
    backend.Free(device[i]);
  }
  return out;
}

// Every buffer of `got` within `tolerance` relative of `want` (0: bit for bit).
inline void ExpectBuffersMatch(const std::string& what, const Buffers& want, const Buffers& got, double tolerance) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (tolerance == 0.0) {
      // Bit for bit (NaN payloads included).
      ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), sizeof(float) * want[i].size()), 0)
          << what << ": buffer " << i;
      continue;
    }
    for (size_t k = 0; k < want[i].size(); ++k) {
      ASSERT_NEAR(got[i][k], want[i][k], tolerance * (1.0 + std::fabs(want[i][k])))
          << what << ": buffer " << i << "[" << k << "]";
    }
  }
}

// The kernel on the CPU's fused kernels and on the composed defaults: every
// buffer (inputs unchanged, outputs computed) within `tolerance` relative.
// `host_outputs` replaces the CPU's value of the buffers it names: those of
// kernels the CPU runs as the defaults too (compared with themselves
// otherwise), computed on the host instead.
inline void ExpectComposedMatchesFused(const std::string& what, const Buffers& buffers, const Kernel& kernel,
                                double tolerance = 2e-5, const std::map<size_t, std::vector<float>>& host_outputs = {}) {
  CpuBackend cpu(1);
  CoreOnlyBackend core(1);
  Buffers want = RunOn(cpu, buffers, kernel);
  for (const auto& [i, values] : host_outputs) want[i] = values;
  ExpectBuffersMatch(what, want, RunOn(core, buffers, kernel), tolerance);
}

// int32 values carried in float words (a kernel's index arguments).
inline std::vector<float> Ints(const std::vector<int32_t>& values) {
  std::vector<float> words(values.size());
  std::memcpy(words.data(), values.data(), sizeof(int32_t) * values.size());
  return words;
}

inline const int32_t* AsInts(const float* p) { return reinterpret_cast<const int32_t*>(p); }

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_KERNEL_TESTING_H_
