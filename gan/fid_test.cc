// FID against hand-computable cases: identical sets, Gaussians whose Frechet
// distance has a closed form, and the matrix square root itself.
#include "gan/fid.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>
#include <random>

#include "gtest/gtest.h"

namespace troupe::gan {
namespace {

Eigen::MatrixXd RandomSpd(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  Eigen::MatrixXd a(n, n);
  for (int i = 0; i < n; ++i) for (int j = 0; j < n; ++j) a(i, j) = d(rng);
  return a * a.transpose() + 0.1 * Eigen::MatrixXd::Identity(n, n);
}

FeatureStats Stats(Eigen::VectorXd mean, Eigen::MatrixXd covariance) {
  FeatureStats s;
  s.count = 1000;
  s.mean = std::move(mean);
  s.covariance = std::move(covariance);
  return s;
}

TEST(FidTest, MatrixSqrtOfDiagonalIsElementwise) {
  const Eigen::MatrixXd root = SqrtPsd(Eigen::Vector3d(4, 9, 16).asDiagonal());
  EXPECT_NEAR((root - Eigen::MatrixXd(Eigen::Vector3d(2, 3, 4).asDiagonal())).norm(), 0.0, 1e-12);
}

TEST(FidTest, MatrixSqrtSquaresBackToAnSpdMatrix) {
  const Eigen::MatrixXd a = RandomSpd(/*n=*/12, /*seed=*/3);
  const Eigen::MatrixXd root = SqrtPsd(a);
  EXPECT_LT((root * root - a).norm() / a.norm(), 1e-12);
  EXPECT_LT((root - root.transpose()).norm(), 1e-12);  // symmetric
  EXPECT_GT(Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(root).eigenvalues().minCoeff(), 0.0);
  // [[2, 1], [1, 2]] has the square root ((sqrt3 + 1)/2, (sqrt3 - 1)/2; ...).
  Eigen::Matrix2d b;
  b << 2, 1, 1, 2;
  const double p = (std::sqrt(3.0) + 1) / 2, q = (std::sqrt(3.0) - 1) / 2;
  Eigen::Matrix2d expected;
  expected << p, q, q, p;
  EXPECT_LT((SqrtPsd(b) - expected).norm(), 1e-12);
}

TEST(FidTest, IdenticalSetsGiveZero) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> features(2000 * 16);
  for (int i = 0; i < 2000; ++i) {
    for (int j = 0; j < 16; ++j) features[i * 16 + j] = d(rng) * (1 + j % 3) + (j % 4 == 0 ? d(rng) : 0.0f) + j;
  }
  const FeatureStats a = ComputeFeatureStats(features.data(), 2000, 16);
  EXPECT_NEAR(FrechetDistance(a, a), 0.0, 1e-8);
}

TEST(FidTest, DiagonalGaussiansGiveTheClosedForm) {
  // ||mu||^2 + sum_i (s1 + s2 - 2 sqrt(s1 s2)) = 9 + 16 + (1 + 4 - 4) + (4 + 9 - 12) = 27.
  const FeatureStats a = Stats(Eigen::Vector2d(0, 0), Eigen::Vector2d(1, 4).asDiagonal());
  const FeatureStats b = Stats(Eigen::Vector2d(3, 4), Eigen::Vector2d(4, 9).asDiagonal());
  EXPECT_NEAR(FrechetDistance(a, b), 27.0, 1e-10);
  EXPECT_NEAR(FrechetDistance(b, a), 27.0, 1e-10);
}

TEST(FidTest, ShiftedGaussiansWithEqualCovarianceGiveTheSquaredShift) {
  const Eigen::MatrixXd s = RandomSpd(/*n=*/10, /*seed=*/5);
  Eigen::VectorXd shift = Eigen::VectorXd::LinSpaced(10, -1.0, 2.0);
  EXPECT_NEAR(FrechetDistance(Stats(Eigen::VectorXd::Zero(10), s), Stats(shift, s)), shift.squaredNorm(), 1e-8);
}

TEST(FidTest, NonCommutingCovariancesMatchTheEigenvaluesOfTheProduct) {
  // tr((S1 S2)^(1/2)) = sum sqrt(eig(S1 S2)), and S1 S2 has the eigenvalues
  // of L^T S1 L with S2 = L L^T (Cholesky): an independent route (no matrix
  // square root). Eigen's general EigenSolver would say the same, at 40 s
  // more of this file's compile.
  const Eigen::MatrixXd s1 = RandomSpd(8, 11), s2 = RandomSpd(8, 12);
  const Eigen::MatrixXd l = Eigen::LLT<Eigen::MatrixXd>(s2).matrixL();
  const Eigen::VectorXd eig = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(l.transpose() * s1 * l).eigenvalues();
  ASSERT_GT(eig.minCoeff(), 0.0);
  double trace_root = 0;
  for (int i = 0; i < eig.size(); ++i) trace_root += std::sqrt(eig[i]);
  const Eigen::VectorXd mean = Eigen::VectorXd::Constant(8, 0.5);
  const double expected = mean.squaredNorm() + s1.trace() + s2.trace() - 2 * trace_root;
  EXPECT_NEAR(FrechetDistance(Stats(Eigen::VectorXd::Zero(8), s1), Stats(mean, s2)), expected, 1e-8 * expected);
}

TEST(FidTest, SampledShiftedGaussiansApproachTheClosedForm) {
  // N(0, I) vs N(mu, I) in 4 dims, 20,000 samples each: FID -> ||mu||^2 = 4.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(20000 * 4), b(20000 * 4);
  for (float& v : a) v = d(rng);
  for (size_t i = 0; i < b.size(); ++i) b[i] = d(rng) + 1.0f;
  const double fid = FrechetDistance(ComputeFeatureStats(a.data(), 20000, 4), ComputeFeatureStats(b.data(), 20000, 4));
  EXPECT_NEAR(fid, 4.0, 0.1);
}

TEST(FidTest, ClassifierScoreOfConfidentBalancedPredictionsIsTheClassCount) {
  std::vector<float> one_hot(100 * 10, 0.0f), uniform(100 * 10, 0.1f);
  for (int i = 0; i < 100; ++i) one_hot[i * 10 + i % 10] = 1.0f;
  EXPECT_NEAR(ClassifierScore(one_hot.data(), 100, 10), 10.0, 1e-6);
  EXPECT_NEAR(ClassifierScore(uniform.data(), 100, 10), 1.0, 1e-6);
}

}  // namespace
}  // namespace troupe::gan
