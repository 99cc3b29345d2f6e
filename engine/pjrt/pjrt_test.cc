// The PJRT backend: the plugin loader's errors, the StableHLO it emits
// (against hand-written text), and each kernel the ops suite does not reach
// through the tape (optimizer updates, the C51 projection, byte images,
// strided copies, unaligned transfers) against the CPU backend, on the XLA
// CPU plugin the ctest fixture fetched (TROUPE_PJRT_PLUGIN). nn_ops_pjrt_test
// runs every op of the tape on it.
#include "common/build_tree.h"
#include "engine/pjrt/pjrt_backend.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/testing.h"
#include "engine/pjrt/pjrt_testing.h"
#include "engine/pjrt/stablehlo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::pjrt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Where pjrt_test's fake plugins are: beside the test in a bundle
// (TROUPE_FAKE_PLUGIN_DIR, set by its run.sh), else the build folder.
std::string FakePlugin(const std::string& name) {
  const char* dir = std::getenv("TROUPE_FAKE_PLUGIN_DIR");
  return std::string(dir != nullptr ? dir : TROUPE_FAKE_PLUGIN_DIR) + "/" + name;
}

using nn::RandomVector;

// --- The loader ---------------------------------------------------------------------------

TEST(PjrtPluginTest, AMissingFileIsNotFoundAndNamed) {
  auto plugin = Plugin::Load("/nonexistent/libtpu.so");
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(plugin.status().message(), HasSubstr("/nonexistent/libtpu.so"));
}

TEST(PjrtPluginTest, AFileThatIsNoLibraryIsRefused) {
  const std::string path = testing::TempDir() + "/not_a_library.so";
  std::ofstream(path) << "plain text\n";
  auto plugin = Plugin::Load(path);
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plugin.status().message(), HasSubstr("cannot load it"));
  EXPECT_FALSE(Plugin::Load(testing::TempDir()).ok()) << "a directory";
}

TEST(PjrtPluginTest, ALibraryWithoutGetPjrtApiIsNotAPlugin) {
  auto plugin = Plugin::Load(FakePlugin("libtroupe_fake_pjrt_no_symbol.so"));
  ASSERT_FALSE(plugin.ok());
  EXPECT_THAT(plugin.status().message(), HasSubstr("no symbol GetPjrtApi"));
}

TEST(PjrtPluginTest, AnUnsupportedApiVersionIsRefusedWithBothVersions) {
  auto plugin = Plugin::Load(FakePlugin("libtroupe_fake_pjrt_version_9.so"));
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plugin.status().message(), HasSubstr("API version 9.0 is not supported"));
  EXPECT_THAT(plugin.status().message(), HasSubstr("troupe speaks 0.81"));
}

TEST(PjrtPluginTest, TheEngineConfigNamesThePluginProblemBeforeAnythingStarts) {
  config::EngineConfig engine;
  engine.set_device(config::EngineConfig::PJRT);
  absl::Status no_plugin = engine::ValidateEngineConfig(engine, "learner", 32);
  EXPECT_THAT(no_plugin.message(), HasSubstr("learner.engine.pjrt_plugin"));
  engine.set_pjrt_plugin("/nonexistent/plugin.so");
  EXPECT_TRUE(engine::ValidateEngineConfig(engine, "learner", 32).ok());
  absl::Status missing = engine::CheckDeviceAvailable(engine, "learner");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("learner.engine.pjrt_plugin: PJRT plugin '/nonexistent/plugin.so'"));
  config::EngineConfig cpu;
  cpu.set_pjrt_plugin("/x.so");
  EXPECT_THAT(engine::ValidateEngineConfig(cpu, "gan", 32).message(), HasSubstr("engine.device is CPU"));
}

TEST(PjrtPluginTest, CompileOptionsAreTheDocumentedProtoBytes) {
  // executable_build_options {device_ordinal: -1 num_replicas: 1 num_partitions: 1}
  // compile_portable_executable: true
  const std::string want("\x1a\x0f\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x20\x01\x28\x01\x20\x01", 19);
  EXPECT_EQ(CompileOptions(), want);
}

// --- The StableHLO text -----------------------------------------------------------------------

TEST(StableHloTest, AnElementwiseProgramPrintsAsWritten) {
  Function f;
  Value x = f.Parameter({4}, "f32");
  Value y = f.Parameter({4}, "f32");
  f.AliasParameter(1, 0);
  f.Return({f.Add(y, f.Mul(f.Constant(2.0), x))});
  EXPECT_EQ(f.Module(),
            "module @troupe_kernel {\n"
            "  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> "
            "(tensor<4xf32>) {\n"
            "    %0 = \"stablehlo.constant\"() {value = dense<2.000000000e+00> : tensor<f32>} : () -> tensor<f32>\n"
            "    %1 = \"stablehlo.broadcast_in_dim\"(%0) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> "
            "tensor<4xf32>\n"
            "    %2 = \"stablehlo.multiply\"(%1, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    %3 = \"stablehlo.add\"(%arg1, %2) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    return %3 : tensor<4xf32>\n"
            "  }\n"
            "}\n");
}

TEST(StableHloTest, AReductionAndAMatrixProductPrintAsWritten) {
  Function f;
  Value a = f.Parameter({2, 3}, "f32");
  Value b = f.Parameter({3, 5}, "f32");
  Value rows = f.Reduce(a, {1});
  Value product = f.Dot(a, b, {1}, {0});
  EXPECT_EQ(rows.dims, Dims({2}));
  EXPECT_EQ(product.dims, Dims({2, 5}));
  f.Return({rows, product});
  const std::string text = f.Module();
  EXPECT_THAT(text, HasSubstr("    %1 = \"stablehlo.reduce\"(%arg0, %0) ({\n"
                              "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
                              "      %r = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
                              "      \"stablehlo.return\"(%r) : (tensor<f32>) -> ()\n"
                              "    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>\n"));
  EXPECT_THAT(text, HasSubstr("%2 = \"stablehlo.dot_general\"(%arg0, %arg1) {dot_dimension_numbers = "
                              "#stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, "
                              "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : "
                              "(tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<2x5xf32>\n"));
  EXPECT_THAT(text, HasSubstr("-> (tensor<2xf32>, tensor<2x5xf32>)"));
}

// The fingerprint stands for the text: programs built alike share it; one
// attribute, alias, result or replica count apart, they do not.
TEST(StableHloTest, TheFingerprintIsTheTextsWithoutPrintingIt) {
  enum Change { kNone, kAttribute, kAlias, kResult, kReplicas, kOperandOrder };
  auto build = [](Change change) {
    Function f;
    Value a = f.Parameter({2, 3}, "f32");
    Value b = f.Parameter({2, 3}, "f32");
    if (change == kAlias) f.AliasParameter(1, 0);
    if (change == kReplicas) f.set_replicas(2);
    Value sum = change == kOperandOrder ? f.Add(b, a) : f.Add(a, b);
    Value rows = f.Reduce(sum, {change == kAttribute ? 0 : 1});
    f.Return(change == kResult ? std::vector<Value>{rows, sum} : std::vector<Value>{rows});
    return std::pair{f.fingerprint(), f.Module()};
  };
  const auto [fingerprint, text] = build(kNone);
  EXPECT_EQ(build(kNone).first, fingerprint);
  for (Change change : {kAttribute, kAlias, kResult, kReplicas, kOperandOrder}) {
    const auto [other, other_text] = build(change);
    EXPECT_NE(other_text, text) << change;
    EXPECT_NE(other, fingerprint) << change;
  }
}

