#include "gan/trainer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <span>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/schedule.h"
#include "engine/replicator/sharded_adam.h"
#include "engine/replicator/sharded_parameters.h"

namespace troupe::gan {

struct GanTrainer::Replica {
  int global_id = 0;
  int part = 0, copy = 0;  // its part of the generator and the model copy it belongs to (model_parallel)
  std::shared_ptr<nn::Backend> backend;  // this replica's device (from the Replicator)
  nn::ParameterSet g, d, d_power;
  // The EMA generator, on this replica's device: the same on every replica
  // (their generators are), so the step is the same program on all of them
  // (K replicas in one compiled program). Replica 0's evaluates and saves.
  nn::ParameterSet ema;
  // gan.optimizer (Adam by default); with engine.shard_state OPTIMIZER,
  // replicator::ShardedAdam (each replica keeps 1/K of the moments, and
  // reduces the gradients itself).
  std::unique_ptr<nn::Optimizer> g_adam, d_adam;
  replicator::ShardedAdam* g_sharded = nullptr;  // g_adam's, when sharded
  replicator::ShardedAdam* d_sharded = nullptr;
  // engine.shard_state PARAMETERS: this replica's parts of the generator,
  // the discriminator and the EMA (the sets above hold whole buffers only
  // during a step; the power vectors stay whole, a few floats).
  std::unique_ptr<replicator::ShardedParameters> g_part, d_part, ema_part;
  std::unique_ptr<nn::Tape> tape;
  std::unique_ptr<ShardSampler> sampler;
  std::vector<float> real;   // [n_critic][shard, 1, 28, 28]
  std::vector<float> noise;  // [n_critic + 1][shard, noise]
  nn::DeviceBuffer ones;     // [shard, 1] on the device
  nn::DeviceBuffer losses;   // the step's last D loss and its G loss, read at the step's end
  int64_t step = 0;          // this replica's step counter
  double d_loss = 0, g_loss = 0;
};

// The whole generator on the host, while a checkpoint, an evaluation or an
// export needs it (model_parallel), and with the parameters split
// (shard_state PARAMETERS) the whole discriminator too.
struct GanTrainer::WholeGenerator {
  nn::CpuBackend backend{std::max(1, static_cast<int>(std::thread::hardware_concurrency()))};
  nn::ParameterSet g, ema;
  std::unique_ptr<nn::Optimizer> adam;
  nn::ParameterSet d;  // shard_state PARAMETERS only
  std::unique_ptr<nn::Optimizer> d_adam;
};

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("gan.", field, ": ", what));
}

}  // namespace

