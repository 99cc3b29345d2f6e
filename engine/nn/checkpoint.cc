#include "engine/nn/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"

namespace troupe::nn {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'C', 'K', 'P', 'T', '1'};

// Everything a checkpoint of (params, optimizer) holds in device memory, in
// file order; the optimizer's step count follows them (StepsEntry).
std::vector<DeviceTensor> Entries(const ParameterSet& params, Optimizer* optimizer) {
  std::vector<DeviceTensor> entries;
  for (int i = 0; i < params.size(); ++i) {
    entries.push_back({kParameterEntryPrefix + params.info(i).name, params.info(i).shape, params.value(i).data});
  }
  if (optimizer != nullptr) {
    for (const OptimizerState& s : optimizer->State()) {
      for (int i = 0; i < params.size(); ++i) {
        entries.push_back({s.name + "/" + params.info(i).name, params.info(i).shape, s.data + params.info(i).offset});
      }
    }
  }
  return entries;
}

// "<optimizer>.steps": the int64's bits in two floats, on the host.
DeviceTensor StepsEntry(const Optimizer& optimizer) { return {optimizer.name() + ".steps", Shape{2}, nullptr}; }

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A bounds-checked reader over the file's bytes.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  template <typename T>
  absl::Status Get(T* v) {
    RETURN_IF_ERROR(Need(sizeof(T)));
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetBytes(size_t n, const char** p) {
    RETURN_IF_ERROR(Need(n));
    *p = bytes_.data() + pos_;
    pos_ += n;
    return absl::OkStatus();
  }

 private:
  absl::Status Need(size_t n) {
    if (pos_ + n > bytes_.size() - sizeof(uint64_t)) {
      return absl::DataLossError(absl::StrCat(path_, ": truncated checkpoint at byte ", pos_));
    }
    return absl::OkStatus();
  }
  const std::string& bytes_;
  const std::string& path_;
  size_t pos_ = sizeof(kMagic);
};

}  // namespace

std::vector<CheckpointTensor> DownloadTensors(Backend& backend, const std::vector<DeviceTensor>& tensors) {
  std::vector<CheckpointTensor> host;
  host.reserve(tensors.size());
  for (const DeviceTensor& t : tensors) {
    CheckpointTensor& h = host.emplace_back(CheckpointTensor{t.name, t.shape, std::vector<float>(t.shape.size())});
    backend.Download(t.data, h.values.data(), sizeof(float) * h.values.size());
  }
  return host;
}

CheckpointTensor Int64Tensor(const std::string& name, std::span<const int64_t> values) {
  CheckpointTensor t{name, Shape{2 * static_cast<int64_t>(values.size())}, std::vector<float>(2 * values.size())};
  std::memcpy(t.values.data(), values.data(), sizeof(int64_t) * values.size());
  return t;
}

std::vector<int64_t> Int64sOf(const CheckpointTensor& tensor) {
  std::vector<int64_t> values(tensor.values.size() / 2);
  std::memcpy(values.data(), tensor.values.data(), sizeof(int64_t) * values.size());
  return values;
}

absl::Status WriteCheckpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors) {
  // Serialise into memory (its size reserved: no growth by doubling, whose
  // transient buffers the heap keeps), then checksum.
  size_t bytes = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint64_t);
  for (const CheckpointTensor& t : tensors) {
    bytes += 2 * sizeof(uint32_t) + t.name.size() + sizeof(int64_t) * t.shape.rank() + sizeof(float) * t.values.size();
  }
  std::string out;
  out.reserve(bytes);
  out.append(kMagic, sizeof(kMagic));
  Put<uint32_t>(out, static_cast<uint32_t>(tensors.size()));
  for (const CheckpointTensor& t : tensors) {
    TROUPE_CHECK(static_cast<int64_t>(t.values.size()) == t.shape.size());
    Put<uint32_t>(out, static_cast<uint32_t>(t.name.size()));
    out += t.name;
    Put<uint32_t>(out, static_cast<uint32_t>(t.shape.rank()));
    for (int d = 0; d < t.shape.rank(); ++d) Put<int64_t>(out, t.shape[d]);
    out.append(reinterpret_cast<const char*>(t.values.data()), sizeof(float) * t.values.size());
  }
  Put<uint64_t>(out, CheckpointChecksum(out.data(), out.size()));
  // Temporary file, synced, then renamed: a crash leaves the old file or the
  // whole new one, never an empty one.
  return WriteFileAtomically(path, out);
}

std::vector<CheckpointTensor> CheckpointTensors(const ParameterSet& params, Optimizer* optimizer) {
  std::vector<CheckpointTensor> tensors = DownloadTensors(params.backend(), Entries(params, optimizer));
  if (optimizer != nullptr) {
    const int64_t steps = optimizer->steps();
    tensors.push_back(Int64Tensor(StepsEntry(*optimizer).name, {&steps, 1}));
  }
  return tensors;
}

absl::Status SaveCheckpoint(const std::string& path, const ParameterSet& params, Optimizer* optimizer) {
  return WriteCheckpoint(path, CheckpointTensors(params, optimizer));
}

