#include "common/generations.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "generation-";
constexpr char kManifest[] = "MANIFEST";
constexpr char kManifestHeader[] = "troupe checkpoint generation ";

std::string FolderName(int64_t number) { return absl::StrFormat("%s%09d", kPrefix, number); }

// The number of a folder named generation-N, or -1.
int64_t NumberOf(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(sizeof(kPrefix) - 1);
  int64_t number = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(digits, &number)) {
    return -1;
  }
  return number;
}

uint32_t Crc32(const char* data, size_t n, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, reinterpret_cast<const Bytef*>(data), n));
}

// A file's size and crc32, read through once.
absl::StatusOr<GenerationFile> Measure(const std::string& path, absl::string_view name) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  GenerationFile file{std::string(name), 0, 0};
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status status = ErrnoStatus(errno, absl::StrCat("cannot read ", path));
      ::close(fd);
      return status;
    }
    if (n == 0) break;
    file.crc32 = Crc32(buffer.data(), static_cast<size_t>(n), file.crc32);
    file.size += n;
  }
  ::close(fd);
  return file;
}

// MANIFEST's text for `files` of generation `number`.
std::string ManifestText(int64_t number, const std::vector<GenerationFile>& files) {
  std::string text = absl::StrCat(kManifestHeader, number, "\n");
  for (const GenerationFile& f : files) absl::StrAppend(&text, "file ", f.name, " ", f.size, " ", f.crc32, "\n");
  absl::StrAppend(&text, "crc32 ", Crc32(text.data(), text.size()), "\n");
  return text;
}

// Parses MANIFEST's text; DataLoss saying what is wrong.
absl::StatusOr<std::vector<GenerationFile>> ParseManifest(const std::string& text, int64_t number) {
  const size_t last = text.rfind("crc32 ");
  uint32_t stored = 0;
  if (last == std::string::npos || (last > 0 && text[last - 1] != '\n') || text.empty() || text.back() != '\n' ||
      !absl::SimpleAtoi(text.substr(last + 6, text.size() - last - 7), &stored)) {
    return absl::DataLossError("MANIFEST has no crc32 line (truncated?)");
  }
  if (Crc32(text.data(), last) != stored) return absl::DataLossError("MANIFEST checksum mismatch (damaged)");
  std::istringstream in(text.substr(0, last));
  std::string line;
  if (!std::getline(in, line) || line != absl::StrCat(kManifestHeader, number)) {
    return absl::DataLossError(absl::StrCat("MANIFEST is not generation ", number, "'s"));
  }
  std::vector<GenerationFile> files;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string word;
    GenerationFile f;
    if (!(fields >> word >> f.name >> f.size >> f.crc32) || word != "file") {
      return absl::DataLossError(absl::StrCat("MANIFEST line \"", line, "\" unreadable"));
    }
    files.push_back(std::move(f));
  }
  return files;
}

// OK for one plain file name (no folder, no blank, not the MANIFEST).
absl::Status CheckPlainName(absl::string_view name) {
  if (!name.empty() && name != "." && name != ".." && name.find('/') == absl::string_view::npos &&
      name.find_first_of(" \n\t") == absl::string_view::npos && name != kManifest) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("checkpoint file name \"", name, "\": not one plain file name"));
}

// Removes a generation folder: its MANIFEST first (it is uncommitted from
// then on), then the rest. `committing` is the generation whose commit
// prunes it (for the crash injection). Returns what went wrong, "" when
// nothing.
std::string RemoveGeneration(const std::string& path, bool committed, int64_t committing) {
  std::error_code ec;
  if (committed) {
    const std::string manifest = absl::StrCat(path, "/", kManifest);
    fs::remove(manifest, ec);
    if (ec) return absl::StrCat("cannot remove ", manifest, ": ", ec.message());
    NoteFileOp(FileOp::kRemoved, manifest);
    // The removal durable before the rest goes: a crash then leaves an
    // uncommitted folder (removed by the next commit), never a committed one
    // with files missing. Left as it is when that cannot be made sure.
    if (absl::Status synced = SyncPath(path); !synced.ok()) return std::string(synced.message());
    CheckpointCrashPoint("pruning", committing);
  }
  fs::remove_all(path, ec);
  if (ec) return absl::StrCat("cannot remove ", path, ": ", ec.message());
  NoteFileOp(FileOp::kRemoved, path);
  return "";
}

// Makes the folder `dir` and each missing folder above it, each one's name
// synced in the folder holding it (so a committed generation's folders are
// all on disk). Errors: ErrnoStatus "cannot create checkpoint folder DIR".
absl::Status MakeFolders(const std::string& dir) {
  fs::path folder;
  for (const fs::path& part : fs::path(dir).lexically_normal()) {
    if (part.empty()) continue;  // a trailing '/'
    folder /= part;
    std::error_code ec;
    if (fs::is_directory(folder, ec)) continue;
    if (::mkdir(folder.c_str(), 0777) != 0) {
      const int error = errno;
      if (error == EEXIST && fs::is_directory(folder, ec)) continue;  // made meanwhile, by someone else
      return ErrnoStatus(error, absl::StrCat("cannot create checkpoint folder ", dir));
    }
    NoteFileOp(FileOp::kMadeFolder, folder.string());
    RETURN_IF_ERROR(SyncPath(folder.has_parent_path() ? folder.parent_path().string() : "."));
  }
  return absl::OkStatus();
}

}  // namespace

