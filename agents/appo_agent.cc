#include "agents/appo_agent.h"

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "agents/augment.h"
#include "agents/trajectory.h"
#include "agents/vtrace.h"
#include "common/fnv1a.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "replay/replay.h"

namespace troupe::agents {

using internal::Weights;

absl::Status CheckAppoEngine(const config::ExperimentConfig& config, int replicas) {
  const config::AppoConfig& appo = config.appo();
  const config::EngineConfig& engine = config.learner().engine();
  if (engine.device() == config::EngineConfig::PJRT) {
    return absl::InvalidArgumentError(
        "agent APPO with learner.engine.device PJRT: APPO runs kernel at a time (CPU, CPU_STRICT or CUDA); its "
        "V-trace targets are computed on the host inside the update");
  }
  if (config.learner().updates_per_execution() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("learner.updates_per_execution ",
                                                   config.learner().updates_per_execution(),
                                                   ": agent APPO takes one update per execution"));
  }
  if (engine.shard_state() != config::EngineConfig::NONE) {
    return absl::InvalidArgumentError(absl::StrCat("learner.engine.shard_state ",
                                                   config::EngineConfig::ShardState_Name(engine.shard_state()),
                                                   ": D4PG's for now, not agent APPO's"));
  }
  if (engine.model_parallel() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("learner.engine.model_parallel ", engine.model_parallel(),
                                                   ": APPO's networks are whole on every replica (D4PG's critic "
                                                   "splits)"));
  }
  if (engine.straggler() == config::EngineConfig::DEADLINE) {
    return absl::InvalidArgumentError("learner.engine.straggler DEADLINE: D4PG's for now, not agent APPO's");
  }
  if (replicas <= 0) return absl::OkStatus();
  const int64_t batch = config.learner().batch_size();
  if (batch < replicas || batch % replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat("learner.batch_size ", batch, ": must be a multiple of the ",
                                                   replicas, " replicas (learner.engine.replicas)"));
  }
  const int64_t shard = batch / replicas;
  if (shard * appo.unroll_length() < appo.minibatches()) {
    return absl::InvalidArgumentError(absl::StrCat("appo.minibatches ", appo.minibatches(), ": more than the ",
                                                   shard * appo.unroll_length(),
                                                   " steps a replica's shard holds (learner.batch_size / replicas x "
                                                   "appo.unroll_length)"));
  }
  return absl::OkStatus();
}

absl::Status CheckAppoStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size) {
  const config::AppoConfig& appo = config.appo();
  nn::ParameterSet model;  // declared, not allocated
  internal::AppoNetworks::Declare(model, appo, spec, action_size);
  const double replicas = config.learner().engine().replicas();
  const double steps = double(config.learner().batch_size()) * (appo.unroll_length() + 1);
  double width = 0;
  for (int64_t h : internal::AppoHiddenSizes(appo)) width += h;
  // Parameters, gradients and two moments per replica; the epoch's forward
  // pass over every step, the host's copies of the batch; from pixels the
  // batch's frames (decoded) and a chunk's or minibatch's encoder
  // activations (input planes and four conv layers).
  double bytes = 4.0 * (4 * model.total_floats() * replicas + 4 * steps * (width + spec.state_size + action_size));
  if (spec.pixels()) {
    const double frame = 3.0 * spec.height * spec.width, side = (std::max(spec.height, spec.width) - 3) / 2 + 1;
    const double rows = std::max<double>(256, steps / std::max(1, appo.minibatches()));
    bytes += steps * spec.frames * frame * 2 +
             rows * 4.0 * (2 * spec.frames * frame + 4 * 2 * appo.conv_channels() * side * side);
  }
  return CheckFitsInMemory(absl::StrCat("learner.batch_size ", config.learner().batch_size(),
                                        " trajectories of appo.unroll_length ", appo.unroll_length(), " with appo.hidden",
                                        spec.pixels() ? ", appo.conv_channels" : "", " and learner.engine.replicas ",
                                        replicas),
                           bytes);
}

