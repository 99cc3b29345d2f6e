// The PJRT tests' plugin: the XLA CPU plugin the ctest fixture fetched
// (tools/pjrt_cpu_plugin.sh), named by TROUPE_PJRT_PLUGIN; and the fixture
// of kernel tests that hold a PJRT backend's kernels against the CPU's
// (the engine's own, and the agents' and the GAN's).
#ifndef TROUPE_ENGINE_PJRT_PJRT_TESTING_H_
#define TROUPE_ENGINE_PJRT_PJRT_TESTING_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/cpu_backend.h"
#include "engine/pjrt/pjrt_backend.h"
#include "gtest/gtest.h"

namespace troupe::pjrt {

// The fetched CPU plugin, or "" (the tests that need it skip).
inline std::string CpuPlugin() {
  const char* path = std::getenv("TROUPE_PJRT_PLUGIN");
  return path != nullptr && std::filesystem::exists(path) ? path : "";
}

// A CPU backend and a PJRT one with the same data: Put uploads to both, Get
// downloads from both.
class PjrtKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string plugin = CpuPlugin();
    if (plugin.empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)";
    auto backend = PjrtBackend::Create({.plugin = plugin});
    ASSERT_TRUE(backend.ok()) << backend.status();
    pjrt_ = std::move(*backend);
  }
  struct Pair {
    float* cpu;
    float* pjrt;
  };
  // The CPU side's buffers, freed with the fixture (the PJRT side's go with
  // its backend).
  void TearDown() override {
    for (float* p : cpu_buffers_) cpu_.Free(p);
  }
  Pair Put(const std::vector<float>& data) {
    Pair p{cpu_.AllocateFloats(data.size()), pjrt_->AllocateFloats(data.size())};
    cpu_buffers_.push_back(p.cpu);
    cpu_.Upload(data.data(), p.cpu, 4 * data.size());
    pjrt_->Upload(data.data(), p.pjrt, 4 * data.size());
    return p;
  }
  // int32 values as the bits of floats (indices for the row kernels).
  Pair PutInts(const std::vector<int32_t>& v) {
    std::vector<float> f(v.size());
    std::memcpy(f.data(), v.data(), 4 * v.size());
    return Put(f);
  }
  void ExpectSame(Pair p, int64_t n, double tolerance = 1e-5, const std::string& what = "") {
    std::vector<float> a(n), b(n);
    cpu_.Download(p.cpu, a.data(), 4 * n);
    pjrt_->Download(p.pjrt, b.data(), 4 * n);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(b[i], a[i], tolerance * (1 + std::fabs(a[i]))) << what << "[" << i << "]";
  }
  nn::CpuBackend cpu_{1};
  std::unique_ptr<PjrtBackend> pjrt_;
  std::vector<float*> cpu_buffers_;
};

}  // namespace troupe::pjrt

// Declares `plugin` (CpuPlugin()), or skips the test saying why.
#define REQUIRE_PLUGIN()                                                                                    \
  const std::string plugin = ::troupe::pjrt::CpuPlugin();                                                   \
  if (plugin.empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)"

#endif  // TROUPE_ENGINE_PJRT_PJRT_TESTING_H_
