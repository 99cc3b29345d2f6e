// The agents' own kernels, which the engine's interface does not hold: the
// C51 projection (agents/categorical.h) against hand-computed cases, and it
// and DrQ's random shift (agents/augment.h) as each backend runs them: the
// CPU's host loops against their composed forms (CoreOnlyBackend: the core
// and nothing else), the shift's tape op's value and gradient on the strict
// device and by finite differences, and on the PJRT CPU plugin against the
// CPU; and a host loop, once warm, allocating nothing.
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "agents/augment.h"
#include "agents/categorical.h"
#include "common/allocation_counter.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/kernel_testing.h"
#include "engine/nn/op_testing.h"
#include "engine/nn/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_testing.h"
#endif

namespace troupe::agents {
namespace {

using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using nn::AsInts;
using nn::Backend;
using nn::Buffers;
using nn::Ints;
using nn::RandomVector;

// --- Categorical projection ----------------------------------------------------

TEST(CategoricalProjectionTest, SplitsMassBetweenNeighbouringAtoms) {
  // Support {0, 1, 2, 3, 4}; all mass at z=1, shifted by 0.5 -> half on 1, half on 2.
  std::vector<float> out(5);
  CategoricalProjectionRow(std::vector<float>{0, 1, 0, 0, 0}, /*reward=*/0.5f, /*discount=*/1.0f, /*v_min=*/0,
                        /*v_max=*/4, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{0, 0.5f, 0.5f, 0, 0}));
  // Uniform mass, discount 0.5: Tz = {0, .5, 1, 1.5, 2}.
  CategoricalProjectionRow(std::vector<float>(5, 0.2f), /*reward=*/0.0f, /*discount=*/0.5f, 0, 4, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{0.3f, 0.4f, 0.3f, 0, 0}));
  // Uneven split: 1 + 0.25 -> 3/4 on atom 1, 1/4 on atom 2.
  CategoricalProjectionRow(std::vector<float>{0, 1, 0, 0, 0}, /*reward=*/0.25f, /*discount=*/1.0f, 0, 4, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{0, 0.75f, 0.25f, 0, 0}));
}

TEST(CategoricalProjectionTest, ClipsAtTheEndsOfTheSupport) {
  std::vector<float> out(5);
  // z=4 + 1 = 5 > v_max: all on the last atom; z=3 + 1 = 4 exactly on it too.
  CategoricalProjectionRow(std::vector<float>{0, 0, 0, 0.5f, 0.5f}, /*reward=*/1.0f, /*discount=*/1.0f, 0, 4, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{0, 0, 0, 0, 1}));
  // z=1 - 3 = -2 < v_min: all on the first atom.
  CategoricalProjectionRow(std::vector<float>{0, 1, 0, 0, 0}, /*reward=*/-3.0f, /*discount=*/1.0f, 0, 4, out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{1, 0, 0, 0, 0}));
}

TEST(CategoricalProjectionTest, DiscountZeroPutsAllMassAtTheReward) {
  // A terminal (discount 0): the target is the reward alone, whatever the distribution.
  std::vector<float> out(5);
  CategoricalProjectionRow(std::vector<float>{0.1f, 0.2f, 0.3f, 0.2f, 0.2f}, /*reward=*/2.25f, /*discount=*/0.0f, 0, 4,
                        out);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6), std::vector<float>{0, 0, 0.75f, 0.25f, 0}));
}

TEST(CategoricalProjectionTest, TargetDistributionSumsToOne) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> p(51), out(51);
    for (float& v : p) v = u(rng);
    const float total = std::accumulate(p.begin(), p.end(), 0.0f);
    for (float& v : p) v /= total;
    const float reward = 300.0f * u(rng) - 100.0f, discount = u(rng);
    CategoricalProjectionRow(p, reward, discount, /*v_min=*/-10.0f, /*v_max=*/150.0f, out);
    EXPECT_NEAR(std::accumulate(out.begin(), out.end(), 0.0), 1.0, 1e-5) << "reward " << reward;
    for (float v : out) EXPECT_GE(v, 0.0f);
  }
}

