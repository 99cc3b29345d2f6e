#include "agents/device_frames.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agents/step_signature.h"
#include "common/status_macros.h"

namespace troupe::agents {

absl::Status DeviceFrameTable::Check(int64_t slots, int64_t frame_bytes, int64_t batch_frames) {
  if (frame_bytes <= 0 || frame_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a frame of ", frame_bytes,
                                                   " bytes is not a whole number of 4-byte words (the device frame "
                                                   "table's kernels move words); height * width must be a multiple "
                                                   "of 4"));
  }
  if (slots < batch_frames) {
    return absl::InvalidArgumentError(absl::StrCat("the device frame table's ", slots, " slots hold fewer than the ",
                                                   batch_frames, " frames of the batches in flight (",
                                                   slots * frame_bytes, " bytes, at least ",
                                                   batch_frames * frame_bytes, " needed)"));
  }
  if (slots >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the device frame table's ", slots, " slots: more than int32 indices address"));
  }
  return absl::OkStatus();
}

DeviceFrameTable::DeviceFrameTable(nn::Backend* backend, int64_t slots, int64_t frame_bytes, int64_t max_slots)
    : backend_(backend),
      slots_(slots),
      max_slots_(max_slots == 0 ? slots : max_slots),
      frame_bytes_(frame_bytes),
      row_words_(frame_bytes / 4) {
  TROUPE_CHECK(slots >= 1 && slots <= max_slots_ && Check(max_slots_, frame_bytes, 1).ok());
  slot_.resize(static_cast<size_t>(slots_));
  // Free slots are taken from the back: slot 0 first.
  free_.reserve(static_cast<size_t>(slots_));
  for (int64_t s = slots_ - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  slots_now_ = slots_;
}

void DeviceFrameTable::Grow() {
  const int64_t old_slots = slots_;
  slots_ = std::min(max_slots_, 2 * slots_);
  slot_.resize(static_cast<size_t>(slots_));
  for (int64_t s = slots_ - 1; s >= old_slots; --s) free_.push_back(static_cast<int32_t>(s));
  slots_now_ = slots_;
  ++grown_;
}

void DeviceFrameTable::GrowDeviceTable(int64_t slots) {
  nn::DeviceBuffer table(*backend_, (slots + 1) * row_words_);
  if (device_slots_ > 0) {
    // The frames so far into the same slots: a gather of rows 0 ..
    // device_slots_ - 1 (the row kernels move bits; a float copy might not).
    std::vector<int32_t> rows(static_cast<size_t>(device_slots_));
    std::iota(rows.begin(), rows.end(), 0);
    nn::DeviceBuffer indices(*backend_, device_slots_);
    const size_t index_bytes = sizeof(int32_t) * rows.size();
    backend_->Upload(rows.data(), indices.data(), index_bytes);
    backend_->GatherRows(device_slots_ + 1, row_words_, table_.data(), device_slots_,
                         reinterpret_cast<const int32_t*>(indices.data()), table.data());
    bytes_uploaded_ += static_cast<int64_t>(index_bytes);
    // Rare (each time the frames replay holds outgrow it), and what the
    // device holds: said where the learner's log is.
    std::fprintf(stderr, "device frame table: grew from %lld to %lld slots (%.0f MiB; at most %lld)\n",
                 static_cast<long long>(device_slots_), static_cast<long long>(slots),
                 static_cast<double>(slots * frame_bytes_) / (1 << 20), static_cast<long long>(max_slots_));
  }
  table_ = std::move(table);
  device_slots_ = slots;
}

int64_t DeviceFrameTable::Bucket(int64_t n) {
  if (n <= 8) return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n)));
  const int64_t step = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n))) / 8;
  return (n + step - 1) / step * step;
}

void DeviceFrameTable::Clear(int32_t s) {
  where_.erase(slot_[s].id);
  slot_[s] = Slot{};
}

int64_t DeviceFrameTable::Sweep() {
  int64_t freed = 0;
  for (int64_t s = 0; s < slots_; ++s) {
    const Slot& slot = slot_[s];
    if (slot.id == 0 || !slot.frame.expired()) continue;
    Clear(static_cast<int32_t>(s));
    free_.push_back(static_cast<int32_t>(s));
    ++freed;
  }
  return freed;
}

