#include "gan/fid.h"

#include <Eigen/Eigenvalues>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/ops.h"

namespace troupe::gan {

FeatureStats ComputeFeatureStats(const float* features, int64_t count, int dim) {
  TROUPE_CHECK(count >= 2);
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> f(features, count, dim);
  const Eigen::MatrixXd x = f.cast<double>();
  FeatureStats stats;
  stats.count = count;
  stats.mean = x.colwise().mean().transpose();
  const Eigen::MatrixXd centered = x.rowwise() - stats.mean.transpose();
  stats.covariance = (centered.transpose() * centered) / static_cast<double>(count - 1);
  return stats;
}

Eigen::MatrixXd SqrtPsd(const Eigen::MatrixXd& symmetric) {
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(symmetric);
  const Eigen::VectorXd roots = eig.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  return eig.eigenvectors() * roots.asDiagonal() * eig.eigenvectors().transpose();
}

double FrechetDistance(const FeatureStats& a, const FeatureStats& b) {
  TROUPE_CHECK(a.mean.size() == b.mean.size());
  // tr((S1 S2)^(1/2)) = tr((S1^(1/2) S2 S1^(1/2))^(1/2)) = sum of sqrt of its eigenvalues.
  const Eigen::MatrixXd root1 = SqrtPsd(a.covariance);
  Eigen::MatrixXd middle = root1 * b.covariance * root1;
  middle = 0.5 * (middle + middle.transpose());  // symmetric up to rounding
  const Eigen::VectorXd eigenvalues = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(middle, Eigen::EigenvaluesOnly)
                                          .eigenvalues();
  const double trace_root = eigenvalues.cwiseMax(0.0).cwiseSqrt().sum();
  const double mean_term = (a.mean - b.mean).squaredNorm();
  return mean_term + a.covariance.trace() + b.covariance.trace() - 2.0 * trace_root;
}

double ClassifierScore(const float* probabilities, int64_t count, int classes) {
  TROUPE_CHECK(count >= 1);
  // The marginal p(y), then the mean KL of each row against it.
  std::vector<double> marginal(classes, 0.0);
  for (int64_t i = 0; i < count; ++i) {
    for (int c = 0; c < classes; ++c) marginal[c] += probabilities[i * classes + c] / static_cast<double>(count);
  }
  constexpr double kTiny = 1e-12;
  double kl = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    for (int c = 0; c < classes; ++c) {
      const double p = probabilities[i * classes + c];
      if (p > 0) kl += p * (std::log(p + kTiny) - std::log(marginal[c] + kTiny));
    }
  }
  return std::exp(kl / static_cast<double>(count));
}

std::string DefaultClassifierPath() { return CacheDirectory() + "/fashion_mnist_classifier.ckpt"; }

FidClassifier::FidClassifier(std::unique_ptr<nn::Backend> backend) : backend_(std::move(backend)), model_(params_) {}

absl::StatusOr<std::unique_ptr<FidClassifier>> FidClassifier::LoadOrTrain(const Options& options,
                                                                          void (*log)(const std::string&)) {
  ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> device, MakeDevice(options.device, options.threads));
  std::unique_ptr<FidClassifier> c(new FidClassifier(std::move(device)));
  c->checkpoint_ = options.checkpoint.empty() ? DefaultClassifierPath() : options.checkpoint;
  c->params_.Allocate(*c->backend_, options.train.seed);
  const std::string accuracy_path = c->checkpoint_ + ".txt";
  if (!std::filesystem::exists(c->checkpoint_)) {
    // Train it (a few minutes on two cores) and cache it for every later run.
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(c->checkpoint_).parent_path(), ec);
    if (log) log(absl::StrCat("FID classifier: ", c->checkpoint_, " not found; training it on Fashion-MNIST"));
    ASSIGN_OR_RETURN(FashionMnist data, LoadFashionMnist(options.data_dir));
    if (options.train_images > 0 && options.train_images < static_cast<int64_t>(data.train_labels.size())) {
      data.train_labels.resize(options.train_images);
      data.train_images.resize(options.train_images * 28 * 28);
    }
    TrainOptions train = options.train;
    train.threads = options.threads;
    train.device = options.device;
    train.checkpoint_path = c->checkpoint_;
    ASSIGN_OR_RETURN(TrainResult result, TrainFashionClassifier(data, train));
    RETURN_IF_ERROR(WriteFileAtomically(
        accuracy_path, absl::StrFormat("test_accuracy %.4f\nepochs %d\ntrain_images %d\nseconds %.1f\n",
                                       result.test_accuracy, train.epochs, data.train_labels.size(), result.seconds)));
  }
  RETURN_IF_ERROR(nn::LoadCheckpoint(c->checkpoint_, c->params_));
  // The accuracy recorded when it was trained.
  std::ifstream in(accuracy_path);
  std::string key;
  if (in >> key && key == "test_accuracy") in >> c->test_accuracy_;
  if (log) {
    log(absl::StrFormat("FID classifier: %s (test accuracy %s)", c->checkpoint_,
                        c->test_accuracy_ >= 0 ? absl::StrFormat("%.4f", c->test_accuracy_) : "unknown"));
  }
  return c;
}

void FidClassifier::Evaluate(const float* images, int64_t count, float* features, float* probabilities) {
  constexpr int64_t kChunk = 500;
  nn::Tape tape(backend_.get());
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    tape.Reset();
    nn::Var f;
    nn::Var logits = model_.Logits(tape, params_, tape.Input(images + begin * 784, {n, 1, 28, 28}), &f);
    if (features != nullptr) {
      backend_->Download(tape.data(f).data, features + begin * kFeatureSize, sizeof(float) * n * kFeatureSize);
    }
    if (probabilities != nullptr) {
      nn::Var p = nn::Softmax(logits);
      backend_->Download(tape.data(p).data, probabilities + begin * kClasses, sizeof(float) * n * kClasses);
    }
  }
}

}  // namespace troupe::gan
