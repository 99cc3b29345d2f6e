#include "engine/nn/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::nn {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'C', 'K', 'P', 'T', '1'};

uint64_t Fnv1a(const char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// One tensor of the file, pointing at the model's memory.
struct Entry {
  std::string name;
  Shape shape;
  float* data;
};

// Everything a checkpoint of (params, optimizer) holds, in file order.
std::vector<Entry> Entries(const ParameterSet& params, Optimizer* optimizer, int64_t* steps) {
  std::vector<Entry> entries;
  auto& mutable_params = const_cast<ParameterSet&>(params);
  for (int i = 0; i < params.size(); ++i) {
    entries.push_back({kParameterEntryPrefix + params.info(i).name, params.info(i).shape, mutable_params.value(i).data});
  }
  if (optimizer != nullptr) {
    for (const OptimizerState& s : optimizer->State()) {
      for (int i = 0; i < params.size(); ++i) {
        entries.push_back({s.name + "/" + params.info(i).name, params.info(i).shape, s.data + params.info(i).offset});
      }
    }
    entries.push_back({optimizer->name() + ".steps", Shape{2}, reinterpret_cast<float*>(steps)});
  }
  return entries;
}

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

absl::Status SaveCheckpoint(const std::string& path, const ParameterSet& params, Optimizer* optimizer) {
  int64_t steps[1] = {optimizer != nullptr ? optimizer->steps() : 0};
  const std::vector<Entry> entries = Entries(params, optimizer, steps);
  // Serialise into memory, then checksum.
  std::string out(kMagic, sizeof(kMagic));
  Put<uint32_t>(out, static_cast<uint32_t>(entries.size()));
  for (const Entry& e : entries) {
    Put<uint32_t>(out, static_cast<uint32_t>(e.name.size()));
    out += e.name;
    Put<uint32_t>(out, static_cast<uint32_t>(e.shape.rank()));
    for (int d = 0; d < e.shape.rank(); ++d) Put<int64_t>(out, e.shape[d]);
    out.append(reinterpret_cast<const char*>(e.data), sizeof(float) * e.shape.size());
  }
  Put<uint64_t>(out, Fnv1a(out.data(), out.size()));
  // Temporary file + rename.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot open ", tmp, " for writing"));
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!f.flush()) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("write failed: ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
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
  if (stored != Fnv1a(bytes.data(), bytes.size() - sizeof(stored))) {
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

absl::Status LoadCheckpoint(const std::string& path, ParameterSet& params, Optimizer* optimizer) {
  ParsedCheckpoint file;
  RETURN_IF_ERROR(Parse(path, &file));
  int64_t steps[1] = {0};
  const std::vector<Entry> expected = Entries(params, optimizer, steps);
  // Check every entry's name and shape before copying anything.
  for (size_t k = 0; k < file.tensors.size(); ++k) {
    const ParsedCheckpoint::Tensor& t = file.tensors[k];
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
  if (file.tensors.size() < expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": checkpoint lacks '", expected[file.tensors.size()].name,
                                                   "' (it has ", file.tensors.size(), " entries, the model ",
                                                   expected.size(), ")"));
  }
  // All checked: copy.
  for (size_t k = 0; k < expected.size(); ++k) {
    std::memcpy(expected[k].data, file.tensors[k].payload, sizeof(float) * expected[k].shape.size());
  }
  if (optimizer != nullptr) optimizer->set_steps(steps[0]);
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