int32_t DeviceFrameTable::TakeSlot() {
  // Slots whose frames replay let go, found at most once per Resolve (a
  // sweep reads every slot).
  if (free_.empty() && swept_ != batch_) {
    swept_ = batch_;
    Sweep();
  }
  // The table is full of live frames: it grows while it may.
  if (free_.empty() && slots_ < max_slots_) Grow();
  if (!free_.empty()) {
    const int32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  // At its largest and full of live frames: CLOCK with a second chance,
  // never a slot this batch or the batches_in_flight - 1 before it use.
  for (int64_t step = 0; step < 2 * slots_; ++step) {
    const int64_t s = hand_;
    hand_ = (hand_ + 1) % slots_;
    Slot& slot = slot_[s];
    if (slot.used + static_cast<uint64_t>(batches_in_flight_) > batch_) continue;
    if (slot.referenced) {
      slot.referenced = false;
      continue;
    }
    Clear(static_cast<int32_t>(s));
    ++replaced_;
    return static_cast<int32_t>(s);
  }
  return -1;
}

absl::Status DeviceFrameTable::Resolve(std::span<const replay::FramePtr> frames, replay::FrameDecoder& decoder,
                                       std::vector<int32_t>* slots) {
  RETURN_IF_ERROR(Prepare(frames, decoder, slots));
  Upload();
  return absl::OkStatus();
}

absl::Status DeviceFrameTable::Prepare(std::span<const replay::FramePtr> frames, replay::FrameDecoder& decoder,
                                       std::vector<int32_t>* slots) {
  const uint64_t end = pending_end_.load(std::memory_order_relaxed);  // (this thread's)
  if (end - pending_begin_.load(std::memory_order_acquire) == pending_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("DeviceFrameTable::Prepare: ", pending_.size(),
                                                      " batches prepared and not uploaded (batches_in_flight)"));
  }
  ++batch_;
  slots->resize(frames.size());
  new_frames_.clear();
  Staged& staged = pending_[end % pending_.size()];
  staged.slots.clear();
  staged.frames = 0;
  // Undoes this call's new slots (an error before their frames landed).
  const auto fail = [&](absl::Status status) {
    FreeNewSlots(staged, static_cast<int64_t>(staged.slots.size()));
    return status;
  };
  // Each frame's slot: where it already is, else a new one.
  for (size_t i = 0; i < frames.size(); ++i) {
    const replay::Frame& frame = *frames[i];
    if (frame.raw_bytes() != frame_bytes_) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "batch frame ", i, ": ", frame.height(), "x", frame.width(), "x", frame.channels(), " (",
          frame.raw_bytes(), " bytes), the device frame table holds frames of ", frame_bytes_, " bytes")));
    }
    if (auto it = where_.find(frame.id()); it != where_.end()) {
      Slot& slot = slot_[it->second];
      slot.used = batch_;
      slot.referenced = true;
      (*slots)[i] = it->second;
      continue;
    }
    const int32_t s = TakeSlot();
    if (s < 0) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("a batch of ", frames.size(), " frames has more distinct frames than the device frame table's ",
                       slots_, " slots not in use by the last ", batches_in_flight_, " batches")));
    }
    slot_[s] = Slot{frames[i], frame.id(), batch_, true};
    where_[frame.id()] = s;
    new_frames_.push_back(&frame);
    staged.slots.push_back(s);
    (*slots)[i] = s;
  }
  resolved_ += static_cast<int64_t>(frames.size());

  // The new frames decoded into rows (references decoded once for all),
  // padded to a bucket whose extra rows go to the spare slot.
  const int64_t n = static_cast<int64_t>(new_frames_.size());
  if (n > 0) {
    const int64_t bucket = Bucket(n);
    staged.words.resize(static_cast<size_t>(bucket * (row_words_ + 1)));
    decoder.BeginBatch();
    for (int64_t k = 0; k < n; ++k) {
      absl::Status status =
          decoder.DecodeInBatch(*new_frames_[k], reinterpret_cast<uint8_t*>(staged.words.data() + k * row_words_));
      if (!status.ok()) return fail(std::move(status));
    }
    // The slots after the rows (the padding's, the spare's index, is Upload's to say).
    std::copy(staged.slots.begin(), staged.slots.end(), staged.words.begin() + bucket * row_words_);
  }
  staged.frames = n;
  pending_end_.store(end + 1, std::memory_order_release);
  return absl::OkStatus();
}

void DeviceFrameTable::FreeNewSlots(const Staged& staged, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    Clear(staged.slots[k]);
    free_.push_back(staged.slots[k]);
  }
}

