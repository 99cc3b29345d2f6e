// The GAN trainer tests' data and configs, shared by gan/trainer_test.cc and
// the MPI test program (gan/trainer_mpi_test_main.cc).
#ifndef TROUPE_GAN_TRAINER_TEST_CONFIGS_H_
#define TROUPE_GAN_TRAINER_TEST_CONFIGS_H_

#include <cstdint>
#include <random>

#include "gan/trainer.h"
#include "proto/config.pb.h"

namespace troupe::gan::testing {

// `count` random training images in [-1, 1], the same every time.
inline GanData RandomData(int64_t count) {
  GanData data;
  data.train_count = count;
  data.train.resize(count * kPixels);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (float& v : data.train) v = d(rng);
  return data;
}

inline config::GanConfig TinyConfig(int replicas, config::GanConfig::Loss loss = config::GanConfig::HINGE) {
  config::GanConfig c;
  c.set_batch_size(8);
  c.mutable_engine()->set_replicas(replicas);
  c.set_noise_size(8);
  c.set_generator_channels(4);
  c.set_discriminator_channels(4);
  c.set_loss(loss);
  c.set_n_critic(2);
  c.set_warmup_images(0);
  c.mutable_engine()->set_threads(1);
  c.mutable_engine()->set_seed(5);
  return c;
}

// The steps an equivalence test trains both sides for before comparing
// their whole state (the replicated, sharded and split against one replica).
inline constexpr int kEquivalenceSteps = 20;

// TinyConfig for the equivalence tests: learning rates (1e-3 and 5e-4 per
// step after linear scaling from batch 64) and an EMA half life (one step)
// at which every part of the state (G, D, their Adam moments, the EMA, the
// spectral norm's power vectors) moves in a step by far more than the
// tolerances, so a path that skips any of them fails by a wide margin.
inline config::GanConfig EquivalenceConfig(int replicas) {
  config::GanConfig c = TinyConfig(replicas);
  c.set_generator_learning_rate(8e-3f);
  c.set_discriminator_learning_rate(4e-3f);
  c.set_ema_half_life_images(16);
  return c;
}

}  // namespace troupe::gan::testing

#endif  // TROUPE_GAN_TRAINER_TEST_CONFIGS_H_