namespace internal {

PpoLoss AppoLoss(nn::Tape& t, nn::Var mean, nn::Var log_std_row, nn::Var value, const PpoInputs& in) {
  const int64_t n = in.n, a = in.action_size;
  const nn::Var log_std = nn::MatMul(t.Input(in.ones, {n, 1}), log_std_row);  // [n, A]
  const nn::Var z = nn::Mul(nn::Sub(t.Input(in.u, {n, a}), mean), nn::Exp(nn::Scale(log_std, -1.0f)));
  const nn::Var log_density = nn::Sub(nn::Scale(nn::SumAxis(nn::Square(z), 1), -0.5f), nn::SumAxis(log_std, 1));
  PpoLoss loss;
  // The log-ratio clamped to +-kMaxLogRatio (no gradient past it): a policy
  // far from the behaviour's (a narrow Gaussian, an old trajectory) would
  // otherwise give an infinite ratio, and 0 x inf for a masked row.
  loss.ratio =
      nn::Exp(nn::Clamp(nn::Sub(log_density, t.Input(in.behaviour, {n})), -kMaxLogRatio, kMaxLogRatio));
  const nn::Var advantage = t.Input(in.advantage, {n});
  const nn::Var surrogate = nn::Minimum(
      nn::Mul(loss.ratio, advantage), nn::Mul(nn::Clamp(loss.ratio, 1.0f - in.clip, 1.0f + in.clip), advantage));
  loss.policy = nn::Scale(nn::Sum(surrogate), -1.0f);
  loss.value = nn::Sum(nn::Mul(nn::Square(nn::Sub(value, t.Input(in.vs, {n}))), t.Input(in.value_weight, {n})));
  loss.total = nn::Add(loss.policy, loss.value);
  // The Gaussian's entropy is sum(log_std) plus a constant.
  if (in.entropy_coef > 0) loss.total = nn::Add(loss.total, nn::Scale(nn::Sum(log_std_row), -in.entropy_coef));
  return loss;
}

}  // namespace internal

// One replica's state: its model, optimizer and tape, its shard of the
// batch and the host's scratch for it.
struct AppoAgent::Replica {
  explicit Replica(std::shared_ptr<nn::Backend> device) : backend(std::move(device)), tape(backend.get()) {}

  std::shared_ptr<nn::Backend> backend;
  nn::ParameterSet model;
  std::unique_ptr<nn::Adam> adam;
  std::unique_ptr<internal::ClippedOptimizer> clipped;
  int64_t generation = -1;  // the Train call the reducer and optimizer below are for
  std::unique_ptr<replicator::GradientReducer> reducer;
  std::unique_ptr<replicator::ReplicatedOptimizer> optimizer;
  nn::Tape tape;
  replay::SampledBatch batch;
  // The observation normaliser (identical on every replica: each batch's
  // moments are averaged over replicas first).
  std::vector<double> obs_mean, obs_var;
  double obs_count = 0;
  std::vector<float> mean32, std32;
  // The shard prepared on the host: normalised observations [Bs * (T+1), S],
  // pre-squash actions [Bs * T, A], scaled rewards, weights (0 for stale
  // trajectories), then per epoch V-trace's targets and advantages; the
  // batch's own frames (pixels, [bs * (T + 1), k, H, W, 3]), behaviour
  // log-densities and discounts [Bs * T] as sampled; with
  // appo.decoupled_clip, the log-densities under the policy at the update's
  // start [Bs * T] (the first epoch's pass), which the clip is taken against.
  std::vector<float> x, u, rewards, weights, log_rhos, vs, advantages, start_log_densities;
  const uint8_t* frames = nullptr;
  const float *behaviour = nullptr, *discounts = nullptr;
  // The epoch's forward pass: values, means and the log standard deviation
  // it used (V-trace's and the entropy metric's).
  std::vector<float> values, means, log_std;
  // A minibatch's inputs.
  std::vector<float> mb_x, mb_u, mb_behaviour, mb_advantage, mb_vs, mb_value_weight, ones, ratio;
  std::vector<uint8_t> mb_frames;
  std::vector<int64_t> order;
  std::mt19937_64 rng;
  // appo.augment_pad's shifts, a stream of their own (augmentation changes
  // what the encoder sees, not the minibatches).
  std::mt19937_64 augment_rng;
  int64_t updates = 0;
};

AppoAgent::~AppoAgent() { StopInput(); }