void DeviceFrameTable::DropPending() {
  const uint64_t end = pending_end_.load(std::memory_order_acquire);
  for (uint64_t i = pending_begin_.load(std::memory_order_relaxed); i != end; ++i) {
    const Staged& staged = pending_[i % pending_.size()];
    FreeNewSlots(staged, staged.frames);  // (not the padding)
  }
  pending_begin_.store(end, std::memory_order_release);
}

int64_t DeviceFrameTable::pending() const {
  const uint64_t begin = pending_begin_.load(std::memory_order_acquire);
  return static_cast<int64_t>(pending_end_.load(std::memory_order_acquire) - begin);
}

void DeviceFrameTable::Upload() {
  const uint64_t begin = pending_begin_.load(std::memory_order_relaxed);  // (this thread's)
  const bool have = begin != pending_end_.load(std::memory_order_acquire);
  Staged& staged = pending_[begin % pending_.size()];
  // The table's memory, on first use (an agent fed host batches never needs
  // it), and again each time a Prepare grew the slots: every slot a staged
  // batch names is below them (a Prepare grows before it stages).
  if (const int64_t slots = slots_now_; device_slots_ < slots) GrowDeviceTable(slots);
  if (have && staged.frames > 0) {
    const int64_t n = staged.frames, bucket = static_cast<int64_t>(staged.words.size()) / (row_words_ + 1);
    const auto slots = staged.words.begin() + bucket * row_words_;
    std::fill(slots + n, slots + bucket, static_cast<uint32_t>(device_slots_));
    // One upload of the rows and their slots, one scatter into the table: a
    // step of its own (replayed where the backend replays: the same buffers
    // for a bucket and table size).
    auto found = std::find_if(staging_.begin(), staging_.end(), [bucket](const auto& s) { return s.first == bucket; });
    if (found == staging_.end()) {
      found = staging_.emplace(found, bucket, nn::DeviceBuffer(*backend_, bucket * (row_words_ + 1)));
    }
    nn::DeviceBuffer& staging = found->second;
    const size_t bytes = sizeof(uint32_t) * staged.words.size();
    backend_->Upload(staged.words.data(), staging.data(), bytes);
    backend_->RunStep(StepSignature(StepKind::kFrameScatter, {device_slots_, row_words_, bucket}), [&] {
      backend_->ScatterRows(device_slots_ + 1, row_words_, table_.data(), bucket,
                            reinterpret_cast<const int32_t*>(staging.data() + bucket * row_words_), staging.data());
    });
    frames_uploaded_ += n;
    bytes_uploaded_ += static_cast<int64_t>(bytes);
    ++scatters_;
  }
  if (have) pending_begin_.store(begin + 1, std::memory_order_release);  // (the entry Prepare's again)
}

DeviceFrameStats DeviceFrameTable::stats() const {
  return {.frames_uploaded = frames_uploaded_, .bytes_uploaded = bytes_uploaded_, .replaced = replaced_,
          .resolved = resolved_, .slots = slots_now_, .grown = grown_, .scatters = scatters_};
}

void DeviceFrameTable::Gather(int64_t count, const int32_t* device_slots, uint8_t* out) {
  backend_->GatherRows(device_slots_ + 1, row_words_, table_.data(), count, device_slots,
                       reinterpret_cast<float*>(out));
}

void DeviceFrameTable::GatherToFloatPlanar(int64_t count, const int32_t* device_slots, int64_t channels, float scale,
                                           float* out) {
  backend_->GatherBytesToFloatPlanar(device_slots_ + 1, row_words_, table_.data(), count, device_slots,
                                     frame_bytes_ / channels, channels, scale, out);
}

int64_t DeviceFrameTable::resident() const {
  int64_t live = 0;
  for (const Slot& slot : slot_) live += slot.id != 0 && !slot.frame.expired() ? 1 : 0;
  return live;
}

// --- Device frames ----------------------------------------------------------------

int BatchesInFlight(const config::LearnerConfig& learner) {
  return (learner.prefetch_input() ? 2 : 1) * std::max(1, learner.updates_per_execution());
}

int64_t FrameBytes(const ObservationSpec& spec) { return int64_t{spec.height} * spec.width * 3; }
int64_t ShardFrames(int64_t batch_size, int replicas, const ObservationSpec& spec) {
  return batch_size / replicas * 2 * spec.frames;
}