TEST(StableHloTest, FloatLiteralsReadBackExactly) {
  for (float v : {0.1f, -3.4028235e38f, 1e-30f, 0.99f}) {
    EXPECT_EQ(std::strtof(FloatLiteral(v).c_str(), nullptr), v) << FloatLiteral(v);
  }
}

TEST(PjrtBackendTest, AnAxpyIsOneProgramOverItsAllocationsWithTheScalarAtRunTime) {
  REQUIRE_PLUGIN();
  auto backend = PjrtBackend::Create({.plugin = plugin});
  ASSERT_TRUE(backend.ok()) << backend.status();
  PjrtBackend& b = **backend;
  float* x = b.AllocateFloats(4);
  float* y = b.AllocateFloats(6);
  b.Axpy(0.5f, x, y + 2, 4);
  EXPECT_EQ(b.last_program(),
            "module @troupe_kernel {\n"
            "  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<16xf32>, %arg2: tensor<6xf32> "
            "{tf.aliasing_output = 0 : i32}) -> (tensor<6xf32>) {\n"
            "    %0 = \"stablehlo.slice\"(%arg1) {start_indices = array<i64: 0>, limit_indices = array<i64: 1>, "
            "strides = array<i64: 1>} : (tensor<16xf32>) -> tensor<1xf32>\n"
            "    %1 = \"stablehlo.reshape\"(%0) : (tensor<1xf32>) -> tensor<f32>\n"
            "    %2 = \"stablehlo.broadcast_in_dim\"(%1) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> "
            "tensor<4xf32>\n"
            "    %3 = \"stablehlo.multiply\"(%2, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    %4 = \"stablehlo.slice\"(%arg2) {start_indices = array<i64: 2>, limit_indices = array<i64: 6>, "
            "strides = array<i64: 1>} : (tensor<6xf32>) -> tensor<4xf32>\n"
            "    %5 = \"stablehlo.add\"(%4, %3) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    %6 = \"stablehlo.constant\"() {value = dense<2> : tensor<i64>} : () -> tensor<i64>\n"
            "    %7 = \"stablehlo.dynamic_update_slice\"(%arg2, %5, %6) : (tensor<6xf32>, tensor<4xf32>, "
            "tensor<i64>) -> tensor<6xf32>\n"
            "    return %7 : tensor<6xf32>\n"
            "  }\n"
            "}\n");
}

// The thread CPU time inside the plugin's calls is counted only while
// turned on, and only on the thread that made them.
TEST(PjrtBackendTest, ThePluginsCallsCpuTimeIsCountedWhileTurnedOnOnTheCallingThread) {
  REQUIRE_PLUGIN();
  auto backend = PjrtBackend::Create({.plugin = plugin});
  ASSERT_TRUE(backend.ok()) << backend.status();
  PjrtBackend& b = **backend;
  const int64_t n = 1 << 22;  // 16 MiB an upload: milliseconds of copying
  std::vector<float> host(n, 1.0f);
  float* device = b.AllocateFloats(n);
  const auto uploads = [&] {
    for (int i = 0; i < 8; ++i) b.Upload(host.data(), device, sizeof(float) * n);
  };
  const double before = PluginCpuSecondsOfThisThread();
  uploads();
  EXPECT_EQ(PluginCpuSecondsOfThisThread(), before) << "counted while off";
  CountPluginCpu(true);
  uploads();
  double elsewhere = -1;
  std::thread([&] { elsewhere = PluginCpuSecondsOfThisThread(); }).join();
  CountPluginCpu(false);
  EXPECT_GT(PluginCpuSecondsOfThisThread() - before, 1e-3);  // 128 MiB copied
  EXPECT_EQ(elsewhere, 0.0) << "another thread's count";
  const double after = PluginCpuSecondsOfThisThread();
  uploads();
  EXPECT_EQ(PluginCpuSecondsOfThisThread(), after);
}

// --- Kernels against the CPU ------------------------------------------------------------------

// A compiled step takes its per-step scalars (the learning rate, Adam's bias
// corrections) as inputs: steps that change them run the one program
// compiled first; a step of another shape (a new batch size) is another
// program. Every step equals the CPU's kernels, and the scratch it wrote
// (the tape's arena) is neither read from nor written back to the device.
TEST_F(PjrtKernelTest, ACompiledStepTakesItsScalarsAtRunTimeAndRecompilesForANewShape) {
  ASSERT_TRUE(pjrt_->compiles_steps());
  for (const int64_t n : {37, 41}) {
    SCOPED_TRACE(::testing::Message() << n << " parameters");
    Pair grad = Put(RandomVector(n, 1)), param = Put(RandomVector(n, 2)), m = Put(std::vector<float>(n)),
         v = Put(std::vector<float>(n)), loss = Put({0.0f});
    float* cpu_scratch = cpu_.AllocateFloats(n);
    cpu_buffers_.push_back(cpu_scratch);
    float* pjrt_scratch = static_cast<float*>(pjrt_->AllocateScratch(4 * n));
    const int64_t compiles = pjrt_->stats().step_compiles, launches = pjrt_->stats().launches,
                  printed = pjrt_->stats().programs_printed;
    for (int step = 1; step <= 3; ++step) {
      const float lr = 1e-3f * step, c1 = 1 - std::pow(0.9f, step), c2 = 1 - std::pow(0.999f, step);
      float cpu_loss = 0, pjrt_loss = 0;
      for (nn::Backend* b : {static_cast<nn::Backend*>(&cpu_), static_cast<nn::Backend*>(pjrt_.get())}) {
        const bool on_cpu = b == &cpu_;
        const Pair* p[] = {&grad, &param, &m, &v, &loss};
        auto at = [&](int i) { return on_cpu ? p[i]->cpu : p[i]->pjrt; };
        float* scratch = on_cpu ? cpu_scratch : pjrt_scratch;
        nn::StepScope scope(*b);
        b->Scale(0.5f * step, at(0), scratch, n);  // the gradient, scaled into scratch
        b->AdamUpdate(n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, c1, c2, scratch, at(1), at(2), at(3));
        b->SquaredNorm(at(1), n, at(4));
        b->ReadAtStepEnd(at(4), on_cpu ? &cpu_loss : &pjrt_loss, sizeof(float));
      }
      EXPECT_NEAR(pjrt_loss, cpu_loss, 1e-5 * (1 + cpu_loss)) << "step " << step;
    }
    // Parameters: the four Adam buffers, the loss and the scalars; not the scratch.
    EXPECT_THAT(pjrt_->last_program(), ::testing::HasSubstr("%arg5: "));
    EXPECT_THAT(pjrt_->last_program(), ::testing::Not(::testing::HasSubstr("%arg6: ")));
    EXPECT_EQ(pjrt_->stats().step_compiles - compiles, 1) << "one program for three steps";
    EXPECT_EQ(pjrt_->stats().launches - launches, 3) << "one execution per step";
    EXPECT_EQ(pjrt_->stats().programs_printed - printed, 1) << "steps 2 and 3 found by their fingerprint";
    ExpectSame(param, n, 1e-6, "param");
    ExpectSame(v, n, 1e-6, "adam v");
  }
  EXPECT_EQ(pjrt_->stats().step_compiles, 2) << "a new shape, a new program";
  EXPECT_EQ(pjrt_->stats().steps, 6);
}