absl::StatusOr<std::unique_ptr<AppoAgent>> AppoAgent::Create(const config::ExperimentConfig& config,
                                                             const ObservationSpec& spec, int action_size,
                                                             replicator::Replicator* replicator) {
  const config::AppoConfig& appo = config.appo();
  RETURN_IF_ERROR(ValidateAppo(appo, spec, action_size));
  if (replicator == nullptr) return absl::InvalidArgumentError("AppoAgent needs a replicator");
  const config::EngineConfig& engine = config.learner().engine();
  const int k = replicator->num_replicas();
  RETURN_IF_ERROR(CheckAppoEngine(config, k));
  const int64_t shard = config.learner().batch_size() / k;
  std::unique_ptr<AppoAgent> agent(new AppoAgent());
  agent->config_ = config;
  agent->spec_ = spec;
  agent->action_size_ = action_size;
  ASSIGN_OR_RETURN(agent->signature_, TrajectorySignature(spec, action_size, appo.unroll_length()));
  agent->replicator_ = replicator;
  agent->shard_ = shard;
  const uint64_t seed = engine.seed();
  for (size_t i = 0; i < replicator->local_replicas().size(); ++i) {
    auto r = std::make_unique<Replica>(replicator->backend(static_cast<int>(i)));
    agent->networks_ = internal::AppoNetworks::Declare(r->model, appo, spec, action_size);
    r->model.Allocate(*r->backend, seed);  // same seed everywhere: identical starts
    r->adam = std::make_unique<nn::Adam>(&r->model, r->backend.get());
    r->clipped = std::make_unique<internal::ClippedOptimizer>(r->adam.get(), r->backend.get(), appo.max_gradient_norm());
    r->obs_mean.assign(spec.state_size, 0.0);
    r->obs_var.assign(spec.state_size, 1.0);
    agent->replicas_.push_back(std::move(r));
  }
  {
    absl::MutexLock lock(&agent->metrics_mu_);
    agent->metric_sums_.assign(std::size(kAppoMetrics), 0.0);
  }
  return agent;
}

void AppoAgent::StartInput(SampleFn sample, std::function<void()> cancel) {
  sample_ = std::move(sample);
  cancel_ = std::move(cancel);
}

void AppoAgent::StopInput() {
  sample_ = nullptr;
  cancel_ = nullptr;
}

absl::Status AppoAgent::Train(int64_t num_updates) {
  if (!sample_) return absl::FailedPreconditionError("AppoAgent::Train without an input: call StartInput first");
  if (num_updates < 0) return absl::InvalidArgumentError(absl::StrCat("Train: num_updates ", num_updates, " < 0"));
  ++train_generation_;
  const absl::Status status = replicator_->Run<Replica*>(
      num_updates,
      // input_fn: this replica's shard of the next batch.
      [&](replicator::ReplicaContext& ctx) -> absl::StatusOr<Replica*> {
        Replica& r = *replicas_[ctx.local_index()];
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(sample_(ctx.replica_id(), shard_, &r.batch));
        if (ctx.local_index() == 0) {
          absl::MutexLock lock(&metrics_mu_);
          input_wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          ++input_waits_;
        }
        return &r;
      },
      // step_fn: the epochs of minibatch steps on it.
      [&](replicator::ReplicaContext& ctx, Replica*& r) -> absl::Status { return Update(ctx, *r); });
  updates_ = replicas_[0]->updates;
  return status;
}

float AppoAgent::LearningRate(int64_t update) const {
  const config::AppoConfig& appo = config_.appo();
  if (!appo.anneal_learning_rate()) return appo.learning_rate();
  const double frames_per_update = double(config_.learner().batch_size()) * appo.unroll_length() *
                                   std::max(config_.env().action_repeat(), 1);
  const double total = std::max(1.0, double(config_.total_frames()) / frames_per_update);
  return static_cast<float>(appo.learning_rate() * std::max(0.0, 1.0 - double(update) / total));
}

void AppoAgent::NormalizerFloats(const Replica& r, std::vector<float>* mean, std::vector<float>* std) const {
  const int64_t s = spec_.state_size;
  const bool normalize = config_.appo().normalize_observations();
  mean->resize(s);
  std->resize(s);
  for (int64_t j = 0; j < s; ++j) {
    (*mean)[j] = normalize ? static_cast<float>(r.obs_mean[j]) : 0.0f;
    (*std)[j] = normalize ? internal::ObservationStd(r.obs_var[j]) : 1.0f;
  }
}

int64_t AppoAgent::FrameStackBytes() const {
  return spec_.pixels() ? int64_t{spec_.frames} * spec_.height * spec_.width * 3 : 0;
}

nn::Var AppoAgent::ObservationInput(nn::Tape& t, const float* state, const uint8_t* frames, int64_t rows) const {
  if (!spec_.pixels()) return t.Input(state, {rows, spec_.state_size});
  return internal::PixelInput(t, frames, rows, spec_);
}

