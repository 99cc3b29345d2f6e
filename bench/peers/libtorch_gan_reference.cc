// The reference implementation of the GAN mode, in libtorch (Debian's
// libtorch-dev 1.13). Not part of troupe: bench/gan_reference.h (`troupe
// bench gan`'s reference comparison and bench/gan_reference_test) compiles
// and runs it when libtorch is installed.
//
//   libtorch_gan_reference THREADS KEY=VALUE...
//     trains the same GAN as troupe's GanTrainer (gan/trainer.h) from
//     troupe's exported initial weights, on the same stream of Fashion-MNIST
//     images and the same noise, and writes samples of its EMA generator for
//     troupe's classifier-FID. The keys are GanConfig's fields (see main
//     below; bench/gan_reference.cc passes them). Prints "step S d_loss X
//     g_loss Y" per step with print_losses=1, "step S of N, images/s X"
//     every save_every steps (default 500) and at the end, then
//     "train_seconds X". With state=FILE the run is resumable: every
//     save_every steps and at the end it writes its whole state to FILE, and
//     a run that finds FILE continues from its step (printing "resumed at
//     step S of N from FILE") with the same losses and samples as one
//     uninterrupted run; train_seconds counts every piece. A state written
//     with other settings is refused, naming the setting. Exits 1 with a
//     message naming the file (and tensor or setting) on bad input.
//
// The timing of the GAN step alone, for `troupe bench gan`'s speed figure,
// is libtorch_gan_step.cc beside this file.
//
// Where the peer follows troupe rather than a library default, it says so.
// Where it cannot match troupe exactly:
//   - float32 arithmetic in another order: libtorch's convolutions and GEMMs
//     against troupe's kernels; batch-norm statistics and the power
//     iteration's norms, which troupe sums in double; Adam's bias
//     corrections, which libtorch computes in double and troupe in float.
//     Over 20 steps the losses agree to ~1e-4 (bench/gan_reference_test);
//     GAN training amplifies such differences, so over hundreds of thousands
//     of images the two runs become different trajectories of the same
//     algorithm, which is what the FID comparison is for.
//   - one process: troupe's K replicas with cross-replica batch norm compute
//     the step of one replica on the whole batch (gan_trainer_test), which
//     is what the peer computes for any K.
//   - Adam only: gan.optimizer LAMB / LARS have no reference here.
#include <torch/torch.h>

#include "common/fnv1a.h"  // troupe's, header-only: the checkpoint checksum

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

namespace {

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "libtorch_gan_reference: %s\n", message.c_str());
  std::exit(1);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// troupe's checkpoint format (engine/nn/checkpoint.h), little-endian:
//   "TRPCKPT1" | u32 entries | entries... | u64 FNV-1a-64 of all prior bytes
//   entry: u32 name length | name | u32 rank | i64 dims[rank] | f32 data
// (the checksum: troupe::CheckpointChecksum, common/fnv1a.h).
//
// The file's tensors by name; `checksum`, when given, gets the file's
// checksum (a fingerprint of its contents).
std::map<std::string, torch::Tensor> ReadTensors(const std::string& path, uint64_t* checksum_out = nullptr) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Fail("cannot open the weights file " + path);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 20 || bytes.compare(0, 8, "TRPCKPT1") != 0) Fail(path + ": not a troupe checkpoint file");
  uint64_t checksum;
  std::memcpy(&checksum, bytes.data() + bytes.size() - 8, 8);
  if (checksum != troupe::CheckpointChecksum(bytes.data(), bytes.size() - 8)) {
    Fail(path + ": checksum mismatch (corrupt or truncated)");
  }
  if (checksum_out != nullptr) *checksum_out = checksum;
  size_t at = 8;
  const size_t end = bytes.size() - 8;
  auto take = [&](void* out, size_t n) {
    if (at + n > end) Fail(path + ": truncated entry");
    std::memcpy(out, bytes.data() + at, n);
    at += n;
  };
  uint32_t entries;
  take(&entries, 4);
  std::map<std::string, torch::Tensor> tensors;
  for (uint32_t e = 0; e < entries; ++e) {
    uint32_t length, rank;
    take(&length, 4);
    std::string name(length, '\0');
    take(name.data(), length);
    take(&rank, 4);
    if (rank > 8) Fail(path + ": tensor " + name + " has rank " + std::to_string(rank));
    std::vector<int64_t> shape(rank);
    int64_t count = 1;
    for (auto& d : shape) {
      take(&d, 8);
      count *= d;
    }
    torch::Tensor t = torch::empty(shape, torch::kFloat32);
    take(t.data_ptr<float>(), sizeof(float) * count);
    tensors[name] = t;
  }
  return tensors;
}