TEST_F(PjrtKernelTest, AdamSgdPolyakAndClipUpdateAsOnTheCpu) {
  const int64_t n = 37;
  Pair grad = Put(RandomVector(n, 1)), param = Put(RandomVector(n, 2)), m = Put(RandomVector(n, 3, 0, 0.1f)), v = Put(RandomVector(n, 4, 0, 0.1f));
  for (int step = 1; step <= 3; ++step) {
    const float c1 = 1 - std::pow(0.9f, step), c2 = 1 - std::pow(0.999f, step);
    cpu_.AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, c1, c2, grad.cpu, param.cpu, m.cpu, v.cpu);
    pjrt_->AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, c1, c2, grad.pjrt, param.pjrt, m.pjrt, v.pjrt);
  }
  ExpectSame(param, n, 1e-6, "adam param");
  ExpectSame(m, n, 1e-6, "adam m");
  ExpectSame(v, n, 1e-6, "adam v");
  Pair buf = Put(std::vector<float>(n, 0.0f));
  cpu_.SgdUpdate(n, 0.1f, 0.9f, 1e-4f, grad.cpu, param.cpu, buf.cpu);
  pjrt_->SgdUpdate(n, 0.1f, 0.9f, 1e-4f, grad.pjrt, param.pjrt, buf.pjrt);
  ExpectSame(param, n, 1e-6, "sgd param");
  Pair target = Put(RandomVector(n, 5));
  cpu_.Polyak(n, 0.05f, param.cpu, target.cpu);
  pjrt_->Polyak(n, 0.05f, param.pjrt, target.pjrt);
  ExpectSame(target, n, 1e-6, "polyak");
  Pair norm = Put({0.0f});
  for (float max_norm : {100.0f, 0.5f}) {
    cpu_.ClipByNorm(grad.cpu, n, max_norm, norm.cpu);
    pjrt_->ClipByNorm(grad.pjrt, n, max_norm, norm.pjrt);
    ExpectSame(grad, n, 1e-6, "clipped");
    ExpectSame(norm, 1, 1e-6, "norm");
  }
  Pair reduced = Put({0.0f, 0.0f});
  pjrt_->SquaredNorm(grad.pjrt, n, reduced.pjrt);
  pjrt_->Sum(param.pjrt, n, /*scale=*/0.5f, reduced.pjrt + 1);
  cpu_.SquaredNorm(grad.cpu, n, reduced.cpu);
  cpu_.Sum(param.cpu, n, 0.5f, reduced.cpu + 1);
  ExpectSame(reduced, 2, 1e-5, "squared norm and half the sum");
  float host[2];
  pjrt_->Download(reduced.pjrt, host, sizeof(host));
  EXPECT_NEAR(host[0], 0.25, 1e-5) << "clipped to norm 0.5";
  // LAMB's and LARS's trust ratio and the scale by it, on the device.
  Pair norms = Put({4.0f, 9.0f, 0.0f, 0.0f});
  cpu_.TrustRatio(norms.cpu, norms.cpu + 1, 0.5f, 0.1f, norms.cpu + 2);
  pjrt_->TrustRatio(norms.pjrt, norms.pjrt + 1, 0.5f, 0.1f, norms.pjrt + 2);
  cpu_.TrustRatio(norms.cpu + 3, norms.cpu + 1, 0.5f, 0.1f, norms.cpu + 3);  // |w| = 0: 1
  pjrt_->TrustRatio(norms.pjrt + 3, norms.pjrt + 1, 0.5f, 0.1f, norms.pjrt + 3);
  ExpectSame(norms, 4, 1e-6, "trust ratios");
  float ratios[4];
  cpu_.Download(norms.cpu, ratios, sizeof(ratios));
  EXPECT_FLOAT_EQ(ratios[2], 0.5f * 2 / (3 + 0.1f * 2));
  EXPECT_FLOAT_EQ(ratios[3], 1.0f);
  cpu_.ScaleByScalar(2.0f, norms.cpu + 2, param.cpu, n);
  pjrt_->ScaleByScalar(2.0f, norms.pjrt + 2, param.pjrt, n);
  ExpectSame(param, n, 1e-6, "scaled by a device scalar");
}

TEST_F(PjrtKernelTest, GemmInEveryTransposeWithAlphaAndBeta) {
  const int64_t m = 3, n = 5, k = 4;
  Pair a = Put(RandomVector(m * k, 7)), b = Put(RandomVector(k * n, 8));
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 0.5f}) {
        Pair c = Put(beta == 0.0f ? std::vector<float>(m * n, NAN) : RandomVector(m * n, 9));
        cpu_.Gemm(ta, tb, m, n, k, 1.5f, a.cpu, b.cpu, beta, c.cpu);
        pjrt_->Gemm(ta, tb, m, n, k, 1.5f, a.pjrt, b.pjrt, beta, c.pjrt);
        ExpectSame(c, m * n, 1e-5, absl::StrCat("gemm ", ta, tb, " beta ", beta));
      }
    }
  }
}

TEST_F(PjrtKernelTest, Bfloat16MatrixInputsStayWithinTheirPrecision) {
  auto bf16 = PjrtBackend::Create({.plugin = CpuPlugin(), .bfloat16 = true});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const int64_t m = 4, n = 6, k = 32;
  const std::vector<float> a = RandomVector(m * k, 20), b = RandomVector(k * n, 21);
  float* da = (*bf16)->AllocateFloats(m * k);
  float* db = (*bf16)->AllocateFloats(k * n);
  float* dc = (*bf16)->AllocateFloats(m * n);
  (*bf16)->Upload(a.data(), da, 4 * a.size());
  (*bf16)->Upload(b.data(), db, 4 * b.size());
  (*bf16)->Gemm(false, false, m, n, k, 1.0f, da, db, 0.0f, dc);
  EXPECT_THAT((*bf16)->last_program(), HasSubstr("tensor<4x32xbf16>"));
  std::vector<float> got(m * n), want(m * n);
  (*bf16)->Download(dc, got.data(), 4 * got.size());
  cpu_.Gemm(false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f, want.data());
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    EXPECT_NEAR(got[i], want[i], 5e-2 * (1 + std::fabs(want[i]))) << i;
    worst = std::max(worst, double{std::fabs(got[i] - want[i])});
  }
  EXPECT_GT(worst, 1e-6) << "bfloat16 inputs round: not float32 bit for bit";
}

TEST_F(PjrtKernelTest, FusedReluConvolutionForwardAndBackward) {
  const nn::ConvGeometry g{.n = 2, .c = 3, .h = 9, .w = 8, .oc = 4, .kh = 3, .kw = 3, .stride = 2, .pad = 1};
  Pair x = Put(RandomVector(g.n * g.c * g.h * g.w, 10)), w = Put(RandomVector(g.oc * g.c * g.kh * g.kw, 11)),
       bias = Put(RandomVector(g.oc, 12)), y = Put(std::vector<float>(g.n * g.oc * g.oh() * g.ow())),
       dy = Put(RandomVector(g.n * g.oc * g.oh() * g.ow(), 13)), dx = Put(std::vector<float>(g.n * g.c * g.h * g.w)),
       dw = Put(std::vector<float>(g.oc * g.c * g.kh * g.kw)), db = Put(std::vector<float>(g.oc));
  cpu_.Conv2dForward(g, nn::FusedActivation::kRelu, x.cpu, w.cpu, bias.cpu, y.cpu);
  pjrt_->Conv2dForward(g, nn::FusedActivation::kRelu, x.pjrt, w.pjrt, bias.pjrt, y.pjrt);
  ExpectSame(y, g.n * g.oc * g.oh() * g.ow(), 1e-5, "y");
  cpu_.Conv2dBackward(g, nn::FusedActivation::kRelu, x.cpu, w.cpu, y.cpu, dy.cpu, dx.cpu, dw.cpu, db.cpu);
  pjrt_->Conv2dBackward(g, nn::FusedActivation::kRelu, x.pjrt, w.pjrt, y.pjrt, dy.pjrt, dx.pjrt, dw.pjrt, db.pjrt);
  ExpectSame(dx, g.n * g.c * g.h * g.w, 1e-5, "dx");
  ExpectSame(dw, g.oc * g.c * g.kh * g.kw, 1e-5, "dw");
  ExpectSame(db, g.oc, 1e-5, "db");
}

