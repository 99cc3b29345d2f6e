#include "replay/item.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace troupe::replay {

int64_t DTypeSize(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_FLOAT32: return 4;
    case proto::DTYPE_FLOAT64: return 8;
    case proto::DTYPE_INT32: return 4;
    case proto::DTYPE_INT64: return 8;
    case proto::DTYPE_UINT8: return 1;
    default: return 0;
  }
}

proto::DType WireDType(config::ReplayFieldConfig::DType dtype) {
  switch (dtype) {
    case config::ReplayFieldConfig::float32: return proto::DTYPE_FLOAT32;
    case config::ReplayFieldConfig::float64: return proto::DTYPE_FLOAT64;
    case config::ReplayFieldConfig::int32: return proto::DTYPE_INT32;
    case config::ReplayFieldConfig::int64: return proto::DTYPE_INT64;
    case config::ReplayFieldConfig::uint8: return proto::DTYPE_UINT8;
  }
  return proto::DTYPE_INVALID;
}

std::string DTypeName(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_FLOAT32: return "float32";
    case proto::DTYPE_FLOAT64: return "float64";
    case proto::DTYPE_INT32: return "int32";
    case proto::DTYPE_INT64: return "int64";
    case proto::DTYPE_UINT8: return "uint8";
    default: return "invalid";
  }
}

std::string ShapeString(proto::DType dtype, const int64_t* shape, int rank) {
  std::vector<int64_t> dims(shape, shape + rank);
  return absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(dims, ","), "]");
}

absl::StatusOr<Signature> Signature::FromConfig(const config::ReplayTableConfig& config) {
  const std::string where = absl::StrCat("table '", config.name(), "'");
  if (config.fields_size() == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": has no fields"));
  Signature signature;
  absl::flat_hash_set<std::string> names;
  for (const auto& field : config.fields()) {
    FieldSpec spec;
    spec.name = field.name();
    const std::string at = absl::StrCat(where, " field '", field.name(), "'");
    if (spec.name.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": a field has no name"));
    if (!names.insert(spec.name).second) return absl::InvalidArgumentError(absl::StrCat(at, ": duplicate name"));
    spec.dtype = WireDType(field.dtype());
    if (spec.dtype == proto::DTYPE_INVALID) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": unknown dtype ", static_cast<int>(field.dtype()),
                                                     "; expected float32, float64, int32, int64 or uint8"));
    }
    spec.frames = field.frames();
    spec.bytes = DTypeSize(spec.dtype);
    for (int64_t d : field.shape()) {
      if (d <= 0) return absl::InvalidArgumentError(absl::StrCat(at, ": dimension ", d, " must be positive"));
      // Bounded so that no size overflows (a config is checked tighter by
      // ValidateTableConfig; this also guards a checkpoint's table config).
      if (d > (int64_t{1} << 30) || spec.bytes > (int64_t{1} << 33) / d) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": dimension ", d, " makes the field too large"));
      }
      spec.shape.push_back(d);
      spec.bytes *= d;
    }
    if (spec.frames < 0) return absl::InvalidArgumentError(absl::StrCat(at, ": frames must be >= 0"));
    if (spec.frames > 0) {
      // Pixel field: frames of uint8 [H, W, C].
      if (spec.dtype != proto::DTYPE_UINT8 || spec.shape.size() != 3) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": a pixel field (frames > 0) must be uint8 with shape "
                                                           "[H, W, C], got ",
                                                       ShapeString(spec.dtype, spec.shape.data(), spec.shape.size())));
      }
      spec.offset = signature.num_frames;
      signature.num_frames += spec.frames;
    } else {
      spec.offset = signature.dense_bytes;
      signature.dense_bytes += spec.bytes;
    }
    signature.fields.push_back(std::move(spec));
  }
  return signature;
}

bool Signature::SameAs(const Signature& other) const {
  if (fields.size() != other.fields.size()) return false;
  for (size_t i = 0; i < fields.size(); ++i) {
    const FieldSpec& a = fields[i];
    const FieldSpec& b = other.fields[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.frames != b.frames) return false;
  }
  return true;
}

}  // namespace troupe::replay
