// `troupe bench learner-input`: what feeding a D4PG pixel learner costs on
// its input side, the device frame table (agents/device_frames.h) against
// troupe's own host-assembled path, on one thread and the CPU backend (the
// device's memory is the host's: a gather is a copy). Both are troupe's
// paths: each ratio is a design figure, not a comparison with a peer.
//
// Replay holds D4PG transitions of 84x84 frames stacked 3 (n-step
// transitions sharing frames, as actors write them; each path has a replay
// of its own, filled alike); each update inserts batch /
// samples_per_insert new transitions (untimed: the actors' side) and then
//  - host-assembled: samples a batch with its pixels decoded and uploads
//    both observation fields (learner.device_frames: false);
//  - device frames: samples frame references, uploads the frames the device
//    lacks (one upload, one scatter) and the batch's slots; the stacked
//    observations are gathered inside the first layer's uint8 -> float
//    conversion (the learner's path).
// The two alternate by the protocol (bench/protocol.h: a warm-up round
// each, then rounds device, host, device, ... of the same seconds of timed
// work, medians), in two regimes of the table:
//  1. sized for replay as the learner sizes it: it holds every frame replay
//     does, so an update uploads only the frames inserted since the last
//     (the bytes ratio follows from the bench's 8 inserts an update);
//  2. replay holding ~8x the frames the table does (the budget
//     learner.device_frame_mib set low, as the default config's 2 GiB is
//     against a million transitions): batches miss, frames are evicted and
//     uploaded again when sampled again; the misses and bytes uploaded per
//     update are counted over the measured rounds and printed.
// Figures for each: bytes uploaded per update, frames uploaded (misses)
// and replaced per update against frames inserted, input transitions/s of
// each path, and the same through the first layer's float input (each
// path's conversion kernel included: on the CPU backend it writes 130 MB of
// floats a batch either way), the latter from the same rounds.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "agents/d4pg_agent.h"
#include "agents/device_frames.h"
#include "bench/bench.h"
#include "bench/synthetic.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "replay/client.h"
#include "replay/replay.h"

namespace troupe::bench {
namespace {

constexpr int kInputSide = kSceneSide, kInputStack = kSceneStack, kInputBatch = 256;
constexpr int64_t kFrameBytes = kSceneFrameBytes;

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One round of one input path, timed per update: the inserts before each
// update (the actors' side) untimed, the update's input (`input`) and the
// first layer's conversion (`convert`) each timed, until the two together
// reach `seconds`.
struct PathRound {
  double updates = 0, input_seconds = 0, convert_seconds = 0;
};
absl::StatusOr<PathRound> RunPath(double seconds, TransitionStream& stream, int inserts_per_update,
                                  const std::function<absl::Status()>& input, const std::function<void()>& convert) {
  PathRound r;
  while (r.input_seconds + r.convert_seconds < seconds) {
    RETURN_IF_ERROR(stream.Write(inserts_per_update));
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(input());
    const auto input_done = std::chrono::steady_clock::now();
    convert();
    r.input_seconds += Seconds(input_done - start);
    r.convert_seconds += Seconds(std::chrono::steady_clock::now() - input_done);
    ++r.updates;
  }
  return r;
}

// The learner's device-frame input: frame references sampled, the frames
// the table lacks decoded and uploaded (one upload, one scatter), the
// batch's slots uploaded; the first layer gathers and converts.
class DeviceFramePath {
 public:
  DeviceFramePath(nn::Backend& device, const agents::DeviceFrameSizing& sizing, std::unique_ptr<replay::Sampler> sampler,
                  float* planes)
      : device_(device),
        table_(&device, sizing.slots, kFrameBytes, sizing.max_slots),
        sampler_(std::move(sampler)),
        gather_slots_(kBatchFrames),
        device_slots_(device, kBatchFrames),
        planes_(planes) {}

