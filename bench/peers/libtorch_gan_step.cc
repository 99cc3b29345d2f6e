// The comparison peer for `troupe bench gan`, in libtorch (Debian's
// libtorch-dev 1.13): it times the GAN mode's step. Not part of troupe: the
// benchmark compiles and runs it when libtorch is installed.
//
//   libtorch_gan_step THREADS BATCH CHANNELS NOISE SECONDS
//     times the GAN mode's generator + discriminator step (gan/networks.h:
//     DCGAN generator with batch norm, spectrally normalised discriminator
//     with one power iteration per D update, hinge loss, Adam for both) on
//     random images; prints "images_per_second X" (real images shown to D).
//
// The reference trainer, which trains the same GAN as troupe's from the same
// weights on the same data, is libtorch_gan_reference.cc beside this file.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

namespace F = torch::nn::functional;

// w / sigma(w) with persistent u (one power iteration when `update`).
struct SpectralWeight {
  torch::Tensor w, u;
  torch::Tensor Normalized(bool update) {
    torch::Tensor mat = w.reshape({w.size(0), -1});
    if (update) {
      torch::NoGradGuard no_grad;
      torch::Tensor v = F::normalize(torch::mv(mat.t(), u), F::NormalizeFuncOptions().dim(0));
      u = F::normalize(torch::mv(mat, v), F::NormalizeFuncOptions().dim(0));
    }
    torch::Tensor v = F::normalize(torch::mv(mat.t(), u), F::NormalizeFuncOptions().dim(0)).detach();
    torch::Tensor sigma = torch::dot(u.detach(), torch::mv(mat, v));
    return w / sigma;
  }
};

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s THREADS BATCH CHANNELS NOISE SECONDS\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const int64_t batch = std::atoll(argv[2]), c = std::atoll(argv[3]), noise = std::atoll(argv[4]);
  const double seconds = std::atof(argv[5]);
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  // Generator.
  torch::nn::Linear fc(torch::nn::LinearOptions(noise, 2 * c * 49).bias(false));
  torch::nn::BatchNorm2d bn0(2 * c), bn1(c);
  torch::nn::ConvTranspose2d up1(torch::nn::ConvTranspose2dOptions(2 * c, c, 4).stride(2).padding(1).bias(false));
  torch::nn::ConvTranspose2d up2(torch::nn::ConvTranspose2dOptions(c, 1, 4).stride(2).padding(1));
  std::vector<torch::Tensor> g_params;
  for (auto* m : std::initializer_list<torch::nn::Module*>{fc.get(), bn0.get(), bn1.get(), up1.get(), up2.get()}) {
    for (auto& p : m->parameters()) g_params.push_back(p);
  }
  auto generate = [&](const torch::Tensor& z) {
    torch::Tensor h = torch::relu(bn0(fc(z).view({-1, 2 * c, 7, 7})));
    h = torch::relu(bn1(up1(h)));
    return torch::tanh(up2(h));
  };
  // Discriminator.
  auto weight = [](std::vector<int64_t> shape, int64_t fan_in) {
    return SpectralWeight{(torch::rand(shape) * 2 - 1).div(std::sqrt(double(fan_in))).requires_grad_(),
                          torch::randn({shape[0]})};
  };
  SpectralWeight w1 = weight({c, 1, 4, 4}, 16), w2 = weight({2 * c, c, 4, 4}, c * 16), w3 = weight({1, 2 * c * 49}, 2 * c * 49);
  torch::Tensor b1 = torch::zeros({c}).requires_grad_(), b2 = torch::zeros({2 * c}).requires_grad_(),
                b3 = torch::zeros({1}).requires_grad_();
  std::vector<torch::Tensor> d_params = {w1.w, w2.w, w3.w, b1, b2, b3};
  auto discriminate = [&](const torch::Tensor& x, bool update) {
    torch::Tensor h = F::leaky_relu(F::conv2d(x, w1.Normalized(update), F::Conv2dFuncOptions().bias(b1).stride(2).padding(1)),
                                    F::LeakyReLUFuncOptions().negative_slope(0.2));
    h = F::leaky_relu(F::conv2d(h, w2.Normalized(update), F::Conv2dFuncOptions().bias(b2).stride(2).padding(1)),
                      F::LeakyReLUFuncOptions().negative_slope(0.2));
    return F::linear(h.flatten(1), w3.Normalized(update), b3);
  };
  torch::optim::Adam g_adam(g_params, torch::optim::AdamOptions(1e-4).betas({0.0, 0.9}));
  torch::optim::Adam d_adam(d_params, torch::optim::AdamOptions(4e-4).betas({0.0, 0.9}));
  const torch::Tensor real = torch::rand({batch, 1, 28, 28}) * 2 - 1;
  auto step = [&] {
    // Discriminator update on [real; fake], generator without gradients.
    d_adam.zero_grad();
    torch::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = generate(torch::randn({batch, noise}));
    }
    torch::Tensor scores = discriminate(torch::cat({real, fake}), true);
    torch::Tensor d_loss = torch::relu(1 - scores.slice(0, 0, batch)).mean() + torch::relu(1 + scores.slice(0, batch)).mean();
    d_loss.backward();
    d_adam.step();
    // Generator update through the discriminator (its weights get no update).
    g_adam.zero_grad();
    torch::Tensor g_loss = -discriminate(generate(torch::randn({batch, noise})), false).mean();
    g_loss.backward();
    g_adam.step();
  };
  step();  // warm up
  long steps = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds || steps < 4) {  // bench/protocol.h kMinStepsPerRound
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("images_per_second %.2f\n", steps * batch / elapsed);
  return 0;
}

