#include "replay/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "proto/replay_checkpoint.pb.h"
#include "google/protobuf/unknown_field_set.h"

namespace troupe::replay {
namespace {

constexpr char kMagic[] = "TRPCKPT1";
constexpr char kTrailerMagic[] = "TRPCEND1";
constexpr size_t kMagicBytes = 8;
constexpr size_t kTrailerBytes = 8 + 8 + 4;
// 2: frames may be compressed against an earlier frame (reference_id).
// 3: frames say their codec (LZ4 or zstd); version 2 files (all zstd) are
// still read.
constexpr int kVersion = 3;
constexpr int kOldestVersion = 2;

// Appends to a file through a buffer, keeping a running crc32.
class RecordWriter {
 public:
  explicit RecordWriter(std::FILE* file) : file_(file) {}

  void Raw(const void* data, size_t n) {
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), n);
    if (std::fwrite(data, 1, n, file_) != n) ok_ = false;
    bytes_ += static_cast<int64_t>(n);
  }
  void Record(const proto::CheckpointRecord& record) {
    record.SerializeToString(&buffer_);
    const uint32_t n = static_cast<uint32_t>(buffer_.size());
    Raw(&n, sizeof(n));
    Raw(buffer_.data(), buffer_.size());
    ++records_;
  }
  void Trailer() {
    const uint32_t crc = static_cast<uint32_t>(crc_);
    Raw(kTrailerMagic, kMagicBytes);
    Raw(&records_, sizeof(records_));
    Raw(&crc, sizeof(crc));
  }
  bool ok() const { return ok_; }
  int64_t bytes() const { return bytes_; }
  // The crc32 of every byte written so far (after Trailer: the whole file's).
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }

 private:
  std::FILE* file_;
  uLong crc_ = crc32_z(0L, Z_NULL, 0);
  bool ok_ = true;
  int64_t bytes_ = 0;
  uint64_t records_ = 0;
  std::string buffer_;
};

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return ErrnoStatus(errno, absl::StrCat("checkpoint ", path, ": ", what));
}

}  // namespace

absl::StatusOr<int64_t> WriteCheckpoint(const std::vector<const Table*>& tables, const std::string& path,
                                        uint32_t* file_crc32) {
  // Snapshot every table (pointers only), and number each distinct frame,
  // a frame's reference before the frame.
  std::vector<TableSnapshot> snapshots;
  absl::flat_hash_map<const Frame*, int64_t> frame_ids;
  std::vector<const Frame*> frames;
  auto number = [&](const Frame* frame, auto& self) -> void {
    if (frame_ids.contains(frame)) return;
    if (frame->reference() != nullptr) self(frame->reference().get(), self);
    frame_ids.emplace(frame, static_cast<int64_t>(frames.size()));
    frames.push_back(frame);
  };
  for (const Table* table : tables) {
    snapshots.push_back(table->Snapshot());
    for (const auto& item : snapshots.back().items) {
      for (const FramePtr& frame : item->frames) number(frame.get(), number);
    }
  }
  // Write PATH.tmp.
  const std::string tmp = path + ".tmp";
  // A fresh file: whatever had the temporary name (a stale one, a link) is
  // replaced, never written through.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  std::FILE* file = fd < 0 ? nullptr : ::fdopen(fd, "wb");
  if (file == nullptr) {
    if (fd >= 0) ::close(fd);
    return ErrnoError("cannot open " + tmp + " for writing", path);
  }
  RecordWriter writer(file);
  writer.Raw(kMagic, kMagicBytes);
  proto::CheckpointRecord record;
  auto* header = record.mutable_header();
  header->set_version(kVersion);
  header->set_num_tables(static_cast<int64_t>(tables.size()));
  header->set_num_frames(static_cast<int64_t>(frames.size()));
  writer.Record(record);
  for (size_t i = 0; i < frames.size(); ++i) {
    auto* frame = record.mutable_frame();
    frame->Clear();
    frame->set_id(static_cast<int64_t>(i));
    frame->add_shape(frames[i]->height());
    frame->add_shape(frames[i]->width());
    frame->add_shape(frames[i]->channels());
    frame->set_data(frames[i]->data());
    frame->set_compression(frames[i]->codec());
    if (frames[i]->reference() != nullptr) frame->set_reference_id(frame_ids.at(frames[i]->reference().get()));
    writer.Record(record);
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableSnapshot& snapshot = snapshots[t];
    auto* table = record.mutable_table();
    table->Clear();
    *table->mutable_config() = tables[t]->config();
    table->set_num_items(static_cast<int64_t>(snapshot.items.size()));
    table->set_inserts(snapshot.inserts);
    table->set_samples(snapshot.samples);
    table->set_deletes(snapshot.deletes);
    table->set_next_key(snapshot.next_key);
    writer.Record(record);
    for (size_t i = 0; i < snapshot.items.size(); ++i) {
      const Item& item = *snapshot.items[i];
      auto* out = record.mutable_item();
      out->Clear();
      out->set_key(item.key);
      out->set_priority(snapshot.priorities[i]);
      out->set_dense(item.dense.data(), item.dense.size());
      for (const FramePtr& frame : item.frames) out->add_frame_ids(frame_ids.at(frame.get()));
      writer.Record(record);
    }
  }
  writer.Trailer();
  // Flush to disk, then move into place; on any failure drop the temporary.
  bool ok = writer.ok() && std::fflush(file) == 0;
  if (ok) NoteFileOp(FileOp::kWritten, tmp);
  if (ok) {
    if (const int error = SyncFile(fileno(file), tmp); error != 0) {
      ok = false;
      errno = error;  // for ErrnoError below
    }
  }
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) {
    auto status = ErrnoError("write to " + tmp + " failed", path);
    std::remove(tmp.c_str());
    return status;
  }
  if (const int error = RenamePath(tmp, path); error != 0) {
    errno = error;  // for ErrnoError
    auto status = ErrnoError("cannot rename " + tmp, path);
    std::remove(tmp.c_str());
    return status;
  }
  if (file_crc32 != nullptr) *file_crc32 = writer.crc();
  return writer.bytes();
}