void WriteTensor(const std::string& path, const std::string& name, const torch::Tensor& tensor) {
  const torch::Tensor t = tensor.contiguous();
  std::string out = "TRPCKPT1";
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint32_t entries = 1, length = static_cast<uint32_t>(name.size()), rank = static_cast<uint32_t>(t.dim());
  put(&entries, 4);
  put(&length, 4);
  out += name;
  put(&rank, 4);
  for (int64_t d : t.sizes()) put(&d, 8);
  put(t.data_ptr<float>(), sizeof(float) * t.numel());
  const uint64_t checksum = troupe::CheckpointChecksum(out.data(), out.size());
  put(&checksum, 8);
  // Temporary file + rename, as troupe writes checkpoints.
  {
    std::ofstream f(path + ".tmp", std::ios::binary | std::ios::trunc);
    if (!f.write(out.data(), static_cast<std::streamsize>(out.size())) || !f.flush()) Fail("cannot write " + path);
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) Fail("cannot rename " + path + ".tmp to " + path);
}

// Fashion-MNIST training images as [60000, 1, 28, 28] in [-1, 1], computed as
// troupe's LoadGanData does (byte / 255.0f, then * 2 - 1, in float).
torch::Tensor LoadTrainImages(const std::string& dir) {
  const std::string path = dir + "/train-images-idx3-ubyte.gz";
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) Fail("cannot open " + path + " (apt-get install dataset-fashion-mnist)");
  std::string raw;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) raw.append(buf, n);
  gzclose(f);
  auto be32 = [&](size_t at) {
    return (uint32_t{static_cast<uint8_t>(raw[at])} << 24) | (uint32_t{static_cast<uint8_t>(raw[at + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(raw[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(raw[at + 3])};
  };
  if (n < 0 || raw.size() < 16 || be32(0) != 2051 || be32(8) != 28 || be32(12) != 28 ||
      raw.size() != 16 + size_t{be32(4)} * 784) {
    Fail(path + ": not an IDX file of 28x28 images (or truncated)");
  }
  const int64_t count = be32(4);
  torch::Tensor images = torch::empty({count, 1, 28, 28}, torch::kFloat32);
  float* out = images.data_ptr<float>();
  for (int64_t i = 0; i < count * 784; ++i) out[i] = static_cast<uint8_t>(raw[16 + i]) / 255.0f * 2.0f - 1.0f;
  return images;
}

// troupe's FillNoise (gan/trainer.cc), ported exactly: counter-based normal
// noise, so the peer draws the very noise troupe draws.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr double kPi = 3.141592653589793238462643383279502884;  // std::numbers::pi (C++20)

torch::Tensor Noise(uint64_t seed, uint64_t stream, int64_t first_index, int64_t rows, int64_t width) {
  torch::Tensor t = torch::empty({rows, width}, torch::kFloat32);
  float* out = t.data_ptr<float>();
  const uint64_t key = SplitMix64(SplitMix64(seed) ^ (stream * 0xD6E8FEB86659FD93ull));
  for (int64_t i = 0; i < rows * width; ++i) {
    const int64_t e = first_index + i;
    const uint64_t h1 = SplitMix64(key ^ static_cast<uint64_t>(e / 2));
    const uint64_t h2 = SplitMix64(h1 + 0x632BE59BD9B4E019ull);
    const double u1 = (static_cast<double>(h1 >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(h2 >> 11) / 9007199254740992.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * kPi * u2;
    out[i] = static_cast<float>(radius * (e % 2 == 0 ? std::cos(angle) : std::sin(angle)));
  }
  return t;
}

// troupe's ShardSampler (gan/data.cc) for one replica: every epoch one
// permutation of the training images from (seed, epoch), std::shuffle with
// std::mt19937_64 (the same libstdc++ gives the same permutation).
class ImageStream {
 public:
  ImageStream(torch::Tensor images, uint64_t seed) : images_(std::move(images)), seed_(seed) {}
  torch::Tensor Batch(int64_t position, int64_t batch) {
    const int64_t count = images_.size(0);
    std::vector<int64_t> rows(batch);
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t p = position + r;
      if (p / count != epoch_) {
        order_.resize(count);
        std::iota(order_.begin(), order_.end(), 0);
        std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(p / count) + 1);
        std::shuffle(order_.begin(), order_.end(), rng);
        epoch_ = p / count;
      }
      rows[r] = order_[p % count];
    }
    return images_.index_select(0, torch::tensor(rows));
  }

 private:
  torch::Tensor images_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int32_t> order_;
};

// The networks of gan/networks.h, functional, with troupe's parameter names
// and layouts (a linear weight is [in, out], as troupe stores it, and is
// applied as x.mm(w); convolutions use PyTorch's layouts, as troupe does).
struct Parameters {
  std::map<std::string, torch::Tensor> g, d, power;  // power: spectral norm u, v (not trained)
};

// The names and shapes troupe's Generator / Discriminator declare.
std::vector<std::pair<std::string, std::vector<int64_t>>> GeneratorShapes(int64_t noise, int64_t c) {
  return {{"g.fc.w", {noise, 2 * c * 49}}, {"g.bn0.gamma", {2 * c}}, {"g.bn0.beta", {2 * c}},
          {"g.up1.w", {2 * c, c, 4, 4}},   {"g.bn1.gamma", {c}},     {"g.bn1.beta", {c}},
          {"g.up2.w", {c, 1, 4, 4}},       {"g.up2.b", {1}}};
}
std::vector<std::pair<std::string, std::vector<int64_t>>> DiscriminatorShapes(int64_t c) {
  return {{"d.c1.w", {c, 1, 4, 4}},  {"d.c1.b", {c}},          {"d.c2.w", {2 * c, c, 4, 4}},
          {"d.c2.b", {2 * c}},       {"d.fc.w", {2 * c * 49, 1}}, {"d.fc.b", {1}}};
}
std::vector<std::pair<std::string, std::vector<int64_t>>> PowerVectorShapes(int64_t c) {
  return {{"d.c1.u", {c}}, {"d.c1.v", {16}}, {"d.c2.u", {2 * c}}, {"d.c2.v", {c * 16}},
          {"d.fc.u", {2 * c * 49}}, {"d.fc.v", {1}}};
}

// Takes every expected tensor from the file's; a missing one, a shape that
// differs or a tensor the model does not have is an error naming the file
// and the tensor. `checksum` gets the file's checksum.
Parameters ImportWeights(const std::string& path, int64_t noise, int64_t g_channels, int64_t d_channels,
                         uint64_t* checksum) {
  std::map<std::string, torch::Tensor> file = ReadTensors(path, checksum);
  Parameters p;
  auto take = [&](const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                  std::map<std::string, torch::Tensor>& into) {
    for (const auto& [name, shape] : shapes) {
      auto it = file.find(name);
      if (it == file.end()) Fail(path + ": tensor " + name + " " + ShapeString(shape) + " is missing");
      if (it->second.sizes().vec() != shape) {
        Fail(path + ": tensor " + name + " has shape " + ShapeString(it->second.sizes().vec()) +
             ", the peer's model (noise " + std::to_string(noise) + ", channels " + std::to_string(g_channels) + "/" +
             std::to_string(d_channels) + ") wants " + ShapeString(shape));
      }
      into[name] = it->second;
      file.erase(it);
    }
  };
  take(GeneratorShapes(noise, g_channels), p.g);
  take(DiscriminatorShapes(d_channels), p.d);
  take(PowerVectorShapes(d_channels), p.power);
  if (!file.empty()) Fail(path + ": tensor " + file.begin()->first + " is not part of the model");
  for (auto& [name, t] : p.g) t.requires_grad_(true);
  for (auto& [name, t] : p.d) t.requires_grad_(true);
  return p;
}

// troupe's batch norm in training mode: batch statistics (biased variance),
// eps 1e-5, no running statistics, in training and in sampling alike.
torch::Tensor BatchNorm(const torch::Tensor& x, const torch::Tensor& gamma, const torch::Tensor& beta) {
  return torch::batch_norm(x, gamma, beta, /*running_mean=*/{}, /*running_var=*/{}, /*training=*/true,
                           /*momentum=*/0.0, /*eps=*/1e-5, /*cudnn_enabled=*/false);
}

torch::Tensor Generate(std::map<std::string, torch::Tensor>& g, const torch::Tensor& z, int64_t c) {
  torch::Tensor h = z.mm(g["g.fc.w"]).view({-1, 2 * c, 7, 7});
  h = torch::relu(BatchNorm(h, g["g.bn0.gamma"], g["g.bn0.beta"]));
  h = torch::conv_transpose2d(h, g["g.up1.w"], /*bias=*/{}, /*stride=*/{2, 2}, /*padding=*/{1, 1});
  h = torch::relu(BatchNorm(h, g["g.bn1.gamma"], g["g.bn1.beta"]));
  h = torch::conv_transpose2d(h, g["g.up2.w"], g["g.up2.b"], /*stride=*/{2, 2}, /*padding=*/{1, 1});
  return torch::tanh(h);
}

// w / sigma(w) as troupe's SpectralNorm (Miyato et al. 2018): the matrix is w
// as [shape[0], rest]; `iterate` runs one power iteration on the stored u, v
// first (v = normalize(W^T u), then u = normalize(W v), normalize dividing by
// norm + 1e-12 as troupe does); sigma = u^T W v with u, v constants. Without
// `iterate` the stored u and v are used as they are (troupe keeps v too,
// where torch.nn.utils.spectral_norm would recompute it).
torch::Tensor SpectralNormalized(const torch::Tensor& w, torch::Tensor& u, torch::Tensor& v, bool iterate) {
  const torch::Tensor mat = w.reshape({w.size(0), -1});
  if (iterate) {
    torch::NoGradGuard no_grad;
    v = torch::mv(mat.t(), u);
    v = v / (v.norm() + 1e-12);
    u = torch::mv(mat, v);
    u = u / (u.norm() + 1e-12);
  }
  const torch::Tensor sigma = torch::dot(u, torch::mv(mat, v));
  return w / sigma;
}

torch::Tensor Discriminate(Parameters& p, const torch::Tensor& x, bool iterate) {
  auto sn = [&](const std::string& name) {
    return SpectralNormalized(p.d[name + ".w"], p.power[name + ".u"], p.power[name + ".v"], iterate);
  };
  torch::Tensor h = torch::leaky_relu(torch::conv2d(x, sn("d.c1"), p.d["d.c1.b"], /*stride=*/{2, 2}, /*padding=*/{1, 1}), 0.2);
  h = torch::leaky_relu(torch::conv2d(h, sn("d.c2"), p.d["d.c2.b"], /*stride=*/{2, 2}, /*padding=*/{1, 1}), 0.2);
  return h.flatten(1).mm(sn("d.fc")) + p.d["d.fc.b"];
}

std::vector<torch::Tensor> Values(const std::map<std::string, torch::Tensor>& m) {
  std::vector<torch::Tensor> v;
  for (const auto& [name, t] : m) v.push_back(t);
  return v;
}

void SetLearningRate(torch::optim::Adam& adam, double lr) {
  for (auto& group : adam.param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

// --- Resuming: the state file (state=FILE) ------------------------------------
// Everything a step depends on besides its index (the images and the noise
// are functions of the step), as one torch::serialize archive:
//   format              kStateFormat
//   setting_KEY         the run's KEY=VALUE for each of kStateSettings, and
//                       setting_weights_checksum, the initial weights file's
//   step, train_seconds the steps done and their wall time, over all pieces
//   g_*, d_*, power_*, ema_*  the generator, discriminator, power vectors and
//                       EMA generator (troupe's names, '.' written as '_')
//   g_adam, d_adam      the optimizers' state (torch::optim::Adam::save)
// Written to FILE.tmp then renamed, so a kill never leaves half a state.

constexpr char kStateFormat[] = "troupe libtorch_gan state 1";
// The settings that change the training: a state must have been written
// with the same values (steps, samples, data_dir and threads may differ).
constexpr const char* kStateSettings[] = {
    "batch",      "base_batch",    "noise", "g_channels", "d_channels", "loss", "g_lr", "d_lr",
    "lr_scaling", "warmup_images", "beta1", "beta2",      "eps",        "n_critic", "ema_half_life_images", "seed"};
using Settings = std::vector<std::pair<std::string, std::string>>;
using TensorMap = std::map<std::string, torch::Tensor>;

std::string ArchiveKey(const std::string& prefix, const std::string& name) {
  std::string key = prefix + "_" + name;
  std::replace(key.begin(), key.end(), '.', '_');
  return key;
}

// libtorch's message without its backtrace, first line only.
std::string ErrorText(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = error != nullptr ? error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

// The tensor groups of a state, with their archive prefixes.
std::vector<std::pair<std::string, TensorMap*>> StateTensors(Parameters& p, TensorMap& ema) {
  return {{"g", &p.g}, {"d", &p.d}, {"power", &p.power}, {"ema", &ema}};
}

void SaveState(const std::string& path, const Settings& settings, Parameters& p, TensorMap& ema,
               torch::optim::Adam& g_adam, torch::optim::Adam& d_adam, int64_t step, double train_seconds) {
  const std::string temporary = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string(kStateFormat)));
    for (const auto& [key, value] : settings) archive.write("setting_" + key, c10::IValue(value));
    archive.write("step", c10::IValue(step));
    archive.write("train_seconds", c10::IValue(train_seconds));
    for (const auto& [prefix, tensors] : StateTensors(p, ema)) {
      for (const auto& [name, t] : *tensors) archive.write(ArchiveKey(prefix, name), t.detach());
    }
    for (const auto& [key, adam] : {std::pair{"g_adam", &g_adam}, std::pair{"d_adam", &d_adam}}) {
      torch::serialize::OutputArchive optimizer(archive.compilation_unit());
      adam->save(optimizer);
      archive.write(key, optimizer);
    }
    archive.save_to(temporary);
  } catch (const std::exception& e) {
    Fail("cannot write the state file " + temporary + ": " + ErrorText(e));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) Fail("cannot rename " + temporary + " to " + path);
}

// Opens the state at `path` and checks it against this run's settings; a
// file that is not a state, or one written with other settings, is an error
// naming the file (and the first setting that differs).
void OpenState(const std::string& path, const Settings& settings, torch::serialize::InputArchive& archive) {
  const std::string unreadable = path + ": not a readable state file (corrupt or truncated? remove it to start over)";
  c10::IValue format;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    Fail(unreadable + ": " + ErrorText(e));
  }
  if (!archive.try_read("format", format) || !format.isString() || format.toStringRef() != kStateFormat) {
    Fail(unreadable + ": no \"" + std::string(kStateFormat) + "\" format entry");
  }
  for (const auto& [key, value] : settings) {
    c10::IValue saved;
    const std::string was =
        archive.try_read("setting_" + key, saved) && saved.isString() ? saved.toStringRef() : "(none)";
    if (was != value) {
      Fail(path + ": the state was written with " + key + "=" + was + ", this run has " + key + "=" + value +
           "; run with the same settings to resume, or remove the file to start over");
    }
  }
}

// Reads the state's tensors into p and ema (shapes checked against them) and
// returns its step and train_seconds.
std::pair<int64_t, double> ReadStateTensors(const std::string& path, torch::serialize::InputArchive& archive,
                                            Parameters& p, TensorMap& ema) {
  try {
    for (const auto& [prefix, tensors] : StateTensors(p, ema)) {
      for (auto& [name, t] : *tensors) {
        torch::Tensor saved;
        if (!archive.try_read(ArchiveKey(prefix, name), saved)) {
          Fail(path + ": the state has no tensor " + prefix + " " + name);
        }
        if (!saved.sizes().equals(t.sizes())) {
          Fail(path + ": the state's " + prefix + " " + name + " has shape " + ShapeString(saved.sizes().vec()) +
               ", the model's is " + ShapeString(t.sizes().vec()));
        }
        t = saved.detach().clone().requires_grad_(t.requires_grad());
      }
    }
    c10::IValue step, seconds;
    archive.read("step", step);
    archive.read("train_seconds", seconds);
    return {step.toInt(), seconds.toDouble()};
  } catch (const std::exception& e) {
    Fail(path + ": not a readable state file (corrupt or truncated? remove it to start over): " + ErrorText(e));
  }
}

// Loads the optimizers' state (after they were built on p's tensors).
void ReadStateOptimizers(const std::string& path, torch::serialize::InputArchive& archive, torch::optim::Adam& g_adam,
                         torch::optim::Adam& d_adam) {
  try {
    for (const auto& [key, adam] : {std::pair{"g_adam", &g_adam}, std::pair{"d_adam", &d_adam}}) {
      torch::serialize::InputArchive optimizer;
      archive.read(key, optimizer);
      adam->load(optimizer);
    }
  } catch (const std::exception& e) {
    Fail(path + ": the state's optimizers are unreadable (corrupt? remove it to start over): " + ErrorText(e));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // KEY=VALUE arguments: GanConfig's fields, with its defaults.
  std::map<std::string, std::string> args = {
      {"batch", "64"},          {"base_batch", "64"},         {"noise", "64"},
      {"g_channels", "64"},     {"d_channels", "64"},         {"loss", "hinge"},
      {"g_lr", "1e-4"},         {"d_lr", "4e-4"},             {"lr_scaling", "linear"},
      {"warmup_images", "50000"}, {"beta1", "0"},             {"beta2", "0.9"},
      {"eps", "1e-8"},          {"n_critic", "1"},            {"ema_half_life_images", "20000"},
      {"seed", "0"},            {"steps", "1"},               {"samples", "0"},
      {"samples_out", ""},      {"weights", ""},              {"data_dir", "/usr/share/datasets/fashion-mnist"},
      {"print_losses", "0"},    {"state", ""},                {"save_every", "500"}};
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s THREADS KEY=VALUE...\n", argv[0]);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || args.count(arg.substr(0, eq)) == 0) Fail("unknown argument " + arg);
    args[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  auto i64 = [&](const char* key) { return std::atoll(args[key].c_str()); };
  auto f64 = [&](const char* key) { return std::atof(args[key].c_str()); };
  torch::set_num_threads(std::atoi(argv[1]));
  const int64_t batch = i64("batch"), z = i64("noise"), gc = i64("g_channels"), dc = i64("d_channels");
  const int64_t n_critic = i64("n_critic"), steps = i64("steps"), samples = i64("samples");
  const uint64_t seed = std::strtoull(args["seed"].c_str(), nullptr, 10);
  const bool hinge = args["loss"] == "hinge";
  if (args["weights"].empty()) Fail("weights=FILE is required (troupe's initial weights, GanTrainer::ExportWeights)");
  if (samples > 0 && args["samples_out"].empty()) Fail("samples=N needs samples_out=FILE");
  const std::string state_path = args["state"];
  const int64_t save_every = i64("save_every");
  if (save_every < 1) Fail("save_every=" + args["save_every"] + ": want a positive number of steps");

  // troupe's learning rates (GanTrainer::Create / *LearningRate): the config's
  // float rate times the double scale, as a float; warmup (step + 1) / warmup_steps.
  const double ratio = static_cast<double>(batch) / i64("base_batch");
  const double scale = args["lr_scaling"] == "linear" ? ratio : args["lr_scaling"] == "sqrt" ? std::sqrt(ratio) : 1.0;
  const float g_base = static_cast<float>(static_cast<float>(f64("g_lr")) * scale);
  const float d_base = static_cast<float>(static_cast<float>(f64("d_lr")) * scale);
  const int64_t images_per_step = batch * n_critic;
  const int64_t warmup_steps = (i64("warmup_images") + images_per_step - 1) / images_per_step;
  auto learning_rate = [&](float base, int64_t step) -> float {
    if (step < warmup_steps) return base * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    return base;
  };
  // troupe's EMA: decay per step from the half-life in images, capped early by
  // (1 + step) / (10 + step); ema += (1 - decay) * (g - ema) after each G update.
  const int64_t half_life = i64("ema_half_life_images");
  const double ema_decay = half_life > 0 ? std::pow(0.5, static_cast<double>(images_per_step) / half_life) : 0.0;

  uint64_t weights_checksum = 0;
  Parameters p = ImportWeights(args["weights"], z, gc, dc, &weights_checksum);
  std::map<std::string, torch::Tensor> ema;
  for (const auto& [name, t] : p.g) ema[name] = t.detach().clone();
  // A state from an earlier piece of this run replaces the initial weights.
  Settings settings;
  for (const char* key : kStateSettings) settings.emplace_back(key, args[key]);
  char checksum_text[17];
  std::snprintf(checksum_text, sizeof(checksum_text), "%016llx", static_cast<unsigned long long>(weights_checksum));
  settings.emplace_back("weights_checksum", checksum_text);
  torch::serialize::InputArchive state;
  const bool resume = !state_path.empty() && std::ifstream(state_path).good();
  int64_t first_step = 0;
  double earlier_seconds = 0;  // the earlier pieces' training time
  if (resume) {
    OpenState(state_path, settings, state);
    std::tie(first_step, earlier_seconds) = ReadStateTensors(state_path, state, p, ema);
    if (first_step > steps) {
      Fail(state_path + ": the state is at step " + std::to_string(first_step) + ", past this run's steps=" +
           std::to_string(steps));
    }
    std::printf("resumed at step %lld of %lld from %s\n", static_cast<long long>(first_step),
                static_cast<long long>(steps), state_path.c_str());
    std::fflush(stdout);
  }
  ImageStream stream(LoadTrainImages(args["data_dir"]), seed);
  // Adam with troupe's betas and eps (troupe's AdamUpdate is PyTorch's formula:
  // lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)).
  auto adam_options = [&] {
    return torch::optim::AdamOptions(1e-3).betas({f64("beta1"), f64("beta2")}).eps(f64("eps"));
  };
  torch::optim::Adam g_adam(Values(p.g), adam_options());
  torch::optim::Adam d_adam(Values(p.d), adam_options());
  if (resume) ReadStateOptimizers(state_path, state, g_adam, d_adam);
  const bool print_losses = i64("print_losses") != 0;

  const auto start = std::chrono::steady_clock::now();
  auto piece_seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (int64_t step = first_step; step < steps; ++step) {
    // n_critic discriminator updates, each one pass over [real; fake] with one
    // power iteration, the generator (batch statistics) without gradients.
    double d_loss_value = 0;
    for (int64_t c = 0; c < n_critic; ++c) {
      const torch::Tensor real = stream.Batch((step * n_critic + c) * batch, batch);
      torch::Tensor fake;
      {
        torch::NoGradGuard no_grad;
        fake = Generate(p.g, Noise(seed, step * (n_critic + 1) + c, 0, batch, z), gc);
      }
      d_adam.zero_grad();
      const torch::Tensor scores = Discriminate(p, torch::cat({real, fake}), /*iterate=*/true);
      const torch::Tensor real_scores = scores.slice(0, 0, batch), fake_scores = scores.slice(0, batch);
      const torch::Tensor d_loss = hinge ? torch::relu(1 - real_scores).mean() + torch::relu(1 + fake_scores).mean()
                                         : torch::softplus(-real_scores).mean() + torch::softplus(fake_scores).mean();
      d_loss.backward();
      SetLearningRate(d_adam, learning_rate(d_base, step));
      d_adam.step();
      d_loss_value = d_loss.item<double>();
    }
    // One generator update through the discriminator (whose gradients are
    // dropped: d_adam.zero_grad() precedes every use), no power iteration.
    g_adam.zero_grad();
    const torch::Tensor scores =
        Discriminate(p, Generate(p.g, Noise(seed, step * (n_critic + 1) + n_critic, 0, batch, z), gc), false);
    const torch::Tensor g_loss = hinge ? -scores.mean() : torch::softplus(-scores).mean();
    g_loss.backward();
    SetLearningRate(g_adam, learning_rate(g_base, step));
    g_adam.step();
    // The EMA generator.
    if (ema_decay > 0) {
      torch::NoGradGuard no_grad;
      const double decay = std::min(ema_decay, (1.0 + step) / (10.0 + step));
      const float tau = static_cast<float>(1.0 - decay);
      for (auto& [name, t] : ema) t.add_(tau * (p.g[name] - t));
    }
    if (print_losses) std::printf("step %lld d_loss %.9g g_loss %.9g\n", static_cast<long long>(step), d_loss_value,
                                  g_loss.item<double>());
    // Every save_every steps and after the last: progress, and the state.
    const int64_t done = step + 1;
    if (done % save_every == 0 || done == steps) {
      const double seconds = piece_seconds();
      if (!state_path.empty()) SaveState(state_path, settings, p, ema, g_adam, d_adam, done, earlier_seconds + seconds);
      std::printf("step %lld of %lld, images/s %.1f%s\n", static_cast<long long>(done), static_cast<long long>(steps),
                  (done - first_step) * images_per_step / seconds, state_path.empty() ? "" : ", state saved");
      std::fflush(stdout);
    }
  }
  const double seconds = piece_seconds();  // this piece's

  // Samples as troupe's GanTrainer::Generate draws them: the EMA generator
  // (the online one without EMA), noise stream kEvalNoiseStream of seed ^
  // 0x5EED, batch statistics over chunks of 500, mapped to [0, 1].
  if (samples > 0) {
    torch::NoGradGuard no_grad;
    constexpr uint64_t kEvalNoiseStream = 0xE7A1000000000000ull;
    std::map<std::string, torch::Tensor>& weights = ema_decay > 0 ? ema : p.g;
    std::vector<torch::Tensor> chunks;
    for (int64_t begin = 0; begin < samples; begin += 500) {
      const int64_t n = std::min<int64_t>(500, samples - begin);
      const torch::Tensor images = Generate(weights, Noise(seed ^ 0x5EED, kEvalNoiseStream, begin * z, n, z), gc);
      chunks.push_back(0.5f * (images + 1.0f));
    }
    WriteTensor(args["samples_out"], "samples", torch::cat(chunks));
  }
  // train_seconds: over every piece of a resumed run; images/s: this piece's.
  std::printf("train_seconds %.3f\n", earlier_seconds + seconds);
  std::printf("images_per_second %.2f\n", first_step < steps ? (steps - first_step) * images_per_step / seconds : 0.0);
  return 0;
}