// The weight gradient split over chunks of samples (PjrtBackendOptions::
// split_weight_gradients; 2-4x faster on the CPU plugin): the chunk rule at
// the benchmarks' layers, and at 7 samples of 48x48 (chunks of 2, the last
// of 1) the CPU's values, split or not, with the split's four convolutions
// in its program beside the input gradient's one. On the "cpu" platform the
// default splits; TROUPE_PJRT_WEIGHT_GRADIENTS=one does not, a value it does
// not know is refused naming it.
TEST_F(PjrtKernelTest, AWeightGradientSplitOverChunksOfSamplesHasTheCpusValues) {
  const auto samples = [](int64_t n, int64_t c, int64_t h, int64_t stride) {
    return ConvWeightGradSamples({.n = n, .c = c, .h = h, .w = h, .oc = 32, .kh = 3, .kw = 3, .stride = stride});
  };
  EXPECT_EQ(samples(128, 9, 64, 2), 8);    // DrQ at 64x64: 31x31 outputs
  EXPECT_EQ(samples(256, 32, 41, 1), 4);   // D4PG at 84x84: 39x39
  EXPECT_EQ(samples(4, 32, 41, 1), 4);     // a batch within one chunk: the whole batch
  EXPECT_EQ(ConvWeightGradSamples({.n = 32, .c = 4, .h = 41, .w = 41, .oc = 4, .kh = 3, .kw = 3}), 32);  // too small
  // The GAN discriminator's second layer (4x4, stride 2, 14x14 to 7x7): its
  // patches bound the chunk, not its contraction (which would allow 128).
  EXPECT_EQ(ConvWeightGradSamples(
                {.n = 512, .c = 64, .h = 14, .w = 14, .oc = 128, .kh = 4, .kw = 4, .stride = 2, .pad = 1}),
            32);

  const nn::ConvGeometry g{.n = 7, .c = 32, .h = 48, .w = 48, .oc = 32, .kh = 3, .kw = 3, .stride = 1, .pad = 1};
  ASSERT_EQ(ConvWeightGradSamples(g), 2);
  const std::vector<float> x = RandomVector(g.n * g.c * g.h * g.w, 20), w = RandomVector(g.oc * g.c * g.kh * g.kw, 21),
                           dy = RandomVector(g.n * g.oc * g.oh() * g.ow(), 22);
  const int64_t dw_floats = g.oc * g.c * g.kh * g.kw;
  // The CPU's dw (the fixture's pairs; their PJRT sides stay unused).
  const Pair cx = Put(x), cw = Put(w), cdy = Put(dy), cdx = Put(std::vector<float>(x.size())),
             cdw = Put(std::vector<float>(dw_floats));
  cpu_.Conv2dBackward(g, nn::FusedActivation::kNone, cx.cpu, cw.cpu, nullptr, cdy.cpu, cdx.cpu, cdw.cpu, nullptr);
  std::vector<float> want(dw_floats);
  cpu_.Download(cdw.cpu, want.data(), 4 * dw_floats);

  // dw on a backend made with `split`; the convolutions its program holds.
  const auto run = [&](PjrtBackendOptions::SplitWeightGradients split, int* convolutions) {
    auto made = PjrtBackend::Create({.plugin = CpuPlugin(), .split_weight_gradients = split});
    if (!made.ok()) {
      ADD_FAILURE() << made.status();
      *convolutions = -1;
      return std::vector<float>(dw_floats, std::nanf(""));
    }
    PjrtBackend& b = **made;
    const auto put = [&b](const std::vector<float>& v) {
      float* p = b.AllocateFloats(v.size());
      b.Upload(v.data(), p, 4 * v.size());
      return p;
    };
    float* dx = put(std::vector<float>(x.size()));
    float* dw = put(std::vector<float>(dw_floats));
    b.Conv2dBackward(g, nn::FusedActivation::kNone, put(x), put(w), nullptr, put(dy), dx, dw, nullptr);
    std::vector<float> got(dw_floats);
    b.Download(dw, got.data(), 4 * dw_floats);
    const std::string& text = b.last_program();
    *convolutions = 0;
    for (size_t at = text.find("stablehlo.convolution"); at != std::string::npos;
         at = text.find("stablehlo.convolution", at + 1)) {
      ++*convolutions;
    }
    return got;
  };
  using Split = PjrtBackendOptions::SplitWeightGradients;
  for (const Split split : {Split::kAlways, Split::kNever, Split::kAuto}) {
    int convolutions = 0;
    const std::vector<float> got = run(split, &convolutions);
    EXPECT_EQ(convolutions, split == Split::kNever ? 2 : 5) << int(split);
    // Each dw a float32 sum of 16,128 products of values in [-1, 1] (tens in
    // size), in another order on each side: within 1e-3; a sample left out
    // or taken twice moves it by about one.
    for (int64_t i = 0; i < dw_floats; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-3) << "split " << int(split) << ", dw[" << i << "]";
    }
  }
  setenv("TROUPE_PJRT_WEIGHT_GRADIENTS", "one", /*overwrite=*/1);
  int convolutions = 0;
  run(Split::kAlways, &convolutions);
  EXPECT_EQ(convolutions, 2);
  setenv("TROUPE_PJRT_WEIGHT_GRADIENTS", "chunks", 1);
  auto refused = PjrtBackend::Create({.plugin = CpuPlugin()});
  unsetenv("TROUPE_PJRT_WEIGHT_GRADIENTS");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("TROUPE_PJRT_WEIGHT_GRADIENTS=chunks: expected split or one"));
}