namespace {

// A checkpoint file read into memory and checked: magic, checksum, and every
// entry's header and payload within bounds. Payloads point into `bytes`.
struct ParsedCheckpoint {
  struct Tensor {
    std::string name;
    Shape shape;
    const char* payload;
  };
  std::string bytes;
  std::vector<Tensor> tensors;
};

absl::Status Parse(const std::string& path, ParsedCheckpoint* parsed) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path));
  parsed->bytes.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string& bytes = parsed->bytes;
  // Magic and checksum first.
  if (bytes.size() < sizeof(kMagic) + 4 + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a troupe checkpoint (bad magic or too short)"));
  }
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof(stored), sizeof(stored));
  if (stored != CheckpointChecksum(bytes.data(), bytes.size() - sizeof(stored))) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (file corrupt or truncated)"));
  }
  // Each entry: name, rank, dims, payload.
  Reader r(bytes, path);
  uint32_t count;
  RETURN_IF_ERROR(r.Get(&count));
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t name_len, rank;
    const char* name_bytes;
    RETURN_IF_ERROR(r.Get(&name_len));
    RETURN_IF_ERROR(r.GetBytes(name_len, &name_bytes));
    const std::string name(name_bytes, name_len);
    RETURN_IF_ERROR(r.Get(&rank));
    if (rank > static_cast<uint32_t>(kMaxRank)) {
      return absl::DataLossError(absl::StrCat(path, ": entry '", name, "' has rank ", rank));
    }
    int64_t dims[kMaxRank] = {0, 0, 0, 0};
    for (uint32_t d = 0; d < rank; ++d) RETURN_IF_ERROR(r.Get(&dims[d]));
    Shape shape;
    switch (rank) {
      case 0: shape = Shape{}; break;
      case 1: shape = Shape{dims[0]}; break;
      case 2: shape = Shape{dims[0], dims[1]}; break;
      case 3: shape = Shape{dims[0], dims[1], dims[2]}; break;
      default: shape = Shape{dims[0], dims[1], dims[2], dims[3]}; break;
    }
    const char* payload;
    RETURN_IF_ERROR(r.GetBytes(sizeof(float) * shape.size(), &payload));
    parsed->tensors.push_back({name, shape, payload});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const CheckpointTensor*> FindCheckpointEntry(const std::vector<CheckpointTensor>& tensors,
                                                            const std::string& path, const std::string& name,
                                                            const Shape* shape) {
  const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const CheckpointTensor& t) { return t.name == name; });
  if (it == tensors.end()) return absl::InvalidArgumentError(absl::StrCat(path, ": no entry '", name, "'"));
  if (shape != nullptr && it->shape != *shape) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": '", name, "' has shape ", it->shape.ToString(),
                                                   ", the policy expects ", shape->ToString()));
  }
  return &*it;
}

absl::StatusOr<std::vector<CheckpointTensor>> ReadCheckpointMatching(const std::string& path,
                                                                      const std::vector<DeviceTensor>& expected) {
  ASSIGN_OR_RETURN(std::vector<CheckpointTensor> file, ReadCheckpoint(path));
  for (size_t k = 0; k < file.size(); ++k) {
    const CheckpointTensor& t = file[k];
    if (k >= expected.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": checkpoint has extra entry '", t.name,
                                                     "' the model does not have"));
    }
    if (t.name != expected[k].name) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": entry ", k, " is '", t.name, "', the model expects '",
                                                     expected[k].name, "'"));
    }
    if (t.shape != expected[k].shape) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", t.name, "' has shape ", t.shape.ToString(),
                                                     ", the model expects ", expected[k].shape.ToString()));
    }
  }
  if (file.size() < expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": checkpoint lacks '", expected[file.size()].name,
                                                   "' (it has ", file.size(), " entries, the model ",
                                                   expected.size(), ")"));
  }
  return file;
}

void UploadTensors(Backend& backend, const std::vector<CheckpointTensor>& host, const std::vector<DeviceTensor>& to) {
  TROUPE_CHECK(host.size() >= to.size());
  for (size_t k = 0; k < to.size(); ++k) {
    TROUPE_CHECK(host[k].shape == to[k].shape);
    backend.Upload(host[k].values.data(), to[k].data, sizeof(float) * host[k].values.size());
  }
}

absl::Status LoadCheckpoint(const std::string& path, ParameterSet& params, Optimizer* optimizer) {
  const std::vector<DeviceTensor> entries = Entries(params, optimizer);
  std::vector<DeviceTensor> expected = entries;
  if (optimizer != nullptr) expected.push_back(StepsEntry(*optimizer));
  // Every entry's name and shape is checked before anything is overwritten.
  ASSIGN_OR_RETURN(const std::vector<CheckpointTensor> file, ReadCheckpointMatching(path, expected));
  UploadTensors(params.backend(), file, entries);
  if (optimizer != nullptr) optimizer->set_steps(Int64sOf(file.back())[0]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointTensor>> ReadCheckpoint(const std::string& path) {
  ParsedCheckpoint file;
  RETURN_IF_ERROR(Parse(path, &file));
  std::vector<CheckpointTensor> tensors;
  for (const ParsedCheckpoint::Tensor& t : file.tensors) {
    const auto* values = reinterpret_cast<const float*>(t.payload);
    tensors.push_back({t.name, t.shape, std::vector<float>(values, values + t.shape.size())});
  }
  return tensors;
}

}  // namespace troupe::nn
