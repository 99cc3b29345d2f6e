// The CUDA backend against the CPU reference, op by op (forward and
// backward, random inputs), then whole training steps and replica groups.
// Every test first looks for a device and skips, saying why, where there is
// none: the binary links the CUDA runtime statically, so it starts (and
// skips) on machines without a GPU driver.
//
// Tolerances: float32 |gpu - cpu| <= 1e-4 * (1 + |cpu|) for elementwise ops
// and 2e-4 * max|cpu| for GEMM/conv/reduction outputs (summation order
// differs); bfloat16 GEMM/conv 2e-2 * max|cpu| (8-bit mantissa inputs,
// float32 accumulation). Training steps compare parameters after a few
// Adam steps to 1e-3 absolute (Adam normalises gradient noise up to ~lr).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/processes.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/state_match.h"
#include "engine/nn/testing.h"
#include "engine/replicator/replicator.h"
#include "engine/replicator/test_model.h"
#ifdef TROUPE_HAVE_NCCL
#include "engine/cuda/nccl_collectives.h"
#endif

namespace troupe::cuda {
namespace {

using nn::Activation;
using nn::Binary;
using nn::ConvGeometry;

#define REQUIRE_CUDA_DEVICE()                                                                         \
  do {                                                                                                \
    std::string why;                                                                                  \
    if (DeviceCount(&why) == 0) {                                                                     \
      GTEST_SKIP() << "no CUDA device: " << why << " (this test runs on a GPU machine)";              \
    }                                                                                                 \
  } while (false)

using nn::RandomVector;

// A device copy of a host vector, freed with the backend.
class DeviceVector {
 public:
  DeviceVector(CudaBackend* gpu, const std::vector<float>& host) : gpu_(gpu), size_(host.size()) {
    data_ = gpu->AllocateFloats(static_cast<int64_t>(size_));
    gpu->Upload(host.data(), data_, sizeof(float) * size_);
  }
  ~DeviceVector() { gpu_->Free(data_); }
  DeviceVector(const DeviceVector&) = delete;
  float* data() { return data_; }
  std::vector<float> ToHost() const {
    std::vector<float> host(size_);
    gpu_->Download(data_, host.data(), sizeof(float) * size_);
    return host;
  }

 private:
  CudaBackend* gpu_;
  size_t size_;
  float* data_;
};

// Same data as int32 in device memory (labels, shifts).
int32_t* DeviceInts(CudaBackend* gpu, const std::vector<int32_t>& host) {
  auto* p = static_cast<int32_t*>(gpu->Allocate(sizeof(int32_t) * host.size()));
  gpu->Upload(host.data(), p, sizeof(int32_t) * host.size());
  return p;
}

// Elementwise: |a - b| <= rtol * (1 + |b|); scaled: |a - b| <= rtol * max|b|.
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, float rtol, bool scaled,
                const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  float scale = 1.0f;
  if (scaled) {
    for (float v : cpu) scale = std::max(scale, std::abs(v));
  }
  int reported = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const float bound = scaled ? rtol * scale : rtol * (1.0f + std::abs(cpu[i]));
    if (!(std::abs(gpu[i] - cpu[i]) <= bound) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i] << " (bound " << bound << ")";
    }
  }
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    auto b = CudaBackend::Create();
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }
  nn::CpuBackend cpu_{/*num_threads=*/1};
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(CudaOpsTest, MemoryOpsMatchCpu) {
  const int64_t n = 10007;
  std::vector<float> x = RandomVector(n, 1), y = RandomVector(n, 2);
  DeviceVector dx(gpu_.get(), x), dy(gpu_.get(), y);
  cpu_.Axpy(0.5f, x.data(), y.data(), n);
  gpu_->Axpy(0.5f, dx.data(), dy.data(), n);
  ExpectNear(dy.ToHost(), y, 1e-6f, false, "Axpy");
  cpu_.AddScalar(0.5f, x.data(), y.data(), n);
  gpu_->AddScalar(0.5f, dx.data(), dy.data(), n);
  ExpectNear(dy.ToHost(), y, 1e-6f, false, "AddScalar");
  cpu_.Scale(-2.0f, x.data(), y.data(), n);
  gpu_->Scale(-2.0f, dx.data(), dy.data(), n);
  ExpectNear(dy.ToHost(), y, 1e-6f, false, "Scale");
  // CopyBlocks: 7 rows of 13 into a [7, 40] buffer at offset 5, accumulating.
  std::vector<float> src = RandomVector(7 * 13, 3), dst = RandomVector(7 * 40, 4);
  DeviceVector dsrc(gpu_.get(), src), ddst(gpu_.get(), dst);
  cpu_.CopyBlocks(7, 13, src.data(), 13, 0, dst.data(), 40, 5, true);
  gpu_->CopyBlocks(7, 13, dsrc.data(), 13, 0, ddst.data(), 40, 5, true);
  ExpectNear(ddst.ToHost(), dst, 1e-6f, false, "CopyBlocks");
  gpu_->Fill(dy.data(), n, 3.5f);
  gpu_->Copy(dy.data(), dx.data(), n);
  EXPECT_EQ(dx.ToHost(), std::vector<float>(n, 3.5f));
}

// The device frame table's kernels: rows of words moved as bits (every
// pattern, NaNs included: random bytes), and the gather inside the float
// conversion, equal to the CPU's exactly.
TEST_F(CudaOpsTest, RowScatterGatherAndGatheredFloatPlanesMatchCpuBitForBit) {
  const int64_t rows = 33, words = 27, count = 12;
  std::mt19937_64 rng(41);
  std::vector<uint32_t> bits(count * words);
  for (uint32_t& b : bits) b = static_cast<uint32_t>(rng());
  std::vector<float> values(bits.size()), table(rows * words, 0.25f);
  std::memcpy(values.data(), bits.data(), sizeof(float) * bits.size());
  std::vector<int32_t> at(count), picks = {32, 0, 5, 5, 31, 7, 2, 2, 9, 30, 1, 0};
  for (int64_t i = 0; i < count; ++i) at[i] = static_cast<int32_t>((i * 7 + 3) % rows);
  DeviceVector dvalues(gpu_.get(), values), dtable(gpu_.get(), table);
  int32_t* dat = DeviceInts(gpu_.get(), at);
  int32_t* dpicks = DeviceInts(gpu_.get(), picks);
  cpu_.ScatterRows(rows, words, table.data(), count, at.data(), values.data());
  gpu_->ScatterRows(rows, words, dtable.data(), count, dat, dvalues.data());
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0) << what;
  };
  same_bits(dtable.ToHost(), table, "ScatterRows");
  std::vector<float> out(count * words);
  DeviceVector dout(gpu_.get(), out);
  cpu_.GatherRows(rows, words, table.data(), count, picks.data(), out.data());
  gpu_->GatherRows(rows, words, dtable.data(), count, dpicks, dout.data());
  same_bits(dout.ToHost(), out, "GatherRows");
  // Images of 9 pixels x 3 channels (27 of a row's 108 bytes).
  std::vector<float> planes(count * 27);
  DeviceVector dplanes(gpu_.get(), planes);
  cpu_.GatherBytesToFloatPlanar(rows, words, table.data(), count, picks.data(), 9, 3, 1.0f / 255, planes.data());
  gpu_->GatherBytesToFloatPlanar(rows, words, dtable.data(), count, dpicks, 9, 3, 1.0f / 255, dplanes.data());
  same_bits(dplanes.ToHost(), planes, "GatherBytesToFloatPlanar");
  gpu_->Free(dat);
  gpu_->Free(dpicks);
}

