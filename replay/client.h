// One API for both ways of reaching replay: embedded (NewLocalClient, the
// learner's default: no server to start) and over gRPC (NewGrpcClient in
// replay/grpc_client.h, for a standalone `troupe replay`).
//
//   auto writer = client->NewWriter();            // an actor's stream
//   uint64_t f = *writer->AppendFrame(pixels, 84, 84, 3);
//   writer->Insert("pixels", 1.0, {FieldValue::Frames({f0, f1, f}), ...});
//   auto sampler = client->NewSampler({.table = "pixels", .batch_size = 256});
//   SampledBatch batch; sampler->Next(&batch);     // a learner's stream
//
// Locking: a Writer or Sampler belongs to one thread at a time; a
// ReplayClient may be shared by threads.
#ifndef TROUPE_REPLAY_CLIENT_H_
#define TROUPE_REPLAY_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/replay.pb.h"
#include "replay/frame_codec.h"
#include "replay/frame_store.h"
#include "replay/replay.h"

namespace troupe::replay {

struct WriterOptions {
  // How the writer (i.e. the actor) compresses frames: COMPRESSION_LZ4
  // (fast to decode when sampling) or COMPRESSION_ZSTD, at
  // `compression_level` (replay/frame_codec.h, FrameCompressor).
  proto::Compression codec = proto::COMPRESSION_LZ4;
  int compression_level = 1;
  // Items may refer to the last `frame_window` frames only; older ones are
  // forgotten by the server's stream (items keep theirs).
  int frame_window = 64;
  // Queued items or bytes that trigger a send.
  int max_items_per_request = 16;
  int64_t max_request_bytes = 1 << 20;
  // AppendFrame compresses a frame against a similar recent key frame of
  // this writer when that at least halves it (replay/frame_codec.h,
  // FrameEncoder); false: every frame is compressed alone.
  bool reference_frames = true;
  // Over gRPC: a writer session (proto/replay.proto InsertRequest.writer).
  // The writer keeps every request until the server acknowledges it (an
  // ack asked for by Flush, or by the writer itself once
  // kMaxUnacknowledgedBytes wait), so that after its stream breaks Resume
  // can re-send them on a new stream with nothing inserted twice. The
  // embedded writer ignores it (it cannot lose a request).
  bool resumable = false;
};

// A resumable writer asks for an ack once this many request bytes wait for one.
inline constexpr int64_t kMaxUnacknowledgedBytes = 64 << 20;

// How a replay server's insert or sample stream begins its message
// (UNAVAILABLE) when replay closed under it: the learner is stopping.
inline constexpr absl::string_view kReplayShuttingDown = "replay is shutting down";
// True for a stream that replay ended so: a writer that is itself stopping
// has nothing to resume then (and one that is not may resume with backoff).
inline bool IsReplayShuttingDown(const absl::Status& status) {
  return absl::IsUnavailable(status) && absl::StartsWith(status.message(), kReplayShuttingDown);
}

// One field of an item: dense bytes with dtype and shape, or frame keys.
// Shapes and key lists are stored inline (an item's fields cost no heap
// allocation up to rank 4 and 8 keys).
struct FieldValue {
  proto::DType dtype = proto::DTYPE_INVALID;
  absl::InlinedVector<int64_t, 4> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  absl::InlinedVector<uint64_t, 8> frame_keys;

  // `data` must stay valid until Insert returns.
  static FieldValue Dense(proto::DType dtype, absl::Span<const int64_t> shape, const void* data);
  static FieldValue Frames(absl::Span<const uint64_t> keys);
};

// An actor's insert stream. Frames and items are queued and sent in
// requests; server-side errors (bad item, unknown table, closed server)
// surface from the call that sends, or from Flush.
class Writer {
 public:
  explicit Writer(const WriterOptions& options);
  virtual ~Writer() = default;

  // Compresses one uint8 [height, width, channels] frame (against a recent
  // similar frame, see WriterOptions::reference_frames) and queues it.
  // Returns its key (0, 1, 2, ... on this writer).
  absl::StatusOr<uint64_t> AppendFrame(const uint8_t* pixels, int height, int width, int channels);
  // Queues a frame the caller already compressed with `codec` (an LZ4
  // block or zstd frame of height*width*channels bytes made by
  // FrameCompressor or FrameEncoder: troupe bench replay's transport rows;
  // actors use AppendFrame); the server checks that it
  // decodes to that many bytes (replay/frame_codec.h, Validation). Returns
  // its key.
  absl::StatusOr<uint64_t> AppendCompressedFrame(std::string data, proto::Compression codec, int height, int width,
                                                 int channels);
  // The same for a frame compressed against frame `reference_key` of this
  // writer (FrameCompressor::Compress with that frame's pixels as
  // reference). InvalidArgument if that key is not among the last
  // frame_window frames.
  absl::StatusOr<uint64_t> AppendCompressedFrame(std::string data, proto::Compression codec, int height, int width,
                                                 int channels, uint64_t reference_key);
  // Queues one item for `table`; its fields follow the table's signature.
  // InvalidArgument (client-side) for a frame key not appended yet or
  // outside the frame window.
  absl::Status Insert(const std::string& table, double priority, absl::Span<const FieldValue> fields);
  // Sends everything queued and waits until all of it is in its tables
  // (blocking on the rate limiter as needed).
  absl::Status Flush();
  // Flushes and ends the stream; the writer is unusable afterwards.
  virtual absl::Status Close() = 0;

