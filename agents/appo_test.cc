// APPO: V-trace against its direct definition, the clipped loss's gradient
// against finite differences, a one-state bandit learned from the policy's
// own trajectories, stale trajectories left out and counted, K=2 replicas
// equal to K=1, and checkpoints.
#include "agents/appo_agent.h"

#include <cmath>
#include <filesystem>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"
#include "agents/trajectory.h"
#include "agents/vtrace.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/ops.h"
#include "engine/nn/state_match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::agents {
namespace {

using ::testing::HasSubstr;

// --- V-trace -------------------------------------------------------------------

// The paper's definition (Espeholt et al. 2018, eq. 1), summed directly:
// vs_t = V_t + sum_{s >= t} (prod_{t <= i < s} d_i c_i) delta_s.
void DirectVtrace(int64_t batch, int64_t steps, const std::vector<float>& log_rhos, const std::vector<float>& r,
                  const std::vector<float>& d, const std::vector<float>& v, const VtraceOptions& o,
                  std::vector<double>* vs, std::vector<double>* adv) {
  vs->assign(batch * steps, 0);
  adv->assign(batch * steps, 0);
  for (int64_t b = 0; b < batch; ++b) {
    auto at = [&](int64_t t) { return b * steps + t; };
    auto value = [&](int64_t t) { return double(v[b * (steps + 1) + t]); };
    auto ratio = [&](int64_t t) { return std::exp(double(log_rhos[at(t)])); };
    for (int64_t t = 0; t < steps; ++t) {
      double sum = 0, trace = 1;
      for (int64_t s = t; s < steps; ++s) {
        const double delta = std::min<double>(o.rho_bar, ratio(s)) * (r[at(s)] + d[at(s)] * value(s + 1) - value(s));
        sum += trace * delta;
        trace *= d[at(s)] * o.lambda * std::min<double>(o.c_bar, ratio(s));
      }
      (*vs)[at(t)] = value(t) + sum;
    }
    for (int64_t t = 0; t < steps; ++t) {
      const double next = t + 1 < steps ? (*vs)[at(t + 1)] : value(steps);
      (*adv)[at(t)] = std::min<double>(o.pg_rho_bar, ratio(t)) * (r[at(t)] + d[at(t)] * next - value(t));
    }
  }
}

struct VtraceCase {
  int64_t batch = 3, steps = 9;
  std::vector<float> log_rhos, rewards, discounts, values;
};

VtraceCase RandomCase(uint64_t seed, float log_rho_scale) {
  VtraceCase c;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < c.batch * c.steps; ++i) {
    c.log_rhos.push_back(log_rho_scale * u(rng));
    c.rewards.push_back(u(rng));
    // Episode ends (discount 0) in some trajectories, at the middle and the end.
    c.discounts.push_back(i % 7 == 3 ? 0.0f : 0.97f);
  }
  for (int64_t i = 0; i < c.batch * (c.steps + 1); ++i) c.values.push_back(2 * u(rng));
  return c;
}

TEST(VtraceTest, MatchesTheDirectSumWithTruncationAndEpisodeEnds) {
  const VtraceCase c = RandomCase(1, 1.5f);
  for (const VtraceOptions& o : {VtraceOptions{}, VtraceOptions{.rho_bar = 1.5f, .c_bar = 0.8f, .pg_rho_bar = 1.2f,
                                                                 .lambda = 0.9f}}) {
    std::vector<float> vs(c.batch * c.steps), adv(c.batch * c.steps);
    Vtrace(c.batch, c.steps, c.log_rhos.data(), c.rewards.data(), c.discounts.data(), c.values.data(), o, vs.data(),
           adv.data());
    std::vector<double> want_vs, want_adv;
    DirectVtrace(c.batch, c.steps, c.log_rhos, c.rewards, c.discounts, c.values, o, &want_vs, &want_adv);
    for (size_t i = 0; i < vs.size(); ++i) {
      EXPECT_NEAR(vs[i], want_vs[i], 1e-5) << "vs " << i << " rho_bar " << o.rho_bar;
      EXPECT_NEAR(adv[i], want_adv[i], 1e-5) << "advantage " << i << " rho_bar " << o.rho_bar;
    }
  }
}

TEST(VtraceTest, OnPolicyWithFullTracesIsTheBootstrappedDiscountedReturn) {
  VtraceCase c = RandomCase(2, 0.0f);  // log_rho 0: pi = mu
  std::vector<float> vs(c.batch * c.steps), adv(c.batch * c.steps);
  Vtrace(c.batch, c.steps, c.log_rhos.data(), c.rewards.data(), c.discounts.data(), c.values.data(), {}, vs.data(),
         adv.data());
  for (int64_t b = 0; b < c.batch; ++b) {
    double ret = c.values[b * (c.steps + 1) + c.steps];  // the bootstrap
    for (int64_t t = c.steps - 1; t >= 0; --t) {
      ret = c.rewards[b * c.steps + t] + c.discounts[b * c.steps + t] * ret;
      EXPECT_NEAR(vs[b * c.steps + t], ret, 1e-5) << b << "," << t;
    }
  }
}