class CudaGemmTest : public CudaOpsTest, public ::testing::WithParamInterface<GemmPrecision> {
 protected:
  float Tolerance() const { return GetParam() == GemmPrecision::kBfloat16 ? 2e-2f : 2e-4f; }
};

TEST_P(CudaGemmTest, GemmMatchesCpuInEveryTransposeCase) {
  gpu_->set_gemm_precision(GetParam());
  const int64_t m = 67, n = 45, k = 129;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    std::vector<float> a = RandomVector(m * k, 10 + t), b = RandomVector(k * n, 20 + t), c = RandomVector(m * n, 30 + t);
    DeviceVector da(gpu_.get(), a), db(gpu_.get(), b), dc(gpu_.get(), c);
    cpu_.Gemm(ta, tb, m, n, k, 0.7f, a.data(), b.data(), 0.3f, c.data());
    gpu_->Gemm(ta, tb, m, n, k, 0.7f, da.data(), db.data(), 0.3f, dc.data());
    ExpectNear(dc.ToHost(), c, Tolerance(), true, "Gemm trans=" + std::to_string(t));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGemmTest,
                         ::testing::Values(GemmPrecision::kFloat32, GemmPrecision::kBfloat16),
                         [](const auto& info) { return info.param == GemmPrecision::kFloat32 ? "Float32" : "Bfloat16"; });

// Convolutions on each path (cuDNN, im2col) at each precision.
class CudaConvTest : public ::testing::TestWithParam<std::tuple<GemmPrecision, ConvAlgorithm>> {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    CudaBackendOptions options;
    options.gemm_precision = std::get<0>(GetParam());
    options.convolutions = std::get<1>(GetParam());
    auto b = CudaBackend::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    std::printf("convolutions: %s\n", gpu_->convolutions().c_str());
    if (options.convolutions == ConvAlgorithm::kCudnn && gpu_->convolutions().rfind("cuDNN", 0) != 0) {
      GTEST_SKIP() << "cuDNN not usable here: " << gpu_->convolutions();
    }
  }
  float Tolerance() const { return std::get<0>(GetParam()) == GemmPrecision::kBfloat16 ? 2e-2f : 2e-4f; }
  nn::CpuBackend cpu_{/*num_threads=*/1};
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_P(CudaConvTest, ConvolutionsMatchCpuForwardAndBackward) {
  // DrQ's first layer shape (stride 2), padded stride-1 and -2 layers, an odd
  // size whose transposed conv needs an output padding (10 -> 5 -> 10), and
  // a DrQ-sized stride-1 layer (32 channels, 41x41), where cuDNN's
  // algorithm choice differs from the small ones'.
  const ConvGeometry geometries[] = {
      {.n = 3, .c = 9, .h = 21, .w = 21, .oc = 8, .kh = 3, .kw = 3, .stride = 2, .pad = 0},
      {.n = 2, .c = 4, .h = 8, .w = 8, .oc = 5, .kh = 3, .kw = 3, .stride = 1, .pad = 1},
      {.n = 2, .c = 3, .h = 8, .w = 8, .oc = 6, .kh = 4, .kw = 4, .stride = 2, .pad = 1},
      {.n = 2, .c = 3, .h = 10, .w = 10, .oc = 4, .kh = 3, .kw = 3, .stride = 2, .pad = 1},
      {.n = 4, .c = 32, .h = 41, .w = 41, .oc = 32, .kh = 3, .kw = 3, .stride = 1, .pad = 0},
  };
  for (const auto& [g, act] : {std::pair{geometries[0], nn::FusedActivation::kNone},
                               std::pair{geometries[1], nn::FusedActivation::kNone},
                               std::pair{geometries[2], nn::FusedActivation::kNone},
                               std::pair{geometries[3], nn::FusedActivation::kNone},
                               std::pair{geometries[0], nn::FusedActivation::kRelu},
                               std::pair{geometries[1], nn::FusedActivation::kRelu},
                               std::pair{geometries[4], nn::FusedActivation::kRelu}}) {
    const int64_t xs = g.n * g.c * g.h * g.w, ys = g.n * g.oc * g.oh() * g.ow(), ws = g.oc * g.c * g.kh * g.kw;
    const std::string name = "conv c=" + std::to_string(g.c) + " " + std::to_string(g.h) + "x" +
                             std::to_string(g.w) + " stride=" + std::to_string(g.stride) +
                             (act == nn::FusedActivation::kRelu ? " relu" : "");
    std::vector<float> x = RandomVector(xs, 1), w = RandomVector(ws, 2), b = RandomVector(g.oc, 3), dy = RandomVector(ys, 4);
    std::vector<float> y(ys), dx = RandomVector(xs, 5), dw = RandomVector(ws, 6), db = RandomVector(g.oc, 7);
    DeviceVector gx(gpu_.get(), x), gw(gpu_.get(), w), gb(gpu_.get(), b), gdy(gpu_.get(), dy), gy(gpu_.get(), y),
        gdx(gpu_.get(), dx), gdw(gpu_.get(), dw), gdb(gpu_.get(), db);
    cpu_.Conv2dForward(g, act, x.data(), w.data(), b.data(), y.data());
    gpu_->Conv2dForward(g, act, gx.data(), gw.data(), gb.data(), gy.data());
    ExpectNear(gy.ToHost(), y, Tolerance(), true, name + " forward");
    cpu_.Conv2dBackward(g, act, x.data(), w.data(), y.data(), dy.data(), dx.data(), dw.data(), db.data());
    gpu_->Conv2dBackward(g, act, gx.data(), gw.data(), gy.data(), gdy.data(), gdx.data(), gdw.data(), gdb.data());
    ExpectNear(gdx.ToHost(), dx, Tolerance(), true, name + " dx");
    ExpectNear(gdw.ToHost(), dw, Tolerance(), true, name + " dw");
    ExpectNear(gdb.ToHost(), db, 2e-4f, true, name + " db");
    // Without an input gradient (a network's first layer) and without bias.
    std::vector<float> dw2 = dw;
    cpu_.Conv2dBackward(g, act, x.data(), w.data(), y.data(), dy.data(), nullptr, dw2.data(), nullptr);
    gpu_->Conv2dBackward(g, act, gx.data(), gw.data(), gy.data(), gdy.data(), nullptr, gdw.data(), nullptr);
    ExpectNear(gdw.ToHost(), dw2, Tolerance(), true, name + " dw, no dx");
    // The transposed conv over the same geometry: x is the conv's output side.
    std::vector<float> tx = RandomVector(ys, 8), tdy = RandomVector(xs, 9), ty(xs), tdx = RandomVector(ys, 10), tb = RandomVector(g.c, 11);
    std::vector<float> tdw = RandomVector(ws, 12), tdb = RandomVector(g.c, 13);
    DeviceVector gtx(gpu_.get(), tx), gtdy(gpu_.get(), tdy), gty(gpu_.get(), ty), gtdx(gpu_.get(), tdx),
        gtb(gpu_.get(), tb), gtdw(gpu_.get(), tdw), gtdb(gpu_.get(), tdb);
    cpu_.ConvTranspose2dForward(g, tx.data(), w.data(), tb.data(), ty.data());
    gpu_->ConvTranspose2dForward(g, gtx.data(), gw.data(), gtb.data(), gty.data());
    ExpectNear(gty.ToHost(), ty, Tolerance(), true, name + " transposed forward");
    cpu_.ConvTranspose2dBackward(g, tx.data(), w.data(), tdy.data(), tdx.data(), tdw.data(), tdb.data());
    gpu_->ConvTranspose2dBackward(g, gtx.data(), gw.data(), gtdy.data(), gtdx.data(), gtdw.data(), gtdb.data());
    ExpectNear(gtdx.ToHost(), tdx, Tolerance(), true, name + " transposed dx");
    ExpectNear(gtdw.ToHost(), tdw, Tolerance(), true, name + " transposed dw");
    ExpectNear(gtdb.ToHost(), tdb, 2e-4f, true, name + " transposed db");
  }
  // Every geometry and pass above ran on the path asked for: cuDNN had an
  // algorithm for each (none fell back to im2col).
  EXPECT_EQ(gpu_->conv_fallbacks(), 0) << gpu_->convolutions();
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionsAndPaths, CudaConvTest,
    ::testing::Combine(::testing::Values(GemmPrecision::kFloat32, GemmPrecision::kBfloat16),
                       ::testing::Values(ConvAlgorithm::kCudnn, ConvAlgorithm::kIm2col)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == GemmPrecision::kFloat32 ? "Float32" : "Bfloat16") +
             (std::get<1>(info.param) == ConvAlgorithm::kCudnn ? "Cudnn" : "Im2col");
    });

