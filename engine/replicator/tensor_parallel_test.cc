// Tensor-parallel dense layers (nn::ColumnParallelLinear, then
// nn::RowParallelLinear) split over K = 2 and 4 in-process replicas, the
// group's sums through ReplicaContext: the loss, every weight's gradient (the
// replica's slice of the unsplit layer's) and the input's gradient equal the
// unsplit MLP's.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/replicator/replicator.h"
#include "gtest/gtest.h"

namespace troupe::replicator {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kBatch = 6, kIn = 8, kHidden = 16, kOut = 4;

struct Gradients {
  float loss = 0;
  std::vector<float> w1, b1, w2, b2, dx;  // w1 [in, hidden], w2 [hidden, out], dx [batch, in]
};

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

const std::vector<float> kX = Random(kBatch * kIn, 1), kTarget = Random(kBatch * kOut, 2);
const std::vector<float> kW1 = Random(kIn * kHidden, 3), kB1 = Random(kHidden, 4), kW2 = Random(kHidden * kOut, 5),
                         kB2 = Random(kOut, 6);

// Columns [begin, end) of a row-major [rows, cols] matrix, and rows [begin, end).
std::vector<float> Columns(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t end) {
  std::vector<float> out;
  for (size_t r = 0; r < m.size() / cols; ++r) out.insert(out.end(), m.begin() + r * cols + begin, m.begin() + r * cols + end);
  return out;
}
std::vector<float> Rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t end) {
  return {m.begin() + begin * cols, m.begin() + end * cols};
}

std::vector<float> Read(nn::Backend& backend, const float* data, int64_t n) {
  std::vector<float> host(n);
  backend.Download(data, host.data(), sizeof(float) * n);
  return host;
}

// The unsplit MLP on one CPU backend: relu(x w1 + b1) w2 + b2, mean squared error.
Gradients Unsplit() {
  nn::CpuBackend backend(1);
  nn::ParameterSet params;
  const nn::LinearLayer l1 = nn::LinearLayer::Create(params, "l1", kIn, kHidden);
  const nn::LinearLayer l2 = nn::LinearLayer::Create(params, "l2", kHidden, kOut);
  params.Allocate(backend, 0);
  std::vector<float> values(params.total_floats());
  for (const auto& [index, from] : {std::pair{l1.w, &kW1}, std::pair{l1.b, &kB1}, std::pair{l2.w, &kW2}, std::pair{l2.b, &kB2}}) {
    std::copy(from->begin(), from->end(), values.begin() + params.info(index).offset);
  }
  TROUPE_CHECK(params.UploadValues(values).ok());
  nn::DeviceBuffer x(backend, kBatch * kIn);
  x.Upload(kX);
  nn::Tape tape(&backend);
  params.ZeroGrad();
  const nn::Var input = tape.Leaf(x.data(), {kBatch, kIn});
  const nn::Var y = l2(tape, params, nn::Relu(l1(tape, params, input)));
  const nn::Var loss = nn::MeanSquaredError(y, tape.Input(kTarget.data(), {kBatch, kOut}));
  tape.Backward(loss);
  Gradients g;
  g.loss = tape.item(loss);
  g.w1 = Read(backend, params.grad(l1.w).data, kIn * kHidden);
  g.b1 = Read(backend, params.grad(l1.b).data, kHidden);
  g.w2 = Read(backend, params.grad(l2.w).data, kHidden * kOut);
  g.b2 = Read(backend, params.grad(l2.b).data, kOut);
  g.dx = Read(backend, tape.grad(input).data, kBatch * kIn);
  return g;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += std::pow(double(got[i]) - want[i], 2);
    norm += std::pow(double(want[i]), 2);
  }
  EXPECT_GT(norm, 0) << what << ": the reference gradient is zero, the comparison vacuous";
  EXPECT_LE(std::sqrt(diff / norm), 1e-5) << what;
}

TEST(TensorParallelTest, ColumnThenRowParallelLayersEqualTheUnsplitMlp) {
  const Gradients whole = Unsplit();
  for (const int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("K=", k));
    ReplicatorOptions o;
    o.num_replicas = k;
    o.timeout = 30000ms;
    auto replicator = Replicator::Create(o);
    ASSERT_TRUE(replicator.ok());
    std::vector<Gradients> got(k);
    std::vector<int64_t> weight_floats(k);
    ASSERT_TRUE((*replicator)->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
      const int r = ctx.replica_id();
      nn::Backend& backend = *ctx.backend();
      nn::ParameterSet params;
      const auto column = nn::ColumnParallelLinear::Create(params, "l1", kIn, kHidden, k);
      const auto row = nn::RowParallelLinear::Create(params, "l2", kHidden, kOut, k, r);
      params.Allocate(backend, 0);
      // This replica's slices of the unsplit layers.
      const int64_t part = kHidden / k;
      std::vector<float> values(params.total_floats());
      const std::vector<float> w1 = Columns(kW1, kHidden, r * part, (r + 1) * part);
      const std::vector<float> b1(kB1.begin() + r * part, kB1.begin() + (r + 1) * part);
      const std::vector<float> w2 = Rows(kW2, kOut, r * part, (r + 1) * part);
      for (const auto& [index, from] : {std::pair{column.w, &w1}, std::pair{column.b, &b1}, std::pair{row.w, &w2},
                                        std::pair{row.b, &kB2}}) {
        std::copy(from->begin(), from->end(), values.begin() + params.info(index).offset);
      }
      RETURN_IF_ERROR(params.UploadValues(values));
      nn::DeviceBuffer x(backend, kBatch * kIn);
      x.Upload(kX);
      nn::Tape tape(&backend);
      params.ZeroGrad();
      const nn::Var input = tape.Leaf(x.data(), {kBatch, kIn});
      const nn::Var y = row(tape, params, nn::Relu(column(tape, params, input, &ctx)), &ctx);
      const nn::Var loss = nn::MeanSquaredError(y, tape.Input(kTarget.data(), {kBatch, kOut}));
      tape.Backward(loss);
      RETURN_IF_ERROR(ctx.status());
      Gradients& g = got[r];
      g.loss = tape.item(loss);
      g.w1 = Read(backend, params.grad(column.w).data, kIn * part);
      g.b1 = Read(backend, params.grad(column.b).data, part);
      g.w2 = Read(backend, params.grad(row.w).data, part * kOut);
      g.b2 = Read(backend, params.grad(row.b).data, kOut);
      g.dx = Read(backend, tape.grad(input).data, kBatch * kIn);
      weight_floats[r] = params.info(column.w).shape.size() + params.info(row.w).shape.size();
      return absl::OkStatus();
    }).ok());
    const int64_t part = kHidden / k;
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("replica ", r));
      EXPECT_NEAR(got[r].loss, whole.loss, 1e-6 * whole.loss);
      ExpectNear(got[r].w1, Columns(whole.w1, kHidden, r * part, (r + 1) * part), "w1's columns");
      ExpectNear(got[r].b1, {whole.b1.begin() + r * part, whole.b1.begin() + (r + 1) * part}, "b1's part");
      ExpectNear(got[r].w2, Rows(whole.w2, kOut, r * part, (r + 1) * part), "w2's rows");
      if (r == 0) ExpectNear(got[r].b2, whole.b2, "b2 (part 0's)");
      ExpectNear(got[r].dx, whole.dx, "the input's gradient");
      EXPECT_EQ(weight_floats[r] * k, kIn * kHidden + kHidden * kOut) << "1/K of the weights";
    }
  }
}

}  // namespace
}  // namespace troupe::replicator
