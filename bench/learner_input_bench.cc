// `troupe bench learner-input`: what feeding a D4PG pixel learner costs on
// its input side, the device frame table (agents/device_frames.h) against
// the host-assembled path measured in the same run, on one thread and the
// CPU backend (the device's memory is the host's: a gather is a copy).
//
// Replay holds D4PG transitions of 84x84 frames stacked 3 (n-step
// transitions sharing frames, as actors write them); each update inserts
// batch / samples_per_insert new transitions (untimed: the actors' side)
// and then
//  - host-assembled: samples a batch with its pixels decoded and uploads
//    both observation fields (the learner's path before the table);
//  - device frames: samples frame references, uploads the frames the device
//    lacks (one upload, one scatter) and the batch's slots; the stacked
//    observations are gathered inside the first layer's uint8 -> float
//    conversion (the learner's path).
// Figures: bytes uploaded per update, frames uploaded per update against
// frames inserted, input transitions/s of each, and the same through the
// first layer's float input (each path's conversion kernel included: on
// the CPU backend it writes 130 MB of floats a batch either way).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "agents/d4pg_agent.h"
#include "agents/device_frames.h"
#include "bench/bench.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "replay/client.h"
#include "replay/replay.h"

namespace troupe::bench {
namespace {

constexpr int kSide = 84, kStack = 3, kBatch = 256;
constexpr int64_t kFrameBytes = int64_t{kSide} * kSide * 3;

// A frame like a rendered one: a fixed textured floor (compresses poorly on
// its own) and a block that moves with t.
std::vector<uint8_t> SceneFrame(int t) {
  std::vector<uint8_t> f(kFrameBytes);
  uint32_t noise = 2463534242u;
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      const bool block = std::abs(x - (12 + t % 60)) < 6 && std::abs(y - (30 + (t / 60) % 30)) < 8;
      for (int c = 0; c < 3; ++c) {
        noise ^= noise << 13;
        noise ^= noise >> 17;
        noise ^= noise << 5;
        const uint8_t floor = static_cast<uint8_t>(90 + 20 * c + (y / 6) * 3 + (noise >> 29));
        f[(y * kSide + x) * 3 + c] = block ? static_cast<uint8_t>(230 - 30 * c) : floor;
      }
    }
  }
  return f;
}