TEST(CudaBackendTest, AnUnknownConvolutionPathInTheEnvironmentIsRefusedNamingIt) {
  REQUIRE_CUDA_DEVICE();
  setenv("TROUPE_CUDA_CONV", "winograd", /*overwrite=*/1);
  auto b = CudaBackend::Create();
  unsetenv("TROUPE_CUDA_CONV");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("TROUPE_CUDA_CONV=winograd: expected cudnn or im2col"), std::string::npos)
      << b.status();
  // And an explicit im2col says so.
  setenv("TROUPE_CUDA_CONV", "im2col", 1);
  auto im2col = CudaBackend::Create();
  unsetenv("TROUPE_CUDA_CONV");
  ASSERT_TRUE(im2col.ok()) << im2col.status();
  EXPECT_EQ((*im2col)->convolutions(), "im2col + cuBLAS (as asked)");
}

// Host only (no GPU): which GPUs a build's architecture list covers, as
// CMAKE_CUDA_ARCHITECTURES spells it, and what the start-up check says.
TEST(CudaArchitectureTest, MachineCodeCoversItsMajorVersionAndPtxEveryNewerGpu) {
  auto default_list = ParseCudaArchitectures("80-real;86-real;89-real;90");
  ASSERT_TRUE(default_list.ok()) << default_list.status();
  EXPECT_EQ(DescribeCudaArchitectures(*default_list), "sm_80, sm_86, sm_89, sm_90 + PTX compute_90");
  EXPECT_TRUE(CoversComputeCapability(*default_list, 8, 0));   // A100
  EXPECT_TRUE(CoversComputeCapability(*default_list, 8, 7));   // Orin: sm_86's machine code
  EXPECT_TRUE(CoversComputeCapability(*default_list, 9, 0));   // H100, H200
  EXPECT_TRUE(CoversComputeCapability(*default_list, 12, 0));  // a newer GPU: compute_90's PTX
  EXPECT_FALSE(CoversComputeCapability(*default_list, 7, 5));  // T4: older than every entry
  auto hopper_code_only = ParseCudaArchitectures("90-real");
  ASSERT_TRUE(hopper_code_only.ok());
  EXPECT_FALSE(CoversComputeCapability(*hopper_code_only, 10, 0)) << "machine code does not cross a major version";
  EXPECT_FALSE(CoversComputeCapability(*hopper_code_only, 8, 9));
  auto ptx_only = ParseCudaArchitectures("75-virtual");
  ASSERT_TRUE(ptx_only.ok());
  EXPECT_EQ(DescribeCudaArchitectures(*ptx_only), "no machine code + PTX compute_75");
  EXPECT_TRUE(CoversComputeCapability(*ptx_only, 8, 6));
  for (const char* bad : {"sm_90", "9", "90-fast", "x"}) {
    auto parsed = ParseCudaArchitectures(absl::StrCat("80-real,", bad));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find(absl::StrCat("'", bad, "'")), std::string::npos) << parsed.status();
  }
  // This build's own list parses (it is baked in at configure time) and covers something.
  EXPECT_FALSE(BuiltArchitectures().empty());
}

// Host only (no GPU): cuDNN opens where the toolkit has it, and the
// descriptors troupe builds give cuDNN the engine's output shape for each
// geometry, odd sizes and padding included.
TEST(CudnnLibraryTest, DescriptorsGiveTheEnginesOutputShapes) {
  absl::StatusOr<const CudnnApi*> api = LoadCudnn();
  if (!api.ok()) GTEST_SKIP() << api.status();
  std::printf("%s\n", CudnnDescription(**api).c_str());
  const ConvGeometry geometries[] = {
      {.n = 256, .c = 9, .h = 84, .w = 84, .oc = 32, .kh = 3, .kw = 3, .stride = 2, .pad = 0},
      {.n = 3, .c = 4, .h = 10, .w = 7, .oc = 5, .kh = 3, .kw = 2, .stride = 2, .pad = 1},
      {.n = 1, .c = 1, .h = 28, .w = 28, .oc = 64, .kh = 4, .kw = 4, .stride = 2, .pad = 1},
  };
  for (const ConvGeometry& g : geometries) {
    absl::StatusOr<std::array<int, 4>> shape = CudnnOutputShape(**api, g);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(*shape, (std::array<int, 4>{static_cast<int>(g.n), static_cast<int>(g.oc), static_cast<int>(g.oh()),
                                          static_cast<int>(g.ow())}));
  }
  // What cuDNN's 4-d descriptors cannot hold is an error, not a wrong plan.
  const ConvGeometry huge{.n = 70000, .c = 64, .h = 32, .w = 32, .oc = 8, .kh = 3, .kw = 3, .stride = 1, .pad = 1};
  absl::StatusOr<std::array<int, 4>> shape = CudnnOutputShape(**api, huge);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("elements"), std::string::npos) << shape.status();
}

TEST(CudnnLibraryTest, AMissingLibraryOrSymbolIsAClearError) {
  absl::StatusOr<const CudnnApi*> missing = OpenCudnn({"/nonexistent/libcudnn.so.9"});
  ASSERT_FALSE(missing.ok());
  if (missing.status().message().find("built without cudnn.h") != std::string::npos) {
    GTEST_SKIP() << missing.status();
  }
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("cuDNN not found"), std::string::npos) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/libcudnn.so.9"), std::string::npos) << missing.status();
  // A library that opens but is not cuDNN names the first call it lacks.
  absl::StatusOr<const CudnnApi*> wrong = OpenCudnn({"libm.so.6"});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("libm.so.6 has no cudnnGetVersion"), std::string::npos) << wrong.status();
}