// The table's start: the frames replay holds for the actors' streams
// (actors/transition_writer.h). An episode of T steps appends T + 1 frames
// (its first once, however many stacks repeat it) and inserts T transitions;
// transition t refers to frames t - k + 1 .. t + n (k = frame_stack, n =
// n_step, clipped to the episode), so next observations share frames.
// Replay evicts the oldest item, so the transitions of one episode it holds
// are consecutive, and r of them refer to at most r + k + n - 1 frames (r + 1
// for a whole episode): N transitions in S such runs, at most N + S (k + n -
// 1) frames. The shards in flight (BatchesInFlight: an execution's, and the
// next execution's made ahead) hold their frames after replay let them go.
//
// That is no bound the config proves: S depends on episode lengths and on
// the envs writing at once (1/8 of N covers S (k + n - 1) for episodes of
// at least 8 (k + n - 1) transitions: 40 for k = n = 3, against dm_control's
// 1000 steps / action_repeat), and frames outlive their items where no
// config says how long (key frames that coded frames refer to; over gRPC the
// frames a sampler keeps until its stream forgets them, 16 batches of
// inserts later); items with frames of their own share none (2k each). So
// the table starts at the estimate and grows on demand, doubling, up to what
// the items can refer to at all (2k frames each, and the shards in flight);
// the budget caps both, and at it the table is a cache (DeviceFrameTable).
DeviceFrameSizing DeviceFrameSlots(const config::ExperimentConfig& config, const ObservationSpec& spec, int replicas) {
  const config::LearnerConfig& learner = config.learner();
  if (!spec.pixels() || !learner.device_frames() || replicas < 1) return {};
  const int64_t n = learner.replay_size(),
                in_flight = BatchesInFlight(learner) * ShardFrames(learner.batch_size(), replicas, spec);
  const int64_t frame_bytes = FrameBytes(spec);
  const int64_t budget = (int64_t{learner.device_frame_mib()} << 20) / frame_bytes;
  const int64_t expected = n + (n + 7) / 8 + in_flight;
  const int64_t most = n * 2 * spec.frames + in_flight;
  DeviceFrameSizing sizing{.slots = std::min(expected, budget),
                           .max_slots = std::min(most, budget),
                           .frame_bytes = frame_bytes,
                           .budget_bound = budget < expected};
  const auto mib = [&](int64_t slots) {
    return absl::StrFormat("%.0f MiB", static_cast<double>(slots * frame_bytes) / (1 << 20));
  };
  const std::string budget_name = absl::StrCat("the budget learner.device_frame_mib ", learner.device_frame_mib());
  sizing.description = absl::StrCat(
      "each replica's device frame table: ", sizing.slots, " slots of ", spec.width, "x", spec.height, " frames (",
      mib(sizing.slots), ") at start, bounded by ",
      sizing.budget_bound
          ? absl::StrCat(budget_name, " (replay's ", n, " transitions would want ", expected, ")")
          : absl::StrCat("replay (", n, " transitions at about one new frame each, 1/8 more for episode edges, ",
                         in_flight, " frames of batches in flight)"),
      sizing.max_slots > sizing.slots
          ? absl::StrCat("; grows on demand, doubling, up to ", sizing.max_slots, " slots (", mib(sizing.max_slots),
                         ", ", sizing.max_slots == budget ? budget_name : "what replay's items can refer to", ")")
          : "; when full, the frames least recently sampled make room");
  return sizing;
}

absl::Status ValidateDeviceFrames(const config::ExperimentConfig& config, const ObservationSpec& spec) {
  const config::LearnerConfig& learner = config.learner();
  if (!spec.pixels() || !learner.device_frames()) return absl::OkStatus();
  if (learner.device_frame_mib() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("learner.device_frame_mib ", learner.device_frame_mib(), ": must be >= 1"));
  }
  const int replicas = std::max(1, learner.engine().replicas());
  // The batches in flight all hold their frames at once.
  const absl::Status status =
      DeviceFrameTable::Check(DeviceFrameSlots(config, spec, replicas).max_slots, FrameBytes(spec),
                              BatchesInFlight(learner) * ShardFrames(learner.batch_size(), replicas, spec));
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat("learner.device_frame_mib ", learner.device_frame_mib(), " with ",
                                                 spec.width, "x", spec.height, " frames and learner.batch_size ",
                                                 learner.batch_size(), ": ", status.message(),
                                                 " (or learner.device_frames: false assembles batches on the host)"));
}


}  // namespace troupe::agents
