// The replay service's core, used directly in embedded mode (the learner
// links it; nothing to start) and behind gRPC by replay/service.h. Clients
// reach either through the same interface (replay/client.h).
//
// Locking: the set of tables is fixed at creation; each Table locks itself
// and the FrameStore uses atomics, so Replay needs no lock of its own.
// InsertSession and the batch helpers belong to one thread at a time.
#ifndef TROUPE_REPLAY_REPLAY_H_
#define TROUPE_REPLAY_REPLAY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/replay.pb.h"
#include "replay/frame_store.h"
#include "replay/item.h"
#include "replay/table.h"

namespace troupe::replay {

// One field of a sampled batch, row-major [batch, ...]. A pixel field is
// uint8 [batch, frames, H, W, C] (frames oldest first).
struct SampledField {
  proto::DType dtype = proto::DTYPE_INVALID;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

struct SampledBatch {
  std::vector<uint64_t> keys;
  std::vector<double> probabilities;
  // (N P(i))^-beta normalized by the batch max; all 1 for non-prioritized tables.
  std::vector<float> weights;
  int64_t table_size = 0;
  std::vector<SampledField> fields;  // in signature order
  // Frame references instead of pixels (SamplerOptions::frame_references):
  // each item's frames, [batch, signature.num_frames] in signature order
  // (the pixel fields' frames, oldest first), held alive until the batch is
  // refilled; the pixel fields are then shaped but hold no bytes. Empty when
  // the pixels were decoded into the fields.
  std::vector<FramePtr> frames;
};

// Sizes *batch for `batch_size` items of `signature`; reuses its buffers, so
// it allocates only when the shape grows. `frame_references`: pixel fields
// get their shape and no bytes, `frames` one entry per item frame.
void ShapeBatch(const Signature& signature, int64_t batch_size, SampledBatch* batch, bool frame_references = false);

// The one check of a batch against the signature it was sampled with, for
// whoever consumes batches (the learner's agent, agents/transition.h): `rows`
// items, each field of the dtype and shape ShapeBatch gives it with at
// least its bytes (`frame_references`: pixel fields shaped with no bytes
// needed, and `frames` exactly rows * signature.num_frames). InvalidArgument
// naming the field: "batch field 1 (action): got float32[4,3] with 48
// bytes, expected float32[4,2]".
absl::Status CheckBatch(const Signature& signature, const SampledBatch& batch, int64_t rows, bool frame_references);

// Importance weights (Schaul et al. 2016): w_i = (N P(i))^-beta / max_j w_j
// when `prioritized` and beta > 0, else 1. Writes items.size() floats.
void ComputeWeights(const std::vector<SampledItem>& items, int64_t table_size, bool prioritized, double beta,
                    float* weights);

// Fills *batch (already shaped) from sampled items: keys, probabilities,
// importance weights (exponent `beta`, when `prioritized`), dense fields
// copied and frames decoded; each distinct frame of the batch (stacked obs
// and next obs share frames; frames share references) is decoded once and
// copied. Allocates only when `decoder` meets a larger batch than before.
// DataLoss if a stored frame does not decode.
absl::Status FillBatch(const Signature& signature, const std::vector<SampledItem>& items, int64_t table_size,
                       bool prioritized, double beta, FrameDecoder& decoder, SampledBatch* batch);
// As FillBatch for a batch shaped with `frame_references`: dense fields
// copied, each item's frames referenced in `frames` (nothing decoded).
void FillBatchReferences(const Signature& signature, const std::vector<SampledItem>& items, int64_t table_size,
                         bool prioritized, double beta, SampledBatch* batch);

// Limits of the service-wide options.
inline constexpr int64_t kMaxMessageBytes = (int64_t{1} << 31) - 1;  // gRPC takes an int
inline constexpr int kMaxWorkerThreads = 256;
inline constexpr int kMaxTables = 64;

// Checks a replay section without creating, binding or allocating
// anything: listen (strict HOST:PORT), max_message_bytes, worker_threads,
// frame_compression_level, checkpoint_dir (an existing directory when
// set), restore_path (a regular file when set), and every table
// (ValidateTableConfig; names unique). `tables_required`: false where an
// empty list means the caller adds its own table (the RL learner's
// transitions). InvalidArgument naming the field ("replay.tables[1].selector
// ..."); NotFound for a missing checkpoint_dir or restore_path.
absl::Status ValidateReplayConfig(const config::ReplayConfig& config, bool tables_required = true);

class Replay {
 public:
  // Creates every table of `config` (at least one; names unique), and
  // restores config.restore_path when set. InvalidArgument for a bad config.
  static absl::StatusOr<std::unique_ptr<Replay>> Create(const config::ReplayConfig& config);
  ~Replay();

  const config::ReplayConfig& config() const { return config_; }
  // NotFound "unknown table 'x'; tables: a, b" when absent.
  absl::StatusOr<Table*> FindTable(const std::string& name) const;
  const std::vector<std::unique_ptr<Table>>& tables() const { return tables_; }
  FrameStore& frame_store() { return frame_store_; }