// A linear layer on a convolution's flattened output inside one compiled
// step: its three products (y = x w, dx += dy w^T, dw += x^T dy) take the
// image channels-last and permute the weight's rows instead (pjrt_kernels.cc,
// ImageOf): the CPU's values, and the step's program holds those
// permutations. Kernel at a time (no image written in the same program) the
// products are the plain ones.
TEST_F(PjrtKernelTest, ALinearLayerOnAFlattenedConvolutionTakesItChannelsLastWithTheCpusValues) {
  const nn::ConvGeometry g{.n = 3, .c = 2, .h = 7, .w = 6, .oc = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 0};
  const int64_t k = g.oc * g.oh() * g.ow(), cols = 5;
  Pair x = Put(RandomVector(g.n * g.c * g.h * g.w, 30)), cw = Put(RandomVector(g.oc * g.c * g.kh * g.kw, 31)),
       image = Put(std::vector<float>(g.n * k)), w = Put(RandomVector(k * cols, 32)),
       y = Put(std::vector<float>(g.n * cols, NAN)), dy = Put(RandomVector(g.n * cols, 33)),
       dx = Put(RandomVector(g.n * k, 34)), dw = Put(RandomVector(k * cols, 35));
  for (const bool in_step : {true, false}) {
    SCOPED_TRACE(in_step ? "one compiled step" : "kernel at a time");
    for (nn::Backend* b : {static_cast<nn::Backend*>(&cpu_), static_cast<nn::Backend*>(pjrt_.get())}) {
      const bool on_cpu = b == &cpu_;
      auto at = [&](Pair& p) { return on_cpu ? p.cpu : p.pjrt; };
      std::optional<nn::StepScope> scope;
      if (in_step) scope.emplace(*b);
      b->Conv2dForward(g, nn::FusedActivation::kRelu, at(x), at(cw), nullptr, at(image));
      b->Gemm(false, false, g.n, cols, k, 1.0f, at(image), at(w), 0.0f, at(y));
      b->Gemm(false, true, g.n, k, cols, 1.0f, at(dy), at(w), 1.0f, at(dx));
      b->Gemm(true, false, k, cols, g.n, 1.0f, at(image), at(dy), 1.0f, at(dw));
    }
    if (in_step) {
      // The image flattened channels-last, and the weight's rows permuted to (h, w, c) and back.
      EXPECT_THAT(pjrt_->last_program(), HasSubstr("permutation = array<i64: 0, 2, 3, 1>"));
      EXPECT_THAT(pjrt_->last_program(), HasSubstr("permutation = array<i64: 1, 2, 0, 3>"));
      EXPECT_THAT(pjrt_->last_program(), HasSubstr("permutation = array<i64: 2, 0, 1, 3>"));
      EXPECT_THAT(pjrt_->last_program(), HasSubstr("permutation = array<i64: 0, 3, 1, 2>"));
    } else {
      EXPECT_THAT(pjrt_->last_program(), Not(HasSubstr("permutation")));
    }
    ExpectSame(y, g.n * cols, 1e-5, "y");
    ExpectSame(dx, g.n * k, 1e-5, "dx");
    ExpectSame(dw, k * cols, 1e-5, "dw");
  }
}

TEST_F(PjrtKernelTest, BytesAtUnalignedOffsetsBecomeFloatPlanes) {
  // 2 images of 3 pixels x 3 channels: 18 bytes, uploaded 1 byte into a
  // block (neither offset nor size a whole float).
  std::vector<uint8_t> bytes(18);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13 + 1);
  uint8_t* cpu_in = static_cast<uint8_t*>(cpu_.Allocate(32));
  cpu_buffers_.push_back(reinterpret_cast<float*>(cpu_in));
  uint8_t* pjrt_in = static_cast<uint8_t*>(pjrt_->Allocate(32));
  cpu_.Upload(bytes.data(), cpu_in + 1, bytes.size());
  pjrt_->Upload(bytes.data(), pjrt_in + 1, bytes.size());
  std::vector<uint8_t> back(bytes.size());
  pjrt_->Download(pjrt_in + 1, back.data(), back.size());
  EXPECT_EQ(back, bytes);
  Pair out = Put(std::vector<float>(18));
  cpu_.BytesToFloatPlanar(2, 3, 3, 1.0f / 255, cpu_in + 1, out.cpu);
  pjrt_->BytesToFloatPlanar(2, 3, 3, 1.0f / 255, pjrt_in + 1, out.pjrt);
  ExpectSame(out, 18, 1e-6, "planes");
}

// The device frame table's kernels move rows of words as bits: every
// pattern (NaNs, infinities, denormals: random bytes hold them all) comes
// back as the CPU's, by a scatter outside a step and a gather inside one,
// with the indices as run-time data (a second step with other indices runs
// the same program).
TEST_F(PjrtKernelTest, RowsScatterAndGatherAsBitsWithIndicesAtRunTime) {
  constexpr int64_t kRows = 9, kWords = 6, kCount = 4;
  std::mt19937_64 rng(31);
  std::vector<uint32_t> bits(kCount * kWords);
  for (uint32_t& b : bits) b = static_cast<uint32_t>(rng());
  bits[0] = 0x7fc00001u;  // a NaN with a payload
  bits[1] = 0xff800000u;  // -inf
  bits[2] = 0x00000001u;  // the smallest denormal
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), 4 * bits.size());
  Pair table = Put(std::vector<float>(kRows * kWords, 0.5f)), rows = Put(values);
  Pair out = Put(std::vector<float>(kCount * kWords));
  const std::vector<int32_t> scatter_at = {7, 0, 3, 8};
  Pair at = PutInts(scatter_at);
  cpu_.ScatterRows(kRows, kWords, table.cpu, kCount, reinterpret_cast<int32_t*>(at.cpu), rows.cpu);
  pjrt_->ScatterRows(kRows, kWords, table.pjrt, kCount, reinterpret_cast<int32_t*>(at.pjrt), rows.pjrt);
  auto same_bits = [&](Pair p, int64_t n, const char* what) {
    std::vector<uint32_t> a(n), b(n);
    cpu_.Download(p.cpu, a.data(), 4 * n);
    pjrt_->Download(p.pjrt, b.data(), 4 * n);
    EXPECT_EQ(a, b) << what;
  };
  same_bits(table, kRows * kWords, "table after the scatter");
  const int64_t compiles = pjrt_->stats().step_compiles;
  for (const std::vector<int32_t>& gather_at : {std::vector<int32_t>{8, 7, 7, 1}, std::vector<int32_t>{0, 3, 8, 2}}) {
    Pair g = PutInts(gather_at);
    cpu_.GatherRows(kRows, kWords, table.cpu, kCount, reinterpret_cast<int32_t*>(g.cpu), out.cpu);
    pjrt_->BeginStep();
    pjrt_->GatherRows(kRows, kWords, table.pjrt, kCount, reinterpret_cast<int32_t*>(g.pjrt), out.pjrt);
    pjrt_->EndStep();
    same_bits(out, kCount * kWords, "gathered rows");
  }
  EXPECT_EQ(pjrt_->stats().step_compiles, compiles + 1) << "new indices, the same program";
  // Rows as images of 2 pixels x 3 channels (6 of a row's 24 bytes), gathered
  // into float planes: the CPU's floats exactly.
  Pair planes = Put(std::vector<float>(kCount * 6));
  Pair image_at = PutInts({3, 3, 8, 0});
  cpu_.GatherBytesToFloatPlanar(kRows, kWords, table.cpu, kCount, reinterpret_cast<int32_t*>(image_at.cpu), 2, 3,
                                1.0f / 255, planes.cpu);
  pjrt_->GatherBytesToFloatPlanar(kRows, kWords, table.pjrt, kCount, reinterpret_cast<int32_t*>(image_at.pjrt), 2, 3,
                                  1.0f / 255, planes.pjrt);
  same_bits(planes, kCount * 6, "gathered float planes");
  std::vector<uint32_t> got(kCount * kWords);
  pjrt_->Download(out.pjrt, got.data(), 4 * got.size());
  // Row 0 of the table is scatter row 1; gathered first above.
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + kWords, bits.begin() + kWords));
}