TEST(VtraceTest, RatiosAboveTheTruncationLevelsCountAsTheLevels) {
  // Every ratio e^3 > rho_bar = c_bar = 1: the same targets as ratio 1.
  VtraceCase high = RandomCase(3, 0.0f), one = high;
  std::fill(high.log_rhos.begin(), high.log_rhos.end(), 3.0f);
  std::vector<float> vs_high(high.batch * high.steps), vs_one(vs_high.size()), adv_high(vs_high.size()),
      adv_one(vs_high.size());
  Vtrace(high.batch, high.steps, high.log_rhos.data(), high.rewards.data(), high.discounts.data(), high.values.data(),
         {}, vs_high.data(), adv_high.data());
  Vtrace(one.batch, one.steps, one.log_rhos.data(), one.rewards.data(), one.discounts.data(), one.values.data(), {},
         vs_one.data(), adv_one.data());
  EXPECT_EQ(vs_high, vs_one);
  EXPECT_EQ(adv_high, adv_one);
  // Without truncation they differ.
  Vtrace(high.batch, high.steps, high.log_rhos.data(), high.rewards.data(), high.discounts.data(), high.values.data(),
         {.rho_bar = 100, .c_bar = 100, .pg_rho_bar = 100}, vs_high.data(), adv_high.data());
  EXPECT_NE(vs_high, vs_one);
}

// --- The loss --------------------------------------------------------------------

// The loss on the host, in double, of the same inputs (internal::AppoLoss's
// definition), for finite differences.
double HostLoss(const std::vector<double>& mean, const std::vector<double>& log_std, const std::vector<double>& value,
                const internal::PpoInputs& in) {
  double policy = 0, value_loss = 0;
  for (int64_t i = 0; i < in.n; ++i) {
    double log_density = 0;
    for (int j = 0; j < in.action_size; ++j) {
      const double z = (in.u[i * in.action_size + j] - mean[i * in.action_size + j]) * std::exp(-log_std[j]);
      log_density += -0.5 * z * z - log_std[j];
    }
    const double r = std::exp(log_density - in.behaviour[i]);
    const double clipped = std::clamp(r, 1.0 - in.clip, 1.0 + in.clip);
    policy -= std::min(r * in.advantage[i], clipped * in.advantage[i]);
    value_loss += in.value_weight[i] * (value[i] - in.vs[i]) * (value[i] - in.vs[i]);
  }
  double entropy = 0;
  for (double l : log_std) entropy += l;
  return policy + value_loss - in.entropy_coef * entropy;
}

TEST(AppoLossTest, GradientMatchesFiniteDifferencesWithClippedAndUnclippedRatios) {
  constexpr int64_t n = 12;
  constexpr int a = 2;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> mean(n * a), log_std = {-0.3f, 0.2f}, value(n), u(n * a), behaviour(n), advantage(n), vs(n),
      value_weight(n), ones(n, 1.0f);
  for (float& x : mean) x = uniform(rng);
  for (float& x : value) x = uniform(rng);
  for (int64_t i = 0; i < n; ++i) {
    double log_density = 0;
    for (int j = 0; j < a; ++j) {
      u[i * a + j] = mean[i * a + j] + 0.5f * uniform(rng);
      const double z = (u[i * a + j] - mean[i * a + j]) * std::exp(-log_std[j]);
      log_density += -0.5 * z * z - log_std[j];
    }
    // Ratios spread over [e^-0.6, e^0.6]: some inside the clip range, some
    // past each side, each with either sign of advantage.
    behaviour[i] = static_cast<float>(log_density - 0.6 * uniform(rng));
    advantage[i] = uniform(rng) / n;
    vs[i] = uniform(rng);
    value_weight[i] = 0.25f / n;
  }
  const internal::PpoInputs in{.n = n, .action_size = a, .u = u.data(), .behaviour = behaviour.data(),
                               .advantage = advantage.data(), .vs = vs.data(), .value_weight = value_weight.data(),
                               .ones = ones.data(), .clip = 0.2f, .entropy_coef = 0.01f};
  nn::CpuBackend cpu(1);
  nn::Tape t(&cpu);
  nn::DeviceBuffer mean_d(cpu, n * a), log_std_d(cpu, a), value_d(cpu, n);
  mean_d.Upload(mean);
  log_std_d.Upload(log_std);
  value_d.Upload(value);
  const nn::Var mean_v = t.Leaf(mean_d.data(), {n, a}), log_std_v = t.Leaf(log_std_d.data(), {1, a}),
                value_v = t.Leaf(value_d.data(), {n});
  const internal::PpoLoss loss = internal::AppoLoss(t, mean_v, log_std_v, value_v, in);
  std::vector<double> m(mean.begin(), mean.end()), l(log_std.begin(), log_std.end()), v(value.begin(), value.end());
  EXPECT_NEAR(t.item(loss.total), HostLoss(m, l, v, in), 1e-5);
  // Some ratios clipped on each side, some not.
  std::vector<float> ratio(n);
  cpu.Download(t.data(loss.ratio).data, ratio.data(), sizeof(float) * n);
  int below = 0, inside = 0, above = 0;
  for (float r : ratio) (r < 0.8f ? below : r > 1.2f ? above : inside)++;
  EXPECT_GT(below, 0);
  EXPECT_GT(inside, 0);
  EXPECT_GT(above, 0);
  t.Backward(loss.total);
  auto grad = [&](nn::Var var, int64_t count) {
    std::vector<float> g(count);
    cpu.Download(t.grad(var).data, g.data(), sizeof(float) * count);
    return g;
  };
  const std::vector<float> dm = grad(mean_v, n * a), dl = grad(log_std_v, a), dv = grad(value_v, n);
  constexpr double h = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<float>& analytic, const char* what) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + h;
      const double up = HostLoss(m, l, v, in);
      x[i] = keep - h;
      const double down = HostLoss(m, l, v, in);
      x[i] = keep;
      EXPECT_NEAR(analytic[i], (up - down) / (2 * h), 2e-4) << what << " " << i;
    }
  };
  check(m, dm, "mean");
  check(l, dl, "log_std");
  check(v, dv, "value");
}

