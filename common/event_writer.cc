#include "common/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/host.h"
#include "common/status_macros.h"
#include "proto/tensorboard_event.pb.h"

namespace troupe {
namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial 0x82f63b78.
constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82f63b78u : 0u);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

void AppendLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t ReadLittleEndian(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) value |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// This machine's name for a file name: no '/'.
std::string HostNameForFile() {
  std::string name = HostName();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

// Files this process made, so that two writers opened in one second get
// different names.
std::atomic<int> files_opened{0};

}  // namespace

uint32_t Crc32c(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (const char c : data) crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string FrameRecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  AppendLittleEndian(&record, data.size(), 8);
  AppendLittleEndian(&record, MaskCrc32c(Crc32c(record)), 4);
  record.append(data);
  AppendLittleEndian(&record, MaskCrc32c(Crc32c(data)), 4);
  return record;
}

absl::StatusOr<std::vector<std::string>> ReadRecords(const std::string& path, bool* cut_off) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  std::string_view rest(bytes);
  std::vector<std::string> records;
  if (cut_off != nullptr) *cut_off = false;
  while (!rest.empty()) {
    const size_t offset = bytes.size() - rest.size();
    // A header or data shorter than it says: the writer was stopped mid-record.
    if (rest.size() < 12) break;
    const uint64_t length = ReadLittleEndian(rest.substr(0, 8));
    if (MaskCrc32c(Crc32c(rest.substr(0, 8))) != ReadLittleEndian(rest.substr(8, 4))) {
      return absl::DataLossError(absl::StrCat("event file ", path, ": the length of the record at byte ", offset,
                                              " fails its CRC"));
    }
    if (rest.size() - 12 < length || rest.size() - 12 - length < 4) break;
    const std::string_view data = rest.substr(12, length);
    if (MaskCrc32c(Crc32c(data)) != ReadLittleEndian(rest.substr(12 + length, 4))) {
      return absl::DataLossError(absl::StrCat("event file ", path, ": the data of the record at byte ", offset,
                                              " fails its CRC"));
    }
    records.emplace_back(data);
    rest.remove_prefix(12 + length + 4);
  }
  if (cut_off != nullptr) *cut_off = !rest.empty();
  return records;
}

bool IsEventFileName(std::string_view name) { return name.starts_with("events.out.tfevents."); }

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Open(const std::string& dir, int64_t start_step) {
  // A fresh name: O_EXCL never reuses a file another writer made.
  const long long seconds = static_cast<long long>(UnixSeconds());
  std::string path;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    path = absl::StrFormat("%s/events.out.tfevents.%010d.%s.%d.%d", dir, seconds, HostNameForFile(), getpid(),
                           files_opened.fetch_add(1));
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
      return ErrnoStatus(errno, absl::StrCat("cannot create event file ", path));
    }
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(fd, path));
  // The file version, then where this writer's steps start.
  tensorboard::Event version;
  version.set_wall_time(UnixSeconds());
  version.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(writer->Append(version.SerializeAsString()));
  tensorboard::Event start;
  start.set_wall_time(UnixSeconds());
  start.set_step(start_step);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  RETURN_IF_ERROR(writer->Append(start.SerializeAsString()));
  return writer;
}

EventWriter::~EventWriter() { ::close(fd_); }

absl::Status EventWriter::Append(const std::string& event) {
  const std::string record = FrameRecord(event);
  absl::MutexLock lock(&mutex_);
  if (!error_.ok()) return error_;
  if (const int error = WriteAll(fd_, record); error != 0) {
    error_ = ErrnoStatus(error, absl::StrCat("cannot write event file ", path_));
  }
  return error_;
}

absl::Status EventWriter::AddScalars(int64_t step, std::span<const Scalar> scalars) {
  tensorboard::Event event;
  event.set_wall_time(UnixSeconds());
  event.set_step(step);
  for (const Scalar& scalar : scalars) {
    tensorboard::Summary::Value* value = event.mutable_summary()->add_value();
    value->set_tag(std::string(scalar.tag));
    value->set_simple_value(static_cast<float>(scalar.value));
  }
  return Append(event.SerializeAsString());
}

absl::Status EventWriter::AddScalar(std::string_view tag, int64_t step, double value) {
  const Scalar scalar{tag, value};
  return AddScalars(step, {&scalar, 1});
}

absl::Status EventWriter::AddImage(std::string_view tag, int64_t step, const Image& image) {
  ASSIGN_OR_RETURN(std::string png, EncodePng(image));
  tensorboard::Event event;
  event.set_wall_time(UnixSeconds());
  event.set_step(step);
  tensorboard::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag(std::string(tag));
  tensorboard::Summary::Image* summary_image = value->mutable_image();
  summary_image->set_height(image.height);
  summary_image->set_width(image.width);
  summary_image->set_colorspace(image.channels);  // 1 grey, 3 RGB
  summary_image->set_encoded_image_string(std::move(png));
  return Append(event.SerializeAsString());
}

absl::StatusOr<int64_t> DropEventsPast(const std::string& dir, int64_t limit) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && IsEventFileName(entry.path().filename().string())) {
      paths.push_back(entry.path().string());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, " for event files: ", ec.message()));
  int64_t dropped = 0;
  absl::Status first_error;
  for (const std::string& path : paths) {
    bool cut_off = false;
    absl::StatusOr<std::vector<std::string>> records = ReadRecords(path, &cut_off);
    if (!records.ok()) {
      first_error.Update(records.status());
      continue;
    }
    // The kept records, byte for byte as they were (no re-serialization).
    std::string kept;
    int64_t dropped_here = 0;
    for (const std::string& record : *records) {
      tensorboard::Event event;
      if (event.ParseFromString(record) && event.step() > limit) {
        ++dropped_here;
        continue;
      }
      kept += FrameRecord(record);
    }
    if (dropped_here == 0 && !cut_off) continue;
    if (absl::Status written = WriteFileAtomically(path, kept); !written.ok()) {
      first_error.Update(written);
      continue;
    }
    dropped += dropped_here;
  }
  if (!first_error.ok()) return first_error;
  return dropped;
}

}  // namespace troupe