absl::Status AppoAgent::UpdateNormalizer(replicator::ReplicaContext& ctx, Replica& r, const float* observation) {
  const config::AppoConfig& appo = config_.appo();
  const int64_t bs = shard_, steps = appo.unroll_length(), s = spec_.state_size;
  const int64_t rows = bs * steps;
  // This batch's moments (its first T observations of each
  // trajectory, averaged over replicas), merged into the running ones.
  const bool normalize = appo.normalize_observations() && !spec_.pixels();
  if (normalize) {
    std::vector<float> moments(2 * s, 0.0f);
    for (int64_t b = 0; b < bs; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const float* x = observation + (b * (steps + 1) + t) * s;
        for (int64_t j = 0; j < s; ++j) {
          moments[j] += x[j] / float(rows);
          moments[s + j] += x[j] * x[j] / float(rows);
        }
      }
    }
    RETURN_IF_ERROR(ctx.AllReduce(moments, replicator::ReduceOp::kMean));
    const double n = double(rows) * ctx.num_replicas(), total = r.obs_count + n;
    for (int64_t j = 0; j < s; ++j) {
      const double mean = moments[j], var = std::max(0.0, double(moments[s + j]) - mean * mean);
      const double delta = mean - r.obs_mean[j];
      r.obs_mean[j] += delta * n / total;
      r.obs_var[j] = (r.obs_var[j] * r.obs_count + var * n + delta * delta * r.obs_count * n / total) / total;
    }
    r.obs_count = total;
  }
  NormalizerFloats(r, &r.mean32, &r.std32);
  return absl::OkStatus();
}