// A scatter of a few rows into a large table (the device frame table: 2 GiB
// by default) updates it in place: the table is not copied to a new buffer
// per scatter, which the process's page faults would count (a copy touches
// every page of a fresh allocation: 16,384 for 64 MiB). As bits, as above.
TEST_F(PjrtKernelTest, ScatteringAFewRowsIntoALargeTableUpdatesItInPlace) {
  constexpr int64_t kRows = 16384, kWords = 1024, kCount = 4, kPages = kRows * kWords * 4 / 4096;
  float* table = pjrt_->AllocateFloats(kRows * kWords);
  Pair rows = Put(std::vector<float>(kCount * kWords, 1.0f));
  Pair places = PutInts({5, 16383, 0, 77});
  pjrt_->ScatterRows(kRows, kWords, table, kCount, reinterpret_cast<int32_t*>(places.pjrt), rows.pjrt);  // compiles
  pjrt_->Synchronize();
  auto faults = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return int64_t{usage.ru_minflt};
  };
  const int64_t before = faults();
  for (int i = 0; i < 8; ++i) {
    pjrt_->ScatterRows(kRows, kWords, table, kCount, reinterpret_cast<int32_t*>(places.pjrt), rows.pjrt);
  }
  pjrt_->Synchronize();
  const int64_t touched = faults() - before;
  std::printf("8 scatters of %ld rows into a %ld MiB table: %ld page faults\n", long(kCount),
              long(kRows * kWords * 4 >> 20), long(touched));
  EXPECT_LT(touched, kPages) << "the table was copied by the scatter";
  std::vector<float> row(kWords);
  pjrt_->Download(table + 16383 * kWords, row.data(), 4 * kWords);
  EXPECT_EQ(row, std::vector<float>(kWords, 1.0f));
}

TEST_F(PjrtKernelTest, StridedBlocksCopyAndAccumulate) {
  Pair src = Put(RandomVector(40, 14)), dst = Put(RandomVector(50, 15));
  for (bool accumulate : {false, true}) {
    cpu_.CopyBlocks(4, 3, src.cpu, 9, 2, dst.cpu, 11, 5, accumulate);
    pjrt_->CopyBlocks(4, 3, src.pjrt, 9, 2, dst.pjrt, 11, 5, accumulate);
    ExpectSame(dst, 50, 1e-6, accumulate ? "accumulated" : "copied");
  }
  cpu_.Fill(dst.cpu + 3, 7, 2.5f);
  pjrt_->Fill(dst.pjrt + 3, 7, 2.5f);
  Pair scalar = Put({4.0f});
  cpu_.AddScalar(-0.5f, scalar.cpu, dst.cpu, 10);
  pjrt_->AddScalar(-0.5f, scalar.pjrt, dst.pjrt, 10);
  ExpectSame(dst, 50, 1e-6, "filled");
}

// --- Memory, the cache, devices ------------------------------------------------------------------

TEST_F(PjrtKernelTest, TheSameKernelOnTheSameShapesCompilesOnce) {
  Pair x = Put(RandomVector(8, 18)), y = Put(RandomVector(8, 19));
  pjrt_->Axpy(0.5f, x.pjrt, y.pjrt, 8);
  const int64_t compiles = pjrt_->stats().compiles;
  for (float alpha : {0.25f, -1.0f, 3.0f}) {
    cpu_.Axpy(alpha, x.cpu, y.cpu, 8);
    pjrt_->Axpy(alpha, x.pjrt, y.pjrt, 8);
  }
  cpu_.Axpy(0.5f, x.cpu, y.cpu, 8);
  EXPECT_EQ(pjrt_->stats().compiles, compiles) << "alpha is a run-time scalar, not part of the program";
  ExpectSame(y, 8, 1e-6);
}

TEST_F(PjrtKernelTest, DeviceMemoryIsNotTheHosts) {
  float* p = pjrt_->AllocateFloats(4);
  EXPECT_DEATH({ volatile float x = p[0]; (void)x; }, "");
  EXPECT_DEATH(pjrt_->Fill(reinterpret_cast<float*>(&p), 1, 0.0f), "not this device's memory");
}

TEST(PjrtDeviceTest, EachDeviceOfThePluginAndAnOutOfRangeOne) {
  REQUIRE_PLUGIN();
  auto client = Client::Shared(plugin);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->platform().empty());  // "cpu" here, "cuda" through the CUDA plugin
  const int devices = (*client)->num_devices();
  ASSERT_GE(devices, 1);
  auto last = PjrtBackend::Create({.plugin = plugin, .device = devices - 1});
  ASSERT_TRUE(last.ok()) << last.status();
  float* x = (*last)->AllocateFloats(3);
  const std::vector<float> in = {1, 2, 3};
  (*last)->Upload(in.data(), x, 12);
  (*last)->Scale(2.0f, x, x, 3);
  std::vector<float> out(3);
  (*last)->Download(x, out.data(), 12);
  EXPECT_EQ(out, std::vector<float>({2, 4, 6}));
  auto beyond = PjrtBackend::Create({.plugin = plugin, .device = devices});
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kOutOfRange);
}

