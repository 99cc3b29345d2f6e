#include "bench/gan_reference.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/peers.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"

namespace troupe::bench {

namespace {

// `text` single-quoted for the shell (paths with spaces or quotes).
std::string ShellQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char ch : text) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

}  // namespace

std::string LibtorchGanArguments(const config::GanConfig& c, const GanReferenceOptions& options) {
  auto real = [](double x) { return absl::StrFormat("%.9g", x); };
  const char* scaling = c.lr_scaling() == config::GanConfig::LINEAR ? "linear"
                        : c.lr_scaling() == config::GanConfig::SQRT ? "sqrt"
                                                                     : "none";
  return absl::StrCat(
      "train batch=", c.batch_size(), " base_batch=", c.base_batch_size(), " noise=", c.noise_size(),
      " g_channels=", c.generator_channels(), " d_channels=", c.discriminator_channels(),
      " loss=", c.loss() == config::GanConfig::HINGE ? "hinge" : "non_saturating", " g_lr=",
      real(c.generator_learning_rate()), " d_lr=", real(c.discriminator_learning_rate()), " lr_scaling=", scaling,
      " warmup_images=", c.warmup_images(), " beta1=", real(c.adam_beta1()), " beta2=", real(c.adam_beta2()),
      " n_critic=", c.n_critic(), " ema_half_life_images=", c.ema_half_life_images(), " seed=", c.engine().seed(),
      " ", ShellQuoted("data_dir=" + c.data_dir()), " ", ShellQuoted("weights=" + options.weights),
      " steps=", options.steps, " samples=", options.samples,
      options.samples > 0 ? absl::StrCat(" ", ShellQuoted("samples_out=" + options.samples_path)) : "",
      " print_losses=", options.per_step_losses ? 1 : 0);
}

absl::StatusOr<GanReferenceRun> RunLibtorchGanReference(const config::GanConfig& config,
                                                         const GanReferenceOptions& options) {
  if (config.optimizer() != config::GanConfig::ADAM) {
    return absl::UnimplementedError("the libtorch reference GAN has gan.optimizer ADAM only");
  }
  ASSIGN_OR_RETURN(const std::string binary, CompileLibtorchPeer("libtorch_gan"));
  GanReferenceOptions o = options;
  if (o.samples > 0 && o.samples_path.empty()) {
    o.samples_path = (std::filesystem::temp_directory_path() / absl::StrCat("troupe_gan_reference_", getpid(), ".ckpt"))
                         .string();
  }
  // The peer's messages go to stderr: keep them with its output for errors.
  ASSIGN_OR_RETURN(const std::string out,
                   RunCommand(absl::StrCat(binary, " ", o.threads, " ", LibtorchGanArguments(config, o), " 2>&1")));
  GanReferenceRun run;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    long long step;
    double d, g;
    if (std::sscanf(line.c_str(), "step %lld d_loss %lf g_loss %lf", &step, &d, &g) == 3) {
      run.discriminator_losses.push_back(d);
      run.generator_losses.push_back(g);
    } else {
      std::sscanf(line.c_str(), "train_seconds %lf", &run.train_seconds);
    }
  }
  if (o.per_step_losses && static_cast<int64_t>(run.discriminator_losses.size()) != o.steps) {
    return absl::InternalError(absl::StrCat("the libtorch reference printed ", run.discriminator_losses.size(),
                                            " step losses, not ", o.steps, ": ", out.substr(0, 400)));
  }
  if (o.samples > 0) {
    absl::StatusOr<std::vector<float>> samples = ReadGanSamples(o.samples_path);
    if (options.samples_path.empty()) std::filesystem::remove(o.samples_path);
    if (!samples.ok()) return samples.status();
    if (static_cast<int64_t>(samples->size()) != o.samples * 784) {
      return absl::InternalError(absl::StrCat(o.samples_path, ": ", samples->size() / 784, " samples, asked for ",
                                              o.samples));
    }
    run.samples = *std::move(samples);
  }
  return run;
}

absl::StatusOr<std::vector<float>> ReadGanSamples(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<nn::CheckpointTensor> tensors, nn::ReadCheckpoint(path));
  if (tensors.size() != 1 || tensors[0].name != "samples" || tensors[0].shape.rank() != 4 ||
      tensors[0].shape[1] != 1 || tensors[0].shape[2] != 28 || tensors[0].shape[3] != 28) {
    const std::string what = tensors.empty() ? "no tensor"
                                             : absl::StrCat(tensors.size(), " tensor(s), the first \"",
                                                            tensors[0].name, "\" of shape ",
                                                            tensors[0].shape.ToString());
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds ", what, "; a samples file holds one tensor \"samples\" [N, 1, 28, 28]"));
  }
  return std::move(tensors[0].values);
}

}  // namespace troupe::bench
