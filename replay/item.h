// Items and the table signature they follow.
//
// A table's signature lists its fields (config ReplayFieldConfig): a dense
// field is a tensor of fixed dtype and shape, a pixel field is `frames`
// references into the frame store (a frame stack, or a sequence's frames).
// An n-step transition is e.g. {obs: pixels x3, action, reward, discount,
// next_obs: pixels x3}; a sequence of length T has a leading T in every
// dense shape and T*stack frames.
//
// An Item is immutable once a table holds it and is shared (std::shared_ptr)
// with the batches that sample it; no lock is needed to read one.
#ifndef TROUPE_REPLAY_ITEM_H_
#define TROUPE_REPLAY_ITEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "proto/tensor.pb.h"
#include "replay/frame_store.h"

namespace troupe::replay {

// Bytes per element of `dtype` (0 for DTYPE_INVALID).
int64_t DTypeSize(proto::DType dtype);
// A table field's element type on the wire: ReplayFieldConfig::float32 ->
// DTYPE_FLOAT32, ...; DTYPE_INVALID for a value the enum does not have.
proto::DType WireDType(config::ReplayFieldConfig::DType dtype);
// DTYPE_FLOAT32 -> "float32".
std::string DTypeName(proto::DType dtype);
// "float32[3,84,84]".
std::string ShapeString(proto::DType dtype, const int64_t* shape, int rank);

struct FieldSpec {
  std::string name;
  proto::DType dtype = proto::DTYPE_INVALID;
  std::vector<int64_t> shape;  // dense: item shape; pixel: one frame's [H, W, C]
  int32_t frames = 0;          // > 0: pixel field
  int64_t bytes = 0;           // dense: bytes per item; pixel: bytes per frame
  int64_t offset = 0;          // dense: offset in Item::dense; pixel: first index in Item::frames
};

struct Signature {
  std::vector<FieldSpec> fields;
  int64_t dense_bytes = 0;  // sum of dense field bytes
  int64_t num_frames = 0;   // sum of pixel field frame counts

  // Builds and checks a signature: names unique and non-empty, known dtypes,
  // positive dimensions, pixel fields uint8 [H, W, C]. `where` names the
  // table in errors.
  static absl::StatusOr<Signature> FromConfig(const config::ReplayTableConfig& config);

  // True if both have the same fields (names, dtypes, shapes, frames).
  bool SameAs(const Signature& other) const;
};

// Stored inline (one allocation per item, not three) up to the sizes of a
// pixel transition: a few dense floats and two stacks of 3 frames; larger
// items spill to the heap.
struct Item {
  uint64_t key = 0;                              // set by the table on insert
  absl::InlinedVector<uint8_t, 48> dense;        // dense fields, concatenated in signature order
  absl::InlinedVector<FramePtr, 6> frames;       // pixel fields' frames, concatenated in signature order
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_ITEM_H_
