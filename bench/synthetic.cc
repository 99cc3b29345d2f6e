#include "bench/synthetic.h"

#include <cstdlib>
#include <random>

#include "common/status_macros.h"

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

std::vector<uint8_t> SceneFrame(int t) {
  std::vector<uint8_t> f(kSceneFrameBytes);
  uint32_t noise = 2463534242u;
  for (int y = 0; y < kSceneSide; ++y) {
    for (int x = 0; x < kSceneSide; ++x) {
      const bool block = std::abs(x - (12 + t % 60)) < 6 && std::abs(y - (30 + (t / 60) % 30)) < 8;
      for (int c = 0; c < 3; ++c) {
        noise ^= noise << 13;
        noise ^= noise >> 17;
        noise ^= noise << 5;
        const uint8_t floor = static_cast<uint8_t>(90 + 20 * c + (y / 6) * 3 + (noise >> 29));
        f[(y * kSceneSide + x) * 3 + c] = block ? static_cast<uint8_t>(230 - 30 * c) : floor;
      }
    }
  }
  return f;
}

absl::Status TransitionStream::Write(int count) {
  for (int i = 0; i < count; ++i) {
    while (static_cast<int>(keys_.size()) < next_ + 6) {
      const std::vector<uint8_t> frame = SceneFrame(static_cast<int>(keys_.size()));
      ASSIGN_OR_RETURN(const uint64_t key, writer_->AppendFrame(frame.data(), kSceneSide, kSceneSide, 3));
      keys_.push_back(key);
    }
    const int t = next_++;
    const float action = 0.01f * static_cast<float>(t % 100), reward = 0.5f, discount = 0.97f;
    RETURN_IF_ERROR(writer_->Insert(
        agents::kTransitionTable, 1.0,
        {replay::FieldValue::Frames({keys_[t], keys_[t + 1], keys_[t + 2]}),
         replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {1}, &action),
         replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
         replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount),
         replay::FieldValue::Frames({keys_[t + 3], keys_[t + 4], keys_[t + 5]})}));
  }
  return writer_->Flush();
}

absl::StatusOr<FilledReplay> FillTransitions(const config::ExperimentConfig& config, int held) {
  config::ReplayConfig replay_config;
  *replay_config.add_tables() = agents::TransitionTable(kSceneSpec, /*action_size=*/1, config);
  FilledReplay r;
  ASSIGN_OR_RETURN(r.replay, replay::Replay::Create(replay_config));
  r.client = replay::NewLocalClient(r.replay.get());
  ASSIGN_OR_RETURN(r.writer, r.client->NewWriter());
  r.stream = std::make_unique<TransitionStream>(r.writer.get());
  RETURN_IF_ERROR(r.stream->Write(held));
  return r;
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
