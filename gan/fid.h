// Classifier-FID and the classifier score for the GAN mode.
//
// FID (Heusel et al. 2017, "GANs Trained by a Two Time-Scale Update Rule
// Converge to a Local Nash Equilibrium") is the Frechet distance between two
// Gaussians fitted to feature sets:
//   ||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)),
// with tr((S1 S2)^(1/2)) computed as tr((S1^(1/2) S2 S1^(1/2))^(1/2)) through
// symmetric eigen-decompositions (both factors are symmetric PSD, so this is
// exact and needs no complex arithmetic, unlike scipy's sqrtm).
//
// The features here are the penultimate (128-wide) layer of the Fashion-MNIST
// classifier trained by this engine (gan/fashion_classifier.h), not
// Inception-v3's pool3: the figures are a classifier-FID, comparable only with
// each other, never with Inception-based FIDs. The classifier score is the
// Inception-score formula (Salimans et al. 2016), exp(E_x KL(p(y|x) || p(y))),
// on that classifier's class probabilities.
#ifndef TROUPE_GAN_FID_H_
#define TROUPE_GAN_FID_H_

#include <Eigen/Core>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "gan/fashion_classifier.h"

namespace troupe::gan {

// Mean and (unbiased, n - 1) covariance of a feature set, in double.
struct FeatureStats {
  int64_t count = 0;
  Eigen::VectorXd mean;
  Eigen::MatrixXd covariance;
};

// Stats of `count` rows of `dim` features (row-major). count >= 2.
FeatureStats ComputeFeatureStats(const float* features, int64_t count, int dim);

// The symmetric PSD square root of a symmetric matrix: V sqrt(max(L, 0)) V^T
// from its eigen-decomposition (tiny negative eigenvalues from rounding are
// clamped to zero).
Eigen::MatrixXd SqrtPsd(const Eigen::MatrixXd& symmetric);

// The Frechet distance between the Gaussians of `a` and `b` (>= 0 up to rounding).
double FrechetDistance(const FeatureStats& a, const FeatureStats& b);

// exp(mean_i KL(p_i || mean_j p_j)) over `count` rows of `classes` probabilities.
double ClassifierScore(const float* probabilities, int64_t count, int classes);

// ~/.cache/troupe/fashion_mnist_classifier.ckpt ($XDG_CACHE_HOME/troupe/... when set).
std::string DefaultClassifierPath();

// The trained classifier as a feature extractor. Not thread-safe.
class FidClassifier {
 public:
  struct Options {
    std::string checkpoint;             // empty = DefaultClassifierPath()
    std::string data_dir = kFashionMnistDir;  // to train on when the checkpoint is missing
    TrainOptions train;         // how it is trained then (2 epochs, ~88-90%)
    int64_t train_images = 0;           // train on the first this many (0 = all 60,000; tests use fewer)
    int threads = 2;
    config::EngineConfig::Device device = config::EngineConfig::CPU;  // where it computes (and trains)
  };
  // Loads options.checkpoint, or trains the classifier, saves it there and
  // writes its test accuracy to `<checkpoint>.txt`. `log` (may be null) hears
  // one line saying which happened and the accuracy. Errors: data or
  // checkpoint errors naming the file.
  static absl::StatusOr<std::unique_ptr<FidClassifier>> LoadOrTrain(const Options& options,
                                                                    void (*log)(const std::string&) = nullptr);

  // Features [count, 128] and class probabilities [count, 10] of images
  // [count, 1, 28, 28] in [0, 1]; either output may be null.
  void Evaluate(const float* images, int64_t count, float* features, float* probabilities);

  const std::string& checkpoint() const { return checkpoint_; }
  // The accuracy recorded when it was trained (-1 if unknown).
  double test_accuracy() const { return test_accuracy_; }

 private:
  explicit FidClassifier(std::unique_ptr<nn::Backend> backend);
  std::unique_ptr<nn::Backend> backend_;  // before the parameters that live in it
  nn::ParameterSet params_;
  FashionClassifier model_;
  std::string checkpoint_;
  double test_accuracy_ = -1;
};

inline constexpr int kFeatureSize = 128;
inline constexpr int kClasses = 10;

}  // namespace troupe::gan

#endif  // TROUPE_GAN_FID_H_
