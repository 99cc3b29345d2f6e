// The learner's frames on its device: a table of slots in backend memory,
// one rendered frame (uint8 [H, W, C]) each, so that a pixel frame crosses to
// the device once and a step gathers its stacked observations there instead
// of uploading them decoded (docs/design.md, "Learner input").
//
//   DeviceFrameTable table(&backend, /*slots=*/25000, /*frame_bytes=*/84 * 84 * 3, /*max_slots=*/100000);
//   sampler options: frame_references = true   // batches carry FramePtrs
//   RETURN_IF_ERROR(table.Resolve(batch.frames, decoder, &slots));  // outside a step
//   ... in the step: upload `slots` (int32) and
//   table.GatherToFloatPlanar(count, device_slots, 3, 1 / 255.0f, out);  // the first layer's input
//
// A frame is named by its Frame::id() (unique in its store for the store's
// life). Resolve gives each frame of a batch a slot: a frame the table holds
// costs nothing; the others are decoded (each once) and written into free
// slots with one upload and one scatter kernel. A slot frees when replay
// lets its frame go (the table holds a weak reference: items, insert streams
// and batches hold the frames), so in steady state the frames uploaded are
// the frames replay took in since the last batch, not the batch's frames.
//
// The table starts with `slots` frames and grows on demand up to
// `max_slots`: how many distinct frames replay holds depends on how items
// share frames (a stacked transition stream: about one per item; items of
// their own: six), on episode lengths, and on frames kept alive past their
// items (key frames that coded frames refer to, a remote sampler's frames
// until the stream forgets them), which no config says. When every slot
// holds a live frame and the table is below max_slots, it doubles (capped at
// max_slots): the next Upload allocates the larger table and copies the
// frames over on the device (counted in stats().grown). At max_slots it is a
// cache (the default replay, a million transitions, ~21 GB of 84x84 frames,
// is meant to be larger than a device): the slot least recently used by a
// batch (CLOCK, second chance) takes the new frame, and the frame it held is
// uploaded again if a later batch samples it (counted in stats().replaced).
// A batch's own frames are never replaced while resolving it, nor those of
// the batches_in_flight - 1 batches before it (the updates of an execution
// and of the one made ahead: their frames all go up before they run); slots
// must hold that many batches' frames.
//
// Threads: Resolve and Upload on the thread that issues the device's kernels
// (the backend's rule); Prepare on one other thread at a time, concurrently
// with Upload (a sampler thread makes batches ahead of the device's).
// A batch's slots stay valid while it is one of the last batches_in_flight
// resolved, and for as long as the device's work that reads them is queued
// before a later Upload (an upload is ordered after the device's work
// queued before it).
#ifndef TROUPE_AGENTS_DEVICE_FRAMES_H_
#define TROUPE_AGENTS_DEVICE_FRAMES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "engine/nn/backend.h"
#include "proto/config.pb.h"
#include "replay/frame_store.h"

namespace troupe::agents {

struct DeviceFrameStats {
  int64_t frames_uploaded = 0;  // frames written into slots (new ones, and replaced ones sampled again)
  int64_t bytes_uploaded = 0;   // host -> device bytes: frames (with the rows that pad an upload) and slot indices
  int64_t replaced = 0;         // live frames dropped to make room (the table full)
  int64_t resolved = 0;         // frames looked up by Resolve (a batch's, repeats included)
  int64_t slots = 0;            // the table's slots now (grown on demand up to its max_slots)
  int64_t grown = 0;            // times the table grew
  int64_t scatters = 0;         // uploads that sent frames (each one scatter into the table, a step)
};

class DeviceFrameTable {
 public:
  // Checks a table's geometry without allocating: frame bytes a whole
  // number of 4-byte words (the kernels move words), slots at least
  // `batch_frames` (the frames of the batches in flight at once) and
  // addressable by int32.
  // InvalidArgument naming the sizes otherwise.
  static absl::Status Check(int64_t slots, int64_t frame_bytes, int64_t batch_frames);

  // `slots` frames of `frame_bytes` each in `backend`'s memory (which must
  // outlive the table), plus one spare slot that padding rows of an upload
  // land in; allocated by the first Resolve. It grows (doubling) up to
  // `max_slots` frames when full of live frames; max_slots 0: `slots`, a
  // fixed size. Requires slots <= max_slots and Check(max_slots,
  // frame_bytes, 1) to pass.
  DeviceFrameTable(nn::Backend* backend, int64_t slots, int64_t frame_bytes, int64_t max_slots = 0);
  DeviceFrameTable(const DeviceFrameTable&) = delete;
  DeviceFrameTable& operator=(const DeviceFrameTable&) = delete;

