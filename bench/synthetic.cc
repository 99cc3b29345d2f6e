#include "bench/synthetic.h"

#include <random>

namespace troupe::bench {

absl::StatusOr<replay::SampledBatch> RandomD4pgBatch(const agents::ObservationSpec& spec, int action_size,
                                                     const config::ExperimentConfig& config, int64_t batch,
                                                     uint32_t seed) {
  auto signature = replay::Signature::FromConfig(agents::TransitionTable(spec, action_size, config));
  if (!signature.ok()) return signature.status();
  replay::SampledBatch data;
  replay::ShapeBatch(*signature, batch, &data);
  std::mt19937 rng(seed);
  for (auto& field : data.fields) {
    if (field.dtype == proto::DTYPE_UINT8) {
      for (auto& b : field.data) b = static_cast<uint8_t>(rng());
    } else {
      float* f = reinterpret_cast<float*>(field.data.data());
      for (size_t i = 0; i < field.data.size() / 4; ++i) f[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    }
  }
  return data;
}

agents::D4pgAgent::SampleFn ServeEveryUpdate(const replay::SampledBatch& data) {
  return [&data](int, int64_t, replay::SampledBatch* out) {
    if (out->keys.empty()) *out = data;  // the first update: copy once, then keep it
    return absl::OkStatus();
  };
}

gan::GanData RandomGanData(int64_t count) {
  gan::GanData data;
  data.train_count = count;
  data.train.resize(data.train_count * 28 * 28);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> pixel(-1.0f, 1.0f);
  for (float& v : data.train) v = pixel(rng);
  return data;
}

}  // namespace troupe::bench
