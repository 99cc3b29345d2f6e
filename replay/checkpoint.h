// Replay checkpoints: every table's items, priorities and rate-limiter
// counters, with each frame written once.
//
// File layout (all integers little-endian):
//   "TRPCKPT1"                              8-byte magic
//   repeated: u32 length, CheckpointRecord  (proto/replay_checkpoint.proto)
//       one header (format version 2); header.num_frames frames, each after
//       the frame it was compressed against; then per table one table
//       record followed by its num_items items, oldest first
//   "TRPCEND1", u64 record count, u32 crc32 of every byte before "TRPCEND1"
//
// Written to PATH.tmp, flushed and fsync'd, then renamed over PATH, so a
// crash or error leaves the previous checkpoint in place. Reading checks
// magic, trailer and checksum before parsing anything, so a truncated or
// corrupt file is refused whole.
#ifndef TROUPE_REPLAY_CHECKPOINT_H_
#define TROUPE_REPLAY_CHECKPOINT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/config.pb.h"
#include "replay/frame_store.h"
#include "replay/table.h"

namespace troupe::replay {

// Writes `tables` to `path`; returns the bytes written, and with
// `file_crc32` the crc32 of the whole file (computed as it was written, for
// a checkpoint generation's manifest). Tables keep serving meanwhile (each
// is snapshotted under its lock, then written without it). Errors:
// ErrnoStatus naming the path (ResourceExhausted for a full disk).
absl::StatusOr<int64_t> WriteCheckpoint(const std::vector<const Table*>& tables, const std::string& path,
                                        uint32_t* file_crc32 = nullptr);

struct RestoredTable {
  config::ReplayTableConfig config;
  TableSnapshot snapshot;
};

// The longest checkpoint name the Checkpoint and Restore RPCs take.
inline constexpr size_t kMaxCheckpointNameBytes = 128;

// OK when `name` is one plain file name, safe to join to a checkpoint
// directory: 1 to kMaxCheckpointNameBytes characters of [A-Za-z0-9_.-], not
// starting with '.' (so never "." or "..", no hidden file) and no '/'.
// InvalidArgument saying which rule it breaks; the name itself is quoted
// only with unprintable characters escaped.
absl::Status ValidateCheckpointName(absl::string_view name);

// Reads a checkpoint, making its frames in `frames`. DataLoss naming the
// path and what is wrong ("truncated", "checksum mismatch", ...) for a bad
// file; FailedPrecondition for another format version (version 1 files,
// from before reference-coded frames, are refused); NotFound if it does not
// exist; FailedPrecondition for something that is not a regular file (a
// directory, a device, a symbolic link: never followed). Messages never
// quote the file's bytes.
absl::StatusOr<std::vector<RestoredTable>> ReadCheckpoint(const std::string& path, FrameStore& frames);

// A table config read from a checkpoint that an earlier version wrote, when
// a table's `selector` and its fields' `dtype` were strings (fields 3 and 2
// of proto/config.proto, now reserved; they parse as unknown fields): sets
// the enums from those strings (the enum value names are the old strings)
// unless they are set, and drops them. ReadCheckpoint applies it to every
// table. InvalidArgument naming the table, the field and the allowed values
// for a string the enum does not have.
absl::Status UpgradeFormerStringFields(config::ReplayTableConfig* config);

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_CHECKPOINT_H_