  // Makes every frame in `frames` resident and writes its slot to
  // (*slots)[i] (resized). Frames not resident are decoded with `decoder`
  // and uploaded with one Upload and one ScatterRows, a step the backend
  // replays (after growing the table when it had to: one allocation and a
  // copy on the device); call it outside a step.
  // DataLoss if a frame does not decode (nothing is then half written: the
  // slots given to the batch's new frames are free again); InvalidArgument
  // for a frame of the wrong size or a batch with more distinct frames than
  // the table has slots.
  absl::Status Resolve(std::span<const replay::FramePtr> frames, replay::FrameDecoder& decoder,
                       std::vector<int32_t>* slots);

  // Resolve in two halves, so that a sampler thread can do the host's part
  // while the device runs earlier steps: Prepare finds or assigns the slots
  // and decodes the new frames into host staging (no device call), Upload
  // sends the oldest staged batch's (the device's thread). Batches queue
  // between the two: each Upload sends one Prepare's frames, in the order
  // prepared; an Upload with none staged sends nothing.
  absl::Status Prepare(std::span<const replay::FramePtr> frames, replay::FrameDecoder& decoder,
                       std::vector<int32_t>* slots);
  void Upload();
  // How many batches, the one being resolved included, keep their frames
  // (1 unless set; BatchesInFlight's for an agent's input), and how many may
  // be prepared and not yet uploaded. Before the first Prepare.
  void set_batches_in_flight(int batches) {
    batches_in_flight_ = std::max(1, batches);
    pending_.resize(static_cast<size_t>(batches_in_flight_));
  }
  // Forgets what Prepare staged and Upload did not send: their new frames'
  // slots are free again (an input made ahead, then stopped). Not while a
  // Prepare runs.
  void DropPending();
  // Batches prepared and not yet uploaded.
  int64_t pending() const;

  // out[i] = the frame in slot device_slots[i] for i < count: frame_bytes()
  // bytes each, contiguous, as uint8 [count, H, W, C]. `device_slots`
  // (int32) and `out` are the backend's memory; a kernel (inside a step too).
  void Gather(int64_t count, const int32_t* device_slots, uint8_t* out);
  // The same frames as the first layer's input: float planes [count,
  // channels, pixels] times `scale` (Backend::GatherBytesToFloatPlanar),
  // gathered inside the conversion, without a uint8 copy.
  void GatherToFloatPlanar(int64_t count, const int32_t* device_slots, int64_t channels, float scale, float* out);

  // Slots now (Prepare grows them; the device table follows at Upload),
  // and what they may grow to. slots(): the preparing thread, or between
  // Resolves; stats().slots from any thread.
  int64_t slots() const { return slots_; }
  int64_t max_slots() const { return max_slots_; }
  int64_t frame_bytes() const { return frame_bytes_; }
  // Slots holding a frame replay still has.
  int64_t resident() const;
  // The counters so far; from any thread (the input thread prepares the
  // next batch while the learner reads them).
  DeviceFrameStats stats() const;

 private:
  struct Slot {
    std::weak_ptr<const replay::Frame> frame;  // expired: replay let the frame go
    uint64_t id = 0;                           // 0: never used
    uint64_t used = 0;                         // the last Resolve that used it
    bool referenced = false;                   // CLOCK's second chance
  };
  // Rows an upload of `n` frames is padded to: few distinct sizes, so a
  // backend that compiles programs per shape (PJRT) compiles few.
  static int64_t Bucket(int64_t n);
  // A slot for a new frame: a free one, else one whose frame replay let go,
  // else one the table grows by (below max_slots_), else the CLOCK's choice
  // among those not used by this Resolve.
  int32_t TakeSlot();
  // Doubles slots_ (capped at max_slots_) on the host side; the new slots
  // are free.
  void Grow();
  // The device's table made `slots` + 1 rows (the frames so far copied as
  // bits); the device's thread, at Upload.
  void GrowDeviceTable(int64_t slots);
  // Frees every slot whose frame expired; returns how many.
  int64_t Sweep();
  // Empties slot `s` (its frame no longer found there).
  void Clear(int32_t s);
  // One Prepare's new frames, decoded, and their slots: `words` holds
  // `bucket` rows and then `bucket` slots (int32), one upload; the rows past
  // `frames` are padding, sent to the spare slot (Upload writes its index).
  // `slots` keeps the new frames' slots for the host's bookkeeping.
  struct Staged {
    std::vector<uint32_t> words;
    std::vector<int32_t> slots;
    int64_t frames = 0;
  };
  // Empties and frees the first `count` of `staged`'s slots (new slots of
  // a Prepare that are not to be sent).
  void FreeNewSlots(const Staged& staged, int64_t count);