bool Generation::Has(absl::string_view name) const {
  return std::any_of(files.begin(), files.end(), [&](const GenerationFile& f) { return f.name == name; });
}

std::string Generation::File(absl::string_view name) const { return absl::StrCat(path, "/", name); }

void CheckpointCrashPoint(absl::string_view point, int64_t generation) {
  // Read each time (a few points per checkpoint), so a test's child process
  // may set it after fork.
  const char* value = std::getenv(kCheckpointCrashVariable);
  if (value == nullptr || *value == '\0') return;
  const std::string wanted = value;
  const std::string here = absl::StrCat(point, "@", generation);
  if (wanted == "trace") {
    std::fprintf(stderr, "checkpoint point %s\n", here.c_str());
    std::fflush(stderr);
    return;
  }
  if (wanted != point && wanted != here) return;
  std::fprintf(stderr, "checkpoint crash injected at %s (%s)\n", here.c_str(), kCheckpointCrashVariable);
  std::fflush(stderr);
  ::raise(SIGKILL);
}

std::vector<std::pair<int64_t, std::string>> ListGenerations(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t number = NumberOf(it->path().filename().string());
    if (number >= 0 && it->is_directory(ec)) found.emplace_back(number, it->path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

GenerationWriter::GenerationWriter(std::string dir, int64_t number)
    : dir_(std::move(dir)), number_(number), path_(absl::StrCat(dir_, "/", FolderName(number))) {}

GenerationWriter::GenerationWriter(GenerationWriter&& other) noexcept
    : dir_(std::move(other.dir_)),
      number_(other.number_),
      path_(std::move(other.path_)),
      files_(std::move(other.files_)),
      done_(other.done_) {
  other.done_ = true;
}

GenerationWriter::~GenerationWriter() { Abandon(); }

absl::StatusOr<GenerationWriter> GenerationWriter::Begin(const std::string& dir) {
  RETURN_IF_ERROR(MakeFolders(dir));
  const auto existing = ListGenerations(dir);
  GenerationWriter writer(dir, existing.empty() ? 1 : existing.front().first + 1);
  if (::mkdir(writer.path_.c_str(), 0755) != 0) {
    const int error = errno;
    writer.done_ = true;  // nothing of ours to remove
    return ErrnoStatus(error, absl::StrCat("cannot create checkpoint generation ", writer.path_));
  }
  NoteFileOp(FileOp::kMadeFolder, writer.path_);
  // The folder's name durable in `dir` before anything is written into it.
  if (absl::Status synced = SyncPath(dir); !synced.ok()) return synced;  // ~writer removes the folder
  CheckpointCrashPoint("begun", writer.number_);
  return writer;
}

std::string GenerationWriter::File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

absl::Status GenerationWriter::Add(absl::string_view name) {
  TROUPE_CHECK(!done_);
  RETURN_IF_ERROR(CheckPlainName(name));
  const std::string path = File(name);
  RETURN_IF_ERROR(SyncPath(path));
  ASSIGN_OR_RETURN(GenerationFile file, Measure(path, name));
  files_.push_back(std::move(file));
  CheckpointCrashPoint(absl::StrCat("added:", name), number_);
  return absl::OkStatus();
}

absl::Status GenerationWriter::AddWritten(absl::string_view name, int64_t size, uint32_t crc32) {
  TROUPE_CHECK(!done_);
  RETURN_IF_ERROR(CheckPlainName(name));
  const std::string path = File(name);
  RETURN_IF_ERROR(SyncPath(path));
  std::error_code ec;
  const auto on_disk = fs::file_size(path, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("cannot stat ", path));
  if (static_cast<int64_t>(on_disk) != size) {
    return absl::InternalError(absl::StrCat(path, ": ", on_disk, " bytes on disk, its writer wrote ", size));
  }
  files_.push_back(GenerationFile{std::string(name), size, crc32});
  CheckpointCrashPoint(absl::StrCat("added:", name), number_);
  return absl::OkStatus();
}

absl::Status GenerationWriter::AddText(absl::string_view name, const std::string& text) {
  TROUPE_CHECK(!done_);
  RETURN_IF_ERROR(WriteFileAtomically(File(name), text));
  return Add(name);
}

absl::StatusOr<std::string> GenerationWriter::Commit(int keep, const std::vector<std::string>& legacy_files) {
  TROUPE_CHECK(!done_);
  TROUPE_CHECK(keep >= 1);
  // The folder synced (the names of the files added, each renamed into it),
  // then MANIFEST.tmp written and synced, renamed into place, the folder
  // synced again: the MANIFEST is never on disk before what it lists.
  const std::string manifest = File(kManifest);
  absl::Status status = SyncPath(path_);
  if (status.ok()) status = WriteFileAtomically(manifest + ".tmp", ManifestText(number_, files_));
  if (status.ok()) CheckpointCrashPoint("manifest-written", number_);
  if (status.ok()) {
    if (const int error = RenamePath(manifest + ".tmp", manifest); error != 0) {
      status = ErrnoStatus(error, absl::StrCat("cannot rename ", manifest, ".tmp to ", manifest));
    }
  }
  if (status.ok()) status = SyncPath(path_);
  if (!status.ok()) {
    Abandon();
    return status;
  }
  done_ = true;
  CheckpointCrashPoint("committed", number_);

  // Only the newest `keep` committed generations stay; uncommitted folders go.
  std::vector<std::string> problems;
  int committed = 0;
  for (const auto& [number, path] : ListGenerations(dir_)) {
    if (number == number_) {
      ++committed;
      continue;
    }
    const bool is_committed = fs::exists(path + "/" + kManifest);
    if (is_committed && number < number_ && committed < keep) {
      ++committed;
      continue;
    }
    if (std::string problem = RemoveGeneration(path, is_committed, number_); !problem.empty()) {
      problems.push_back(std::move(problem));
    }
  }
  if (committed >= keep) {
    for (const std::string& name : legacy_files) {
      std::error_code ec;
      const std::string legacy = absl::StrCat(dir_, "/", name);
      if (fs::remove(legacy, ec)) NoteFileOp(FileOp::kRemoved, legacy);
      if (ec) problems.push_back(absl::StrCat("cannot remove ", legacy, ": ", ec.message()));
    }
  }
  if (absl::Status synced = SyncPath(dir_); !synced.ok()) problems.push_back(std::string(synced.message()));
  CheckpointCrashPoint("pruned", number_);
  return absl::StrJoin(problems, "; ");
}

void GenerationWriter::Abandon() {
  if (done_) return;
  done_ = true;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string NewestCommittedGeneration(const std::string& dir) {
  std::error_code ec;
  for (const auto& [number, path] : ListGenerations(dir)) {
    if (fs::exists(path + "/" + kManifest, ec)) return path;
  }
  return "";
}

std::string NewestCheckpointFile(const std::string& dir, absl::string_view name) {
  std::error_code ec;
  for (const auto& [number, path] : ListGenerations(dir)) {
    const std::string file = absl::StrCat(path, "/", name);
    if (fs::exists(path + "/" + kManifest, ec) && fs::is_regular_file(file, ec)) return file;
  }
  const std::string legacy = absl::StrCat(dir, "/", name);
  return fs::is_regular_file(legacy, ec) ? legacy : "";
}

absl::StatusOr<Generation> VerifyGeneration(const std::string& path) {
  const int64_t number = NumberOf(fs::path(path).filename().string());
  if (number < 0) return absl::DataLossError(absl::StrCat(path, ": not a generation folder"));
  const absl::StatusOr<std::string> text = ReadFile(path + "/" + kManifest);
  if (absl::IsNotFound(text.status())) return absl::DataLossError("not committed (no MANIFEST): a checkpoint cut short");
  if (!text.ok()) return absl::DataLossError(absl::StrCat("MANIFEST unreadable: ", text.status().message()));
  ASSIGN_OR_RETURN(std::vector<GenerationFile> files, ParseManifest(*text, number));
  for (const GenerationFile& listed : files) {
    const std::string file = absl::StrCat(path, "/", listed.name);
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(file, ec))) return absl::DataLossError(absl::StrCat(listed.name, ": missing"));
    absl::StatusOr<GenerationFile> found = Measure(file, listed.name);
    if (!found.ok()) return absl::DataLossError(absl::StrCat(listed.name, ": ", found.status().message()));
    if (found->size != listed.size) {
      return absl::DataLossError(absl::StrCat(listed.name, ": ", found->size, " bytes, the manifest says ", listed.size,
                                              " (truncated or overwritten)"));
    }
    if (found->crc32 != listed.crc32) {
      return absl::DataLossError(absl::StrCat(listed.name, ": checksum mismatch (the file is damaged)"));
    }
  }
  return Generation{number, path, std::move(files)};
}

absl::StatusOr<Generation> LoadNewestGeneration(const std::string& dir,
                                                absl::FunctionRef<absl::Status(const Generation&)> load,
                                                std::vector<std::string>* passed_over) {
  std::vector<std::string> reasons;
  const auto generations = ListGenerations(dir);
  for (const auto& [number, path] : generations) {
    absl::StatusOr<Generation> generation = VerifyGeneration(path);
    absl::Status status = generation.status();
    if (status.ok()) status = load(*generation);
    if (status.ok()) {
      if (passed_over != nullptr) passed_over->insert(passed_over->end(), reasons.begin(), reasons.end());
      return *std::move(generation);
    }
    if (!absl::IsDataLoss(status)) return status;
    reasons.push_back(absl::StrCat("generation ", number, " (", path, "): ", status.message()));
  }
  if (passed_over != nullptr) passed_over->insert(passed_over->end(), reasons.begin(), reasons.end());
  if (generations.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no checkpoint generation"));
  return absl::NotFoundError(
      absl::StrCat(dir, ": no usable checkpoint generation: ", absl::StrJoin(reasons, "; ")));
}

}  // namespace troupe