TEST_F(CudaOpsTest, RowBiasMatchesCpu) {
  const int64_t rows = 33, cols = 70;
  std::vector<float> y = RandomVector(rows * cols, 1), bias = RandomVector(cols, 2), dbias = RandomVector(cols, 3);
  DeviceVector gy(gpu_.get(), y), gb(gpu_.get(), bias), gdb(gpu_.get(), dbias);
  cpu_.AddRowBias(rows, cols, bias.data(), y.data());
  gpu_->AddRowBias(rows, cols, gb.data(), gy.data());
  ExpectNear(gy.ToHost(), y, 1e-6f, false, "AddRowBias");
  cpu_.RowBiasBackward(rows, cols, y.data(), dbias.data());
  gpu_->RowBiasBackward(rows, cols, gy.data(), gdb.data());
  ExpectNear(gdb.ToHost(), dbias, 1e-4f, true, "RowBiasBackward");
}

TEST_F(CudaOpsTest, ActivationsAndBinaryOpsMatchCpu) {
  const int64_t n = 4099;
  std::vector<float> x = RandomVector(n, 1, -3.0f, 3.0f), b = RandomVector(n, 2), dy = RandomVector(n, 3);
  DeviceVector gx(gpu_.get(), x), gb(gpu_.get(), b), gdy(gpu_.get(), dy);
  for (int f = 0; f <= static_cast<int>(Activation::kSoftplus); ++f) {
    const auto act = static_cast<Activation>(f);
    std::vector<float> y(n), dx = RandomVector(n, 4);
    DeviceVector gy(gpu_.get(), y), gdx(gpu_.get(), dx);
    cpu_.ActivationForward(act, 0.2f, x.data(), y.data(), n);
    gpu_->ActivationForward(act, 0.2f, gx.data(), gy.data(), n);
    ExpectNear(gy.ToHost(), y, 1e-5f, false, "activation " + std::to_string(f));
    cpu_.ActivationBackward(act, 0.2f, x.data(), y.data(), dy.data(), dx.data(), n);
    gpu_->ActivationBackward(act, 0.2f, gx.data(), gy.data(), gdy.data(), gdx.data(), n);
    ExpectNear(gdx.ToHost(), dx, 1e-5f, false, "activation backward " + std::to_string(f));
  }
  for (int op = 0; op <= static_cast<int>(Binary::kMul); ++op) {
    const auto bin = static_cast<Binary>(op);
    std::vector<float> y(n), da = RandomVector(n, 5), db = RandomVector(n, 6);
    DeviceVector gy(gpu_.get(), y), gda(gpu_.get(), da), gdb(gpu_.get(), db);
    cpu_.BinaryForward(bin, x.data(), b.data(), y.data(), n);
    gpu_->BinaryForward(bin, gx.data(), gb.data(), gy.data(), n);
    ExpectNear(gy.ToHost(), y, 1e-6f, false, "binary " + std::to_string(op));
    cpu_.BinaryBackward(bin, x.data(), b.data(), dy.data(), da.data(), db.data(), n);
    gpu_->BinaryBackward(bin, gx.data(), gb.data(), gdy.data(), gda.data(), gdb.data(), n);
    ExpectNear(gda.ToHost(), da, 1e-6f, false, "binary da " + std::to_string(op));
    ExpectNear(gdb.ToHost(), db, 1e-6f, false, "binary db " + std::to_string(op));
  }
}

TEST_F(CudaOpsTest, ReductionsMatchCpu) {
  const int64_t outer = 5, reduce = 37, inner = 11, n = outer * reduce * inner;
  std::vector<float> x = RandomVector(n, 1), y(outer * inner), dy = RandomVector(outer * inner, 2), dx = RandomVector(n, 3);
  DeviceVector gx(gpu_.get(), x), gy(gpu_.get(), y), gdy(gpu_.get(), dy), gdx(gpu_.get(), dx);
  std::vector<float> reduced(2);
  DeviceVector greduced(gpu_.get(), reduced);
  cpu_.Sum(x.data(), n, 0.5f, &reduced[0]);
  cpu_.SquaredNorm(x.data(), n, &reduced[1]);
  gpu_->Sum(gx.data(), n, 0.5f, greduced.data());
  gpu_->SquaredNorm(gx.data(), n, greduced.data() + 1);
  ExpectNear(greduced.ToHost(), reduced, 1e-6f, true, "Sum and SquaredNorm (on the device)");
  cpu_.SumAxis(outer, reduce, inner, x.data(), y.data());
  gpu_->SumAxis(outer, reduce, inner, gx.data(), gy.data());
  ExpectNear(gy.ToHost(), y, 1e-5f, true, "SumAxis");
  cpu_.SumAxisBackward(outer, reduce, inner, dy.data(), dx.data());
  gpu_->SumAxisBackward(outer, reduce, inner, gdy.data(), gdx.data());
  ExpectNear(gdx.ToHost(), dx, 1e-6f, false, "SumAxisBackward");
}

TEST_F(CudaOpsTest, LayerNormMatchesCpu) {
  const int64_t rows = 19, cols = 300;
  std::vector<float> x = RandomVector(rows * cols, 1, -2.0f, 3.0f), gamma = RandomVector(cols, 2), beta = RandomVector(cols, 3);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows), dy = RandomVector(rows * cols, 4);
  std::vector<float> dx = RandomVector(rows * cols, 5), dgamma = RandomVector(cols, 6), dbeta = RandomVector(cols, 7);
  DeviceVector gx(gpu_.get(), x), gg(gpu_.get(), gamma), gbeta(gpu_.get(), beta), gy(gpu_.get(), y),
      gmean(gpu_.get(), mean), grstd(gpu_.get(), rstd), gdy(gpu_.get(), dy), gdx(gpu_.get(), dx),
      gdg(gpu_.get(), dgamma), gdbeta(gpu_.get(), dbeta);
  cpu_.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
  gpu_->LayerNormForward(rows, cols, 1e-5f, gx.data(), gg.data(), gbeta.data(), gy.data(), gmean.data(),
                         grstd.data());
  ExpectNear(gy.ToHost(), y, 1e-4f, false, "LayerNorm y");
  ExpectNear(grstd.ToHost(), rstd, 1e-5f, false, "LayerNorm rstd");
  cpu_.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                         dgamma.data(), dbeta.data());
  gpu_->LayerNormBackward(rows, cols, gx.data(), gg.data(), gmean.data(), grstd.data(), gdy.data(), gdx.data(),
                          gdg.data(), gdbeta.data());
  ExpectNear(gdx.ToHost(), dx, 1e-4f, false, "LayerNorm dx");
  ExpectNear(gdg.ToHost(), dgamma, 2e-4f, true, "LayerNorm dgamma");
  ExpectNear(gdbeta.ToHost(), dbeta, 2e-4f, true, "LayerNorm dbeta");
}