absl::Status ValidateCheckpointName(absl::string_view name) {
  auto bad = [&name](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint name \"", absl::CHexEscape(name.substr(0, 64)),
                                                   name.size() > 64 ? "..." : "", "\" ", why,
                                                   "; a name is one plain file name of [A-Za-z0-9_.-], 1 to ",
                                                   kMaxCheckpointNameBytes, " characters, not starting with '.'"));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > kMaxCheckpointNameBytes) return bad(absl::StrCat("is ", name.size(), " bytes long"));
  if (name.front() == '.') return bad("starts with '.'");
  for (const char c : name) {
    if (c == '/') return bad("has a '/': it would leave the checkpoint directory");
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return bad("has a character outside [A-Za-z0-9_.-]");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RestoredTable>> ReadCheckpoint(const std::string& path, FrameStore& frame_store) {
  // Read the whole file, which must be a regular one (not a directory, a
  // device, a fifo).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": cannot open: ", std::strerror(errno)));
  std::string data;
  {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, " is not a regular file"));
    }
    data.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    data.resize(got);
  }
  auto corrupt = [&path](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is corrupt or truncated (", what,
                                            "); refusing it, nothing was restored"));
  };
  // Magic, trailer, checksum.
  if (data.size() < kMagicBytes + kTrailerBytes || std::memcmp(data.data(), kMagic, kMagicBytes) != 0) {
    return corrupt(data.size() < kMagicBytes + kTrailerBytes ? "too short" : "bad magic: not a troupe checkpoint");
  }
  const size_t body_end = data.size() - kTrailerBytes;
  if (std::memcmp(data.data() + body_end, kTrailerMagic, kMagicBytes) != 0) return corrupt("no trailer: truncated");
  uint64_t num_records = 0;
  uint32_t stored_crc = 0;
  std::memcpy(&num_records, data.data() + body_end + 8, 8);
  std::memcpy(&stored_crc, data.data() + body_end + 16, 4);
  const uint32_t crc =
      static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), body_end));
  if (crc != stored_crc) return corrupt(absl::StrCat("checksum mismatch: stored ", stored_crc, ", computed ", crc));
  // Parse records in order.
  size_t pos = kMagicBytes;
  uint64_t records_read = 0;
  proto::CheckpointRecord record;
  auto next = [&]() -> absl::Status {
    uint32_t n = 0;
    if (pos + 4 > body_end) return corrupt("record header past end");
    std::memcpy(&n, data.data() + pos, 4);
    pos += 4;
    if (pos + n > body_end || !record.ParseFromArray(data.data() + pos, static_cast<int>(n))) {
      return corrupt(absl::StrCat("record ", records_read, " does not parse"));
    }
    pos += n;
    ++records_read;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(next());
  if (!record.has_header()) return corrupt("missing header");
  const int version = record.header().version();
  if (version < kOldestVersion || version > kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " has format version ", version, "; this build reads versions ", kOldestVersion, " to ",
        kVersion, " (version 1 predates reference-coded frames); refusing it, nothing was restored"));
  }
  const proto::CheckpointHeader header = record.header();
  // Every frame and table is a record of its own: counts beyond the records
  // there are cannot be right (and would be allocated for below).
  if (header.num_frames() < 0 || static_cast<uint64_t>(header.num_frames()) > num_records ||
      header.num_tables() < 0 || static_cast<uint64_t>(header.num_tables()) > num_records) {
    return corrupt("header counts more frames or tables than there are records");
  }
  std::vector<FramePtr> frames;
  FrameDecoder decoder;  // checks zstd frames
  frames.reserve(header.num_frames());
  for (int64_t i = 0; i < header.num_frames(); ++i) {
    RETURN_IF_ERROR(next());
    if (!record.has_frame() || record.frame().id() != i || record.frame().shape_size() != 3) {
      return corrupt(absl::StrCat("frame ", i, " expected"));
    }
    auto& f = *record.mutable_frame();
    FramePtr reference;
    if (f.has_reference_id()) {
      if (f.reference_id() < 0 || f.reference_id() >= i) return corrupt(absl::StrCat("frame ", i, ": bad reference id"));
      reference = frames[f.reference_id()];
    }
    for (int64_t d : f.shape()) {
      if (d <= 0 || d > 65536) return corrupt(absl::StrCat("frame ", i, ": dimension ", d, " out of range"));
    }
    const proto::Compression codec = version == 2 ? proto::COMPRESSION_ZSTD : f.compression();
    ASSIGN_OR_RETURN(FramePtr frame,
                     frame_store.FromCompressed(std::move(*f.mutable_data()), codec, f.shape(0), f.shape(1),
                                                f.shape(2), std::move(reference), decoder,
                                                absl::StrCat("checkpoint ", path, " frame ", i)));
    frames.push_back(std::move(frame));
  }
  std::vector<RestoredTable> tables;
  for (int64_t t = 0; t < header.num_tables(); ++t) {
    RETURN_IF_ERROR(next());
    if (!record.has_table()) return corrupt(absl::StrCat("table ", t, " expected"));
    RestoredTable restored;
    if (absl::Status upgraded = UpgradeFormerStringFields(record.mutable_table()->mutable_config()); !upgraded.ok()) {
      return corrupt(std::string(upgraded.message()));
    }
    const proto::CheckpointTable table = record.table();
    restored.config = table.config();
    ASSIGN_OR_RETURN(Signature signature, Signature::FromConfig(table.config()));
    TableSnapshot& snapshot = restored.snapshot;
    snapshot.inserts = table.inserts();
    snapshot.samples = table.samples();
    snapshot.deletes = table.deletes();
    snapshot.next_key = table.next_key();
    for (int64_t i = 0; i < table.num_items(); ++i) {
      RETURN_IF_ERROR(next());
      if (!record.has_item()) return corrupt(absl::StrCat("table '", table.config().name(), "' item ", i, " expected"));
      const proto::CheckpointItem& stored = record.item();
      if (static_cast<int64_t>(stored.dense().size()) != signature.dense_bytes ||
          stored.frame_ids_size() != signature.num_frames) {
        return corrupt(absl::StrCat("table '", table.config().name(), "' item ", i, " does not match the signature"));
      }
      auto item = std::make_shared<Item>();
      item->key = stored.key();
      item->dense.assign(stored.dense().begin(), stored.dense().end());
      for (int64_t id : stored.frame_ids()) {
        if (id < 0 || id >= static_cast<int64_t>(frames.size())) return corrupt("frame id out of range");
        item->frames.push_back(frames[id]);
      }
      snapshot.items.push_back(std::move(item));
      snapshot.priorities.push_back(stored.priority());
    }
    tables.push_back(std::move(restored));
  }
  if (records_read != num_records || pos != body_end) return corrupt("record count mismatch");
  return tables;
}