  // One update's input; counts the slot bytes it uploaded besides the table's.
  absl::Status Input() {
    RETURN_IF_ERROR(sampler_->Next(&batch_));
    RETURN_IF_ERROR(table_.Resolve(batch_.frames, decoder_, &resolved_));
    // Gather order: every observation's frames, then every next observation's.
    for (int64_t b = 0; b < kInputBatch; ++b) {
      for (int64_t j = 0; j < kInputStack; ++j) {
        gather_slots_[b * kInputStack + j] = resolved_[b * 2 * kInputStack + j];
        gather_slots_[(kInputBatch + b) * kInputStack + j] = resolved_[b * 2 * kInputStack + kInputStack + j];
      }
    }
    const int64_t bytes = static_cast<int64_t>(sizeof(int32_t)) * kBatchFrames;
    device_.Upload(gather_slots_.data(), device_slots_.data(), bytes);
    slot_bytes_ += bytes;
    return absl::OkStatus();
  }
  void Convert() {
    table_.GatherToFloatPlanar(kBatchFrames, reinterpret_cast<const int32_t*>(device_slots_.data()), 3,
                               1.0f / 255.0f, planes_);
  }
  const agents::DeviceFrameTable& table() const { return table_; }
  int64_t slot_bytes() const { return slot_bytes_; }

  static constexpr int64_t kBatchFrames = int64_t{kInputBatch} * 2 * kInputStack;