absl::Status AppoAgent::Update(replicator::ReplicaContext& ctx, Replica& r) {
  const config::AppoConfig& appo = config_.appo();
  const int64_t bs = shard_, steps = appo.unroll_length(), s = spec_.state_size, a = action_size_;
  const int64_t rows = bs * steps, obs_rows = bs * (steps + 1);
  RETURN_IF_ERROR(replay::CheckBatch(signature_, r.batch, bs, /*frame_references=*/false));
  if (r.generation != train_generation_) {
    r.generation = train_generation_;
    r.reducer = std::make_unique<replicator::GradientReducer>(&ctx, &r.model);
    r.optimizer = std::make_unique<replicator::ReplicatedOptimizer>(r.clipped.get(), &ctx, r.reducer.get());
  }
  const auto& fields = r.batch.fields;
  // State [bs, T + 1, S] floats, or pixels [bs, (T + 1) k, H, W, 3] bytes.
  const float* observation = fields[kTrajectoryObservation].as<float>();
  r.frames = fields[kTrajectoryObservation].as<uint8_t>();
  const float* action = fields[kTrajectoryAction].as<float>();
  const float* reward = fields[kTrajectoryReward].as<float>();
  r.discounts = fields[kTrajectoryDiscount].as<float>();
  r.behaviour = fields[kTrajectoryLogProb].as<float>();
  const int64_t* version = fields[kTrajectoryVersion].as<int64_t>();

  RETURN_IF_ERROR(UpdateNormalizer(ctx, r, observation));

  // The shard on the host (pixels stay in the batch, as sampled).
  r.x.resize(obs_rows * s);
  internal::NormalizeObservations(observation, obs_rows, s, r.mean32.data(), r.std32.data(), r.x.data());
  r.u.resize(rows * a);
  for (int64_t i = 0; i < rows * a; ++i) r.u[i] = internal::PreSquash(action[i]);
  r.rewards.resize(rows);
  for (int64_t i = 0; i < rows; ++i) r.rewards[i] = reward[i] * appo.reward_scale();
  r.weights.resize(rows);
  const int64_t learner_version = r.updates + 1;  // what the learner publishes now
  double dropped = 0, lag_sum = 0, kept = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t lag = learner_version - version[b];
    const bool stale = lag > appo.max_policy_lag();
    dropped += stale;
    if (!stale) {
      lag_sum += lag;
      ++kept;
    }
    std::fill(r.weights.begin() + b * steps, r.weights.begin() + (b + 1) * steps, stale ? 0.0f : 1.0f);
  }

  const int minibatches = appo.minibatches();
  const VtraceOptions vtrace{.rho_bar = appo.vtrace_rho(), .c_bar = appo.vtrace_c(), .pg_rho_bar = appo.vtrace_rho(),
                             .lambda = appo.vtrace_lambda()};
  double sums[5] = {0, 0, 0, 0, 0};  // policy loss, value loss, approx KL, clip fraction, minibatch steps
  double value_moments[5] = {0, 0, 0, 0, 0};
  r.rng.seed(internal::MixSeed(config_.learner().engine().seed(), ctx.replica_id(), r.updates));
  r.augment_rng.seed(internal::MixSeed(config_.learner().engine().seed(), ctx.replica_id(), ~r.updates));
  int epochs_run = 0;
  for (int epoch = 0; epoch < appo.epochs(); ++epoch) {
    ++epochs_run;
    // V-trace under the current networks: a forward pass over every
    // observation (no gradient; in chunks, which bound a pixel pass's
    // memory), the recursion on the host.
    nn::Tape& t = r.tape;
    const Weights fixed{&r.model, false};
    r.means.resize(obs_rows * a);
    r.values.resize(obs_rows);
    for (int64_t first = 0; first < obs_rows; first += kForwardChunk) {
      const int64_t count = std::min(kForwardChunk, obs_rows - first);
      t.Reset();
      const nn::Var features = networks_.Features(
          t, fixed, ObservationInput(t, r.x.data() + first * s, r.frames + first * FrameStackBytes(), count));
      const nn::Var mean = networks_.Mean(t, fixed, features);
      const nn::Var value = networks_.value(t, fixed, features);
      r.backend->Download(t.data(mean).data, r.means.data() + first * a, sizeof(float) * count * a);
      r.backend->Download(t.data(value).data, r.values.data() + first, sizeof(float) * count);
    }
    r.log_std.resize(a);
    r.backend->Download(r.model.value(networks_.log_std).data, r.log_std.data(), sizeof(float) * a);
    r.log_rhos.resize(rows);
    const bool update_start = epoch == 0 && appo.decoupled_clip();
    if (update_start) r.start_log_densities.resize(rows);
    for (int64_t b = 0; b < bs; ++b) {
      for (int64_t i = 0; i < steps; ++i) {
        const int64_t row = b * steps + i;
        const double now = internal::GaussianLogDensity(&r.u[row * a], &r.means[(b * (steps + 1) + i) * a],
                                                        r.log_std.data(), static_cast<int>(a));
        if (update_start) r.start_log_densities[row] = static_cast<float>(now);
        // Clamped as the loss clamps it (a ratio past e^20 is truncated anyway).
        r.log_rhos[row] = static_cast<float>(std::clamp(now - r.behaviour[row], -double(internal::kMaxLogRatio),
                                                        double(internal::kMaxLogRatio)));
      }
    }
    r.vs.resize(rows);
    r.advantages.resize(rows);
    Vtrace(bs, steps, r.log_rhos.data(), r.rewards.data(), r.discounts, r.values.data(), vtrace, r.vs.data(),
           r.advantages.data());
    if (epoch == 0) {
      // The explained variance's moments: weight, then the targets' and the
      // residuals' first and second.
      for (int64_t b = 0; b < bs; ++b) {
        for (int64_t i = 0; i < steps; ++i) {
          const int64_t row = b * steps + i;
          const double w = r.weights[row], target = r.vs[row], residual = target - r.values[b * (steps + 1) + i];
          value_moments[0] += w;
          value_moments[1] += w * target;
          value_moments[2] += w * target * target;
          value_moments[3] += w * residual;
          value_moments[4] += w * residual * residual;
        }
      }
    }
    if (appo.normalize_advantages()) {
      std::vector<float> moments = {0, 0, 0};
      for (int64_t i = 0; i < rows; ++i) {
        moments[0] += r.weights[i] * r.advantages[i];
        moments[1] += r.weights[i] * r.advantages[i] * r.advantages[i];
        moments[2] += r.weights[i];
      }
      RETURN_IF_ERROR(ctx.AllReduce(moments, replicator::ReduceOp::kSum));
      if (moments[2] > 0) {
        const double m = moments[0] / moments[2];
        const double sd = std::sqrt(std::max(0.0, moments[1] / moments[2] - m * m));
        for (float& adv : r.advantages) adv = static_cast<float>((adv - m) / (sd + 1e-8));
      }
    }
    // The minibatches: a shuffle of the shard's steps, cut in equal parts.
    r.order.resize(rows);
    std::iota(r.order.begin(), r.order.end(), 0);
    std::shuffle(r.order.begin(), r.order.end(), r.rng);
    const double kl_before = sums[2];
    for (int m = 0; m < minibatches; ++m) {
      const int64_t begin = rows * m / minibatches, end = rows * (m + 1) / minibatches;
      RETURN_IF_ERROR(MinibatchStep(r, r.order.data() + begin, end - begin, sums));
      if (!ctx.status().ok()) return ctx.status();
    }
    // appo.target_kl: no more epochs once this one's mean approximate KL
    // (over every replica: all stop together) passes 1.5x the target.
    if (appo.target_kl() > 0) {
      std::vector<float> kl = {static_cast<float>((sums[2] - kl_before) / minibatches)};
      RETURN_IF_ERROR(ctx.AllReduce(kl, replicator::ReduceOp::kMean));
      if (kl[0] > 1.5 * appo.target_kl()) break;
    }
  }
  ++r.updates;

  // The update's metrics, over the whole batch.
  std::vector<float> metrics = {float(sums[0] / sums[4]), float(sums[1] / sums[4]), float(sums[2] / sums[4]),
                                float(sums[3] / sums[4]), float(dropped), float(lag_sum), float(kept)};
  for (double m : value_moments) metrics.push_back(static_cast<float>(m));
  RETURN_IF_ERROR(ctx.AllReduce(metrics, replicator::ReduceOp::kSum));
  // A loss that is no longer a number stops training before the actors get
  // a policy that acts NaN (every replica sees the same sums).
  if (!std::isfinite(metrics[0]) || !std::isfinite(metrics[1])) {
    return absl::InternalError(absl::StrCat("APPO update ", r.updates, ": the ",
                                            std::isfinite(metrics[0]) ? "value" : "policy",
                                            " loss is not finite; a lower appo.learning_rate or "
                                            "appo.max_gradient_norm, or a smaller appo.reward_scale, may keep it so"));
  }
  if (&r == replicas_[0].get()) {
    const double k = ctx.num_replicas();
    double entropy = 0;
    for (float l : r.log_std) entropy += l + 0.5 + 0.5 * std::log(2 * std::numbers::pi);
    // The weighted variance of the targets (moments at 8) and of the
    // residuals (at 10).
    const double w = metrics[7];
    auto variance = [&](int first) {
      return w > 0 ? std::max(0.0, metrics[first + 1] / w - std::pow(metrics[first] / w, 2)) : 0.0;
    };
    const double targets = variance(8), explained = targets > 0 ? 1 - variance(10) / targets : 0.0;
    // In kAppoMetrics' order.
    const double update[] = {metrics[0] / k, metrics[1] / k, entropy, metrics[2] / k, metrics[3] / k, metrics[4],
                             metrics[6] > 0 ? metrics[5] / metrics[6] : 0.0, double(epochs_run), explained};
    static_assert(std::size(update) == std::size(kAppoMetrics));
    absl::MutexLock lock(&metrics_mu_);
    for (size_t i = 0; i < std::size(update); ++i) metric_sums_[i] += update[i];
    ++metric_count_;
    metric_updates_ = r.updates;
  }
  return absl::OkStatus();
}