TEST_F(CudaOpsTest, BatchNormKernelsMatchCpu) {
  const int64_t n = 6, c = 5, hw = 49, size = n * c * hw;
  std::vector<float> x = RandomVector(size, 1, -1.0f, 2.0f), sums(2 * c + 1), gamma = RandomVector(c, 2), beta = RandomVector(c, 3);
  std::vector<float> mean = RandomVector(c, 4), rstd = RandomVector(c, 5, 0.5f, 2.0f), y(size), dy = RandomVector(size, 6);
  std::vector<float> bsums(2 * c + 1), dx = RandomVector(size, 7);
  DeviceVector gx(gpu_.get(), x), gsums(gpu_.get(), sums), gg(gpu_.get(), gamma), gbeta(gpu_.get(), beta),
      gmean(gpu_.get(), mean), grstd(gpu_.get(), rstd), gy(gpu_.get(), y), gdy(gpu_.get(), dy),
      gbsums(gpu_.get(), bsums), gdx(gpu_.get(), dx);
  cpu_.BatchNormStats(n, c, hw, x.data(), sums.data());
  gpu_->BatchNormStats(n, c, hw, gx.data(), gsums.data());
  ExpectNear(gsums.ToHost(), sums, 1e-5f, true, "BatchNormStats");
  // Moments and running statistics from the sums, on the device.
  std::vector<float> moments(2 * c), running = RandomVector(2 * c, 8, 0.5f, 1.5f);
  DeviceVector gmoments(gpu_.get(), moments), grunning(gpu_.get(), running);
  cpu_.BatchNormMoments(c, 1e-5f, 0.1f, sums.data(), running.data(), running.data() + c, moments.data(),
                        moments.data() + c);
  gpu_->BatchNormMoments(c, 1e-5f, 0.1f, gsums.data(), grunning.data(), grunning.data() + c, gmoments.data(),
                         gmoments.data() + c);
  ExpectNear(gmoments.ToHost(), moments, 1e-5f, false, "BatchNormMoments mean, rstd");
  ExpectNear(grunning.ToHost(), running, 1e-5f, false, "BatchNormMoments running statistics");
  cpu_.BatchNormApply(n, c, hw, x.data(), mean.data(), rstd.data(), gamma.data(), beta.data(), y.data());
  gpu_->BatchNormApply(n, c, hw, gx.data(), gmean.data(), grstd.data(), gg.data(), gbeta.data(), gy.data());
  ExpectNear(gy.ToHost(), y, 1e-5f, false, "BatchNormApply");
  cpu_.BatchNormBackwardStats(n, c, hw, x.data(), mean.data(), rstd.data(), dy.data(), bsums.data());
  gpu_->BatchNormBackwardStats(n, c, hw, gx.data(), gmean.data(), grstd.data(), gdy.data(), gbsums.data());
  ExpectNear(gbsums.ToHost(), bsums, 1e-5f, true, "BatchNormBackwardStats");
  // The cross-replica hook sits between the halves: a doubled count stands in for two replicas.
  bsums[2 * c] *= 2;
  DeviceVector gdoubled(gpu_.get(), bsums);
  cpu_.BatchNormBackwardApply(n, c, hw, x.data(), mean.data(), rstd.data(), gamma.data(), bsums.data(), dy.data(),
                              dx.data());
  gpu_->BatchNormBackwardApply(n, c, hw, gx.data(), gmean.data(), grstd.data(), gg.data(), gdoubled.data(), gdy.data(),
                               gdx.data());
  ExpectNear(gdx.ToHost(), dx, 1e-4f, false, "BatchNormBackwardApply");
}

TEST_F(CudaOpsTest, SoftmaxAndCrossEntropyMatchCpu) {
  const int64_t rows = 17, cols = 51;  // 51 atoms: D4PG's categorical critic
  std::vector<float> x = RandomVector(rows * cols, 1, -4.0f, 4.0f), dy = RandomVector(rows * cols, 2);
  std::vector<int32_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>((r * 7) % cols);
  int32_t* glabels = DeviceInts(gpu_.get(), labels);
  DeviceVector gx(gpu_.get(), x), gdy(gpu_.get(), dy);
  for (bool log : {false, true}) {
    std::vector<float> y(rows * cols), dx = RandomVector(rows * cols, 3);
    DeviceVector gy(gpu_.get(), y), gdx(gpu_.get(), dx);
    cpu_.SoftmaxForward(rows, cols, x.data(), y.data(), log);
    gpu_->SoftmaxForward(rows, cols, gx.data(), gy.data(), log);
    ExpectNear(gy.ToHost(), y, 1e-5f, false, log ? "LogSoftmax" : "Softmax");
    cpu_.SoftmaxBackward(rows, cols, y.data(), dy.data(), dx.data(), log);
    gpu_->SoftmaxBackward(rows, cols, gy.data(), gdy.data(), gdx.data(), log);
    ExpectNear(gdx.ToHost(), dx, 1e-4f, false, log ? "LogSoftmax backward" : "Softmax backward");
  }
  std::vector<float> logp(rows * cols), dx = RandomVector(rows * cols, 4);
  DeviceVector glogp(gpu_.get(), logp), gdx(gpu_.get(), dx);
  std::vector<float> loss(1);
  DeviceVector gloss(gpu_.get(), loss);
  cpu_.CrossEntropyForward(rows, cols, x.data(), labels.data(), logp.data(), loss.data());
  gpu_->CrossEntropyForward(rows, cols, gx.data(), glabels, glogp.data(), gloss.data());
  ExpectNear(gloss.ToHost(), loss, 1e-5f, true, "CrossEntropyForward loss (on the device)");
  const float half = 0.5f;
  DeviceVector gdloss(gpu_.get(), {half});
  cpu_.CrossEntropyBackward(rows, cols, logp.data(), labels.data(), &half, dx.data());
  gpu_->CrossEntropyBackward(rows, cols, glogp.data(), glabels, gdloss.data(), gdx.data());
  ExpectNear(gdx.ToHost(), dx, 1e-5f, false, "CrossEntropyBackward");
  gpu_->Free(glabels);
}

TEST_F(CudaOpsTest, OptimizerKernelsMatchCpu) {
  const int64_t n = 5003;
  std::vector<float> g = RandomVector(n, 1), p = RandomVector(n, 2), m = RandomVector(n, 3, 0.0f, 0.1f), v = RandomVector(n, 4, 0.0f, 0.1f);
  DeviceVector gg(gpu_.get(), g), gp(gpu_.get(), p), gm(gpu_.get(), m), gv(gpu_.get(), v);
  cpu_.AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f, 0.002f, g.data(), p.data(), m.data(), v.data());
  gpu_->AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f, 0.002f, gg.data(), gp.data(), gm.data(), gv.data());
  ExpectNear(gp.ToHost(), p, 1e-5f, false, "Adam param");
  ExpectNear(gm.ToHost(), m, 1e-6f, false, "Adam m");
  ExpectNear(gv.ToHost(), v, 1e-6f, false, "Adam v");
  cpu_.SgdUpdate(n, 0.1f, 0.9f, 1e-4f, g.data(), p.data(), m.data());
  gpu_->SgdUpdate(n, 0.1f, 0.9f, 1e-4f, gg.data(), gp.data(), gm.data());
  ExpectNear(gp.ToHost(), p, 1e-5f, false, "SGD param");
  cpu_.Polyak(n, 0.005f, g.data(), p.data());
  gpu_->Polyak(n, 0.005f, gg.data(), gp.data());
  ExpectNear(gp.ToHost(), p, 1e-5f, false, "Polyak");
  // Clipping: once above the limit (scaled), once below (untouched), the norm on the device.
  for (const float max_norm : {1.0f, 1e6f}) {
    float cpu_norm = 0;
    DeviceVector gpu_norm(gpu_.get(), {0.0f});
    cpu_.ClipByNorm(g.data(), n, max_norm, &cpu_norm);
    gpu_->ClipByNorm(gg.data(), n, max_norm, gpu_norm.data());
    ExpectNear(gg.ToHost(), g, 1e-6f, false, "ClipByNorm x");
    ExpectNear(gpu_norm.ToHost(), {cpu_norm}, 1e-4f, false, "ClipByNorm norm");
  }
  // LAMB's and LARS's trust ratio and the scale by it, on the device.
  std::vector<float> norms = {4.0f, 9.0f, 0.0f, 0.0f};
  DeviceVector gnorms(gpu_.get(), norms);
  cpu_.TrustRatio(&norms[0], &norms[1], 0.5f, 0.1f, &norms[2]);
  gpu_->TrustRatio(gnorms.data(), gnorms.data() + 1, 0.5f, 0.1f, gnorms.data() + 2);
  cpu_.TrustRatio(&norms[3], &norms[1], 0.5f, 0.1f, &norms[3]);
  gpu_->TrustRatio(gnorms.data() + 3, gnorms.data() + 1, 0.5f, 0.1f, gnorms.data() + 3);
  ExpectNear(gnorms.ToHost(), norms, 1e-6f, false, "TrustRatio");
  cpu_.ScaleByScalar(2.0f, &norms[2], p.data(), n);
  gpu_->ScaleByScalar(2.0f, gnorms.data() + 2, gp.data(), n);
  ExpectNear(gp.ToHost(), p, 1e-6f, false, "ScaleByScalar");
}