// Compiled steps are kept on disk: a second backend (a resumed run, the next
// process) loads the program instead of compiling it and computes the same;
// a damaged file is compiled again and replaced.
TEST(PjrtCacheTest, AStepCompiledOnceIsLoadedFromTheDiskCacheByTheNextBackend) {
  const std::string plugin = CpuPlugin();
  if (plugin.empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("troupe_pjrt_cache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto run_step = [&](PjrtBackend& b) {
    float* x = b.AllocateFloats(64);
    float* y = b.AllocateFloats(1);
    float out = 0;
    {
      nn::StepScope step(b);
      b.Fill(x, 64, 0.5f);
      b.Axpy(2.0f, x, x, 64);
      b.SquaredNorm(x, 64, y);
      b.ReadAtStepEnd(y, &out, sizeof(out));
    }
    return out;
  };
  auto files = [&] {
    std::vector<std::filesystem::path> found;
    for (const auto& e : std::filesystem::directory_iterator(dir)) found.push_back(e.path());
    return found;
  };
  auto first = PjrtBackend::Create({.plugin = plugin, .cache_dir = dir.string()});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FLOAT_EQ(run_step(**first), 64 * 1.5f * 1.5f);
  EXPECT_EQ((*first)->stats().step_compiles, 1);
  EXPECT_EQ((*first)->stats().step_cache_loads, 0);
  // Whether this plugin can serialize a program, asked of it directly (the
  // step's own program, compiled again): a cache that stayed empty is a skip
  // only where the plugin answers Unimplemented, and a failure where it can.
  {
    auto client = Client::Shared(plugin);
    ASSERT_TRUE(client.ok()) << client.status();
    auto executable = (*client)->Compile((*first)->last_program());
    ASSERT_TRUE(executable.ok()) << executable.status();
    const absl::StatusOr<std::string> bytes = (*client)->Serialize(*executable);
    (*client)->Destroy(*executable);
    if (absl::IsUnimplemented(bytes.status())) {
      ASSERT_FALSE(std::filesystem::exists(dir)) << "a cache written by a plugin that cannot serialize";
      GTEST_SKIP() << "this plugin cannot serialize programs (" << bytes.status() << "): nothing is cached";
    }
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_FALSE(bytes->empty());
  }
  ASSERT_TRUE(std::filesystem::exists(dir)) << "the plugin serializes programs, yet the step was not cached in " << dir;
  ASSERT_EQ(files().size(), 1u);

  auto second = PjrtBackend::Create({.plugin = plugin, .cache_dir = dir.string()});
  ASSERT_TRUE(second.ok());
  EXPECT_FLOAT_EQ(run_step(**second), 64 * 1.5f * 1.5f);
  EXPECT_EQ((*second)->stats().step_compiles, 0) << "compiled again despite the cache";
  EXPECT_EQ((*second)->stats().step_cache_loads, 1);

  // A damaged file: compiled again, and the file replaced by a good one.
  std::filesystem::resize_file(files()[0], 10);
  auto third = PjrtBackend::Create({.plugin = plugin, .cache_dir = dir.string()});
  ASSERT_TRUE(third.ok());
  EXPECT_FLOAT_EQ(run_step(**third), 64 * 1.5f * 1.5f);
  EXPECT_EQ((*third)->stats().step_compiles, 1);
  ASSERT_EQ(files().size(), 1u);
  EXPECT_GT(std::filesystem::file_size(files()[0]), 10u);

  // Other XLA_FLAGS, another program: compiled again and kept beside the
  // first (a test's unoptimised program is never a run's).
  const char* had = std::getenv("XLA_FLAGS");
  const std::string before = had != nullptr ? had : "";
  // The caller's XLA_FLAGS back, and the cache gone, however the case ends.
  auto restore = absl::MakeCleanup([&, had_flags = had != nullptr] {
    if (had_flags) {
      ::setenv("XLA_FLAGS", before.c_str(), 1);
    } else {
      ::unsetenv("XLA_FLAGS");
    }
    std::filesystem::remove_all(dir);
  });
  ::setenv("XLA_FLAGS", (before + " --xla_cpu_enable_fast_min_max=false").c_str(), 1);
  auto fourth = PjrtBackend::Create({.plugin = plugin, .cache_dir = dir.string()});
  ASSERT_TRUE(fourth.ok());
  EXPECT_FLOAT_EQ(run_step(**fourth), 64 * 1.5f * 1.5f);
  EXPECT_EQ((*fourth)->stats().step_compiles, 1) << "loaded a program compiled under other XLA_FLAGS";
  EXPECT_EQ(files().size(), 2u);
}

// K replicas run a step as one program only if they recorded the same one
// (compared by the programs' fingerprints): replicas whose steps differ
// stop the process naming the replica, as a half-run step cannot go on.
TEST(PjrtGroupDeathTest, ReplicasThatRecordDifferentStepsStopTheProcessNamingTheReplica) {
  REQUIRE_PLUGIN();
  auto client = Client::Shared(plugin);
  ASSERT_TRUE(client.ok()) << client.status();
  if ((*client)->num_devices() < 2) GTEST_SKIP() << "the plugin has one device: a group needs two";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto steps = [&](int64_t second_size) {
    auto group = std::make_shared<PjrtReplicaGroup>(2, std::chrono::seconds(60));
    std::vector<std::unique_ptr<PjrtBackend>> backends;
    for (int r = 0; r < 2; ++r) {
      auto b = PjrtBackend::Create({.plugin = plugin, .device = r, .group = group, .cache_dir = ""});
      TROUPE_CHECK(b.ok());
      backends.push_back(std::move(*b));
    }
    std::vector<float> out(2);
    std::vector<std::thread> replicas;
    for (int r = 0; r < 2; ++r) {
      replicas.emplace_back([&, r] {
        PjrtBackend& b = *backends[r];
        const int64_t n = r == 0 ? 64 : second_size;
        float* x = b.AllocateFloats(n);
        float* y = b.AllocateFloats(1);
        nn::StepScope step(b);
        b.Fill(x, n, 0.5f);
        b.SquaredNorm(x, n, y);
        b.ReadAtStepEnd(y, &out[r], sizeof(float));
      });
    }
    for (std::thread& t : replicas) t.join();
    return out;
  };
  EXPECT_EQ(steps(64), std::vector<float>({16.0f, 16.0f})) << "the same step on both replicas runs";
  EXPECT_DEATH(steps(32), "replica 1 recorded another step than replica 0");
}

// A reduce-scatter and an all-gather inside a step of 2 replicas are
// collectives of its one program: replica r gets part r of the sum (the
// mean), and every replica every replica's part in order, exactly.
TEST(PjrtGroupTest, AReduceScatterAndAnAllGatherInAStepGiveEachReplicaItsParts) {
  REQUIRE_PLUGIN();
  auto client = Client::Shared(plugin);
  ASSERT_TRUE(client.ok()) << client.status();
  if ((*client)->num_devices() < 2) GTEST_SKIP() << "the plugin has one device: a group needs two";
  auto group = std::make_shared<PjrtReplicaGroup>(2, std::chrono::seconds(60));
  std::vector<std::unique_ptr<PjrtBackend>> backends;
  for (int r = 0; r < 2; ++r) {
    auto b = PjrtBackend::Create({.plugin = plugin, .device = r, .group = group, .cache_dir = ""});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE((*b)->runs_replicas_as_one_program());
    backends.push_back(std::move(*b));
  }
  std::vector<std::vector<float>> summed(2, std::vector<float>(3)), averaged = summed,
                                  gathered(2, std::vector<float>(6));
  std::vector<std::string> programs(2);
  std::vector<std::thread> replicas;
  for (int r = 0; r < 2; ++r) {
    replicas.emplace_back([&, r] {
      PjrtBackend& b = *backends[r];
      // in[p * 3 + j] = 100 p + 10 j + r: part p of replica r.
      std::vector<float> in(6);
      for (int p = 0; p < 2; ++p) {
        for (int j = 0; j < 3; ++j) in[p * 3 + j] = 100.0f * p + 10.0f * j + r;
      }
      const std::vector<float> mine = {7.0f * r, 7.0f * r + 1, 7.0f * r + 2};
      float* x = b.AllocateFloats(6);
      float* part = b.AllocateFloats(3);
      float* mean = b.AllocateFloats(3);
      float* own = b.AllocateFloats(3);
      float* all = b.AllocateFloats(6);
      b.Upload(in.data(), x, sizeof(float) * 6);
      b.Upload(mine.data(), own, sizeof(float) * 3);
      nn::StepScope step(b);
      b.ReduceScatterInStep(x, part, 3, /*mean=*/false);
      b.ReduceScatterInStep(x, mean, 3, /*mean=*/true);
      b.AllGatherInStep(own, all, 3);
      b.ReadAtStepEnd(part, summed[r].data(), sizeof(float) * 3);
      b.ReadAtStepEnd(mean, averaged[r].data(), sizeof(float) * 3);
      b.ReadAtStepEnd(all, gathered[r].data(), sizeof(float) * 6);
      step.End();
      programs[r] = b.last_program();
    });
  }
  for (std::thread& t : replicas) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "replica " << r);
    // Summed over replicas 0 and 1: 200 p + 20 j + 1, replica r's part p = r.
    EXPECT_EQ(summed[r], (std::vector<float>{200.0f * r + 1, 200.0f * r + 21, 200.0f * r + 41}));
    EXPECT_EQ(averaged[r], (std::vector<float>{100.0f * r + 0.5f, 100.0f * r + 10.5f, 100.0f * r + 20.5f}));
    EXPECT_EQ(gathered[r], (std::vector<float>{0, 1, 2, 7, 8, 9}));
    EXPECT_THAT(programs[r], ::testing::HasSubstr("\"stablehlo.reduce_scatter\""));
    EXPECT_THAT(programs[r], ::testing::HasSubstr("\"stablehlo.all_gather\""));
  }
}

TEST(PjrtDeviceTest, ThePluginAtTheBaselineApiVersionRunsTheSameKernels) {
  REQUIRE_PLUGIN();
  const std::string baseline = std::filesystem::path(plugin).parent_path() / "pjrt_cpu_plugin_0.81.so";
  if (!std::filesystem::exists(baseline)) GTEST_SKIP() << "no baseline plugin at " << baseline;
  auto backend = PjrtBackend::Create({.plugin = baseline});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->client().plugin().minor_version(), 81);
  float* x = (*backend)->AllocateFloats(4);
  const std::vector<float> in = {1, -2, 3, -4};
  (*backend)->Upload(in.data(), x, 16);
  (*backend)->SquaredNorm(x, 4, x);
  float out = 0;
  (*backend)->Download(x, &out, sizeof(out));
  EXPECT_EQ(out, 30.0f);
}