  proto::InfoResponse Info() const;
  // Returns how many keys were no longer present.
  absl::StatusOr<int64_t> MutatePriorities(const proto::MutatePrioritiesRequest& request);
  // Writes every table to `path` (replay/checkpoint.h); returns bytes
  // written, and with `file_crc32` the file's crc32. For the process's own
  // files (the learner's run directory): a path from a client goes through
  // CheckpointByName.
  absl::StatusOr<int64_t> Checkpoint(const std::string& path, uint32_t* file_crc32 = nullptr);
  // Replaces every table's contents with the checkpoint at `path`; returns
  // items restored. A missing, truncated, corrupt or mismatched checkpoint
  // is refused with the reason and leaves every table as it was.
  absl::StatusOr<int64_t> Restore(const std::string& path);

  // Checkpoint and Restore for a client (the Checkpoint and Restore RPCs,
  // ReplayClient): `name` is a plain file name (ValidateCheckpointName)
  // inside config.checkpoint_dir, and nothing else is ever read or written.
  // FailedPrecondition when the config has no checkpoint_dir; Restore also
  // refuses a name that is not a regular file there (a link is not
  // followed). Messages say the name, never the directory or anything read
  // from a file the server did not write.
  absl::StatusOr<int64_t> CheckpointByName(absl::string_view name);
  absl::StatusOr<int64_t> RestoreByName(absl::string_view name);

  // Wakes every blocked insert and sample with Cancelled.
  void Close();

  // Every table's Table::StopLimitingInserts: inserts no longer wait for
  // samples (nothing samples any more at the end of a run).
  void StopLimitingInserts();

 private:
  explicit Replay(config::ReplayConfig config) : config_(std::move(config)) {}

  config::ReplayConfig config_;
  FrameStore frame_store_;
  std::vector<std::unique_ptr<Table>> tables_;
};

// The receiving end of one insert stream (a gRPC Insert call or a local
// Writer): the frames the client sent, by key, and the items of the last
// request still waiting for the rate limiter.
class InsertSession {
 public:
  explicit InsertSession(Replay* replay);

  // Registers the request's frames, then checks its items against their
  // tables (existence, field count, dtypes, shapes, frame keys) and queues
  // them. On error nothing is queued, and the message says what and where:
  // "item 2 field 'obs' (table 'pixels'): expected float32[24], got float32[23]".
  // Frame bytes are moved out of *request. Requires !has_pending().
  //
  // A request of a writer session (request.writer() != 0; proto/replay.proto)
  // may be a re-send: its items below items_inserted() (counted from
  // request.first_item()) are skipped, and when its sequence is one this
  // session already saw, its frames at or below the newest key held are
  // skipped too (they arrived the first time). InvalidArgument for a
  // session request with sequence < 1 or first_item < 0.
  absl::Status Prepare(proto::InsertRequest* request);

  // Inserts the queued items in order, each waiting up to `timeout` (and at
  // most its table's rate_limiter.insert_timeout_ms, when set) for its
  // table's rate limiter. DeadlineExceeded leaves the rest queued for a
  // later call; Cancelled if a table closed.
  absl::Status InsertPending(absl::Duration timeout);

  bool has_pending() const { return next_pending_ < pending_.size(); }
  // The configured insert timeout of the next queued item's table
  // (InfiniteDuration when none); requires has_pending().
  absl::Duration pending_timeout() const;
  int64_t items_inserted() const { return items_inserted_; }
  // Items of re-sent requests skipped because they were inserted already.
  int64_t items_skipped() const { return items_skipped_; }
  int64_t frames_held() const { return static_cast<int64_t>(frames_.size()); }

  // Forgets the queued items (a writer session taken over by a new stream
  // after the old one ended mid-request: the writer re-sends them).
  void DropPending() {
    pending_.clear();
    next_pending_ = 0;
  }

 private:
  struct Pending {
    Table* table;
    std::shared_ptr<Item> item;
    double priority;
  };

  absl::Status PrepareItem(const proto::ItemData& data, int index, Pending* out);
  // Checks a group's layout once, then queues its items (numbered from
  // `first`) but the first `skip` of them.
  absl::Status PrepareGroup(const proto::ItemGroup& group, int first, int64_t skip);
  // The table named by item `index`; NotFound naming the item.
  absl::StatusOr<Table*> ItemTable(const std::string& name, int index);
  // The held frame `key`, of `spec`'s frame shape; `at` names the field in errors.
  absl::StatusOr<FramePtr> ItemFrame(uint64_t key, const FieldSpec& spec, absl::FunctionRef<std::string()> at) const;

  Replay* replay_;
  FrameCompressor compressor_;  // frames sent raw
  FrameDecoder decoder_;        // checks zstd frames
  absl::btree_map<uint64_t, FramePtr> frames_;
  Table* last_table_ = nullptr;  // the previous item's table
  bool any_frame_ = false;
  uint64_t last_frame_key_ = 0;
  std::vector<Pending> pending_;
  size_t next_pending_ = 0;
  int64_t items_inserted_ = 0;
  int64_t items_skipped_ = 0;
  int64_t last_sequence_ = 0;  // a writer session's newest request prepared
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_REPLAY_H_
