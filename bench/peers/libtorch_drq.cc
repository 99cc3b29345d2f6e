// The comparison peer for `troupe bench learner`: the same DrQ-style network
// in libtorch (Debian's libtorch-dev 1.13), forward + backward + Adam.
// Not part of troupe: the benchmark compiles and runs it when libtorch is
// installed. Usage: libtorch_drq THREADS BATCH SIZE SECONDS; prints
// "samples_per_second X".
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

struct DrqNet : torch::nn::Module {
  DrqNet(int64_t size) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(9, 32, 3).stride(2)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3)));
    c3 = register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3)));
    c4 = register_module("c4", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3)));
    const int64_t s = (size - 3) / 2 + 1 - 6;
    fc = register_module("fc", torch::nn::Linear(32 * s * s, 50));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({50})));
    h1 = register_module("h1", torch::nn::Linear(50, 1024));
    h2 = register_module("h2", torch::nn::Linear(1024, 1024));
    h3 = register_module("h3", torch::nn::Linear(1024, 1));
  }
  // uint8 frames [B, k, H, W, 3] -> float [B, 3k, H, W] / 255 (channel f*3 + c: frame f's colour c).
  torch::Tensor forward(const torch::Tensor& frames) {
    const auto s = frames.sizes();
    torch::Tensor x = frames.permute({0, 1, 4, 2, 3}).reshape({s[0], s[1] * s[4], s[2], s[3]}).to(torch::kFloat) *
                      (1.0 / 255.0);
    x = torch::relu(c1(x));
    x = torch::relu(c2(x));
    x = torch::relu(c3(x));
    x = torch::relu(c4(x));
    x = torch::tanh(ln(fc(x.flatten(1))));
    x = torch::relu(h1(x));
    x = torch::relu(h2(x));
    return h3(x);
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr}, c4{nullptr};
  torch::nn::Linear fc{nullptr}, h1{nullptr}, h2{nullptr}, h3{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s THREADS BATCH SIZE SECONDS\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const int64_t batch = std::atoll(argv[2]), size = std::atoll(argv[3]);
  const double seconds = std::atof(argv[4]);
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  DrqNet net(size);
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-4));
  // As troupe's side is handed them: uint8 frames as replay holds them.
  const torch::Tensor x = torch::randint(0, 256, {batch, 3, size, size, 3}, torch::kUInt8);
  const torch::Tensor y = torch::rand({batch, 1});
  auto step = [&] {
    adam.zero_grad();
    torch::Tensor loss = torch::mse_loss(net.forward(x), y);
    loss.backward();
    adam.step();
  };
  step();  // warm up
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  long steps = 0;
  double elapsed = 0;
  while (elapsed < seconds || steps < 4) {  // bench/protocol.h kMinStepsPerRound
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  std::printf("samples_per_second %.3f\n", steps * batch / elapsed);
  return 0;
}