 private:
  nn::Backend& device_;
  agents::DeviceFrameTable table_;
  std::unique_ptr<replay::Sampler> sampler_;
  replay::SampledBatch batch_;
  replay::FrameDecoder decoder_;
  std::vector<int32_t> resolved_, gather_slots_;
  nn::DeviceBuffer device_slots_;
  float* planes_;
  int64_t slot_bytes_ = 0;
};

}  // namespace

absl::StatusOr<Report> RunLearnerInputBenchmark(const Options& options) {
  Report report;
  report.benchmark = "learner-input";
  const int held = options.quick ? 3000 : 20000;  // transitions replay holds
  const int samples_per_insert = 32;
  const int inserts_per_update = kInputBatch / samples_per_insert;
  const agents::ObservationSpec spec = kSceneSpec;
  config::ExperimentConfig config;
  config.mutable_learner()->set_batch_size(kInputBatch);
  config.mutable_learner()->set_replay_size(held);
  config.mutable_learner()->set_min_replay_size(1);
  // Each path has a replay of its own, filled alike, so the frames a path
  // uploads are those its own updates' inserts brought (as in a learner),
  // not the other path's.
  ASSIGN_OR_RETURN(FilledReplay host_replay, FillTransitions(config, held));
  ASSIGN_OR_RETURN(FilledReplay device_replay, FillTransitions(config, held));
  TransitionStream& host_stream = *host_replay.stream;
  TransitionStream& stream = *device_replay.stream;

  nn::CpuBackend device(/*num_threads=*/1);
  constexpr int64_t batch_frames = DeviceFramePath::kBatchFrames;
  const int64_t pixels = int64_t{kInputSide} * kInputSide;
  nn::DeviceBuffer planes(device, batch_frames * kFrameBytes);  // the first layer's input, both paths
  // Both paths by the protocol (bench/protocol.h), rounds alternated device
  // frames, host-assembled, ...: troupe's two input paths, so each ratio is
  // a design figure of troupe's, not a comparison with a peer.
  const ProtocolOptions protocol = DefaultProtocol(options, /*threads=*/1);
  const std::string host_reference = "troupe's host-assembled batch (design figure, not a peer)";

  // --- Host-assembled: decoded batches, both observation fields uploaded.
  ASSIGN_OR_RETURN(auto host_sampler,
                   host_replay.client->NewSampler({.table = agents::kTransitionTable, .batch_size = kInputBatch}));
  replay::SampledBatch host;
  RETURN_IF_ERROR(host_sampler->Next(&host));
  const size_t field_bytes = host.fields[0].data.size();
  nn::DeviceBuffer host_pixels(device, static_cast<int64_t>(2 * field_bytes / 4));
  const double host_bytes_per_update = 2.0 * static_cast<double>(field_bytes);
  const auto host_input = [&]() -> absl::Status {
    RETURN_IF_ERROR(host_sampler->Next(&host));
    device.Upload(host.fields[0].data.data(), host_pixels.data(), field_bytes);
    device.Upload(host.fields[4].data.data(), reinterpret_cast<uint8_t*>(host_pixels.data()) + field_bytes,
                  field_bytes);
    return absl::OkStatus();
  };
  const auto host_convert = [&] {
    device.BytesToFloatPlanar(batch_frames, pixels, 3, 1.0f / 255.0f,
                              reinterpret_cast<const uint8_t*>(host_pixels.data()), planes.data());
  };

  // One regime: the device-frame path with a table of `sizing` against the
  // host-assembled path, by the protocol; the rows, and the table's
  // uploads and misses over the device path's measured rounds.
  const std::string setup = absl::StrFormat("batch %d, 84x84x3 stacked 3, %d transitions held, %d inserted/update",
                                            kInputBatch, held, inserts_per_update);
  auto regime = [&](const std::string& which, const agents::DeviceFrameSizing& sizing) -> absl::Status {
    RETURN_IF_ERROR(agents::DeviceFrameTable::Check(sizing.max_slots, kFrameBytes, batch_frames));
    ASSIGN_OR_RETURN(auto sampler, device_replay.client->NewSampler(
                                       {.table = agents::kTransitionTable, .batch_size = kInputBatch,
                                        .frame_references = true}));
    DeviceFramePath path(device, sizing, std::move(sampler), planes.data());
    // Warm-up: passes over replay put its frames on the device (the
    // learner's first minutes, or a full table), then the steady state is
    // measured.
    const int64_t warmup = 3 * held / kInputBatch + 1;
    for (int64_t i = 0; i < warmup; ++i) {
      RETURN_IF_ERROR(stream.Write(inserts_per_update));
      RETURN_IF_ERROR(path.Input());
      path.Convert();
    }
    std::vector<double> layer[2];  // to the first layer's input: device, host
    double updates = 0, frames_inserted = 0, slot_bytes = 0;
    agents::DeviceFrameStats uploaded;  // over the measured rounds
    const Side device_side = [&](const Round& round) -> absl::StatusOr<double> {
      const agents::DeviceFrameStats before = path.table().stats();
      const int64_t frames_before = stream.frames(), slot_bytes_before = path.slot_bytes();
      ASSIGN_OR_RETURN(const PathRound r, RunPath(round.seconds, stream, inserts_per_update,
                                                  [&] { return path.Input(); }, [&] { path.Convert(); }));
      if (!round.warmup) {
        const agents::DeviceFrameStats after = path.table().stats();
        uploaded.frames_uploaded += after.frames_uploaded - before.frames_uploaded;
        uploaded.bytes_uploaded += after.bytes_uploaded - before.bytes_uploaded;
        uploaded.replaced += after.replaced - before.replaced;
        updates += r.updates;
        frames_inserted += static_cast<double>(stream.frames() - frames_before);
        slot_bytes += static_cast<double>(path.slot_bytes() - slot_bytes_before);
        layer[0].push_back(r.updates * kInputBatch / (r.input_seconds + r.convert_seconds));
      }
      return r.updates * kInputBatch / r.input_seconds;
    };
    const Side host_side = [&](const Round& round) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(const PathRound r, RunPath(round.seconds, host_stream, inserts_per_update, host_input, host_convert));
      if (!round.warmup) layer[1].push_back(r.updates * kInputBatch / (r.input_seconds + r.convert_seconds));
      return r.updates * kInputBatch / r.input_seconds;
    };
    ASSIGN_OR_RETURN(const Comparison c, CompareAlternated(device_side, host_side, protocol));
    const double device_bytes_per_update = (static_cast<double>(uploaded.bytes_uploaded) + slot_bytes) / updates;
    const double uploaded_per_update = static_cast<double>(uploaded.frames_uploaded) / updates;
    const double replaced_per_update = static_cast<double>(uploaded.replaced) / updates;
    const double inserted_per_update = frames_inserted / updates;
    std::printf("%s: %s; over %.0f measured updates %.1f frames uploaded (misses) and %.1f replaced an update, "
                "%.0f bytes uploaded an update\n",
                which.c_str(), sizing.description.c_str(), updates, uploaded_per_update, replaced_per_update,
                device_bytes_per_update);
    report.Add(absl::StrFormat("%s: bytes uploaded per D4PG pixel update, device frames (%s)", which, setup),
               device_bytes_per_update, "bytes", absl::StrCat(host_reference, ": the batch's decoded frames"),
               host_bytes_per_update);
    report.Add(absl::StrFormat("%s: frames uploaded per update (misses: frames sampled not on the device) vs frames "
                               "inserted per update",
                               which),
               uploaded_per_update, "frames", "frames inserted", inserted_per_update);
    report.Add(absl::StrFormat("%s: frames a batch uses (%ld) vs frames uploaded per update", which, batch_frames),
               static_cast<double>(batch_frames), "frames", "frames uploaded", uploaded_per_update);
    report.Add(absl::StrFormat("%s: live frames replaced per update (the table full: evicted, uploaded again if "
                               "sampled again)",
                               which),
               replaced_per_update, "frames", "", 0);
    report.Add(absl::StrFormat("%s: input side, one thread: sample keys + new frames + slots (the gather is in the "
                               "first layer; bar: >= 200,000/s)",
                               which),
               "transitions/s", absl::StrCat(host_reference, ": sample + decode + upload"), c);
    report.Add(absl::StrFormat("%s: to the first layer's float input, one thread: the above + gather-convert kernel",
                               which),
               "transitions/s", absl::StrCat(host_reference, ": the above + convert kernel"),
               [&] {
                 Comparison l = c;  // the same rounds
                 l.troupe = Summarize(std::move(layer[0]));
                 l.peer = Summarize(std::move(layer[1]));
                 l.ratio = l.troupe.median / l.peer.median;
                 return l;
               }());
    report.Add(absl::StrFormat("%s: device frame table, %ld slots (%ld at start, at most %ld)", which,
                               path.table().slots(), sizing.slots, sizing.max_slots),
               static_cast<double>(path.table().resident()), "frames resident", "", 0);
    return absl::OkStatus();
  };