namespace {

// Removes every length-delimited unknown field `number` of `message`; the
// last one's bytes (what a parser keeps of a repeated singular field) go to
// *value. False when there was none.
bool TakeFormerString(google::protobuf::Message& message, int number, std::string* value) {
  google::protobuf::UnknownFieldSet* unknown = message.GetReflection()->MutableUnknownFields(&message);
  bool found = false;
  for (int i = unknown->field_count() - 1; i >= 0; --i) {
    const google::protobuf::UnknownField& field = unknown->field(i);
    if (field.number() != number || field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (!found) *value = field.length_delimited();
    found = true;
    unknown->DeleteSubrange(i, 1);
  }
  return found;
}

}  // namespace

absl::Status UpgradeFormerStringFields(config::ReplayTableConfig* config) {
  constexpr int kFormerSelector = 3, kFormerDType = 2;  // proto/config.proto's reserved numbers
  const auto unknown = [&](const std::string& field, const std::string& value,
                           const google::protobuf::EnumDescriptor* type) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config->name(), "' ", field, " '",
                                                   absl::CHexEscape(value.substr(0, 64)),
                                                   "' (written by an earlier version): unknown; expected one of ",
                                                   EnumValues(type)));
  };
  std::string value;
  if (TakeFormerString(*config, kFormerSelector, &value) && !config->has_selector()) {
    config::ReplayTableConfig::Selector selector;
    if (!config::ReplayTableConfig::Selector_Parse(value, &selector)) {
      return unknown("selector", value, config::ReplayTableConfig::Selector_descriptor());
    }
    config->set_selector(selector);
  }
  for (int i = 0; i < config->fields_size(); ++i) {
    config::ReplayFieldConfig* field = config->mutable_fields(i);
    if (!TakeFormerString(*field, kFormerDType, &value) || field->has_dtype()) continue;
    config::ReplayFieldConfig::DType dtype;
    if (!config::ReplayFieldConfig::DType_Parse(value, &dtype)) {
      return unknown(absl::StrCat("fields[", i, "].dtype"), value, config::ReplayFieldConfig::DType_descriptor());
    }
    field->set_dtype(dtype);
  }
  return absl::OkStatus();
}

}  // namespace troupe::replay