// The host loop (CPU) against the composed form (a backend of the core
// only), with the edge cases: atoms exactly on a support point, beyond both
// bounds, discount 0.
TEST(CategoricalProjectionTest, ComposedEqualsTheHostLoopIncludingAtomsOnSupportPointsAndBounds) {
  const int64_t atoms = 11;
  const float v_min = -5.0f, v_max = 5.0f;  // dz = 1
  // Rows: a generic shift; reward 1 discount 1 (every atom on a support
  // point, the top one clipped to v_max); discount 0 (all mass at the
  // reward, itself on a point); far beyond both bounds (all at v_min, all
  // at v_max); reward 0.5 discount 0.5.
  const std::vector<float> reward = {0.37f, 1.0f, 2.0f, -40.0f, 40.0f, 0.5f};
  const std::vector<float> discount = {0.99f, 1.0f, 0.0f, 0.9f, 0.9f, 0.5f};
  const int64_t rows = static_cast<int64_t>(reward.size());
  std::vector<float> p = RandomVector(rows * atoms, 1, 0.0f, 1.0f);
  const nn::Kernel projection = [&](Backend& b, const std::vector<float*>& d) {
    CategoricalProjection(b, rows, atoms, v_min, v_max, d[0], d[1], d[2], d[3]);
  };
  nn::ExpectComposedMatchesFused("CategoricalProjection", {p, reward, discount, std::vector<float>(rows * atoms)},
                                 projection, 1e-5);
  // The exact cases by hand, composed: discount 0 puts each row's whole mass on atom 7 (z = 2).
  nn::CoreOnlyBackend core;
  const Buffers out = nn::RunOn(core, {p, reward, discount, std::vector<float>(rows * atoms)}, projection);
  float mass = 0.0f;
  for (int64_t j = 0; j < atoms; ++j) mass += p[2 * atoms + j];
  for (int64_t i = 0; i < atoms; ++i) EXPECT_FLOAT_EQ(out[3][2 * atoms + i], i == 7 ? mass : 0.0f) << i;
  mass = 0.0f;
  for (int64_t j = 0; j < atoms; ++j) mass += p[3 * atoms + j];
  EXPECT_FLOAT_EQ(out[3][3 * atoms], mass);  // all below v_min: on v_min
}

// --- DrQ's random shift ----------------------------------------------------------