// An actor's stream of transitions: frame t+5 appended, then transition t
// (observation frames t..t+2, next observation t+3..t+5).
class TransitionStream {
 public:
  explicit TransitionStream(replay::Writer* writer) : writer_(writer) {}
  absl::Status Write(int count) {
    for (int i = 0; i < count; ++i) {
      while (static_cast<int>(keys_.size()) < next_ + 6) {
        const std::vector<uint8_t> frame = SceneFrame(static_cast<int>(keys_.size()));
        ASSIGN_OR_RETURN(const uint64_t key, writer_->AppendFrame(frame.data(), kSide, kSide, 3));
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
  int64_t frames() const { return static_cast<int64_t>(keys_.size()); }

 private:
  replay::Writer* writer_;
  std::vector<uint64_t> keys_;
  int next_ = 0;
};

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::StatusOr<Report> RunLearnerInputBenchmark(const Options& options) {
  Report report;
  report.benchmark = "learner-input";
  const int held = options.quick ? 3000 : 20000;  // transitions replay holds
  const int samples_per_insert = 32;
  const int inserts_per_update = kBatch / samples_per_insert;
  const agents::ObservationSpec spec{.frames = kStack, .height = kSide, .width = kSide};
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(kBatch);
  config.mutable_learner()->set_replay_size(held);
  config.mutable_learner()->set_min_replay_size(1);
  config::ReplayConfig replay_config;
  *replay_config.add_tables() = agents::D4pgTransitionTable(spec, 1, config);
  ASSIGN_OR_RETURN(std::unique_ptr<replay::Replay> replay, replay::Replay::Create(replay_config));
  auto client = replay::NewLocalClient(replay.get());
  ASSIGN_OR_RETURN(std::unique_ptr<replay::Writer> writer, client->NewWriter());
  TransitionStream stream(writer.get());
  RETURN_IF_ERROR(stream.Write(held));

  nn::CpuBackend device(/*num_threads=*/1);
  const int64_t batch_frames = int64_t{kBatch} * 2 * kStack;
  const double seconds = std::max(1.0, 3.0 * options.seconds_per_figure);

  // --- Host-assembled: decoded batches, both observation fields uploaded.
  ASSIGN_OR_RETURN(auto host_sampler, client->NewSampler({.table = agents::kTransitionTable, .batch_size = kBatch}));
  replay::SampledBatch host;
  RETURN_IF_ERROR(host_sampler->Next(&host));
  const size_t field_bytes = host.fields[0].data.size();
  nn::DeviceBuffer host_pixels(device, static_cast<int64_t>(2 * field_bytes / 4));
  nn::DeviceBuffer planes(device, batch_frames * kFrameBytes);  // the first layer's input, both paths
  const int64_t pixels = int64_t{kSide} * kSide;
  double host_time = 0, host_convert_time = 0;
  int64_t host_batches = 0;
  while (host_time < seconds) {
    RETURN_IF_ERROR(stream.Write(inserts_per_update));
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(host_sampler->Next(&host));
    device.Upload(host.fields[0].data.data(), host_pixels.data(), field_bytes);
    device.Upload(host.fields[4].data.data(), reinterpret_cast<uint8_t*>(host_pixels.data()) + field_bytes,
                  field_bytes);
    const auto uploaded = std::chrono::steady_clock::now();
    device.BytesToFloatPlanar(batch_frames, pixels, 3, 1.0f / 255.0f,
                              reinterpret_cast<const uint8_t*>(host_pixels.data()), planes.data());
    host_time += Seconds(uploaded - start);
    host_convert_time += Seconds(std::chrono::steady_clock::now() - uploaded);
    ++host_batches;
  }
  const double host_bytes_per_update = 2.0 * static_cast<double>(field_bytes);
  const double host_rate = static_cast<double>(host_batches) * kBatch / host_time;
  const double host_layer_rate = static_cast<double>(host_batches) * kBatch / (host_time + host_convert_time);

  // --- Device frames: references, new frames once, slots, a gather.
  const agents::DeviceFrameSizing sizing = agents::DeviceFrameSlots(config, spec, 1);
  RETURN_IF_ERROR(agents::DeviceFrameTable::Check(sizing.slots, kFrameBytes, batch_frames));
  agents::DeviceFrameTable table(&device, sizing.slots, kFrameBytes, sizing.max_slots);
  ASSIGN_OR_RETURN(auto sampler, client->NewSampler({.table = agents::kTransitionTable, .batch_size = kBatch,
                                                     .frame_references = true}));
  replay::SampledBatch batch;
  replay::FrameDecoder decoder;
  std::vector<int32_t> resolved, gather_slots(batch_frames);
  nn::DeviceBuffer device_slots(device, batch_frames);
  // One update's input (the gather is the first layer's, timed apart):
  // returns the bytes it uploaded besides the table's.
  auto update = [&]() -> absl::StatusOr<int64_t> {
    RETURN_IF_ERROR(sampler->Next(&batch));
    RETURN_IF_ERROR(table.Resolve(batch.frames, decoder, &resolved));
    // Gather order: every observation's frames, then every next observation's.
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t j = 0; j < kStack; ++j) {
        gather_slots[b * kStack + j] = resolved[b * 2 * kStack + j];
        gather_slots[(kBatch + b) * kStack + j] = resolved[b * 2 * kStack + kStack + j];
      }
    }
    const int64_t slot_bytes = static_cast<int64_t>(sizeof(int32_t)) * batch_frames;
    device.Upload(gather_slots.data(), device_slots.data(), slot_bytes);
    return slot_bytes;
  };
  auto gather = [&] {
    table.GatherToFloatPlanar(batch_frames, reinterpret_cast<const int32_t*>(device_slots.data()), 3,
                              1.0f / 255.0f, planes.data());
  };
  // Warm-up: a few passes over replay put its frames on the device (the
  // learner's first minutes), then the steady state is measured.
  const int64_t warmup = 3 * held / kBatch + 1;
  for (int64_t i = 0; i < warmup; ++i) {
    RETURN_IF_ERROR(stream.Write(inserts_per_update));
    RETURN_IF_ERROR(update().status());
    gather();
  }
  const agents::DeviceFrameStats before = table.stats();
  const int64_t frames_before = stream.frames();
  double device_time = 0, device_gather_time = 0;
  int64_t device_batches = 0, slot_bytes = 0;
  while (device_time < seconds) {
    RETURN_IF_ERROR(stream.Write(inserts_per_update));
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const int64_t bytes, update());
    const auto resolved_at = std::chrono::steady_clock::now();
    gather();
    device_time += Seconds(resolved_at - start);
    device_gather_time += Seconds(std::chrono::steady_clock::now() - resolved_at);
    slot_bytes += bytes;
    ++device_batches;
  }
  const agents::DeviceFrameStats after = table.stats();
  const double updates = static_cast<double>(device_batches);
  const double device_bytes_per_update =
      static_cast<double>(after.bytes_uploaded - before.bytes_uploaded + slot_bytes) / updates;
  const double uploaded_per_update = static_cast<double>(after.frames_uploaded - before.frames_uploaded) / updates;
  const double inserted_per_update = static_cast<double>(stream.frames() - frames_before) / updates;
  const double device_rate = updates * kBatch / device_time;
  const double device_layer_rate = updates * kBatch / (device_time + device_gather_time);

  const std::string setup = absl::StrFormat("batch %d, 84x84x3 stacked 3, %d transitions held, %d inserted/update",
                                            kBatch, held, inserts_per_update);
  report.Add(absl::StrFormat("bytes uploaded per D4PG pixel update, device frames (%s; bar: <= 0.01x)", setup),
             device_bytes_per_update, "bytes", "host-assembled batch upload", host_bytes_per_update);
  report.Add("frames uploaded per update (steady state) vs frames inserted per update", uploaded_per_update,
             "frames", "frames inserted", inserted_per_update);
  report.Add(absl::StrFormat("frames a batch uses (%ld) vs frames uploaded per update", batch_frames),
             static_cast<double>(batch_frames), "frames", "frames uploaded", uploaded_per_update);
  report.Add("input side, one thread: sample keys + new frames + slots (the gather is in the first layer; bar: "
             ">= 200,000/s)",
             device_rate, "transitions/s", "host-assembled: sample + decode + upload", host_rate);
  report.Add("to the first layer's float input, one thread: the above + gather-convert kernel", device_layer_rate,
             "transitions/s", "host-assembled: the above + convert kernel", host_layer_rate);
  report.Add(absl::StrFormat("device frame table: %ld slots (%ld at start), %ld replaced (cache misses) while "
                             "measuring",
                             table.slots(), sizing.slots, after.replaced - before.replaced),
             static_cast<double>(table.resident()), "frames resident", "", 0);
  return report;
}

}  // namespace troupe::bench