  // A resumable writer (WriterOptions::resumable) whose stream broke (a
  // call returned UNAVAILABLE or another transport error): opens a new
  // stream on the same writer session, re-sends every request the server
  // had not acknowledged and waits for their ack (blocking as Flush does;
  // a connection that cannot be made fails it, as it fails any call). The server skips what it had inserted already,
  // so each item is inserted exactly once. Items queued while the stream
  // was broken (Insert and Flush keep them) go too. Returns OK once all is
  // acknowledged (also when nothing was broken); UNAVAILABLE or
  // DEADLINE_EXCEEDED to try again later; FAILED_PRECONDITION when the
  // server no longer has the session (it restarted): the unacknowledged
  // items are then lost, and a new writer must start. Unimplemented for a
  // writer that is not resumable.
  virtual absl::Status Resume();
  // Items sent or queued that the server has not acknowledged yet (what a
  // writer abandoned now would lose). 0 for the embedded writer.
  virtual int64_t items_unacknowledged() const { return 0; }

  // Items accepted by Insert so far (queued, whether or not sent yet).
  int64_t items_queued() const { return items_queued_; }
  int64_t items_sent() const { return items_sent_; }
  // Serialized request bytes sent so far (what went on the wire).
  int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  // Delivers `request` (its forget watermark and ack already set; it may
  // be consumed: cleared afterwards); with request.ack(), returns once the
  // server confirmed it. `items`: how many items it holds; `bytes`: its
  // serialized size (ByteSizeLong, computed once by the caller).
  virtual absl::Status Send(proto::InsertRequest* request, int items, int64_t bytes) = 0;

  const WriterOptions& options() const { return options_; }

  // Hands back a request that Send took out of the writer (swapped into a
  // store of its own, as the resumable gRPC writer keeps requests until
  // acknowledged) once it is no longer needed: its buffers (the frames'
  // tensors, the item groups) serve later requests, so a writer running
  // steadily allocates nothing per frame or item. Leaves *request empty.
  void Recycle(proto::InsertRequest* request);

 private:
  absl::Status SendQueued(bool ack);
  proto::FrameData* AddFrame(proto::Compression codec, int height, int width, int channels);
  // Takes the frame tensors of *request (a frame's Clear would free them)
  // for AddFrame to reuse, and clears it, keeping its other buffers.
  void Reclaim(proto::InsertRequest* request);

  WriterOptions options_;
  FrameEncoder encoder_;
  FrameEncoder::Encoded encoded_;
  proto::InsertRequest request_;
  // Buffers for later requests: frame tensors, and cleared requests (from
  // Recycle), one of which replaces request_ after each Send. At most the
  // bounds below are kept (an actor has ~16 pool steps of its envs' frames
  // in flight between acks); a burst beyond them is freed.
  static constexpr size_t kMaxSpareTensors = 1024, kMaxSpareRequests = 256;
  std::vector<std::unique_ptr<proto::Tensor>> spare_tensors_;
  std::vector<proto::InsertRequest> spare_requests_;
  int request_items_ = 0;
  int64_t request_bytes_ = 0;
  uint64_t next_frame_key_ = 0;
  int64_t items_queued_ = 0;
  int64_t items_sent_ = 0;
  int64_t bytes_sent_ = 0;
};

struct SamplerOptions {
  std::string table;
  int batch_size = 256;
  // Batches the stream gives before Next returns OutOfRange; 0 = unlimited.
  int64_t num_batches = 0;
  // How long one Next may wait on the rate limiter; then DeadlineExceeded.
  absl::Duration timeout = absl::InfiniteDuration();
  // Batches carry their items' frames (SampledBatch::frames) instead of
  // decoded pixels: for a learner that keeps frames on its device
  // (agents/device_frames.h). Over gRPC each frame crosses the stream once
  // (SampleRequest.frames_once): the sampler keeps the frames it received,
  // still compressed, until the server lets them go, and a new sampler (a
  // restarted learner) receives the ones it samples again.
  bool frame_references = false;
};

// A learner's sample stream.
class Sampler {
 public:
  virtual ~Sampler() = default;
  // Fills *batch with the next batch (reusing its buffers). Blocks on the
  // rate limiter up to the options' timeout.
  virtual absl::Status Next(SampledBatch* batch) = 0;
  // Ends the stream from any thread: a Next blocked now returns Cancelled
  // within kCancelLatency (items it had taken are dropped), and so does
  // every later Next. For a learner whose input thread waits on the rate
  // limiter when the run stops.
  virtual void Cancel() = 0;
  static constexpr absl::Duration kCancelLatency = absl::Milliseconds(50);
};

class ReplayClient {
 public:
  virtual ~ReplayClient() = default;
  virtual absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const WriterOptions& options = {}) = 0;
  // NotFound for an unknown table, InvalidArgument for batch_size < 1.
  virtual absl::StatusOr<std::unique_ptr<Sampler>> NewSampler(const SamplerOptions& options) = 0;
  // Returns how many keys were no longer in the table.
  virtual absl::StatusOr<int64_t> MutatePriorities(const proto::MutatePrioritiesRequest& request) = 0;
  virtual absl::StatusOr<proto::InfoResponse> Info() = 0;
  // Writes checkpoint `name` (a plain file name) in the replay's own
  // checkpoint directory (replay.checkpoint_dir); returns bytes written.
  // Errors: Replay::CheckpointByName's.
  virtual absl::StatusOr<int64_t> Checkpoint(const std::string& name) = 0;
  // Restores checkpoint `name` of that directory; returns items restored.
  virtual absl::StatusOr<int64_t> Restore(const std::string& name) = 0;
};

// Embedded mode: calls `replay` directly (no copies through protobuf on the
// sample path). `replay` must outlive the client and everything it makes.
std::unique_ptr<ReplayClient> NewLocalClient(Replay* replay);

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_CLIENT_H_