TEST(RandomShiftTest, ShiftOfPadIsIdentityAndShiftsReplicateTheBorder) {
  nn::CpuBackend backend(1);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i);
  std::vector<float> y(16);
  const int32_t identity[2] = {4, 4};  // offset pad = no shift
  RandomShiftForward(backend, 1, 1, 4, 4, /*pad=*/4, identity, x.data(), y.data());
  EXPECT_EQ(y, x);
  const int32_t up_left[2] = {0, 0};  // shifted by -4: every pixel is the top-left one
  RandomShiftForward(backend, 1, 1, 4, 4, /*pad=*/4, up_left, x.data(), y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(RandomShiftTest, ComposedEqualsTheHostLoopAtZeroAndTwicePadAndInBetween) {
  const int64_t n = 3, c = 2, h = 6, w = 5, pad = 2;
  const std::vector<int32_t> shifts = {0, 0, 2 * pad, 2 * pad, 1, 3};
  nn::ExpectComposedMatchesFused("RandomShift",
                                 {Ints(shifts), RandomVector(n * c * h * w, 1), std::vector<float>(n * c * h * w),
                                  RandomVector(n * c * h * w, 2), RandomVector(n * c * h * w, 3)},
                                 [&](Backend& b, const std::vector<float*>& p) {
                                   RandomShiftForward(b, n, c, h, w, pad, AsInts(p[0]), p[1], p[2]);
                                   RandomShiftBackward(b, n, c, h, w, pad, AsInts(p[0]), p[3], p[4]);
                                 });
  // The forward copies values: bit for bit.
  nn::ExpectComposedMatchesFused("RandomShiftForward",
                                 {Ints(shifts), RandomVector(n * c * h * w, 1), std::vector<float>(n * c * h * w)},
                                 [&](Backend& b, const std::vector<float*>& p) {
                                   RandomShiftForward(b, n, c, h, w, pad, AsInts(p[0]), p[1], p[2]);
                                 },
                                 0.0);
}

// Offsets from a key: each in [0, 2 * pad], every value about as often
// (within 5% of the mean over 90,000 draws), the same for the same key,
// other offsets for the next key.
TEST(RandomShiftTest, OffsetsFromAKeyAreUniformAndAFunctionOfIt) {
  for (const int64_t pad : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "pad " << pad);
    const int64_t images = 45000, range = 2 * pad + 1;
    std::vector<int32_t> a(2 * images), b(2 * images), next(2 * images);
    RandomShiftOffsets(/*key=*/7, images, pad, a.data());
    RandomShiftOffsets(/*key=*/7, images, pad, b.data());
    RandomShiftOffsets(/*key=*/8, images, pad, next.data());
    EXPECT_EQ(a, b);
    std::vector<int64_t> counts(range);
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_GE(a[i], 0);
      ASSERT_LT(a[i], range);
      ++counts[a[i]];
      same += a[i] == next[i] ? 1 : 0;
    }
    const double mean = static_cast<double>(a.size()) / static_cast<double>(range);
    for (int64_t v = 0; v < range; ++v) EXPECT_NEAR(counts[v], mean, 0.05 * mean) << "offset " << v;
    EXPECT_NEAR(static_cast<double>(same), mean, 0.05 * mean) << "the next key's offsets match as by chance";
  }
}

// A kernel run as a host loop (Backend::HostKernel) allocates nothing once
// warm, like the engine's own kernels: the body and the loop are passed as
// references, not as std::functions that would box their captures.
TEST(HostLoopTest, AWarmKernelAllocatesNothing) {
  nn::CpuBackend backend(2);
  const int64_t rows = 64, atoms = 51, n = 8, c = 3, h = 12, w = 12, pad = 2;
  std::vector<float> p = RandomVector(rows * atoms, 1, 0.0f, 1.0f), reward(rows, 0.5f), discount(rows, 0.99f);
  std::vector<float> projected(rows * atoms), x = RandomVector(n * c * h * w, 2), y(x.size()), dx(x.size());
  std::vector<int32_t> shifts(2 * n, 1);
  const auto run = [&] {
    CategoricalProjection(backend, rows, atoms, -10.0f, 10.0f, p.data(), reward.data(), discount.data(),
                          projected.data());
    RandomShiftForward(backend, n, c, h, w, pad, shifts.data(), x.data(), y.data());
    RandomShiftBackward(backend, n, c, h, w, pad, shifts.data(), y.data(), dx.data());
  };
  run();  // warm: the pool's threads and any first-call state
  AllocationCounter counter;
  run();
  EXPECT_EQ(counter.Stop(), 0);
}

// The op's value and input gradient: on the strict device bit for bit, on
// the core-only backend (and CUDA where a GPU answers) within tolerance,
// and against finite differences.
nn::Var ShiftWithFixedSeed(nn::Tape&, std::vector<nn::Var>& v) {
  std::mt19937_64 rng(/*seed=*/5);  // the same shifts on every evaluation
  return RandomShift(v[0], /*pad=*/2, rng);
}

TEST(RandomShiftTest, TheOpOnEveryBackendAndItsGradientOnTheStrictDevice) {
  nn::ExpectBackendsConform({nn::Random({2, 2, 5, 6}, 39)}, ShiftWithFixedSeed);
  EXPECT_LE(nn::GradientError({nn::Random({2, 2, 5, 6}, 39)}, ShiftWithFixedSeed, nn::kStep, nn::kRtol, nn::kAtol), 1.0);
}