absl::Status AppoAgent::MinibatchStep(Replica& r, const int64_t* rows, int64_t n, double* sums) {
  const config::AppoConfig& appo = config_.appo();
  const int64_t steps = appo.unroll_length(), s = spec_.state_size, a = action_size_;
  // The rows' inputs, gathered on the host. Loss terms are sums over the
  // minibatch scaled by 1/n (the mean), each row weighted (0: stale).
  r.mb_x.resize(n * s);
  r.mb_frames.resize(n * FrameStackBytes());
  r.mb_u.resize(n * a);
  r.mb_behaviour.resize(n);
  r.mb_advantage.resize(n);
  r.mb_vs.resize(n);
  r.mb_value_weight.resize(n);
  if (static_cast<int64_t>(r.ones.size()) != n) r.ones.assign(n, 1.0f);
  const double log_2pi = std::log(2 * std::numbers::pi);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i], b = row / steps, step = row % steps;
    const int64_t observation = b * (steps + 1) + step;
    // (One of the two is empty: state or pixels.)
    std::copy_n(r.x.data() + observation * s, s, r.mb_x.data() + i * s);
    std::copy_n(r.frames + observation * FrameStackBytes(), FrameStackBytes(), r.mb_frames.data() + i * FrameStackBytes());
    std::copy_n(&r.u[row * a], a, &r.mb_u[i * a]);
    // The ratio's denominator: the behaviour's log-density, or the policy's
    // at the update's start (appo.decoupled_clip). The device's log-density
    // leaves out the constant -A/2 log(2 pi).
    const float denominator = appo.decoupled_clip() ? r.start_log_densities[row] : r.behaviour[row];
    r.mb_behaviour[i] = static_cast<float>(denominator + 0.5 * a * log_2pi);
    r.mb_advantage[i] = r.weights[row] * r.advantages[row] / float(n);
    r.mb_vs[i] = r.vs[row];
    r.mb_value_weight[i] = 0.5f * appo.value_coef() * r.weights[row] / float(n);
  }
  nn::Tape& t = r.tape;
  t.Reset();
  r.model.ZeroGrad();
  const Weights trained{&r.model, true};
  nn::Var observation = ObservationInput(t, r.mb_x.data(), r.mb_frames.data(), n);
  if (spec_.pixels() && appo.augment_pad() > 0) {
    observation = RandomShift(observation, appo.augment_pad(), r.augment_rng);
  }
  const nn::Var x = networks_.Features(t, trained, observation);
  // appo.detach_policy_features: the policy's head reads the features as
  // constants (no gradient into the encoder).
  const bool detach = spec_.pixels() && appo.detach_policy_features();
  const nn::Var mean = networks_.Mean(t, trained, detach ? t.Constant(t.data(x).data, t.data(x).shape) : x);
  const internal::PpoLoss loss = internal::AppoLoss(
      t, mean, trained(t, networks_.log_std), nn::Reshape(networks_.value(t, trained, x), {n}),
      {.n = n,
       .action_size = static_cast<int>(a),
       .u = r.mb_u.data(),
       .behaviour = r.mb_behaviour.data(),
       .advantage = r.mb_advantage.data(),
       .vs = r.mb_vs.data(),
       .value_weight = r.mb_value_weight.data(),
       .ones = r.ones.data(),
       .clip = appo.clip(),
       .entropy_coef = appo.entropy_coef()});
  r.reducer->Reset();
  t.Backward(loss.total, r.reducer.get());
  r.optimizer->Prepare(LearningRate(r.updates));
  r.optimizer->Apply();
  if (appo.has_min_log_std()) {
    // The floor as a projection, on the device: every replica clamps the same values.
    float* log_std = r.model.value(networks_.log_std).data;
    r.backend->Unary(nn::UnaryOp::kClamp, appo.min_log_std(), std::numeric_limits<float>::infinity(), log_std, log_std,
                     a);
  }
  // Metrics from the pass's values (read before the tape is reused).
  r.ratio.resize(n);
  r.backend->Download(t.data(loss.ratio).data, r.ratio.data(), sizeof(float) * n);
  double kl = 0, clipped = 0, weight = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = r.weights[rows[i]], q = std::max(double(r.ratio[i]), 1e-30);
    kl += w * (q - 1 - std::log(q));
    clipped += w * (std::abs(q - 1) > appo.clip());
    weight += w;
  }
  sums[0] += t.item(loss.policy);
  sums[1] += appo.value_coef() > 0 ? t.item(loss.value) / appo.value_coef() : 0.0;
  sums[2] += weight > 0 ? kl / weight : 0.0;
  sums[3] += weight > 0 ? clipped / weight : 0.0;
  sums[4] += 1;
  return absl::OkStatus();
}