// --- Whole steps through the tape ---------------------------------------------------------
// Everything a step touches is this backend's memory (backend.h), so they
// run on any GPU.

// One DrQ-shaped pixel critic update, as D4PG's learner takes it (conv 3x3
// stride 2 then three stride 1 with fused ReLU, linear, layer
// norm, tanh; the critic MLP on [features, action] to 51 atom logits;
// cross-entropy to fixed target atoms, global-norm clipping, Adam at 1e-2 so
// that every weight moves by far more than the comparison's tolerance) for
// `steps` steps on `backend`; returns the whole state (weights, Adam's
// moments, its step count).
std::vector<nn::CheckpointTensor> PixelCriticSteps(nn::Backend* backend, int steps) {
  constexpr int kBatch = 8, kChannels = 16, kFeatures = 32, kActions = 2, kAtoms = 51;
  nn::ParameterSet params;
  std::vector<nn::Conv2dLayer> convs;
  int64_t in = 9, size = 32;
  for (int i = 0; i < 4; ++i) {
    const int64_t stride = i == 0 ? 2 : 1;
    convs.push_back(nn::Conv2dLayer::Create(params, "conv" + std::to_string(i), in, kChannels, 3, stride, 0));
    in = kChannels;
    size = (size - 3) / stride + 1;
  }
  const auto linear = nn::LinearLayer::Create(params, "linear", kChannels * size * size, kFeatures);
  const auto norm = nn::LayerNormLayer::Create(params, "norm", kFeatures);
  const auto critic = nn::Mlp::Create(params, "critic", {kFeatures + kActions, 64, 64, kAtoms});
  params.Allocate(*backend, /*seed=*/5);
  nn::Tape tape(backend);
  nn::Adam adam(&params, backend);
  const std::vector<float> pixels = RandomVector(kBatch * 9 * 32 * 32, 11, 0.0f, 1.0f);
  const std::vector<float> actions = RandomVector(kBatch * kActions, 12);
  std::vector<int32_t> targets(kBatch);
  for (int i = 0; i < kBatch; ++i) targets[i] = (i * 13) % kAtoms;
  for (int step = 0; step < steps; ++step) {
    tape.Reset();
    params.ZeroGrad();
    nn::Var h = tape.Input(pixels.data(), {kBatch, 9, 32, 32});
    for (const nn::Conv2dLayer& conv : convs) h = conv(tape, params, h, nn::FusedActivation::kRelu);
    nn::Var features = nn::Tanh(norm(tape, params, linear(tape, params, nn::Flatten(h))));
    const std::array<nn::Var, 2> parts = {features, tape.Input(actions.data(), {kBatch, kActions})};
    nn::Var logits = critic(tape, params, nn::Concat(parts, /*axis=*/1));
    nn::Var loss = nn::SoftmaxCrossEntropy(logits, targets);
    tape.Backward(loss);
    nn::ClipGradientsByGlobalNorm(params, *backend, /*max_norm=*/40.0f);
    adam.Step(/*learning_rate=*/1e-2f);
  }
  return nn::CheckpointTensors(params, &adam);
}

// Three critic updates on the GPU against the CPU: the whole state within
// 2e-3 relative (cuDNN's and cuBLAS's summation orders), Adam's moments
// (which carry the gradients' size) included, every part moved by ten
// times that.
TEST(CudaStepTest, PixelCriticStepMatchesCpu) {
  REQUIRE_CUDA_DEVICE();
  auto gpu = CudaBackend::Create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  nn::CpuBackend cpu(1);
  TROUPE_EXPECT_SAME_STATE(PixelCriticSteps(&cpu, 0), PixelCriticSteps(&cpu, 3), PixelCriticSteps(gpu->get(), 3),
                           .tolerance = 2e-3);
}