void FillNoise(uint64_t seed, uint64_t stream, int64_t first_index, int64_t count, float* out) {
  // Box-Muller on a uniform pair hashed from (seed, stream, absolute index / 2):
  // even indices take the cosine, odd the sine, so any split gives the same values.
  const uint64_t key = SplitMix64(SplitMix64(seed) ^ (stream * 0xD6E8FEB86659FD93ull));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = first_index + i;
    const uint64_t h1 = SplitMix64(key ^ static_cast<uint64_t>(e / 2));
    const uint64_t h2 = SplitMix64(h1 + 0x632BE59BD9B4E019ull);
    const double u1 = (static_cast<double>(h1 >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    const double u2 = static_cast<double>(h2 >> 11) / 9007199254740992.0;          // [0, 1)
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    out[i] = static_cast<float>(radius * (e % 2 == 0 ? std::cos(angle) : std::sin(angle)));
  }
}

absl::Status ValidateGanConfig(const config::GanConfig& c) {
  RETURN_IF_ERROR(engine::ValidateEngineConfig(c.engine(), "gan", c.batch_size()));
  if (c.engine().straggler() != config::EngineConfig::WAIT) {
    return FieldError("engine.straggler", absl::StrCat(config::EngineConfig::Straggler_Name(c.engine().straggler()),
                                                       ": the GAN's steps wait for every replica (a deadline is the RL learner's only so far)"));
  }
  const config::EngineConfig::ShardState shard_state = c.engine().shard_state();
  const std::string state_name = config::EngineConfig::ShardState_Name(shard_state);
  if (shard_state != config::EngineConfig::NONE && c.optimizer() != config::GanConfig::ADAM) {
    return FieldError("engine.shard_state",
                      absl::StrCat(state_name, " with optimizer ", config::GanConfig::Optimizer_Name(c.optimizer()),
                                   ": the split optimizer is Adam's (LAMB's and LARS's trust ratios are norms over "
                                   "whole tensors)"));
  }
  auto in_range = [](int64_t value, int64_t low, int64_t high) {
    return absl::StrCat(value, ": must be in [", low, ", ", high, "]");
  };
  if (c.batch_size() > kMaxGanBatchSize) return FieldError("batch_size", in_range(c.batch_size(), 1, kMaxGanBatchSize));
  if (c.total_images() < 1) return FieldError("total_images", "must be positive");
  if (c.noise_size() < 1 || c.noise_size() > kMaxGanWidth) {
    return FieldError("noise_size", in_range(c.noise_size(), 1, kMaxGanWidth));
  }
  if (c.generator_channels() < 1 || c.generator_channels() > kMaxGanChannels) {
    return FieldError("generator_channels", in_range(c.generator_channels(), 1, kMaxGanChannels));
  }
  if (c.discriminator_channels() < 1 || c.discriminator_channels() > kMaxGanChannels) {
    return FieldError("discriminator_channels", in_range(c.discriminator_channels(), 1, kMaxGanChannels));
  }
  if (const int m = c.engine().model_parallel(); m > 1) {
    if (c.optimizer() != config::GanConfig::ADAM) {
      return FieldError("optimizer", absl::StrCat(config::GanConfig::Optimizer_Name(c.optimizer()),
                                                  " with engine.model_parallel ", m,
                                                  ": its trust ratio is a norm over each whole tensor, which the "
                                                  "generator's parts do not hold (ADAM splits)"));
    }
    if ((2 * c.generator_channels()) % m != 0) {
      return FieldError("engine.model_parallel",
                        absl::StrCat(m, ": the generator's ", 2 * c.generator_channels(),
                                     " projected channels (2 x generator_channels) do not split into ", m, " parts"));
    }
  }
  if (!(c.generator_learning_rate() > 0) || std::isinf(c.generator_learning_rate())) {
    return FieldError("generator_learning_rate", "must be positive and finite");
  }
  if (!(c.discriminator_learning_rate() > 0) || std::isinf(c.discriminator_learning_rate())) {
    return FieldError("discriminator_learning_rate", "must be positive and finite");
  }
  if (c.base_batch_size() < 1 || c.base_batch_size() > kMaxGanBatchSize) {
    return FieldError("base_batch_size", in_range(c.base_batch_size(), 1, kMaxGanBatchSize));
  }
  if (c.warmup_images() < 0) return FieldError("warmup_images", "must be >= 0");
  if (!(c.adam_beta1() >= 0 && c.adam_beta1() < 1)) return FieldError("adam_beta1", "must be in [0, 1)");
  if (!(c.adam_beta2() >= 0 && c.adam_beta2() < 1)) return FieldError("adam_beta2", "must be in [0, 1)");
  if (c.n_critic() < 1 || c.n_critic() > kMaxGanCriticSteps) {
    return FieldError("n_critic", in_range(c.n_critic(), 1, kMaxGanCriticSteps));
  }
  if (c.ema_half_life_images() < 0) return FieldError("ema_half_life_images", "must be >= 0 (0 = no EMA)");
  if (c.eval_every_images() < 1) return FieldError("eval_every_images", "must be positive");
  if (c.eval_samples() < 2 || c.eval_samples() > kMaxGanEvalSamples) {
    return FieldError("eval_samples",
                      in_range(c.eval_samples(), 2, kMaxGanEvalSamples) + " (a covariance needs two samples)");
  }
  if (c.checkpoint_every_s() < 1) return FieldError("checkpoint_every_s", "must be >= 1");
  if (c.keep_checkpoints() < 1 || c.keep_checkpoints() > kMaxKeptGenerations) {
    return FieldError("keep_checkpoints", in_range(c.keep_checkpoints(), 1, kMaxKeptGenerations) +
                                              " (checkpoints kept, the newest first)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GanTrainer>> GanTrainer::Create(const config::GanConfig& config, const GanData* data) {
  RETURN_IF_ERROR(ValidateGanConfig(config));
  std::unique_ptr<GanTrainer> t(new GanTrainer());
  t->config_ = config;
  t->data_ = data;
  ASSIGN_OR_RETURN(t->replicator_, engine::MakeReplicator(config.engine()));
  const int k = t->replicator_->num_replicas();
  if (config.batch_size() % k != 0) {
    return FieldError("batch_size", absl::StrCat(config.batch_size(), " is not divisible by the ", k, " replicas"));
  }
  // M parts of each of K/M generators; the batch split over the copies.
  const int m = t->model_parallel_ = t->replicator_->model_parallel();
  const int copies = k / m;
  const uint64_t seed = config.engine().seed();
  const bool sharded = config.engine().shard_state() != config::EngineConfig::NONE;
  const bool split = t->split_parameters_ = config.engine().shard_state() == config::EngineConfig::PARAMETERS;
  // Sharded, the networks' buffers split into K equal parts.
  const int64_t pad = sharded ? replicator::ShardedAdam::PadMultiple(k) : 1;
  replicator::ShardedAdamOptions sharded_options;
  sharded_options.adam.beta1 = config.adam_beta1();
  sharded_options.adam.beta2 = config.adam_beta2();
  auto make_optimizer = [&](nn::ParameterSet* params, nn::Backend* device) -> std::unique_ptr<nn::Optimizer> {
    switch (config.optimizer()) {
      case config::GanConfig::LAMB:
        return std::make_unique<nn::Lamb>(params, device, nn::LambOptions{config.adam_beta1(), config.adam_beta2()});
      case config::GanConfig::LARS:
        return std::make_unique<nn::Lars>(params, device, nn::LarsOptions{});
      case config::GanConfig::ADAM:
        break;
    }
    nn::AdamOptions adam;
    adam.beta1 = config.adam_beta1();
    adam.beta2 = config.adam_beta2();
    return std::make_unique<nn::Adam>(params, device, adam);
  };
  if (m > 1 || split) {
    // The whole generator as one replica would start it; each part takes its
    // share of it below (ScatterGenerator). Split parameters gather into it
    // (and into the whole discriminator) from the replicas' parts.
    t->whole_ = std::make_unique<WholeGenerator>();
    WholeGenerator& w = *t->whole_;
    t->whole_generator_ = std::make_unique<Generator>(w.g, config.noise_size(), config.generator_channels());
    Generator ema_layout(w.ema, config.noise_size(), config.generator_channels());
    w.g.Allocate(w.backend, seed * 3 + 1);
    w.ema.Allocate(w.backend, seed * 3 + 1, 1, /*gradients=*/false);
    RETURN_IF_ERROR(w.ema.CopyValuesFrom(w.g));
    w.adam = make_optimizer(&w.g, &w.backend);
    if (split) {
      nn::ParameterSet power_vectors;  // (declared only: every replica keeps them whole)
      Discriminator d_layout(w.d, power_vectors, config.discriminator_channels());
      w.d.Allocate(w.backend, seed * 3 + 2);
      w.d_adam = make_optimizer(&w.d, &w.backend);
    }
  }
  // Every replica: the same initial values (one seed), its own optimizers, tape and shard.
  for (int id : t->replicator_->local_replicas()) {
    auto r = std::make_unique<Replica>();
    r->global_id = id;
    r->part = id % m;
    r->copy = id / m;
    r->backend = t->replicator_->backend(static_cast<int>(t->replicas_.size()));
    nn::Backend& device = *r->backend;
    auto generator = std::make_unique<Generator>(r->g, config.noise_size(), config.generator_channels(), m);
    auto discriminator = std::make_unique<Discriminator>(r->d, r->d_power, config.discriminator_channels());
    r->g.Allocate(device, seed * 3 + 1, pad);
    r->d.Allocate(device, seed * 3 + 2, pad);
    r->d_power.Allocate(device, seed * 3 + 3);
    if (split) {
      // (Split below, once the EMA has been copied from the whole generator.)
    } else if (sharded) {
      ASSIGN_OR_RETURN(std::unique_ptr<replicator::ShardedAdam> g,
                       replicator::ShardedAdam::Create(&r->g, id, k, sharded_options));
      ASSIGN_OR_RETURN(std::unique_ptr<replicator::ShardedAdam> d,
                       replicator::ShardedAdam::Create(&r->d, id, k, sharded_options));
      r->g_sharded = g.get();
      r->d_sharded = d.get();
      r->g_adam = std::move(g);
      r->d_adam = std::move(d);
    } else {
      r->g_adam = make_optimizer(&r->g, &device);
      r->d_adam = make_optimizer(&r->d, &device);
    }
    r->tape = std::make_unique<nn::Tape>(&device);
    r->sampler = std::make_unique<ShardSampler>(data, seed, config.batch_size(), r->copy, copies);
    const int64_t shard = config.batch_size() / copies;
    r->real.resize(config.n_critic() * shard * kPixels);
    r->noise.resize((config.n_critic() + 1) * shard * config.noise_size());
    r->ones = nn::DeviceBuffer(device, shard);
    device.Fill(r->ones.data(), shard, 1.0f);
    r->losses = nn::DeviceBuffer(device, 2);
    device.Fill(r->losses.data(), 2, 0.0f);
    if (t->generator_ == nullptr) {
      t->generator_ = std::move(generator);
      t->discriminator_ = std::move(discriminator);
    }
    t->replicas_.push_back(std::move(r));
  }
  // The EMA generator starts as a copy of the generator, on every replica.
  for (auto& r : t->replicas_) {
    Generator ema_layout(r->ema, config.noise_size(), config.generator_channels(), m);
    r->ema.Allocate(*r->backend, seed * 3 + 1, pad, /*gradients=*/false);  // an average, never differentiated
    RETURN_IF_ERROR(r->ema.CopyValuesFrom(r->g));
    if (split) {
      // Each replica keeps its 1/K of the three networks (the whole buffers
      // released) and Adam steps that part: ZeRO stage 3.
      const int id = r->global_id;
      ASSIGN_OR_RETURN(r->g_part, replicator::ShardedParameters::Create(&r->g, id, k));
      ASSIGN_OR_RETURN(r->d_part, replicator::ShardedParameters::Create(&r->d, id, k));
      ASSIGN_OR_RETURN(r->ema_part, replicator::ShardedParameters::Create(&r->ema, id, k));
      ASSIGN_OR_RETURN(std::unique_ptr<replicator::ShardedAdam> g,
                       replicator::ShardedAdam::CreateForParameters(r->g_part.get(), id, k, sharded_options));
      ASSIGN_OR_RETURN(std::unique_ptr<replicator::ShardedAdam> d,
                       replicator::ShardedAdam::CreateForParameters(r->d_part.get(), id, k, sharded_options));
      g->set_gather_values(false);  // the generator's step is its last use in a step: released, unread
      r->g_sharded = g.get();
      r->d_sharded = d.get();
      r->g_adam = std::move(g);
      r->d_adam = std::move(d);
    }
  }
  if (m > 1) t->ScatterGenerator();
  // Learning-rate scaling, warmup and EMA decay per step.
  const double ratio = static_cast<double>(config.batch_size()) / config.base_batch_size();
  switch (config.lr_scaling()) {
    case config::GanConfig::LINEAR: t->lr_scale_ = ratio; break;
    case config::GanConfig::SQRT: t->lr_scale_ = std::sqrt(ratio); break;
    case config::GanConfig::NONE: t->lr_scale_ = 1.0; break;
  }
  const int64_t images_per_step = int64_t{config.batch_size()} * config.n_critic();
  t->warmup_steps_ = (config.warmup_images() + images_per_step - 1) / images_per_step;
  t->ema_decay_ = config.ema_half_life_images() > 0
                      ? std::pow(0.5, static_cast<double>(images_per_step) / config.ema_half_life_images())
                      : 0.0;
  return t;
}

GanTrainer::~GanTrainer() = default;

nn::ParameterSet& GanTrainer::generator_parameters(int r) { return replicas_[r]->g; }
nn::ParameterSet& GanTrainer::discriminator_parameters(int r) { return replicas_[r]->d; }
nn::ParameterSet& GanTrainer::generator_ema() { return replicas_[0]->ema; }
namespace {
// The floats of a set's parameters (without the buffers' alignment padding).
int64_t ParameterFloats(const nn::ParameterSet& set) {
  int64_t floats = 0;
  for (const nn::ParameterInfo& info : set.infos()) floats += info.shape.size();
  return floats;
}
}  // namespace

int64_t GanTrainer::generator_floats_per_replica() const { return ParameterFloats(replicas_[0]->g); }
int64_t GanTrainer::generator_floats() const { return ParameterFloats(whole_ ? whole_->g : replicas_[0]->g); }

int64_t GanTrainer::parameter_state_bytes() const {
  const Replica& r = *replicas_[0];
  int64_t floats = r.d_power.padded_floats();
  if (r.g_part != nullptr) {
    int64_t bytes = 0;
    for (const auto* part : {r.g_part.get(), r.d_part.get(), r.ema_part.get()}) bytes += part->part_bytes();
    return bytes + int64_t{sizeof(float)} * floats;
  }
  floats += 2 * (r.g.padded_floats() + r.d.padded_floats()) + r.ema.padded_floats();
  return int64_t{sizeof(float)} * floats;
}

size_t GanTrainer::peak_device_memory() const {
  size_t peak = 0;
  for (const auto& r : replicas_) peak = std::max(peak, r->backend->peak_memory());
  return peak;
}

int64_t GanTrainer::optimizer_state_bytes() const {
  const Replica& r = *replicas_[0];
  if (r.g_sharded != nullptr) return r.g_sharded->state_bytes() + r.d_sharded->state_bytes();
  int64_t floats = 0;
  for (nn::Optimizer* o : {r.g_adam.get(), r.d_adam.get()}) {
    floats += static_cast<int64_t>(o->State().size()) * o->parameters().total_floats();
  }
  return int64_t{sizeof(float)} * floats;
}

namespace {
// A generator's buffers whose parts the whole one's gather and scatter: its
// values, its EMA's, and each of its optimizer's states (Adam's moments).
std::vector<float*> GeneratorBuffers(const nn::ParameterSet& g, const nn::ParameterSet& ema, nn::Optimizer& adam) {
  std::vector<float*> buffers = {g.device_values(), ema.device_values()};
  for (const nn::OptimizerState& s : adam.State()) buffers.push_back(s.data);
  return buffers;
}
std::vector<float> DownloadBuffer(nn::Backend& backend, const float* data, int64_t floats) {
  std::vector<float> host(floats);
  backend.Download(data, host.data(), sizeof(float) * floats);
  return host;
}
}  // namespace

void GanTrainer::GatherGenerator(int copy) const {
  if (split_parameters_) {
    GatherSplitParameters();
    return;
  }
  WholeGenerator& w = *whole_;
  const std::vector<float*> whole = GeneratorBuffers(w.g, w.ema, *w.adam);
  // Part p's buffer b on the host: downloaded from local replica copy x M +
  // p, or over MPI ranks what PrepareCheckpoint gathered of this rank's copy.
  const bool across = state_split_across_processes();
  TROUPE_CHECK(!across || !generator_parts_on_host_.empty());  // PrepareCheckpoint first, on every rank
  const Replica& layout = *replicas_[across ? 0 : copy * model_parallel_];
  auto part_buffer = [&](int p, size_t b) {
    if (across) return generator_parts_on_host_[p][b];
    Replica& r = *replicas_[copy * model_parallel_ + p];
    TROUPE_CHECK(r.part == p && r.copy == copy);
    return DownloadBuffer(*r.backend, GeneratorBuffers(r.g, r.ema, *r.g_adam)[b], r.g.total_floats());
  };
  for (size_t b = 0; b < whole.size(); ++b) {
    std::vector<float> host = DownloadBuffer(w.backend, whole[b], w.g.total_floats());
    for (int p = 0; p < model_parallel_; ++p) {
      std::vector<float> part = part_buffer(p, b);
      generator_->CopyPart(w.g, host, layout.g, part, p, /*to_whole=*/true);
    }
    w.backend.Upload(host.data(), whole[b], sizeof(float) * host.size());
  }
  w.adam->set_steps(layout.g_adam->steps());
}

void GanTrainer::ScatterGenerator() {
  WholeGenerator& w = *whole_;
  const std::vector<float*> whole = GeneratorBuffers(w.g, w.ema, *w.adam);
  std::vector<std::vector<float*>> parts;  // local replica k's buffers
  for (auto& r : replicas_) parts.push_back(GeneratorBuffers(r->g, r->ema, *r->g_adam));
  for (size_t b = 0; b < whole.size(); ++b) {
    std::vector<float> host = DownloadBuffer(w.backend, whole[b], w.g.total_floats());
    for (size_t k = 0; k < replicas_.size(); ++k) {
      Replica& r = *replicas_[k];
      std::vector<float> part(r.g.total_floats());
      generator_->CopyPart(w.g, host, r.g, part, r.part, /*to_whole=*/false);
      r.backend->Upload(part.data(), parts[k][b], sizeof(float) * part.size());
    }
  }
  for (auto& r : replicas_) r->g_adam->set_steps(w.adam->steps());
}

namespace {
// shard_state PARAMETERS: each split network's part in a Replica and its
// whole set on the host, and each split Adam's with the host's whole one.
template <typename Replica, typename Whole>
auto SplitNetworks(Whole& w) {
  return std::array{std::pair{&Replica::g_part, &w.g}, std::pair{&Replica::d_part, &w.d},
                    std::pair{&Replica::ema_part, &w.ema}};
}
template <typename Replica, typename Whole>
auto SplitOptimizers(Whole& w) {
  return std::array{std::pair{&Replica::g_sharded, w.adam.get()}, std::pair{&Replica::d_sharded, w.d_adam.get()}};
}
}  // namespace

void GanTrainer::GatherSplitParameters() const {
  WholeGenerator& w = *whole_;
  // Over MPI ranks, what PrepareCheckpoint gathered; in this process, from
  // every replica's part.
  const bool across = state_split_across_processes();
  TROUPE_CHECK(!across || !split_on_host_.values.empty());  // PrepareCheckpoint first, on every rank
  // Each network's values, assembled on the host.
  size_t i = 0;
  for (const auto& [part, whole] : SplitNetworks<Replica>(w)) {
    std::vector<float> gathered;
    if (!across) {
      std::vector<const replicator::ShardedParameters*> parts;
      for (const auto& r : replicas_) parts.push_back(((*r).*part).get());
      TROUPE_CHECK(replicator::ShardedParameters::GatherLocalToHost(parts, &gathered).ok());  // all K here
    }
    // (The padded length: the set's own floats are its first.)
    const std::vector<float>& values = across ? split_on_host_.values[i++] : gathered;
    TROUPE_CHECK(whole->UploadValues(std::span(values).first(whole->total_floats())).ok());
  }
  // Adam's moments and step count.
  i = 0;
  for (const auto& [sharded, adam] : SplitOptimizers<Replica>(w)) {
    std::vector<std::vector<float>> gathered;
    if (!across) {
      std::vector<replicator::ShardedAdam*> parts;
      for (const auto& r : replicas_) parts.push_back((*r).*sharded);
      TROUPE_CHECK(replicator::ShardedAdam::GatherLocalToHost(parts, &gathered).ok());
    }
    const std::vector<std::vector<float>>& moments = across ? split_on_host_.moments[i++] : gathered;
    const std::vector<nn::OptimizerState> state = adam->State();
    TROUPE_CHECK(state.size() == moments.size());
    for (size_t m = 0; m < state.size(); ++m) {
      w.backend.Upload(moments[m].data(), state[m].data, sizeof(float) * adam->parameters().total_floats());
    }
    adam->set_steps(((*replicas_[0]).*sharded)->steps());  // every replica's count
  }
}

void GanTrainer::ScatterSplitParameters() {
  WholeGenerator& w = *whole_;
  for (const auto& [part, whole] : SplitNetworks<Replica>(w)) {
    std::vector<float> values = whole->DownloadValues();
    values.resize(((*replicas_[0]).*part)->set().padded_floats(), 0.0f);  // the padding the parts split
    for (auto& r : replicas_) ((*r).*part)->SetPartFromHost(values);
  }
  for (const auto& [sharded, adam] : SplitOptimizers<Replica>(w)) {
    const int64_t padded = ((*replicas_[0]).*sharded)->parameters().padded_floats();  // the padding the parts split
    std::vector<std::vector<float>> moments;
    for (const nn::OptimizerState& state : adam->State()) {
      std::vector<float>& host = moments.emplace_back(padded, 0.0f);
      w.backend.Download(state.data, host.data(), sizeof(float) * adam->parameters().total_floats());
    }
    for (auto& r : replicas_) {
      ((*r).*sharded)->KeepOwnPartFromHost(moments);
      ((*r).*sharded)->set_steps(adam->steps());
    }
  }
}

int GanTrainer::num_replicas() const { return replicator_->num_replicas(); }

bool GanTrainer::is_chief() const { return replicator_->local_replicas().front() == 0; }

float GanTrainer::GeneratorLearningRate(int64_t step) const {
  nn::ScheduleOptions s;
  s.base_lr = static_cast<float>(config_.generator_learning_rate() * lr_scale_);
  s.warmup_steps = warmup_steps_;
  return nn::LearningRate(s, step);
}

float GanTrainer::DiscriminatorLearningRate(int64_t step) const {
  nn::ScheduleOptions s;
  s.base_lr = static_cast<float>(config_.discriminator_learning_rate() * lr_scale_);
  s.warmup_steps = warmup_steps_;
  return nn::LearningRate(s, step);
}

absl::Status GanTrainer::Train(int64_t steps) {
  if (moments_gathered_) {
    moments_gathered_ = false;
    for (int r = 0; r < num_local_replicas(); ++r) ReleaseMoments(r);
  }
  generator_parts_on_host_.clear();
  split_on_host_ = {};
  for (auto& r : replicas_) r->step = steps_;
  // input_fn: this replica's shard of n_critic real batches and of the noise.
  std::function<absl::StatusOr<Replica*>(replicator::ReplicaContext&)> input_fn =
      [&](replicator::ReplicaContext& ctx) -> absl::StatusOr<Replica*> {
    Replica& r = *replicas_[ctx.local_index()];
    const int64_t shard = r.sampler->shard();
    const int n_critic = config_.n_critic();
    const int64_t z = config_.noise_size();
    for (int c = 0; c < n_critic; ++c) {
      r.sampler->Fill((r.step * n_critic + c) * config_.batch_size(), r.real.data() + c * shard * kPixels);
    }
    for (int c = 0; c <= n_critic; ++c) {
      FillNoise(config_.engine().seed(), static_cast<uint64_t>(r.step * (n_critic + 1) + c), r.copy * shard * z,
                shard * z, r.noise.data() + c * shard * z);
    }
    return &r;
  };
  std::function<absl::Status(replicator::ReplicaContext&, Replica*&)> step_fn =
      [&](replicator::ReplicaContext& ctx, Replica*& r) { return Step(ctx, *r); };
  RETURN_IF_ERROR(replicator_->Run<Replica*>(steps, input_fn, step_fn));
  steps_ += steps;
  d_loss_ = replicas_[0]->d_loss;
  g_loss_ = replicas_[0]->g_loss;
  return absl::OkStatus();
}

absl::Status GanTrainer::Step(replicator::ReplicaContext& ctx, Replica& r) {
  const int64_t shard = r.sampler->shard();
  const int64_t z = config_.noise_size();
  const bool hinge = config_.loss() == config::GanConfig::HINGE;
  // The batch is split over the model copies (the data axis; every replica
  // without model_parallel), a generator over its parts (the model axis).
  replicator::ReplicaContext& copies = ctx.data_axis();
  nn::CrossReplicaSum* cross = copies.num_replicas() > 1 ? &copies : nullptr;
  nn::CrossReplicaSum* model = model_parallel_ > 1 ? &ctx.model_axis() : nullptr;
  // A sharded optimizer reduces the gradients itself.
  replicator::ReplicatedOptimizer d_replicated(r.d_adam.get(), &copies), g_replicated(r.g_adam.get(), &copies);
  if (r.g_sharded != nullptr) {
    RETURN_IF_ERROR(r.g_sharded->set_context(&ctx));
    RETURN_IF_ERROR(r.d_sharded->set_context(&ctx));
  }
  nn::Optimizer& d_optimizer = r.d_sharded != nullptr ? static_cast<nn::Optimizer&>(*r.d_sharded) : d_replicated;
  nn::Optimizer& g_optimizer = r.g_sharded != nullptr ? static_cast<nn::Optimizer&>(*r.g_sharded) : g_replicated;
  // Split parameters: both networks whole for the step, gathered from every
  // replica's part (the discriminator's gathered again after each of its
  // updates by its ShardedAdam), and freed at its end.
  absl::Cleanup release = [&r] {
    if (r.g_part == nullptr) return;
    r.g_part->Release();
    r.d_part->Release();
  };
  if (r.g_part != nullptr) {
    RETURN_IF_ERROR(r.g_part->Gather(ctx));
    RETURN_IF_ERROR(r.d_part->Gather(ctx));
  }
  nn::Tape& tape = *r.tape;
  nn::Backend& device = *r.backend;
  // One step on the device (nn::Backend's step contract): the host reads
  // nothing until step.End(); the losses are kept on the device meanwhile.
  nn::StepScope step(device);
  // n_critic discriminator updates on real and generated shards.
  for (int c = 0; c < config_.n_critic(); ++c) {
    tape.Reset();
    r.d.ZeroGrad();
    nn::Var noise = tape.Input(r.noise.data() + c * shard * z, {shard, z});
    nn::Var fake = generator_->Forward(tape, r.g, noise, /*trainable=*/false, cross, model);
    nn::Var real = tape.Input(r.real.data() + c * shard * kPixels, {shard, 1, kImageSize, kImageSize});
    // One discriminator pass over [real; fake] (one power iteration per update).
    const nn::Var both_parts[] = {real, fake};
    nn::Var scores = discriminator_->Forward(tape, r.d, r.d_power, nn::Concat(both_parts, 0), /*trainable=*/true,
                                             /*power_iterations=*/1);
    nn::Var real_scores = nn::Slice(scores, 0, 0, shard);
    nn::Var fake_scores = nn::Slice(scores, 0, shard, 2 * shard);
    nn::Var ones = tape.Constant(r.ones.data(), {shard, 1});
    nn::Var loss = hinge ? nn::Add(nn::Mean(nn::Relu(nn::Sub(ones, real_scores))),
                                   nn::Mean(nn::Relu(nn::Add(ones, fake_scores))))
                         : nn::Add(nn::Mean(nn::Softplus(nn::Scale(real_scores, -1.0f))),
                                   nn::Mean(nn::Softplus(fake_scores)));
    device.Copy(tape.data(loss).data, r.losses.data(), 1);
    tape.Backward(loss);
    d_optimizer.Step(DiscriminatorLearningRate(r.step));
    if (!ctx.status().ok()) return ctx.status();
  }
  // One generator update through the (constant) discriminator.
  tape.Reset();
  r.g.ZeroGrad();
  nn::Var noise = tape.Input(r.noise.data() + config_.n_critic() * shard * z, {shard, z});
  nn::Var fake = generator_->Forward(tape, r.g, noise, /*trainable=*/true, cross, model);
  nn::Var scores = discriminator_->Forward(tape, r.d, r.d_power, fake, /*trainable=*/false, /*power_iterations=*/0);
  nn::Var loss = hinge ? nn::Scale(nn::Mean(scores), -1.0f) : nn::Mean(nn::Softplus(nn::Scale(scores, -1.0f)));
  device.Copy(tape.data(loss).data, r.losses.data() + 1, 1);
  tape.Backward(loss);
  g_optimizer.Step(GeneratorLearningRate(r.step));
  // The EMA generator (every replica's, equal as their generators are).
  if (ema_decay_ > 0) {
    const double warm = (1.0 + r.step) / (10.0 + r.step);  // early steps follow the generator closely
    const double decay = std::min(ema_decay_, warm);
    if (r.ema_part != nullptr) {
      r.ema_part->Polyak(*r.g_part, static_cast<float>(1.0 - decay));  // on the parts (the generator's is updated)
    } else {
      RETURN_IF_ERROR(nn::PolyakUpdate(r.g, r.ema, *r.backend, static_cast<float>(1.0 - decay)));
    }
  }
  // Losses averaged over replicas, for the metrics.
  float losses[2] = {0, 0};
  device.ReadAtStepEnd(r.losses.data(), losses, sizeof(losses));
  step.End();
  if (copies.num_replicas() > 1) RETURN_IF_ERROR(copies.AllReduce(losses, replicator::ReduceOp::kMean));
  r.d_loss = losses[0];
  r.g_loss = losses[1];
  ++r.step;
  return ctx.status();
}

void GanTrainer::Generate(uint64_t stream, int64_t first, int64_t count, float* out) {
  constexpr int64_t kChunk = 500;
  // The whole generator: replica 0's, or gathered from the parts.
  if (whole_) GatherGenerator();
  nn::ParameterSet& weights = whole_ ? (ema_decay_ > 0 ? whole_->ema : whole_->g)
                                     : (ema_decay_ > 0 ? replicas_[0]->ema : replicas_[0]->g);
  const Generator& generator = whole_ ? *whole_generator_ : *generator_;
  const int64_t z = config_.noise_size();
  std::vector<float> noise(kChunk * z);
  nn::Tape tape(&weights.backend());
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    FillNoise(config_.engine().seed() ^ 0x5EED, stream, (first + begin) * z, n * z, noise.data());
    tape.Reset();
    nn::Var images = generator.Forward(tape, weights, tape.Input(noise.data(), {n, z}), /*trainable=*/false,
                                       /*cross_replica=*/nullptr);
    // To the host, then [-1, 1] -> [0, 1], the classifier's range.
    float* x = out + begin * kPixels;
    tape.backend().Download(tape.data(images).data, x, sizeof(float) * n * kPixels);
    for (int64_t i = 0; i < n * kPixels; ++i) x[i] = 0.5f * (x[i] + 1.0f);
  }
}

absl::Status GanTrainer::ExportWeights(const std::string& path) const {
  const Replica& r = *replicas_[0];
  if (whole_) GatherGenerator();
  std::vector<nn::CheckpointTensor> host;
  for (const nn::ParameterSet* set : {whole_ ? &whole_->g : &r.g, split_parameters_ ? &whole_->d : &r.d, &r.d_power}) {
    std::vector<nn::DeviceTensor> tensors;
    for (int i = 0; i < set->size(); ++i) tensors.push_back({set->info(i).name, set->info(i).shape, set->value(i).data});
    for (nn::CheckpointTensor& t : nn::DownloadTensors(set->backend(), tensors)) host.push_back(std::move(t));
  }
  return nn::WriteCheckpoint(path, host);
}

namespace {

// The files of a checkpoint (one generation of the checkpoint folder; the
// layout before generations had them directly in it, or in DIR.new).
constexpr char kGeneratorFile[] = "generator.ckpt";
constexpr char kDiscriminatorFile[] = "discriminator.ckpt";
constexpr char kEmaFile[] = "generator_ema.ckpt";
constexpr char kPowerVectorsFile[] = "discriminator_power_vectors.ckpt";

// A folder of the layout before generations is complete once its commit
// point, counters.txt, is there.
bool IsCompleteCheckpoint(const std::string& dir) { return std::filesystem::exists(dir + "/" + kCountersFile); }

}  // namespace

absl::Status GanTrainer::SaveCheckpoint(const std::string& dir,
                                        const std::vector<std::pair<std::string, std::string>>& extra_files) const {
  // One generation: every file of this step, committed at once.
  ASSIGN_OR_RETURN(GenerationWriter generation, GenerationWriter::Begin(dir));
  if (whole_) GatherGenerator();  // the files hold the whole generator
  GatherMoments(0);               // and the whole moments
  absl::Cleanup release = [&] { ReleaseMoments(0); };
  for (const NetworkFile& network : NetworkFiles(0)) {
    RETURN_IF_ERROR(nn::SaveCheckpoint(generation.File(network.file), *network.parameters, network.optimizer));
    RETURN_IF_ERROR(generation.Add(network.file));
  }
  for (const auto& [name, contents] : extra_files) RETURN_IF_ERROR(generation.AddText(name, contents));
  RETURN_IF_ERROR(generation.AddText(kCountersFile, absl::StrCat("steps ", steps_, "\n")));
  std::vector<std::string> legacy = {kGeneratorFile, kDiscriminatorFile, kEmaFile, kPowerVectorsFile, kCountersFile};
  for (const auto& [name, contents] : extra_files) legacy.push_back(name);
  ASSIGN_OR_RETURN(const std::string note, generation.Commit(config_.keep_checkpoints(), legacy));
  if (!note.empty()) std::fprintf(stderr, "checkpoint: %s\n", note.c_str());
  // The layout before generations swapped through DIR.new: once the old
  // files are gone (Commit), so is it.
  std::error_code ec;
  if (!IsCompleteCheckpoint(dir)) std::filesystem::remove_all(dir + ".new", ec);
  return absl::OkStatus();
}

std::vector<GanTrainer::NetworkFile> GanTrainer::NetworkFiles(int r) const {
  const Replica& replica = *replicas_[r];
  // Split, the generator's files are the whole one's (GatherGenerator first).
  if (whole_) {
    return {{kGeneratorFile, &whole_->g, whole_->adam.get()},
            split_parameters_ ? NetworkFile{kDiscriminatorFile, &whole_->d, whole_->d_adam.get()}
                              : NetworkFile{kDiscriminatorFile, &replica.d, replica.d_adam.get()},
            {kEmaFile, &whole_->ema, nullptr},
            {kPowerVectorsFile, &replica.d_power, nullptr}};
  }
  return {{kGeneratorFile, &replica.g, replica.g_adam.get()},
          {kDiscriminatorFile, &replica.d, replica.d_adam.get()},
          {kEmaFile, &replica.ema, nullptr},
          {kPowerVectorsFile, &replica.d_power, nullptr}};
}

bool GanTrainer::state_split_across_processes() const {
  return (replicas_[0]->g_sharded != nullptr || model_parallel_ > 1) &&
         static_cast<int>(replicas_.size()) != replicator_->num_replicas();
}

absl::Status GanTrainer::PrepareCheckpoint() {
  if (!state_split_across_processes()) return absl::OkStatus();
  RETURN_IF_ERROR(replicator_->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
    Replica& r = *replicas_[ctx.local_index()];
    if (model_parallel_ > 1) {
      // Every part of this replica's model copy (each part's set has the
      // same layout): its generator's buffers all-gathered along the model
      // axis, kept on the host by local replica 0.
      const std::vector<float*> buffers = GeneratorBuffers(r.g, r.ema, *r.g_adam);
      const int64_t n = r.g.total_floats();
      nn::DeviceBuffer all(*r.backend, model_parallel_ * n);
      std::vector<std::vector<std::vector<float>>> parts(model_parallel_);
      for (float* buffer : buffers) {
        RETURN_IF_ERROR(ctx.model_axis().AllGatherDevice(*r.backend, buffer, all.data(), n));
        const std::vector<float> host = DownloadBuffer(*r.backend, all.data(), model_parallel_ * n);
        for (int p = 0; p < model_parallel_; ++p) {
          parts[p].emplace_back(host.begin() + p * n, host.begin() + (p + 1) * n);
        }
      }
      if (ctx.local_index() == 0) generator_parts_on_host_ = std::move(parts);
      return absl::OkStatus();
    }
    if (split_parameters_) {
      // Each network, then each Adam's moments, whole on the host (on the
      // device one at a time, and only during its gather), kept by local
      // replica 0.
      SplitOnHost host;
      for (const auto& [part, whole] : SplitNetworks<Replica>(*whole_)) {
        RETURN_IF_ERROR((r.*part)->GatherToHost(ctx, &host.values.emplace_back()));
      }
      for (const auto& [sharded, adam] : SplitOptimizers<Replica>(*whole_)) {
        RETURN_IF_ERROR((r.*sharded)->set_context(&ctx));
        RETURN_IF_ERROR((r.*sharded)->GatherStateToHost(&host.moments.emplace_back()));
      }
      if (ctx.local_index() == 0) split_on_host_ = std::move(host);
      return absl::OkStatus();
    }
    for (replicator::ShardedAdam* sharded : {r.g_sharded, r.d_sharded}) {
      RETURN_IF_ERROR(sharded->set_context(&ctx));
      RETURN_IF_ERROR(sharded->GatherState());
    }
    return absl::OkStatus();
  }));
  moments_gathered_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> GanTrainer::AgreeWithChief(bool chief_wants) {
  if (!state_split_across_processes()) return chief_wants;
  std::atomic<bool> agreed = false;
  RETURN_IF_ERROR(replicator_->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
    float flag[1] = {ctx.replica_id() == 0 && chief_wants ? 1.0f : 0.0f};
    RETURN_IF_ERROR(ctx.AllReduce(flag, replicator::ReduceOp::kSum));
    if (ctx.local_index() == 0) agreed = flag[0] > 0.5f;
    return absl::OkStatus();
  }));
  return agreed.load();
}

