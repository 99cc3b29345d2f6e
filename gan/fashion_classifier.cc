#include "gan/fashion_classifier.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/engine_config.h"
#include "engine/nn/optimizer.h"
#include "gan/idx.h"

namespace troupe::gan {

FashionClassifier::FashionClassifier(nn::ParameterSet& params)
    : conv1_(nn::Conv2dLayer::Create(params, "conv1", 1, 32, 3, /*stride=*/1, /*pad=*/1)),
      conv2_(nn::Conv2dLayer::Create(params, "conv2", 32, 32, 3, /*stride=*/2, /*pad=*/1)),
      conv3_(nn::Conv2dLayer::Create(params, "conv3", 32, 64, 3, /*stride=*/2, /*pad=*/1)),
      fc1_(nn::LinearLayer::Create(params, "fc1", 64 * 7 * 7, 128)),
      fc2_(nn::LinearLayer::Create(params, "fc2", 128, 10)) {}

nn::Var FashionClassifier::Logits(nn::Tape& tape, nn::ParameterSet& params, nn::Var images,
                                  nn::Var* features) const {
  constexpr auto kRelu = nn::FusedActivation::kRelu;
  nn::Var h = conv1_(tape, params, images, kRelu);  // 28x28
  h = conv2_(tape, params, h, kRelu);               // 14x14
  h = conv3_(tape, params, h, kRelu);               // 7x7
  h = nn::Relu(fc1_(tape, params, nn::Flatten(h)));
  if (features != nullptr) *features = h;
  return fc2_(tape, params, h);
}

absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir) {
  FashionMnist data;
  auto load = [&](const std::string& prefix, int64_t expected, std::vector<float>& images,
                  std::vector<int32_t>& labels) -> absl::Status {
    ASSIGN_OR_RETURN(IdxImages raw, ReadIdxImages(absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz")));
    ASSIGN_OR_RETURN(labels, ReadIdxLabels(absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz"), 10));
    if (raw.count != expected || raw.rows != 28 || raw.cols != 28 || static_cast<int64_t>(labels.size()) != expected) {
      return absl::DataLossError(absl::StrCat(dir, "/", prefix, ": ", raw.count, " images of ", raw.rows, "x",
                                              raw.cols, " and ", labels.size(), " labels, expected ", expected,
                                              " of 28x28"));
    }
    images.resize(raw.pixels.size());
    for (size_t i = 0; i < raw.pixels.size(); ++i) images[i] = raw.pixels[i] / 255.0f;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load("train", 60000, data.train_images, data.train_labels));
  RETURN_IF_ERROR(load("t10k", 10000, data.test_images, data.test_labels));
  return data;
}

absl::StatusOr<std::unique_ptr<nn::Backend>> MakeDevice(config::EngineConfig::Device device, int threads) {
  config::EngineConfig engine;
  engine.set_device(device);
  return engine::MakeBackend(engine, /*local_index=*/0, threads);
}

absl::StatusOr<TrainResult> TrainFashionClassifier(const FashionMnist& data, const TrainOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const std::unique_ptr<nn::Backend> device, MakeDevice(options.device, options.threads));
  nn::Backend& backend = *device;
  nn::ParameterSet params;
  FashionClassifier model(params);
  params.Allocate(backend, options.seed);
  nn::Adam adam(&params, &backend);
  nn::Tape tape(&backend);
  constexpr int64_t kPixels = 28 * 28;
  const int64_t n = static_cast<int64_t>(data.train_labels.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(options.seed);
  std::vector<float> batch_images(options.batch * kPixels);
  std::vector<int32_t> batch_labels(options.batch);
  const int64_t steps_per_epoch = n / options.batch;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      // Gather the batch.
      for (int b = 0; b < options.batch; ++b) {
        const int64_t k = order[s * options.batch + b];
        std::copy_n(data.train_images.begin() + k * kPixels, kPixels, batch_images.begin() + b * kPixels);
        batch_labels[b] = data.train_labels[k];
      }
      // One Adam step; the rate halves for the last epoch.
      tape.Reset();
      params.ZeroGrad();
      nn::Var x = tape.Input(batch_images.data(), {options.batch, 1, 28, 28});
      nn::Var loss = nn::SoftmaxCrossEntropy(model.Logits(tape, params, x), batch_labels);
      tape.Backward(loss);
      adam.Step(epoch + 1 == options.epochs && options.epochs > 1 ? options.learning_rate * 0.5f
                                                                   : options.learning_rate);
    }
  }
  // Test accuracy in batches of 500.
  int64_t correct = 0;
  const int64_t test_n = static_cast<int64_t>(data.test_labels.size());
  std::vector<float> host_logits(500 * 10);
  for (int64_t begin = 0; begin < test_n; begin += 500) {
    const int64_t count = std::min<int64_t>(500, test_n - begin);
    tape.Reset();
    nn::Var logits =
        model.Logits(tape, params, tape.Input(data.test_images.data() + begin * kPixels, {count, 1, 28, 28}));
    tape.backend().Download(tape.data(logits).data, host_logits.data(), sizeof(float) * count * 10);
    const float* l = host_logits.data();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t predicted = std::max_element(l + i * 10, l + i * 10 + 10) - (l + i * 10);
      correct += predicted == data.test_labels[begin + i];
    }
  }
  if (!options.checkpoint_path.empty()) RETURN_IF_ERROR(nn::SaveCheckpoint(options.checkpoint_path, params));
  TrainResult result;
  result.test_accuracy = static_cast<double>(correct) / test_n;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace troupe::gan