// A DCGAN-shaped step: generator (linear, transposed conv, batch norm, tanh)
// and discriminator (conv, leaky relu, linear; the trainer's spectral norm
// is the GAN's own op, on CUDA in gan/trainer_test.cc) under the hinge
// loss, one Adam step each, as the GAN trainer does (learning rates of 1e-2
// and 2e-2, so that each network moves by far more than the comparison's
// tolerance). Returns the whole state: each network's weights and Adam
// moments (named generator/... and discriminator/...) and batch norm's
// running statistics.
std::vector<nn::CheckpointTensor> GanSteps(nn::Backend* backend, int steps) {
  nn::ParameterSet g, d;
  auto g_in = nn::LinearLayer::Create(g, "g.in", 16, 8 * 7 * 7);
  const int g_up = g.Add("g.up.w", {8, 4, 4, 4}, nn::Init::FanIn(8 * 16));
  const int g_gamma = g.Add("g.bn.gamma", {4}, nn::Init::Constant(1.0f));
  const int g_beta = g.Add("g.bn.beta", {4}, nn::Init::Zeros());
  const int g_out = g.Add("g.out.w", {4, 1, 3, 3}, nn::Init::FanIn(36));
  const int d_conv = d.Add("d.conv.w", {8, 1, 4, 4}, nn::Init::FanIn(16));
  auto d_head = nn::LinearLayer::Create(d, "d.head", 8 * 7 * 7, 1);
  g.Allocate(*backend, 1);
  d.Allocate(*backend, 2);
  nn::DeviceBuffer running_mean(*backend, 4), running_var(*backend, 4);
  backend->Fill(running_mean.data(), 4, 0.0f);
  backend->Fill(running_var.data(), 4, 1.0f);
  nn::Tape tape(backend);
  nn::Adam g_adam(&g, backend), d_adam(&d, backend);
  const int batch = 8;
  const std::vector<float> real = RandomVector(batch * 28 * 28, 5);
  const std::vector<float> z = RandomVector(batch * 16, 6);
  const std::vector<float> ones_data(batch, 1.0f);  // uploaded each step, as any input
  auto generate = [&](bool trainable) {
    nn::Var h = nn::Relu(g_in(tape, g, tape.Input(z.data(), {batch, 16})));
    h = nn::Reshape(h, {batch, 8, 7, 7});
    h = nn::ConvTranspose2d(h, tape.Parameter(g, g_up), nn::Var{}, /*stride=*/2, /*pad=*/1);
    h = nn::Relu(nn::BatchNorm(h, tape.Parameter(g, g_gamma), tape.Parameter(g, g_beta),
                               {running_mean.data(), running_var.data(), 0.1f}, /*training=*/true));
    h = nn::ConvTranspose2d(h, tape.Parameter(g, g_out), nn::Var{}, 2, 1, /*output_pad=*/1);
    return nn::Tanh(h);  // [batch, 1, 28, 28]: (14 - 1) * 2 - 2 + 3 + 1
  };
  auto discriminate = [&](nn::Var images) {
    nn::Var h = nn::LeakyRelu(nn::Conv2d(images, tape.Parameter(d, d_conv), nn::Var{}, /*stride=*/4, /*pad=*/0), 0.2f);
    return d_head(tape, d, nn::Flatten(h));
  };
  for (int step = 0; step < steps; ++step) {
    // Discriminator: hinge loss on real and generated images.
    tape.Reset();
    d.ZeroGrad();
    g.ZeroGrad();
    nn::Var fake = generate(false);
    nn::Var d_real = discriminate(tape.Input(real.data(), {batch, 1, 28, 28}));
    nn::Var d_fake = discriminate(fake);
    nn::Var ones = tape.Input(ones_data.data(), {batch, 1});
    nn::Var d_loss = nn::Add(nn::Mean(nn::Relu(nn::Sub(ones, d_real))), nn::Mean(nn::Relu(nn::Add(ones, d_fake))));
    tape.Backward(d_loss);
    d_adam.Step(2e-2f);
    // Generator: -D(G(z)).
    tape.Reset();
    d.ZeroGrad();
    g.ZeroGrad();
    nn::Var g_loss = nn::Scale(nn::Mean(discriminate(generate(true))), -1.0f);
    tape.Backward(g_loss);
    g_adam.Step(1e-2f);
  }
  std::vector<nn::CheckpointTensor> state;
  for (const auto& [network, params, adam] :
       {std::tuple{"generator/", &g, &g_adam}, std::tuple{"discriminator/", &d, &d_adam}}) {
    for (nn::CheckpointTensor& t : nn::CheckpointTensors(*params, adam)) {
      t.name = network + t.name;
      state.push_back(std::move(t));
    }
  }
  for (const auto& [name, buffer] : {std::pair{"g.bn.running/mean", &running_mean},
                                     std::pair{"g.bn.running/var", &running_var}}) {
    state.push_back({name, nn::Shape{buffer->size()}, buffer->Download()});
  }
  return state;
}

// The step models above on the CPU alone, so that every build without a GPU
// runs them too (a shape mistake in them once surfaced only on the GPU).
TEST(CudaStepTest, StepModelsRunOnTheCpu) {
  nn::CpuBackend cpu(1);
  for (const auto& [name, state] : {std::pair{"critic", PixelCriticSteps(&cpu, 1)}, std::pair{"GAN", GanSteps(&cpu, 1)}}) {
    ASSERT_FALSE(state.empty()) << name;
    for (const nn::CheckpointTensor& t : state) {
      for (float v : t.values) ASSERT_TRUE(std::isfinite(v)) << name << " " << t.name;
    }
  }
}

// Two GAN steps on the GPU against the CPU: the whole state within 2e-3
// relative, G's and D's Adam moments included, every part moved by ten
// times that (a G that skipped its update fails on every G tensor).
TEST(CudaStepTest, GanStepMatchesCpu) {
  REQUIRE_CUDA_DEVICE();
  auto gpu = CudaBackend::Create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  nn::CpuBackend cpu(1);
  TROUPE_EXPECT_SAME_STATE(GanSteps(&cpu, 0), GanSteps(&cpu, 2), GanSteps(gpu->get(), 2), .tolerance = 2e-3);
}

// --- Replicas ---------------------------------------------------------------------------------

// The test model on a GPU (`device`): replicator/test_model.h.
std::unique_ptr<replicator::testing::TestModel> ModelOnGpu(int device) {
  CudaBackendOptions options;
  options.device = device;
  auto gpu = CudaBackend::Create(options);
  TROUPE_CHECK(gpu.ok());
  return std::make_unique<replicator::testing::TestModel>(std::shared_ptr<nn::Backend>(std::move(*gpu)));
}

// K in-process replicas (threads, in-process collectives) on GPU 0.
std::vector<float> TrainInProcess(int replicas, int steps) {
  replicator::ReplicatorOptions options;
  options.num_replicas = replicas;
  auto replicator = replicator::Replicator::Create(options);
  EXPECT_TRUE(replicator.ok()) << replicator.status();
  std::vector<std::unique_ptr<replicator::testing::TestModel>> models;
  for (int r = 0; r < replicas; ++r) models.push_back(ModelOnGpu(0));
  const absl::Status s = (*replicator)->RunReplicas([&](replicator::ReplicaContext& ctx) {
    return replicator::testing::TrainShard(ctx, *models[ctx.local_index()], steps, /*bucket_floats=*/64);
  });
  EXPECT_TRUE(s.ok()) << s;
  return models[0]->params.DownloadValues();
}

TEST(CudaReplicaTest, TwoReplicasOnOneGpuMatchOneReplica) {
  REQUIRE_CUDA_DEVICE();
  ExpectNear(TrainInProcess(2, 3), TrainInProcess(1, 3), 1e-4f, false, "K=2 vs K=1 params");
}