// A backend whose plugin refuses every step program and may fall back, and
// a kernel-at-a-time one to compare it with.
std::pair<absl::StatusOr<std::unique_ptr<PjrtBackend>>, absl::StatusOr<std::unique_ptr<PjrtBackend>>>
RefusingAndKernelBackends(const std::string& plugin) {
  return {PjrtBackend::Create(
              {.plugin = plugin, .cache_dir = "", .fall_back_to_kernels = true, .refuse_step_programs = true}),
          PjrtBackend::Create({.plugin = plugin, .compile_steps = false, .cache_dir = ""})};
}

// A step whose program the plugin refuses (a compile error XLA could give on
// a GPU) runs again kernel at a time when the backend may fall back
// (engine.pjrt_steps COMPILED_ELSE_KERNELS, device GPU's default): its
// upload, kernels and end-of-step read give what a kernel-at-a-time backend
// gives, bit for bit, and so does every later step, without compiling a
// step again; the refusal is said once with the plugin's message. Without
// the fallback the refusal stops the process, naming it.
TEST(PjrtFallbackTest, ARefusedStepRunsKernelAtATimeAndSaysSo) {
  REQUIRE_PLUGIN();
  auto [refused, kernels] = RefusingAndKernelBackends(plugin);
  ASSERT_TRUE(refused.ok() && kernels.ok());
  const int64_t n = 53;
  const std::vector<float> data = RandomVector(n, 3);
  auto run = [&](PjrtBackend& b, std::vector<float>* params, std::vector<float>* losses) {
    float* param = b.AllocateFloats(n);
    float* m = b.AllocateFloats(n);
    float* v = b.AllocateFloats(n);
    float* grad = b.AllocateFloats(n);
    float* loss = b.AllocateFloats(1);
    b.Fill(param, n, 0.25f);
    b.Fill(m, n, 0.0f);
    b.Fill(v, n, 0.0f);
    for (int step = 1; step <= 3; ++step) {
      float out = 0;
      {
        nn::StepScope scope(b);
        b.Upload(data.data(), grad, 4 * n);  // inside the step: the replay's data is its buffer
        b.Scale(0.5f * step, grad, grad, n);
        b.AdamUpdate(n, 1e-2f * step, 0.9f, 0.999f, 1e-8f, 0.0f, 1 - std::pow(0.9f, step),
                     1 - std::pow(0.999f, step), grad, param, m, v);
        b.SquaredNorm(param, n, loss);
        b.ReadAtStepEnd(loss, &out, sizeof(out));
      }
      losses->push_back(out);
    }
    // The whole state: the parameters and Adam's moments (which carry the
    // gradient's size), one after another.
    params->resize(3 * n);
    b.Download(param, params->data(), 4 * n);
    b.Download(m, params->data() + n, 4 * n);
    b.Download(v, params->data() + 2 * n, 4 * n);
  };
  std::vector<float> refused_params, kernel_params, refused_losses, kernel_losses;
  ::testing::internal::CaptureStderr();
  run(**refused, &refused_params, &refused_losses);
  const std::string said = ::testing::internal::GetCapturedStderr();
  run(**kernels, &kernel_params, &kernel_losses);
  EXPECT_EQ(refused_losses, kernel_losses) << "every step's end-of-step read";
  EXPECT_EQ(refused_params, kernel_params) << "the parameters and Adam's moments after three steps";
  EXPECT_GT(refused_losses.back(), 0.0f);
  EXPECT_NE(refused_losses.front(), refused_losses.back()) << "the steps moved the parameters";
  const PjrtStats& stats = (*refused)->stats();
  EXPECT_EQ(stats.step_fallbacks, 1);
  EXPECT_EQ(stats.steps, 0) << "no compiled step ran";
  EXPECT_EQ(stats.step_compiles, 0);
  EXPECT_FALSE((*refused)->compiles_steps());
  EXPECT_THAT(said, ::testing::HasSubstr("the plugin refused a compiled step (compiling a step: refused"));
  EXPECT_THAT(said, ::testing::HasSubstr("kernel at a time from here on"));
}

// The same where the step is split by a host staging (a host collective's
// download in the middle): the refused first half is replayed before the
// download, which then reads what kernel at a time computed.
TEST(PjrtFallbackTest, ARefusedHalfOfAStepSplitByAHostStagingRunsKernelAtATime) {
  REQUIRE_PLUGIN();
  auto [refused, kernels] = RefusingAndKernelBackends(plugin);
  ASSERT_TRUE(refused.ok() && kernels.ok());
  const int64_t n = 29;
  const std::vector<float> data = RandomVector(n, 5);
  auto run = [&](PjrtBackend& b) {
    float* x = b.AllocateFloats(n);
    float* y = b.AllocateFloats(n);
    std::vector<float> staged(n), out(n);
    {
      nn::StepScope scope(b);
      b.Upload(data.data(), x, 4 * n);
      b.Scale(3.0f, x, x, n);
      {
        nn::Backend::HostStaging staging(b);
        b.Download(x, staged.data(), 4 * n);  // the split: the step so far runs (or is replayed) here
      }
      b.Axpy(0.5f, x, y, n);
      b.ReadAtStepEnd(y, out.data(), 4 * n);
    }
    return std::make_pair(staged, out);
  };
  const auto [refused_staged, refused_out] = run(**refused);
  const auto [kernel_staged, kernel_out] = run(**kernels);
  EXPECT_EQ(refused_staged, kernel_staged) << "the download at the split";
  EXPECT_EQ(refused_out, kernel_out) << "the step's end";
  EXPECT_FLOAT_EQ(refused_staged[0], 3.0f * data[0]);
  EXPECT_EQ((*refused)->stats().step_fallbacks, 1);
  EXPECT_FALSE((*refused)->compiles_steps());
}

TEST(PjrtFallbackDeathTest, ARefusedStepWithoutTheFallbackStopsTheProcessNamingTheRefusal) {
  REQUIRE_PLUGIN();
  EXPECT_DEATH(
      {
        auto b = PjrtBackend::Create({.plugin = plugin, .cache_dir = "", .refuse_step_programs = true});
        float* x = (*b)->AllocateFloats(8);
        nn::StepScope scope(**b);
        (*b)->Fill(x, 8, 1.0f);
        (*b)->Axpy(2.0f, x, x, 8);
      },
      "compiling a step: refused");
}

// How a client takes device memory: the GPU plugin's options (on demand by
// default, or a fraction at start); a plugin that knows no such options (the
// XLA CPU plugin) is asked again without them, and the client says so. A
// fraction outside [0, 1] is refused before any client is made.
TEST(PjrtClientTest, MemoryOptionsThePluginDoesNotTakeAreDroppedAndSaid) {
  REQUIRE_PLUGIN();
  auto refused = Client::Shared(plugin, {.memory_fraction = 1.5f});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("memory fraction 1.5: must be in [0, 1]"));
  auto client = Client::Shared(plugin, {.memory_fraction = 0.5f});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_GE((*client)->num_devices(), 1);
  // The CPU plugin answers an unknown option with InvalidArgument ("Unexpected
  // option name"); one that took them would say "50% of the GPU at start".
  EXPECT_THAT((*client)->memory(), ::testing::AnyOf("the plugin's default (it takes no memory options)",
                                                   "50% of the GPU at start"));
}

}  // namespace
}  // namespace troupe::pjrt