void GanTrainer::GatherMoments(int r) const {
  // (Split parameters gather their moments to the host with the networks.)
  if (replicas_[r]->g_sharded == nullptr || split_parameters_ || moments_gathered_) return;
  TROUPE_CHECK(!state_split_across_processes());  // PrepareCheckpoint first, on every rank
  std::vector<replicator::ShardedAdam*> g, d;
  for (const auto& each : replicas_) {
    g.push_back(each->g_sharded);
    d.push_back(each->d_sharded);
  }
  TROUPE_CHECK(replicator::ShardedAdam::GatherLocal(g, *replicas_[r]->g_sharded).ok());
  TROUPE_CHECK(replicator::ShardedAdam::GatherLocal(d, *replicas_[r]->d_sharded).ok());
}

void GanTrainer::ReleaseMoments(int r) const {
  if (replicas_[r]->g_sharded == nullptr || split_parameters_ || moments_gathered_) return;
  replicas_[r]->g_sharded->ReleaseWholeState();
  replicas_[r]->d_sharded->ReleaseWholeState();
}

std::vector<nn::CheckpointTensor> GanTrainer::CheckpointState(int r) const {
  if (whole_) GatherGenerator(replicas_[r]->copy);
  GatherMoments(r);
  absl::Cleanup release = [&] { ReleaseMoments(r); };
  std::vector<nn::CheckpointTensor> state;
  for (const NetworkFile& network : NetworkFiles(r)) {
    for (nn::CheckpointTensor& t : nn::CheckpointTensors(*network.parameters, network.optimizer)) {
      t.name = absl::StrCat(network.file, "/", t.name);
      state.push_back(std::move(t));
    }
  }
  state.push_back(nn::Int64Tensor(absl::StrCat(kCountersFile, "/steps"), {&steps_, 1}));
  return state;
}

