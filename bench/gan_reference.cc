#include "bench/gan_reference.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/peers.h"
#include "common/files.h"
#include "common/fnv1a.h"
#include "common/shell.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"

namespace troupe::bench {

std::string LibtorchGanArguments(const config::GanConfig& c, const GanReferenceOptions& options) {
  auto real = [](double x) { return absl::StrFormat("%.9g", x); };
  const char* scaling = c.lr_scaling() == config::GanConfig::LINEAR ? "linear"
                        : c.lr_scaling() == config::GanConfig::SQRT ? "sqrt"
                                                                     : "none";
  return absl::StrCat(
      "batch=", c.batch_size(), " base_batch=", c.base_batch_size(), " noise=", c.noise_size(),
      " g_channels=", c.generator_channels(), " d_channels=", c.discriminator_channels(),
      " loss=", c.loss() == config::GanConfig::HINGE ? "hinge" : "non_saturating", " g_lr=",
      real(c.generator_learning_rate()), " d_lr=", real(c.discriminator_learning_rate()), " lr_scaling=", scaling,
      " warmup_images=", c.warmup_images(), " beta1=", real(c.adam_beta1()), " beta2=", real(c.adam_beta2()),
      " n_critic=", c.n_critic(), " ema_half_life_images=", c.ema_half_life_images(), " seed=", c.engine().seed(),
      " ", ShellQuote("data_dir=" + c.data_dir()), " ", ShellQuote("weights=" + options.weights),
      " steps=", options.steps, " samples=", options.samples,
      options.samples > 0 ? absl::StrCat(" ", ShellQuote("samples_out=" + options.samples_path)) : "",
      " print_losses=", options.per_step_losses ? 1 : 0,
      options.state_path.empty() ? "" : absl::StrCat(" ", ShellQuote("state=" + options.state_path)),
      " save_every=", options.save_every);
}

absl::StatusOr<GanReferenceRun> RunLibtorchGanReference(const config::GanConfig& config,
                                                         const GanReferenceOptions& options) {
  if (config.optimizer() != config::GanConfig::ADAM) {
    return absl::UnimplementedError("the libtorch reference GAN has gan.optimizer ADAM only");
  }
  ASSIGN_OR_RETURN(const std::string binary, CompileLibtorchPeer("libtorch_gan_reference"));
  GanReferenceOptions o = options;
  if (o.samples > 0 && o.samples_path.empty()) {
    o.samples_path = (std::filesystem::temp_directory_path() / absl::StrCat("troupe_gan_reference_", getpid(), ".ckpt"))
                         .string();
  }
  // The peer's progress lines as they come, to o.progress.
  std::function<void(const std::string&)> on_line;
  if (o.progress) {
    on_line = [&o](const std::string& line) {
      long long step, steps;
      if (line.rfind("resumed at step ", 0) == 0 ||
          std::sscanf(line.c_str(), "step %lld of %lld", &step, &steps) == 2) {
        o.progress(line);
      }
    };
  }
  // The peer's messages go to stderr: keep them with its output for errors.
  ASSIGN_OR_RETURN(const std::string out, RunCommand(absl::StrCat(binary, " ", o.threads, " ",
                                                                  LibtorchGanArguments(config, o), " 2>&1"),
                                                     on_line));
  GanReferenceRun run;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    long long step, steps;
    double d, g;
    if (std::sscanf(line.c_str(), "resumed at step %lld of %lld", &step, &steps) == 2) {
      run.first_step = step;
    } else if (std::sscanf(line.c_str(), "step %lld d_loss %lf g_loss %lf", &step, &d, &g) == 3) {
      run.discriminator_losses.push_back(d);
      run.generator_losses.push_back(g);
    } else {
      std::sscanf(line.c_str(), "train_seconds %lf", &run.train_seconds);
    }
  }
  if (o.per_step_losses && static_cast<int64_t>(run.discriminator_losses.size()) != o.steps - run.first_step) {
    return absl::InternalError(absl::StrCat("the libtorch reference printed ", run.discriminator_losses.size(),
                                            " step losses, not ", o.steps - run.first_step, ": ", out.substr(0, 400)));
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

std::string ReferenceComparisonKey(const config::GanConfig& config, int64_t images, int64_t samples) {
  return absl::StrCat("images=", images, " samples=", samples, " config={", config.ShortDebugString(), "}");
}

std::string ReferenceComparisonDirectory(const std::string& root, int64_t images, const std::string& key) {
  // FNV-1a: stable across runs, builds and machines (std::hash is not promised to be).
  return absl::StrFormat("%s/images%d-%016x", root, images, Fnv1a64(key.data(), key.size()));
}

absl::Status WriteTroupeHalf(const std::string& path, const std::string& key, const TroupeHalf& half) {
  return WriteFileAtomically(
      path, absl::StrFormat("key %s\nimages %d\nfid %.17g\ndiscriminator_loss %.17g\ngenerator_loss %.17g\n"
                            "seconds %.17g\n",
                            key, half.images, half.fid, half.discriminator_loss, half.generator_loss, half.seconds));
}

absl::StatusOr<TroupeHalf> ReadTroupeHalf(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no such file (troupe's half not finished)"));
  // The first line: the key it was written for.
  std::string line;
  if (!std::getline(in, line) || line.rfind("key ", 0) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": the first line is not \"key ...\" (not a troupe result file?)"));
  }
  if (line.substr(4) != key) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written for another comparison (", line.substr(4),
                                                      "), not for this one (", key, "); not reused"));
  }
  // Then one "name value" a line.
  std::map<std::string, std::string> values;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space != std::string::npos) values[line.substr(0, space)] = line.substr(space + 1);
  }
  TroupeHalf half;
  auto number = [&](const char* name, auto* into) -> absl::Status {
    auto it = values.find(name);
    bool parsed = false;
    if (it != values.end()) {
      if constexpr (std::is_same_v<decltype(into), int64_t*>) {
        parsed = absl::SimpleAtoi(it->second, into);
      } else {
        parsed = absl::SimpleAtod(it->second, into);
      }
    }
    return parsed ? absl::OkStatus()
                  : absl::DataLossError(absl::StrCat(path, ": no readable \"", name, " NUMBER\" line (truncated?)"));
  };
  RETURN_IF_ERROR(number("images", &half.images));
  RETURN_IF_ERROR(number("fid", &half.fid));
  RETURN_IF_ERROR(number("discriminator_loss", &half.discriminator_loss));
  RETURN_IF_ERROR(number("generator_loss", &half.generator_loss));
  RETURN_IF_ERROR(number("seconds", &half.seconds));
  return half;
}

absl::Status SaveTroupeCheckpoint(const gan::GanTrainer& trainer, const std::string& dir, double seconds) {
  return trainer.SaveCheckpoint(dir, {{"seconds.txt", absl::StrFormat("%.17g\n", seconds)}});
}

absl::StatusOr<double> LoadTroupeCheckpoint(gan::GanTrainer& trainer, const std::string& dir) {
  absl::StatusOr<std::string> from = trainer.LoadCheckpoint(dir);
  if (absl::IsNotFound(from.status())) return from.status();
  if (!from.ok()) {
    return absl::Status(from.status().code(), absl::StrCat(from.status().message(), " (remove ", dir,
                                                           " to train troupe's half from the start)"));
  }
  double seconds = 0;
  if (!(std::ifstream(*from + "/seconds.txt") >> seconds)) {
    return absl::DataLossError(
        absl::StrCat(*from, "/seconds.txt: no number (remove ", dir, " to train troupe's half from the start)"));
  }
  return seconds;
}

}  // namespace troupe::bench