// --- The agent ---------------------------------------------------------------------

std::unique_ptr<replicator::Replicator> MakeReplicator(int k) {
  config::EngineConfig engine;
  engine.set_device(config::EngineConfig::CPU);
  engine.set_replicas(k);
  engine.set_threads(k);
  auto r = engine::MakeReplicator(engine);
  TROUPE_CHECK(r.ok());
  return std::move(r).value();
}

config::ExperimentConfig BanditConfig(int batch) {
  config::ExperimentConfig c;
  c.set_agent(config::ExperimentConfig::APPO);
  c.mutable_learner()->set_batch_size(batch);
  c.mutable_learner()->mutable_engine()->set_seed(11);
  config::AppoConfig* appo = c.mutable_appo();
  appo->add_hidden(16);
  appo->set_unroll_length(4);
  appo->set_learning_rate(3e-3f);
  appo->set_epochs(2);
  appo->set_minibatches(2);
  return c;
}

// A one-state bandit: each step its own episode (discount 0), reward
// 1 - (a - 0.5)^2 whatever the observation, which is noise (uniform in
// [-1, 1], or random bytes for pixels: a constant would give the
// normaliser no spread). Fills `out` with `count` trajectories of
// `signature` (spec's observations) acted by `policy` (behaviour
// log-densities its own).
//
// `contextual` (pixels): each observation's frames are one grey level g
// instead, and the reward is 1 - (a - (g / 255 - 0.5))^2: the action to
// learn is read off the frames.
float BanditTarget(uint8_t grey) { return grey / 255.0f - 0.5f; }
void BanditTrajectories(AppoPolicy& policy, const replay::Signature& signature, int64_t count, int64_t version,
                        std::mt19937_64& rng, replay::SampledBatch* out, bool contextual = false) {
  replay::ShapeBatch(signature, count, out);
  const int steps = 4;
  const ObservationSpec& spec = policy.spec();
  std::uniform_real_distribution<float> noise(-1.0f, 1.0f);
  auto floats = [&](int field) { return reinterpret_cast<float*>(out->fields[field].data.data()); };
  const int64_t stack_bytes = int64_t{spec.frames} * spec.height * spec.width * 3;
  for (int64_t b = 0; b < count; ++b) {
    float* state = spec.pixels() ? nullptr : &floats(kTrajectoryObservation)[b * (steps + 1)];
    uint8_t* frames = spec.pixels() ? out->fields[kTrajectoryObservation].data.data() + b * (steps + 1) * stack_bytes
                                    : nullptr;
    std::vector<uint8_t> grey(steps + 1);
    for (int t = 0; t <= steps; ++t) {
      if (state != nullptr) state[t] = noise(rng);
      grey[t] = uint8_t(rng());
      for (int64_t i = 0; frames != nullptr && i < stack_bytes; ++i) {
        frames[t * stack_bytes + i] = contextual ? grey[t] : uint8_t(rng());
      }
    }
    for (int t = 0; t < steps; ++t) {
      float action, log_prob;
      TROUPE_CHECK(policy
                       .Explore(state != nullptr ? &state[t] : nullptr,
                                frames != nullptr ? frames + t * stack_bytes : nullptr, 1, {}, rng, &action, &log_prob)
                       .ok());
      floats(kTrajectoryAction)[b * steps + t] = action;
      const float target = contextual ? BanditTarget(grey[t]) : 0.5f;
      floats(kTrajectoryReward)[b * steps + t] = 1.0f - (action - target) * (action - target);
      floats(kTrajectoryDiscount)[b * steps + t] = 0.0f;
      floats(kTrajectoryLogProb)[b * steps + t] = log_prob;
    }
    reinterpret_cast<int64_t*>(out->fields[kTrajectoryVersion].data.data())[b] = version;
  }
}