#ifdef TROUPE_HAVE_PJRT
// --- On the PJRT CPU plugin ---------------------------------------------------------

class PjrtAgentKernelTest : public pjrt::PjrtKernelTest {};

TEST_F(PjrtAgentKernelTest, TheCategoricalProjectionMatchesAlgorithmOne) {
  const int64_t rows = 5, atoms = 11;
  std::vector<float> p = RandomVector(rows * atoms, 6, 0.0f, 1.0f);
  // Rewards that land on atoms exactly, between them and beyond both ends.
  Pair probabilities = Put(p), reward = Put({0.0f, 0.37f, -20.0f, 20.0f, 1.0f}),
       discount = Put({0.99f, 0.9f, 0.99f, 0.5f, 0.0f}), out = Put(std::vector<float>(rows * atoms, 7.0f));
  CategoricalProjection(cpu_, rows, atoms, -10.0f, 10.0f, probabilities.cpu, reward.cpu, discount.cpu, out.cpu);
  CategoricalProjection(*pjrt_, rows, atoms, -10.0f, 10.0f, probabilities.pjrt, reward.pjrt, discount.pjrt,
                        out.pjrt);
  ExpectSame(out, rows * atoms, 1e-5, "projection");
}

// DrQ's random shift moves pixels, so it equals the CPU's exactly, replicated
// borders included (shifts 0 and 2 * pad clamp); on PJRT it is two gathers
// (rows, then columns) and its adjoint two scatter-adds, never products with
// one-hot selection matrices (n x h x h x c x w multiply-adds a pass).
TEST_F(PjrtAgentKernelTest, RandomShiftIsAGatherEqualToTheCpuAndItsAdjointAScatter) {
  const int64_t n = 3, c = 2, h = 5, w = 7, pad = 2;
  const std::vector<int32_t> shifts = {0, 4, 2, 2, 4, 1};  // (row, column) per sample, each in [0, 2 * pad]
  const Pair s = PutInts(shifts);
  Pair x = Put(RandomVector(n * c * h * w, 20)), y = Put(std::vector<float>(n * c * h * w)),
       dy = Put(RandomVector(n * c * h * w, 21)), dx = Put(RandomVector(n * c * h * w, 22));
  RandomShiftForward(cpu_, n, c, h, w, pad, AsInts(s.cpu), x.cpu, y.cpu);
  RandomShiftForward(*pjrt_, n, c, h, w, pad, AsInts(s.pjrt), x.pjrt, y.pjrt);
  EXPECT_THAT(pjrt_->last_program(), HasSubstr("stablehlo.gather"));
  EXPECT_THAT(pjrt_->last_program(), ::testing::Not(HasSubstr("stablehlo.dot_general")));
  ExpectSame(y, n * c * h * w, 0.0, "y");
  RandomShiftBackward(cpu_, n, c, h, w, pad, AsInts(s.cpu), dy.cpu, dx.cpu);
  RandomShiftBackward(*pjrt_, n, c, h, w, pad, AsInts(s.pjrt), dy.pjrt, dx.pjrt);
  EXPECT_THAT(pjrt_->last_program(), HasSubstr("stablehlo.scatter"));
  EXPECT_THAT(pjrt_->last_program(), ::testing::Not(HasSubstr("stablehlo.dot_general")));
  ExpectSame(dx, n * c * h * w, 1e-6, "dx");  // sums of up to 2 * pad + 1 entries, in another order
}

TEST(PjrtRandomShiftTest, TheOpAndItsGradientEqualTheCpu) {
  nn::ExpectAgreesOnPjrt({nn::Random({2, 2, 5, 6}, 39)}, ShiftWithFixedSeed);
}
#endif  // TROUPE_HAVE_PJRT

}  // namespace
}  // namespace troupe::agents