#ifdef TROUPE_HAVE_NCCL
TEST(NcclCollectivesTest, SingleReplicaCollectivesOnHostAndDeviceMemory) {
  REQUIRE_CUDA_DEVICE();
  auto group = NcclCollectives::CreateGroup({0}, std::chrono::seconds(30));
  ASSERT_TRUE(group.ok()) << group.status();
  NcclCollectives& c = *(*group)[0];
  std::vector<float> host = {1, 2, 3};
  ASSERT_TRUE(c.AllReduce(host, replicator::ReduceOp::kMean).ok());
  EXPECT_EQ(host, (std::vector<float>{1, 2, 3}));
  auto backend = CudaBackend::Create();
  ASSERT_TRUE(backend.ok());
  DeviceVector device(backend->get(), {4, 5});
  ASSERT_TRUE(c.StartAllReduce({device.data(), 2}, replicator::ReduceOp::kSum).ok());
  ASSERT_TRUE(c.WaitAll().ok());
  EXPECT_EQ(device.ToHost(), (std::vector<float>{4, 5}));
  std::vector<float> out(3);
  ASSERT_TRUE(c.AllGather(host, out).ok());
  EXPECT_EQ(out, host);
  EXPECT_TRUE(c.Broadcast(host, 0).ok());
  EXPECT_EQ(c.Broadcast(host, 1).code(), absl::StatusCode::kInvalidArgument);
  // One replica's part is the whole: out of place on the host, in place on the device.
  std::vector<float> part(3);
  ASSERT_TRUE(c.ReduceScatter(host, part, replicator::ReduceOp::kMean).ok());
  EXPECT_EQ(part, host);
  ASSERT_TRUE(c.ReduceScatter({device.data(), 2}, {device.data(), 2}, replicator::ReduceOp::kSum).ok());
  EXPECT_EQ(device.ToHost(), (std::vector<float>{4, 5}));
  EXPECT_EQ(c.ReduceScatter(host, {part.data(), 2}, replicator::ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.AllGather({device.data(), 2}, {device.data(), 2}).ok());
  EXPECT_EQ(device.ToHost(), (std::vector<float>{4, 5}));
}

TEST(NcclCollectivesTest, ReplicasOnSeveralGpusMatchOneReplica) {
  REQUIRE_CUDA_DEVICE();
  const int devices = DeviceCount();
  if (devices < 2) {
    GTEST_SKIP() << "needs 2+ CUDA devices (found " << devices << "): NCCL refuses two ranks on one GPU";
  }
  const int k = 2;
  auto group = NcclCollectives::CreateGroup({0, 1}, std::chrono::seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<std::unique_ptr<replicator::testing::TestModel>> models;
  for (int r = 0; r < k; ++r) models.push_back(ModelOnGpu(r));
  std::vector<absl::Status> results(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      replicator::ReplicaContext ctx((*group)[r].get());
      results[r] = replicator::testing::TrainShard(ctx, *models[r], 3, /*bucket_floats=*/64);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : results) ASSERT_TRUE(s.ok()) << s;
  ExpectNear(models[1]->params.DownloadValues(), TrainInProcess(1, 3), 1e-4f, false, "NCCL K=2 vs K=1 params");
}

// The NCCL the process runs with (needs no GPU): its version, printed for the
// GPU machine's log (which decides whether two ranks may share its GPU).
TEST(NcclVersionTest, IsTheLoadedLibrarysVersion) {
  const int version = NcclVersion();
  std::printf("NCCL %s (%d)\n", NcclVersionString().c_str(), version);
  EXPECT_GE(version, 20900);  // the major*10000 + minor*100 + patch encoding, from NCCL 2.9 on
  EXPECT_LT(version, 100000);
}

// The rank process of TwoProcessesOnOneGpuMatchOneReplica, started by it as
// this binary with TROUPE_NCCL_RANK and TROUPE_NCCL_DIR set (skipped
// otherwise): joins a 2-rank NCCL group on GPU 0 through an id file, as
// one of two processes, trains its shard and writes its parameters.
TEST(NcclRankProcess, TrainsItsShardAndWritesItsParameters) {
  const char* rank = std::getenv("TROUPE_NCCL_RANK");
  const char* dir = std::getenv("TROUPE_NCCL_DIR");
  if (rank == nullptr || dir == nullptr) {
    GTEST_SKIP() << "a rank process of NcclCollectivesTest.TwoProcessesOnOneGpuMatchOneReplica, which starts it";
  }
  NcclOptions options;
  options.rank = std::atoi(rank);
  options.num_replicas = 2;
  options.device = 0;
  options.id_file = std::string(dir) + "/nccl.id";
  auto collectives = NcclCollectives::Create(options);
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  auto model = ModelOnGpu(0);
  replicator::ReplicaContext ctx(collectives->get());
  const absl::Status trained = replicator::testing::TrainShard(ctx, *model, 3, /*bucket_floats=*/64);
  ASSERT_TRUE(trained.ok()) << trained;
  const std::vector<float> params = model->params.DownloadValues();
  std::ofstream(std::string(dir) + "/params-" + rank, std::ios::binary)
      .write(reinterpret_cast<const char*>(params.data()), static_cast<std::streamsize>(sizeof(float) * params.size()));
  // The sharding collectives across the two processes, on device memory
  // (what split optimizer state and split parameters run): rank r gives
  // 10r + i (i = 0..3); its part of the sum is elements [2r, 2r + 2) of
  // 10 + 2i, and gathering the parts gives the whole sum in rank order.
  auto backend = CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int r = options.rank;
  DeviceVector in(backend->get(), {10.0f * r, 10.0f * r + 1, 10.0f * r + 2, 10.0f * r + 3});
  DeviceVector part(backend->get(), {0, 0}), whole(backend->get(), {0, 0, 0, 0});
  ASSERT_TRUE((*collectives)->ReduceScatter({in.data(), 4}, {part.data(), 2}, replicator::ReduceOp::kSum).ok());
  EXPECT_EQ(part.ToHost(), (std::vector<float>{10.0f + 4 * r, 12.0f + 4 * r})) << "rank " << r << "'s part";
  ASSERT_TRUE((*collectives)->AllGather({part.data(), 2}, {whole.data(), 4}).ok());
  EXPECT_EQ(whole.ToHost(), (std::vector<float>{10, 12, 14, 16})) << "rank " << r << "'s gathered parts";
}

// The multi-process NCCL path (what NCCL_MPI runs under mpirun, with the id
// passed through a file instead of MPI) at K = 2 on ONE GPU, where NCCL
// allows two ranks there: two processes, each a rank on GPU 0, end with the
// parameters of one replica on the whole batch, and reduce-scatter and
// all-gather device memory across them exactly (each rank's check).
TEST(NcclCollectivesTest, TwoProcessesOnOneGpuMatchOneReplica) {
  REQUIRE_CUDA_DEVICE();
  if (NcclVersion() < kNcclMultiRankGpuVersion) {
    GTEST_SKIP() << "NCCL " << NcclVersionString()
                 << " refuses two ranks on one GPU; NCCL_MULTI_RANK_GPU_ENABLE=1 allows it from NCCL 2.30";
  }
  std::printf("NCCL %s, NCCL_MULTI_RANK_GPU_ENABLE=1\n", NcclVersionString().c_str());
  const std::string dir = ::testing::TempDir() + "/nccl_two_processes";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Each rank is this binary again, filtered to NcclRankProcess.
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(e2e::Start("/proc/self/exe", {"--gtest_filter=NcclRankProcess.*"},
                               dir + "/rank-" + std::to_string(r) + ".log",
                               {{"NCCL_MULTI_RANK_GPU_ENABLE", "1"},
                                {"TROUPE_NCCL_RANK", std::to_string(r)},
                                {"TROUPE_NCCL_DIR", dir}}));
  }
  for (int r = 0; r < 2; ++r) {
    const int exit_code = e2e::Wait(ranks[r], /*seconds=*/120);
    const std::string log = e2e::Read(dir + "/rank-" + std::to_string(r) + ".log");
    ASSERT_EQ(exit_code, 0) << "rank " << r << " (-1: still running after 120 s):\n" << log;
    ASSERT_NE(log.find("[       OK ] NcclRankProcess"), std::string::npos) << "rank " << r << ":\n" << log;
  }
  const std::vector<float> one_replica = TrainInProcess(1, 3);
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir + "/params-" + std::to_string(r), std::ios::binary);
    std::vector<float> params(one_replica.size());
    in.read(reinterpret_cast<char*>(params.data()), static_cast<std::streamsize>(sizeof(float) * params.size()));
    ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(sizeof(float) * params.size())) << "rank " << r;
    ExpectNear(params, one_replica, 1e-4f, false, "NCCL 2 processes on one GPU vs K=1 params");
  }
}
#endif  // TROUPE_HAVE_NCCL

}  // namespace
}  // namespace troupe::cuda
