// Checkpoints: a model's parameters and (optionally) its optimizer's state in
// one file. Written to `path.tmp`, synced to disk, then renamed
// (WriteFileAtomically), so neither a crash nor a power loss leaves a
// half-written or empty checkpoint under `path`. Format (little-endian):
//   "TRPCKPT1" | u32 entries | entries... | u64 FNV-1a-64 of all prior bytes
//   entry: u32 name length | name | u32 rank | i64 dims[rank] | f32 data
// Parameters are named "param/<name>", optimizer state "<state>/<name>" (e.g.
// "adam.m/conv1.w"), the optimizer's step count "<optimizer>.steps" (rank 1,
// two floats holding the int64's bits).
#ifndef TROUPE_ENGINE_NN_CHECKPOINT_H_
#define TROUPE_ENGINE_NN_CHECKPOINT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/parameters.h"

namespace troupe::nn {

// The name prefix of a parameter's entry ("param/conv1.w").
inline constexpr char kParameterEntryPrefix[] = "param/";

// Writes params (and optimizer state if given), downloaded from their
// backend. Errors: PermissionDenied / DataLoss naming the path.
absl::Status SaveCheckpoint(const std::string& path, const ParameterSet& params, Optimizer* optimizer = nullptr);

// Reads a checkpoint into params (and optimizer), uploaded to their backend.
// The file's checksum, and every entry's name and shape against the model,
// are checked before anything is overwritten; a mismatch is InvalidArgument
// naming the first entry that differs, a corrupt file DataLoss.
absl::Status LoadCheckpoint(const std::string& path, ParameterSet& params, Optimizer* optimizer = nullptr);

// --- The pieces, for models that are more than one ParameterSet ------------

// One tensor of a checkpoint file, on the host.
struct CheckpointTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

// A named tensor in a backend's memory (data may be null for an entry the
// caller fills on the host, as a counter).
struct DeviceTensor {
  std::string name;
  Shape shape;
  float* data = nullptr;
};

// Host copies of `tensors`, one Download each.
std::vector<CheckpointTensor> DownloadTensors(Backend& backend, const std::vector<DeviceTensor>& tensors);
// What SaveCheckpoint(path, params, optimizer) writes, on the host, in file
// order (tests compare whole states through it).
std::vector<CheckpointTensor> CheckpointTensors(const ParameterSet& params, Optimizer* optimizer = nullptr);
// Uploads host[k] into to[k] for every k < to.size() (shapes must match).
void UploadTensors(Backend& backend, const std::vector<CheckpointTensor>& host, const std::vector<DeviceTensor>& to);
// int64 counters as a tensor of 2n floats holding their bits, and back.
CheckpointTensor Int64Tensor(const std::string& name, std::span<const int64_t> values);
std::vector<int64_t> Int64sOf(const CheckpointTensor& tensor);

// Writes `tensors` as a checkpoint file (the format above). Errors:
// WriteFileAtomically's, naming the path (ResourceExhausted for a full disk).
absl::Status WriteCheckpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors);

// Every tensor of the checkpoint at `path`, in file order, for a reader that
// takes only some of them (a policy from its agent's checkpoint). The
// checksum is checked first. Errors: NotFound, DataLoss (corrupt, truncated).
absl::StatusOr<std::vector<CheckpointTensor>> ReadCheckpoint(const std::string& path);

// The entry named `name` of `tensors` (ReadCheckpoint's of `path`), for a
// reader that takes only some of a file's entries (a policy from its
// agent's checkpoint), of `shape` when one is given. InvalidArgument naming
// the file and the entry when it has none of that name, or one of another
// shape.
absl::StatusOr<const CheckpointTensor*> FindCheckpointEntry(const std::vector<CheckpointTensor>& tensors,
                                                            const std::string& path, const std::string& name,
                                                            const Shape* shape = nullptr);

// ReadCheckpoint, then the file's entries checked against `expected`'s names
// and shapes in order: InvalidArgument naming the first that differs, an
// extra or a missing one.
absl::StatusOr<std::vector<CheckpointTensor>> ReadCheckpointMatching(const std::string& path,
                                                                      const std::vector<DeviceTensor>& expected);

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_CHECKPOINT_H_