void AppoAgent::PolicyParameters(std::vector<float>* out) const {
  const Replica& r = *replicas_[0];
  *out = r.model.DownloadValues();
  std::vector<float> mean, std;
  NormalizerFloats(r, &mean, &std);
  out->insert(out->end(), mean.begin(), mean.end());
  out->insert(out->end(), std.begin(), std.end());
}

int64_t AppoAgent::num_policy_parameters() const {
  return replicas_[0]->model.total_floats() + 2 * spec_.state_size;
}

int64_t AppoAgent::gradient_floats() const { return replicas_[0]->model.total_floats(); }

int64_t AppoAgent::optimizer_state_bytes() const {
  return int64_t{sizeof(float)} * replicas_[0]->adam->state_floats();
}

int64_t AppoAgent::parameter_state_bytes() const {
  // Values and gradients.
  return int64_t{sizeof(float)} * 2 * replicas_[0]->model.padded_floats();
}

AgentMetrics AppoAgent::metrics() const {
  absl::MutexLock lock(&metrics_mu_);
  AgentMetrics m{.updates = metric_updates_, .input_wait_s = input_waits_ > 0 ? input_wait_ / input_waits_ : 0.0};
  for (size_t i = 0; i < std::size(kAppoMetrics); ++i) {
    // dropped_stale is a count; the rest are means.
    const bool count = std::string_view(kAppoMetrics[i]) == "dropped_stale";
    m.values.emplace_back(kAppoMetrics[i],
                          count ? metric_sums_[i] : (metric_count_ > 0 ? metric_sums_[i] / metric_count_ : 0.0));
  }
  std::fill(metric_sums_.begin(), metric_sums_.end(), 0.0);
  metric_count_ = 0;
  input_wait_ = 0;
  input_waits_ = 0;
  return m;
}