// Tiny frames for the pixel tests: 2 stacked 16x16 frames, a narrow encoder
// (16 channels: with 4, every unit of a constant frame can start dead).
const ObservationSpec kPixels{.frames = 2, .height = 16, .width = 16};
config::ExperimentConfig PixelConfig(config::ExperimentConfig c) {
  c.mutable_appo()->set_conv_channels(16);
  c.mutable_appo()->set_encoder_features(16);
  return c;
}

TEST(AppoAgentTest, LearnsAOneStateBanditFromItsOwnTrajectories) {
  const config::ExperimentConfig config = BanditConfig(/*batch=*/16);
  const ObservationSpec spec{.state_size = 1};
  auto replicator = MakeReplicator(1);
  auto agent = AppoAgent::Create(config, spec, 1, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto policy = AppoPolicy::Create(config.appo(), spec, 1);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto signature = TrajectorySignature(spec, 1, 4);
  ASSERT_TRUE(signature.ok());
  std::mt19937_64 rng(3);
  std::vector<float> parameters;
  int64_t version = 0;  // the learner's after each update (one sample each)
  (*agent)->StartInput([&](int, int64_t n, replay::SampledBatch* out) {
    (*agent)->PolicyParameters(&parameters);
    RETURN_IF_ERROR((*policy)->SetParameters(parameters));
    BanditTrajectories(**policy, *signature, n, ++version, rng, out);
    return absl::OkStatus();
  });
  const float state = 0.3f;
  float before = 0, after = 0;
  ASSERT_TRUE((*policy)->Act(&state, nullptr, 1, &before).ok());
  ASSERT_TRUE((*agent)->Train(150).ok());
  (*agent)->PolicyParameters(&parameters);
  ASSERT_TRUE((*policy)->SetParameters(parameters).ok());
  ASSERT_TRUE((*policy)->Act(&state, nullptr, 1, &after).ok());
  EXPECT_NEAR(after, 0.5f, 0.1f) << "the mean action started at " << before;
  const AgentMetrics m = (*agent)->metrics();
  EXPECT_EQ(m.updates, 150);
  EXPECT_EQ(m["dropped_stale"], 0);
  // Exploration narrowed as the bandit was learned.
  EXPECT_LT(m["entropy"], 1.0 + 0.5 * std::log(2 * std::numbers::pi) - 0.5);
}

// An APPO agent of `config` on one replica, its input bandit trajectories
// of behaviour version `version` acted by a policy of its own (its
// initial weights: not the agent's), from `seed`.
struct BanditAgent {
  // `contextual`: BanditTrajectories' contextual bandit (pixels).
  BanditAgent(const config::ExperimentConfig& config, const ObservationSpec& spec, uint64_t seed,
              bool contextual = false)
      : replicator(MakeReplicator(1)), rng(seed) {
    auto made = AppoAgent::Create(config, spec, 1, replicator.get());
    TROUPE_CHECK(made.ok());
    agent = *std::move(made);
    auto acting = AppoPolicy::Create(config.appo(), spec, 1);
    TROUPE_CHECK(acting.ok());
    policy = *std::move(acting);
    auto made_signature = TrajectorySignature(spec, 1, config.appo().unroll_length());
    TROUPE_CHECK(made_signature.ok());
    signature = *std::move(made_signature);
    agent->StartInput([this, contextual](int, int64_t n, replay::SampledBatch* out) {
      BanditTrajectories(*policy, signature, n, version, rng, out, contextual);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<replicator::Replicator> replicator;
  std::unique_ptr<AppoAgent> agent;
  std::unique_ptr<AppoPolicy> policy;
  replay::Signature signature;
  std::mt19937_64 rng;
  int64_t version = 1;
};

TEST(AppoAgentTest, StaleTrajectoriesAreLeftOutAndCounted) {
  config::ExperimentConfig config = BanditConfig(/*batch=*/8);
  config.mutable_appo()->set_max_policy_lag(3);
  BanditAgent bandit(config, ObservationSpec{.state_size = 1}, /*seed=*/4);
  AppoAgent* agent = bandit.agent.get();
  // The learner publishes version updates + 1 = 1 now: version -3 lags by 4.
  bandit.version = -3;
  const std::vector<nn::CheckpointTensor> start = agent->CheckpointState();
  ASSERT_TRUE(agent->Train(1).ok());
  AgentMetrics m = agent->metrics();
  EXPECT_EQ(m["dropped_stale"], 8);
  // Nothing learned from them: the model's weights are as they were.
  const std::vector<nn::CheckpointTensor> after = agent->CheckpointState();
  for (size_t i = 0; i < start.size(); ++i) {
    if (start[i].name.starts_with("param/model/policy") || start[i].name.starts_with("param/model/value")) {
      EXPECT_EQ(start[i].values, after[i].values) << start[i].name;
    }
  }
  // Lag 3 (version -1 at update 2) is within the bound: used, none dropped.
  bandit.version = -1;
  ASSERT_TRUE(agent->Train(1).ok());
  m = agent->metrics();
  EXPECT_EQ(m["dropped_stale"], 0);
  EXPECT_EQ(m["policy_lag"], 3);
}

// appo.target_kl stops an update's epochs once one moved the policy past
// 1.5x the target: with a target no step stays under, one epoch of
// minibatch steps an update; without one, every epoch.
TEST(AppoAgentTest, TargetKlStopsTheEpochsEarly) {
  const ObservationSpec spec{.state_size = 1};
  for (const float target : {0.0f, 1e-9f}) {
    config::ExperimentConfig config = BanditConfig(/*batch=*/8);  // 2 epochs of 2 minibatches
    config.mutable_appo()->set_target_kl(target);
    BanditAgent bandit(config, spec, /*seed=*/8);
    AppoAgent* agent = bandit.agent.get();
    ASSERT_TRUE(agent->Train(3).ok());
    const std::vector<nn::CheckpointTensor> state = agent->CheckpointState();
    const std::vector<int64_t> counters = nn::Int64sOf(state.back());  // updates, Adam's steps, observations
    EXPECT_EQ(counters[1], target > 0 ? 3 * 2 : 3 * 2 * 2) << "target_kl " << target;
    EXPECT_EQ(agent->metrics()["epochs"], target > 0 ? 1 : 2);
  }
}

// appo.decoupled_clip: PPO's ratio is taken against the policy at the
// update's start, not the behaviour that acted (here a policy of other
// weights). One minibatch step an epoch: the first step's ratio is then 1
// on every row (no KL, nothing clipped) however far the behaviour is, and
// the second epoch's is measured from the update's start, not its own.
TEST(AppoAgentTest, ADecoupledClipTakesTheRatioAgainstThePolicyAtTheUpdatesStart) {
  const ObservationSpec spec{.state_size = 1};
  auto one_update = [&](bool decoupled, int epochs) {
    config::ExperimentConfig config = BanditConfig(/*batch=*/8);
    config.mutable_appo()->set_decoupled_clip(decoupled);
    config.mutable_appo()->set_epochs(epochs);
    config.mutable_appo()->set_minibatches(1);
    BanditAgent bandit(config, spec, /*seed=*/5);
    TROUPE_CHECK(bandit.agent->Train(1).ok());
    return bandit.agent->metrics();
  };
  const AgentMetrics behaviour = one_update(/*decoupled=*/false, /*epochs=*/1);
  EXPECT_GT(behaviour["approx_kl"], 1e-3) << "the behaviour policy is not the agent's";
  const AgentMetrics start = one_update(/*decoupled=*/true, /*epochs=*/1);
  EXPECT_LT(start["approx_kl"], 1e-9);
  EXPECT_EQ(start["clip_fraction"], 0);
  // Epochs 1 and 2: the second's ratio moved by the first's step.
  EXPECT_GT(one_update(/*decoupled=*/true, /*epochs=*/2)["approx_kl"], 1e-7);
}

// appo.min_log_std: the bandit narrows the policy's exploration (its log
// standard deviation falls from -0.5 below -0.6 without a floor); with the
// floor at -0.6 it stops there, exactly, in every dimension.
TEST(AppoAgentTest, AMinimumLogStdKeepsExplorationAtLeastThatWide) {
  const ObservationSpec spec{.state_size = 1};
  auto log_std_after = [&](bool floor) {
    config::ExperimentConfig config = BanditConfig(/*batch=*/16);
    if (floor) config.mutable_appo()->set_min_log_std(-0.6f);
    BanditAgent bandit(config, spec, /*seed=*/6);
    TROUPE_CHECK(bandit.agent->Train(80).ok());
    for (const nn::CheckpointTensor& t : bandit.agent->CheckpointState()) {
      if (t.name.ends_with("policy.log_std")) return t.values;
    }
    return std::vector<float>{};
  };
  const std::vector<float> free = log_std_after(false);
  ASSERT_EQ(free.size(), 1u);
  EXPECT_LT(free[0], -0.6f);
  EXPECT_EQ(log_std_after(true), std::vector<float>{-0.6f});
}

// appo.anneal_learning_rate: the rate falls to 0 at the run's total_frames,
// so an update past them leaves the model as it was.
TEST(AppoAgentTest, AnnealedLearningRateReachesZeroAtTheRunsEnd) {
  const ObservationSpec spec{.state_size = 1};
  config::ExperimentConfig config = BanditConfig(/*batch=*/8);
  config.mutable_appo()->set_anneal_learning_rate(true);
  config.mutable_env()->set_action_repeat(1);
  config.set_total_frames(2 * 8 * 4);  // two updates of 8 trajectories of 4 steps
  BanditAgent bandit(config, spec, /*seed=*/8);
  AppoAgent* agent = bandit.agent.get();
  auto model = [&] {
    std::vector<float> all;
    agent->PolicyParameters(&all);
    all.resize(all.size() - 2);  // the normaliser's mean and std
    return all;
  };
  const std::vector<float> start = model();
  ASSERT_TRUE(agent->Train(1).ok());
  const std::vector<float> first = model();
  EXPECT_NE(first, start) << "update 0 at the full rate";
  ASSERT_TRUE(agent->Train(1).ok());
  const std::vector<float> second = model();
  EXPECT_NE(second, first) << "update 1 at half the rate";
  ASSERT_TRUE(agent->Train(1).ok());
  EXPECT_EQ(model(), second) << "update 2 at rate 0";
}

// The whole batch on K=1, and halves of it on K=2 (one minibatch per epoch,
// so both take the same steps): the same training state, from `updates`
// bandit batches of `batch` trajectories observing `spec`.
void ExpectTwoReplicasEqualOne(const config::ExperimentConfig& config, const ObservationSpec& spec, int updates) {
  const int64_t batch = config.learner().batch_size();
  auto policy = AppoPolicy::Create(config.appo(), spec, 1);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto signature = TrajectorySignature(spec, 1, 4);
  ASSERT_TRUE(signature.ok());
  // The batches, made once.
  std::mt19937_64 rng(9);
  std::vector<replay::SampledBatch> batches(updates);
  for (auto& b : batches) BanditTrajectories(**policy, *signature, batch, 1, rng, &b);
  std::vector<std::vector<nn::CheckpointTensor>> states;
  std::vector<nn::CheckpointTensor> start;
  for (const int k : {1, 2}) {
    auto replicator = MakeReplicator(k);
    auto agent = AppoAgent::Create(config, spec, 1, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (start.empty()) start = (*agent)->CheckpointState();
    std::vector<int64_t> taken(k, 0);
    (*agent)->StartInput([&](int replica, int64_t n, replay::SampledBatch* out) {
      // Replica r's shard: rows [r n, (r + 1) n) of the update's batch.
      const replay::SampledBatch& whole = batches[taken[replica]++];
      replay::ShapeBatch(*signature, n, out);
      for (size_t f = 0; f < out->fields.size(); ++f) {
        const size_t row = whole.fields[f].data.size() / batch;
        std::copy_n(whole.fields[f].data.begin() + replica * n * row, n * row, out->fields[f].data.begin());
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE((*agent)->Train(updates).ok());
    states.push_back((*agent)->CheckpointState());
  }
  TROUPE_EXPECT_SAME_STATE(start, states[0], states[1], .tolerance = 1e-4);
}

TEST(AppoAgentTest, TwoReplicasEqualOneOnTheWholeBatch) {
  config::ExperimentConfig config = BanditConfig(/*batch=*/8);
  config.mutable_appo()->set_minibatches(1);
  config.mutable_appo()->set_entropy_coef(0.01f);
  ExpectTwoReplicasEqualOne(config, ObservationSpec{.state_size = 1}, /*updates=*/3);
}

// The same from pixels: the encoder's gradients (from both losses) are
// averaged like the rest.
TEST(AppoAgentTest, TwoReplicasEqualOneOnTheWholeBatchFromPixels) {
  config::ExperimentConfig config = PixelConfig(BanditConfig(/*batch=*/4));
  config.mutable_appo()->set_minibatches(1);
  ExpectTwoReplicasEqualOne(config, kPixels, /*updates=*/2);
}

// A contextual bandit from pixels: the action to take is the frames' grey
// level, so the encoder must read the right frames of each step.
TEST(AppoAgentTest, LearnsAContextualBanditFromPixels) {
  config::ExperimentConfig config = PixelConfig(BanditConfig(/*batch=*/8));
  const auto replicator = MakeReplicator(1);
  auto agent = AppoAgent::Create(config, kPixels, 1, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto policy = AppoPolicy::Create(config.appo(), kPixels, 1);
  ASSERT_TRUE(policy.ok());
  auto signature = TrajectorySignature(kPixels, 1, 4);
  ASSERT_TRUE(signature.ok());
  std::mt19937_64 rng(13);
  std::vector<float> parameters;
  int64_t version = 0;
  (*agent)->StartInput([&](int, int64_t n, replay::SampledBatch* out) {
    (*agent)->PolicyParameters(&parameters);
    RETURN_IF_ERROR((*policy)->SetParameters(parameters));
    BanditTrajectories(**policy, *signature, n, ++version, rng, out, /*contextual=*/true);
    return absl::OkStatus();
  });
  ASSERT_TRUE((*agent)->Train(200).ok());
  (*agent)->PolicyParameters(&parameters);
  ASSERT_TRUE((*policy)->SetParameters(parameters).ok());
  for (const uint8_t grey : {30, 128, 225}) {
    const std::vector<uint8_t> frames(2 * 16 * 16 * 3, grey);
    float action = 0;
    ASSERT_TRUE((*policy)->Act(nullptr, frames.data(), 1, &action).ok());
    EXPECT_NEAR(action, BanditTarget(grey), 0.15f) << "grey " << int(grey);
  }
}

// appo.detach_policy_features: the policy reads the encoder's features as
// constants, so with no value loss (value_coef 0) an update leaves the
// encoder exactly as it was while the policy's head moves; the shared
// encoder otherwise moves with the policy's loss alone, and with the value
// loss when detached.
TEST(AppoAgentTest, DetachedPolicyFeaturesLeaveTheEncoderToTheValueLoss) {
  // Whether an update changed any tensor (values or moments) named `part`.
  auto moved = [](bool detach, float value_coef, const std::string& part) {
    config::ExperimentConfig config = PixelConfig(BanditConfig(/*batch=*/8));
    config.mutable_appo()->set_detach_policy_features(detach);
    config.mutable_appo()->set_value_coef(value_coef);
    BanditAgent bandit(config, kPixels, /*seed=*/3);
    const std::vector<nn::CheckpointTensor> before = bandit.agent->CheckpointState();
    TROUPE_CHECK(bandit.agent->Train(1).ok());
    const std::vector<nn::CheckpointTensor> after = bandit.agent->CheckpointState();
    TROUPE_CHECK(before.size() == after.size());
    int named = 0;
    bool changed = false;
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i].name.find(part) == std::string::npos) continue;
      ++named;
      changed = changed || before[i].values != after[i].values;
    }
    if (named == 0) ADD_FAILURE() << "no tensor named " << part;
    return changed;
  };
  EXPECT_TRUE(moved(/*detach=*/false, /*value_coef=*/0, "encoder.")) << "the policy's loss trains a shared encoder";
  EXPECT_FALSE(moved(/*detach=*/true, /*value_coef=*/0, "encoder.")) << "a detached policy's loss reached the encoder";
  EXPECT_TRUE(moved(/*detach=*/true, /*value_coef=*/0, "policy."));
  EXPECT_TRUE(moved(/*detach=*/true, /*value_coef=*/0.5f, "encoder.")) << "the value loss trains the encoder";
}

// appo.augment_pad: each minibatch step's frames are shifted at random
// (replicate-padded, cropped back). A frame of one grey level is its own
// shift, so on the contextual bandit's uniform frames an update equals the
// one without augmentation exactly; on frames of noise it does not.
TEST(AppoAgentTest, AugmentationShiftsTheFramesOfEveryMinibatchStep) {
  auto state_after = [](int pad, bool contextual) {
    config::ExperimentConfig config = PixelConfig(BanditConfig(/*batch=*/8));
    config.mutable_appo()->set_augment_pad(pad);
    BanditAgent bandit(config, kPixels, /*seed=*/21, contextual);
    TROUPE_CHECK(bandit.agent->Train(2).ok());
    return bandit.agent->CheckpointState();
  };
  for (const bool contextual : {true, false}) {
    const std::vector<nn::CheckpointTensor> plain = state_after(0, contextual), shifted = state_after(4, contextual);
    ASSERT_EQ(plain.size(), shifted.size());
    bool same = true;
    for (size_t i = 0; i < plain.size(); ++i) same = same && plain[i].values == shifted[i].values;
    EXPECT_EQ(same, contextual) << (contextual ? "uniform frames" : "frames of noise");
  }
}

TEST(AppoAgentTest, CheckpointRoundTripAndThePolicyLoadsIt) {
  const config::ExperimentConfig config = BanditConfig(/*batch=*/8);
  const ObservationSpec spec{.state_size = 1};
  BanditAgent bandit(config, spec, /*seed=*/6);
  AppoAgent* agent = bandit.agent.get();
  AppoPolicy* policy = bandit.policy.get();
  replicator::Replicator* replicator = bandit.replicator.get();
  ASSERT_TRUE(agent->Train(3).ok());
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("appo_ckpt.", ::getpid())).string();
  ASSERT_TRUE(agent->Save(path).ok());
  auto fresh = AppoAgent::Create(config, spec, 1, replicator);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE((*fresh)->StateChecksum(), agent->StateChecksum());
  ASSERT_TRUE((*fresh)->Load(path).ok());
  EXPECT_EQ((*fresh)->StateChecksum(), agent->StateChecksum());
  EXPECT_EQ((*fresh)->updates(), 3);
  // The policy from the file acts as the policy given the agent's parameters.
  auto loaded = AppoPolicy::Create(config.appo(), spec, 1);
  auto updates = (*loaded)->LoadAgentCheckpoint(path);
  ASSERT_TRUE(updates.ok()) << updates.status();
  EXPECT_EQ(*updates, 3);
  std::vector<float> parameters;
  agent->PolicyParameters(&parameters);
  ASSERT_TRUE(policy->SetParameters(parameters).ok());
  const float state = 0.7f;
  float a = 0, b = 0;
  ASSERT_TRUE(policy->Act(&state, nullptr, 1, &a).ok());
  ASSERT_TRUE((*loaded)->Act(&state, nullptr, 1, &b).ok());
  EXPECT_NEAR(a, b, 1e-6);
  // Another agent's (or task's) file is refused, naming the entry.
  config::ExperimentConfig wider = config;
  wider.mutable_appo()->set_hidden(0, 32);
  auto other = AppoAgent::Create(wider, spec, 1, replicator);
  const absl::Status refused = (*other)->Load(path);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("policy.0"));
  std::filesystem::remove(path);
}

// However far the policy MLP's output runs, the Gaussian's mean stays
// within kMeanBound: the deterministic action is at most tanh(kMeanBound),
// and an action explored there has a finite log-density near its mean's.
TEST(AppoPolicyTest, TheMeanIsBoundedWhereTanhStillMoves) {
  const config::ExperimentConfig config = BanditConfig(8);
  const ObservationSpec spec{.state_size = 1};
  auto policy = AppoPolicy::Create(config.appo(), spec, 1);
  ASSERT_TRUE(policy.ok());
  std::vector<float> parameters = (*policy)->DownloadParameters();
  // The policy MLP's last bias ("policy.1.b", declared before log_std) at 100.
  nn::ParameterSet layout;
  internal::AppoNetworks::Declare(layout, config.appo(), spec, 1);
  const int bias = layout.Find("policy.1.b");
  ASSERT_GE(bias, 0);
  parameters[layout.info(bias).offset] = 100.0f;
  ASSERT_TRUE((*policy)->SetParameters(parameters).ok());
  const float state = 0.1f;
  float action = 0;
  ASSERT_TRUE((*policy)->Act(&state, nullptr, 1, &action).ok());
  EXPECT_NEAR(action, std::tanh(internal::kMeanBound), 1e-6);
  EXPECT_LT(action, 1.0f);
  std::mt19937_64 rng(1);
  float log_prob = 0;
  ASSERT_TRUE((*policy)->Explore(&state, nullptr, 1, {}, rng, &action, &log_prob).ok());
  EXPECT_GT(log_prob, -10.0f) << "the sample stays near the bounded mean";
}

TEST(AppoAgentTest, BadSettingsAreRefusedNamingTheField) {
  const ObservationSpec spec{.state_size = 3};
  auto replicator = MakeReplicator(2);
  auto refused = [&](config::ExperimentConfig c) {
    auto agent = AppoAgent::Create(c, spec, 2, replicator.get());
    return agent.ok() ? std::string("accepted") : std::string(agent.status().message());
  };
  config::ExperimentConfig c = BanditConfig(8);
  c.mutable_appo()->set_clip(0);
  EXPECT_THAT(refused(c), HasSubstr("appo.clip 0"));
  c = BanditConfig(7);
  EXPECT_THAT(refused(c), HasSubstr("learner.batch_size 7"));
  c = BanditConfig(2);
  c.mutable_appo()->set_minibatches(5);  // 1 trajectory x 4 steps per replica
  EXPECT_THAT(refused(c), HasSubstr("appo.minibatches 5"));
  c = BanditConfig(8);
  c.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
  EXPECT_THAT(refused(c), HasSubstr("PJRT"));
  c = BanditConfig(8);
  c.mutable_appo()->set_min_log_std(-9);
  EXPECT_THAT(refused(c), HasSubstr("appo.min_log_std -9: must be in [-5, 5]"));
  c = PixelConfig(BanditConfig(8));
  c.mutable_appo()->set_augment_pad(-1);
  EXPECT_THAT(std::string(AppoAgent::Create(c, kPixels, 2, replicator.get()).status().message()),
              HasSubstr("appo.augment_pad -1: must be in [0, 32]"));
  auto tiny = AppoAgent::Create(BanditConfig(8), ObservationSpec{.frames = 3, .height = 14, .width = 14}, 2,
                                replicator.get());
  EXPECT_THAT(std::string(tiny.status().message()), HasSubstr("too small for the encoder"));
}

}  // namespace
}  // namespace troupe::agents