  nn::Backend* backend_;
  int64_t slots_, max_slots_, frame_bytes_, row_words_;
  // (device_slots_ + 1) rows of row_words_ words; the last is the spare.
  // device_slots_ is the device thread's (Upload sets it, the gathers read
  // it): slots_ may grow in a Prepare on another thread while a step gathers.
  nn::DeviceBuffer table_;
  int64_t device_slots_ = 0;
  // Between the preparing thread and the device's: the batches staged and
  // not uploaded, a ring of batches_in_flight_ (what may be prepared ahead
  // of the uploads): batch i at pending_[i % size], the oldest at
  // pending_begin_, Prepare's next at pending_end_, each counter advanced by
  // its own thread alone and published with release. No lock, no node made
  // or freed an upload; an entry keeps its buffers for the next batch it
  // holds (both were a sixth of Upload's time, docs/benchmarks/learner.md).
  // (Upload grows the device's table to slots_now_, the slots as Prepare
  // left them.)
  std::vector<Staged> pending_ = std::vector<Staged>(1);
  std::atomic<uint64_t> pending_begin_ = 0, pending_end_ = 0;
  std::vector<Slot> slot_;
  absl::flat_hash_map<uint64_t, int32_t> where_;  // frame id -> slot
  std::vector<int32_t> free_;
  int64_t hand_ = 0;    // CLOCK's position
  uint64_t batch_ = 0;   // Resolve calls so far
  int batches_in_flight_ = 1;
  uint64_t swept_ = 0;   // the Resolve that last swept
  // Prepare's new frames; per bucket size the device buffer an upload goes
  // to (a Staged's words, uploaded whole; the device's thread), a few, in
  // one array (a tree's nodes came cold each upload).
  std::vector<const replay::Frame*> new_frames_;
  std::vector<std::pair<int64_t, nn::DeviceBuffer>> staging_;
  // DeviceFrameStats's counters, each atomic (read by stats() from any thread;
  // slots_now_ also by Upload).
  std::atomic<int64_t> frames_uploaded_ = 0, bytes_uploaded_ = 0, replaced_ = 0, resolved_ = 0, slots_now_ = 0,
                       grown_ = 0, scatters_ = 0;
};

// Each replica's device frame table for `config`
// with `replicas` replicas. It starts at the frames replay holds for the
// actors' stacked streams (about one new frame per transition: replay_size,
// 1/8 more for episode edges, and two shards' frames in flight) and grows on
// demand, doubling, up to what replay's items can refer to at all
// (replay_size items of 2 stacks, and the two shards); both at most
// learner.device_frame_mib of frames (the budget; at it the table is a
// cache). All 0 when batches are assembled on the host (state observations,
// or learner.device_frames false).
struct DeviceFrameSizing {
  int64_t slots = 0;         // at start
  int64_t max_slots = 0;     // what it may grow to (>= slots)
  int64_t frame_bytes = 0;   // one rendered RGB frame
  bool budget_bound = false;  // slots is the budget's (replay would want more)
  // For the learner's log: the sizes, in slots and bytes, and what bounded them.
  std::string description;
};
DeviceFrameSizing DeviceFrameSlots(const config::ExperimentConfig& config, const ObservationSpec& spec, int replicas);
// Checks learner.device_frames and device_frame_mib against the frames and
// the batch, before anything is created: InvalidArgument naming the field
// and the sizes (a table smaller than one shard's frames, frames the
// table's kernels cannot move).
absl::Status ValidateDeviceFrames(const config::ExperimentConfig& config, const ObservationSpec& spec);

// Batches whose frames a replica's table keeps at once: an execution's
// (learner.updates_per_execution), and with learner.prefetch_input the next
// execution's, made while it steps.
int BatchesInFlight(const config::LearnerConfig& learner);

// Bytes of one rendered RGB frame, and the frames of one replica's shard of
// a batch (each row: an observation and a next observation of spec.frames).
int64_t FrameBytes(const ObservationSpec& spec);
int64_t ShardFrames(int64_t batch_size, int replicas, const ObservationSpec& spec);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_DEVICE_FRAMES_H_