void AppoAgent::LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const {
  keys->clear();
  priorities->clear();
}

namespace {

// The checkpoint's device entries of `model` and its Adam state.
std::vector<nn::DeviceTensor> DeviceEntries(nn::ParameterSet& model, nn::Optimizer& adam) {
  std::vector<nn::DeviceTensor> entries;
  auto add = [&](const std::string& prefix, float* base) {
    for (int i = 0; i < model.size(); ++i) {
      entries.push_back({internal::AppoModelEntry(prefix + model.info(i).name), model.info(i).shape,
                         base + model.info(i).offset});
    }
  };
  add("", model.device_values());
  for (const nn::OptimizerState& s : adam.State()) add(s.name + "/", s.data);
  return entries;
}

}  // namespace

std::vector<nn::CheckpointTensor> AppoAgent::CheckpointState() const {
  Replica& r = *replicas_[0];
  std::vector<nn::CheckpointTensor> tensors = nn::DownloadTensors(*r.backend, DeviceEntries(r.model, *r.adam));
  if (!spec_.pixels()) {  // the observation normaliser (state only)
    const nn::Shape state{spec_.state_size};
    tensors.push_back({internal::kAppoNormalizerMean, state, std::vector<float>(r.obs_mean.begin(), r.obs_mean.end())});
    tensors.push_back({internal::kAppoNormalizerVar, state, std::vector<float>(r.obs_var.begin(), r.obs_var.end())});
  }
  const int64_t counters[3] = {r.updates, r.adam->steps(), std::llround(r.obs_count)};
  tensors.push_back(nn::Int64Tensor(internal::kAppoCounters, counters));
  return tensors;
}

absl::Status AppoAgent::Save(const std::string& path) const { return nn::WriteCheckpoint(path, CheckpointState()); }

absl::Status AppoAgent::Load(const std::string& path) {
  Replica& r0 = *replicas_[0];
  std::vector<nn::DeviceTensor> layout = DeviceEntries(r0.model, *r0.adam);
  const bool normalizer = !spec_.pixels();
  if (normalizer) {
    const nn::Shape state{spec_.state_size};
    layout.push_back({internal::kAppoNormalizerMean, state, nullptr});
    layout.push_back({internal::kAppoNormalizerVar, state, nullptr});
  }
  layout.push_back({internal::kAppoCounters, nn::Shape{6}, nullptr});
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> file, nn::ReadCheckpointMatching(path, layout));
  const size_t n = file.size();
  const std::vector<int64_t> counters = nn::Int64sOf(file[n - 1]);
  for (auto& r : replicas_) {
    nn::UploadTensors(*r->backend, file, DeviceEntries(r->model, *r->adam));
    if (normalizer) {
      r->obs_mean.assign(file[n - 3].values.begin(), file[n - 3].values.end());
      r->obs_var.assign(file[n - 2].values.begin(), file[n - 2].values.end());
    }
    r->updates = counters[0];
    r->adam->set_steps(counters[1]);
    r->obs_count = static_cast<double>(counters[2]);
  }
  updates_ = counters[0];
  absl::MutexLock lock(&metrics_mu_);
  metric_updates_ = updates_;
  return absl::OkStatus();
}

uint64_t AppoAgent::StateChecksum() const {
  uint64_t hash = kFnv1aBasis;
  for (const nn::CheckpointTensor& t : CheckpointState()) {
    hash = Fnv1a64(reinterpret_cast<const char*>(t.values.data()), sizeof(float) * t.values.size(), hash);
  }
  return hash;
}

}  // namespace troupe::agents