absl::Status GanTrainer::LoadFrom(const std::string& folder) {
  int64_t steps = -1;
  if (!absl::SimpleAtoi(ReadKeyValues(folder + "/" + kCountersFile)["steps"], &steps) || steps < 0) {
    return absl::DataLossError(absl::StrCat(folder, "/", kCountersFile, ": missing or unreadable"));
  }
  if (whole_) {
    // The whole generator (and with split parameters the discriminator) on
    // the host, then each replica's part of it.
    RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kGeneratorFile, whole_->g, whole_->adam.get()));
    RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kEmaFile, whole_->ema));
    if (split_parameters_) {
      RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kDiscriminatorFile, whole_->d, whole_->d_adam.get()));
    }
  }
  for (auto& r : replicas_) {
    if (!whole_) {
      RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kGeneratorFile, r->g, r->g_adam.get()));
      RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kEmaFile, r->ema));
    }
    if (!split_parameters_) {
      RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kDiscriminatorFile, r->d, r->d_adam.get()));
    }
    RETURN_IF_ERROR(nn::LoadCheckpoint(folder + "/" + kPowerVectorsFile, r->d_power));
    if (r->g_sharded != nullptr && !split_parameters_) {
      // The whole moments were loaded: each replica keeps its part.
      r->g_sharded->KeepOwnPart();
      r->d_sharded->KeepOwnPart();
    }
  }
  if (split_parameters_) {
    ScatterSplitParameters();
  } else if (whole_) {
    ScatterGenerator();
  }
  steps_ = steps;
  return absl::OkStatus();
}

absl::StatusOr<std::string> GanTrainer::LoadCheckpoint(const std::string& dir, std::vector<std::string>* passed_over) {
  // The newest whole generation; a damaged or unfinished newer one is
  // passed over, saying why.
  absl::StatusOr<Generation> generation =
      LoadNewestGeneration(dir, [&](const Generation& g) { return LoadFrom(g.path); }, passed_over);
  if (generation.ok()) return generation->path;
  if (!absl::IsNotFound(generation.status())) return generation.status();
  // The layout before generations: `dir`, or DIR.new when killed in its swap.
  for (const std::string& from : {dir, dir + ".new"}) {
    if (IsCompleteCheckpoint(from)) {
      RETURN_IF_ERROR(LoadFrom(from));
      return from;
    }
  }
  return absl::NotFoundError(absl::StrCat(generation.status().message(),
                                          "; no complete checkpoint of the layout before generations either (",
                                          kCountersFile, " missing or unreadable in ", dir, " and in ", dir, ".new)"));
}

}  // namespace troupe::gan
