// The D4PG agent tests' configs and batches, shared by agents/d4pg_test.cc
// and the MPI test program (agents/d4pg_mpi_test_main.cc).
#ifndef TROUPE_AGENTS_D4PG_TEST_DATA_H_
#define TROUPE_AGENTS_D4PG_TEST_DATA_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "agents/d4pg_agent.h"
#include "agents/transition.h"
#include "common/status_macros.h"
#include "proto/config.pb.h"
#include "replay/item.h"
#include "replay/replay.h"

namespace troupe::agents::d4pg_test {

inline config::ExperimentConfig TinyConfig(int batch, std::vector<int> hidden) {
  config::ExperimentConfig c;
  c.mutable_learner()->set_batch_size(batch);
  c.mutable_learner()->mutable_engine()->set_threads(1);
  c.mutable_learner()->mutable_engine()->set_seed(7);
  config::D4pgConfig* d = c.mutable_d4pg();
  for (int h : hidden) d->add_hidden(h);
  d->set_atoms(21);
  d->set_v_min(0.0f);
  d->set_v_max(1.0f);
  d->set_actor_learning_rate(1e-3f);
  d->set_critic_learning_rate(1e-3f);
  return c;
}

// TinyConfig's batch of 16 and two hidden layers of 32, its targets moving
// by more than a test's tolerance (tau 0.1) and its gradients clipped (0.5).
inline config::ExperimentConfig ClippedConfig() {
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);
  c.mutable_d4pg()->set_max_gradient_norm(0.5f);
  return c;
}

// A float field of a batch being filled (replay's bytes, viewed as floats).
inline float* Floats(replay::SampledBatch* out, int field) {
  return reinterpret_cast<float*>(out->fields[field].data.data());
}

// Fills rows [begin, begin + n) of a global batch generated from `seed` into
// *out, shaped as replay shapes it for TransitionTable: a contextual
// bandit (obs ~ U[-1, 1]^S, random actions, reward 1 - (a0 - obs0)^2 clipped
// to [0, 1], discount 0). Pixel fields get random bytes.
inline void BanditBatch(const ObservationSpec& spec, int action_size, const config::ExperimentConfig& config,
                        uint64_t seed, int64_t global, int64_t begin, int64_t n, replay::SampledBatch* out) {
  auto signature = replay::Signature::FromConfig(TransitionTable(spec, action_size, config));
  TROUPE_CHECK(signature.ok());
  replay::ShapeBatch(*signature, n, out);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t obs_size = spec.pixels() ? int64_t{spec.frames} * spec.height * spec.width * 3 : spec.state_size;
  for (int64_t row = 0; row < global; ++row) {
    // Draw every row (so shards of one global batch agree), keep ours.
    std::vector<float> obs(obs_size), next(obs_size), action(action_size);
    for (float& v : obs) v = u(rng);
    for (float& v : next) v = u(rng);
    for (float& v : action) v = u(rng);
    const float reward = std::clamp(1.0f - (action[0] - obs[0]) * (action[0] - obs[0]), 0.0f, 1.0f);
    if (row < begin || row >= begin + n) continue;
    const int64_t i = row - begin;
    out->keys[i] = row;
    for (int field : {0, 4}) {
      const std::vector<float>& src = field == 0 ? obs : next;
      if (spec.pixels()) {
        uint8_t* dst = out->fields[field].data.data() + i * obs_size;
        for (int64_t k = 0; k < obs_size; ++k) dst[k] = static_cast<uint8_t>(127.5f * (src[k] + 1.0f));
      } else {
        std::copy(src.begin(), src.end(), Floats(out, field) + i * obs_size);
      }
    }
    std::copy(action.begin(), action.end(), Floats(out, 1) + i * action_size);
    // Importance weights, read when learner.prioritized (replay shapes them
    // as zeros, which would leave the critic unmoved).
    out->weights[i] = 0.5f + 0.5f * std::fabs(obs[0]);
    Floats(out, 2)[i] = reward;
    Floats(out, 3)[i] = 0.0f;
  }
}

// A sample function serving global batch `seed` split over the replicas.
inline D4pgAgent::SampleFn Bandit(const ObservationSpec& spec, int action_size,
                                  const config::ExperimentConfig& config, uint64_t seed) {
  return [=](int replica, int64_t n, replay::SampledBatch* out) {
    BanditBatch(spec, action_size, config, seed, config.learner().batch_size(), replica * n, n, out);
    return absl::OkStatus();
  };
}

// The same for a critic split over meshes of M parts (learner.engine.
// model_parallel): only part 0 of a model copy samples, that copy's rows.
inline D4pgAgent::SampleFn MeshBandit(const ObservationSpec& spec, const config::ExperimentConfig& c, int m,
                                      uint64_t seed) {
  return [=](int replica, int64_t n, replay::SampledBatch* out) {
    TROUPE_CHECK(replica % m == 0);
    return Bandit(spec, 2, c, seed)(replica / m, n, out);
  };
}

}  // namespace troupe::agents::d4pg_test

#endif  // TROUPE_AGENTS_D4PG_TEST_DATA_H_