  // 1. The table sized for replay (the learner's sizing, learner.replay_size
  // transitions within the default budget): it holds every frame replay
  // does, so it never misses and each update uploads the frames inserted
  // since the last (8 here): the bytes ratio follows from the settings.
  RETURN_IF_ERROR(regime("table holds replay", agents::DeviceFrameSlots(config, spec, 1)));

  // 2. Replay larger than the table, the regime the cache exists for (the
  // default config: learner.device_frame_mib 2 GiB, ~101,000 84x84 frames,
  // against a million transitions' ~1.1M frames): the budget set to an
  // eighth of replay's frames (at least 1.5 batches' frames), so batches
  // miss, frames are evicted and uploaded again when sampled again.
  config::ExperimentConfig small = config;
  const int64_t small_frames = std::max<int64_t>(held / 8, batch_frames * 3 / 2);
  small.mutable_learner()->set_device_frame_mib(static_cast<int32_t>(small_frames * kFrameBytes / (1 << 20) + 1));
  const agents::DeviceFrameSizing small_sizing = agents::DeviceFrameSlots(small, spec, 1);
  if (!small_sizing.budget_bound) return absl::InternalError("the small device frame table is not budget-bound");
  const double frames_held = static_cast<double>(device_replay.replay->Info().frames());
  RETURN_IF_ERROR(regime(absl::StrFormat("replay (%.0f frames) %.1fx the table", frames_held,
                                         frames_held / static_cast<double>(small_sizing.max_slots)),
                         small_sizing));
  return report;
}

}  // namespace troupe::bench
