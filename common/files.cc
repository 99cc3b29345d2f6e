#include "common/files.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace troupe {

std::string CacheDirectory() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache = xdg != nullptr && *xdg != '\0'     ? std::string(xdg)
                            : home != nullptr && *home != '\0' ? absl::StrCat(home, "/.cache")
                                                               : std::string("/tmp");
  return absl::StrCat(cache, "/troupe");
}

std::string ProjectPath(const std::string& relative) {
  static const std::string home = [] {
    if (const char* env = std::getenv("TROUPE_HOME"); env != nullptr && *env != '\0') return std::string(env);
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const std::filesystem::path bundled = exe.parent_path().parent_path() / "share" / "troupe";
      if (std::filesystem::is_directory(bundled, ec)) return bundled.string();
    }
    return std::string(TROUPE_SOURCE_DIR);
  }();
  return home + "/" + relative;
}

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EIO:
      return absl::DataLossError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

int WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

namespace {

std::atomic<FileOpObserver*> file_op_observer{nullptr};

}  // namespace

FileOpObserver* SetFileOpObserver(FileOpObserver* observer) { return file_op_observer.exchange(observer); }

void NoteFileOp(FileOp op, absl::string_view path, absl::string_view to) {
  FileOpObserver* observer = file_op_observer.load(std::memory_order_acquire);
  if (observer != nullptr) observer->Observe(op, path, to);
}

int SyncFile(int fd, absl::string_view path) {
  if (::fsync(fd) != 0) return errno;
  NoteFileOp(FileOp::kSynced, path);
  return 0;
}

int RenamePath(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) return errno;
  NoteFileOp(FileOp::kRenamed, from, to);
  return 0;
}

absl::Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path, " to sync it"));
  const int error = SyncFile(fd, path);
  ::close(fd);
  if (error != 0) return ErrnoStatus(error, absl::StrCat("cannot sync ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot read ", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path, " failed part way"));
  return text;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  // Write and sync path.tmp; on any failure it goes.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", tmp, " for writing"));
  auto fail = [&](int error, const std::string& what) {
    const absl::Status status = ErrnoStatus(error, what);
    ::close(fd);
    ::unlink(tmp.c_str());
    return status;
  };
  if (const int error = WriteAll(fd, text); error != 0) return fail(error, absl::StrCat("write to ", tmp, " failed"));
  NoteFileOp(FileOp::kWritten, tmp);
  if (const int error = SyncFile(fd, tmp); error != 0) return fail(error, absl::StrCat("cannot sync ", tmp));
  if (::close(fd) != 0) {
    const absl::Status status = ErrnoStatus(errno, absl::StrCat("write to ", tmp, " failed"));
    ::unlink(tmp.c_str());
    return status;
  }
  // The rename: readers see the old file or the whole new one.
  if (const int error = RenamePath(tmp, path); error != 0) {
    const absl::Status status = ErrnoStatus(error, absl::StrCat("cannot rename ", tmp, " to ", path));
    ::unlink(tmp.c_str());
    return status;
  }
  return absl::OkStatus();
}

absl::Status AppendToFile(const std::string& path, absl::string_view rows, absl::string_view header) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path, " to append"));
  const off_t before = ::lseek(fd, 0, SEEK_END);
  std::string text;
  if (before == 0) text.append(header.data(), header.size());
  text.append(rows.data(), rows.size());
  if (const int error = WriteAll(fd, text); error != 0) {
    // Whole rows or none: what was written of these goes.
    const absl::Status status = ErrnoStatus(error, absl::StrCat("append to ", path, " failed"));
    if (before >= 0) (void)::ftruncate(fd, before);
    ::close(fd);
    return status;
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("append to ", path, " failed"));
  return absl::OkStatus();
}

bool AppendLog::Append(absl::string_view rows) {
  const absl::Status status = AppendToFile(path_, rows, header_);
  if (!status.ok()) {
    if (lost_++ == 0) {
      std::fprintf(stderr, "%s; the run goes on, its rows are lost until appends work again\n",
                   std::string(status.message()).c_str());
    }
    return false;
  }
  if (lost_ > 0) {
    std::fprintf(stderr, "%s: appends work again (%ld lost)\n", path_.c_str(), static_cast<long>(lost_));
    lost_ = 0;
  }
  return true;
}

absl::Status ValidateRunName(const std::string& name) {
  auto bad = [&name](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name \"", absl::CHexEscape(name.substr(0, 64)), name.size() > 64 ? "..." : "", "\": ", why,
        "; a run name is one plain path component of [A-Za-z0-9_.-], 1 to ", kMaxRunNameBytes,
        " characters, not starting with '.' (the run directory is RUNS_DIR/NAME-DATE-TIME)"));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > kMaxRunNameBytes) return bad("is too long");
  if (name.front() == '.') return bad("starts with '.'");
  for (const char c : name) {
    if (c == '/') return bad("has a '/': it would put the run directory outside runs_dir");
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return bad("has a character outside [A-Za-z0-9_.-]");
    }
  }
  return absl::OkStatus();
}

namespace {

// `text` as a finite number, or nullopt.
std::optional<double> FiniteNumber(std::string_view text) {
  double value = 0;
  if (absl::SimpleAtod(absl::string_view(text.data(), text.size()), &value) && std::isfinite(value)) return value;
  return std::nullopt;
}

}  // namespace

std::optional<double> CsvNumber(std::string_view row, int index) {
  size_t begin = 0;
  for (int column = 0; column < index; ++column) {
    begin = row.find(',', begin);
    if (begin == std::string_view::npos) return std::nullopt;
    ++begin;
  }
  return FiniteNumber(row.substr(begin, row.find(',', begin) - begin));
}

std::optional<double> JsonNumber(std::string_view row, std::string_view key) {
  const std::string needle = absl::StrCat("\"", absl::string_view(key.data(), key.size()), "\": ");
  const size_t at = row.find(needle);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view rest = row.substr(at + needle.size());
  return FiniteNumber(rest.substr(0, rest.find_first_of(",}")));
}

absl::StatusOr<std::vector<std::string>> DropRowsPast(
    const std::string& path, double limit, bool header,
    absl::FunctionRef<std::optional<double>(std::string_view row)> progress) {
  std::vector<std::string> dropped;
  std::ifstream in(path, std::ios::binary);
  if (!in) return dropped;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  std::string kept;
  size_t begin = 0;
  for (bool first = true; begin < text.size(); first = false) {
    const size_t end = text.find('\n', begin);
    const std::string_view row(text.data() + begin, (end == std::string::npos ? text.size() : end) - begin);
    const bool whole = end != std::string::npos;
    if (whole && first && header) {
      kept.append(row).push_back('\n');
    } else if (const std::optional<double> at = progress(row); whole && at.has_value() && *at <= limit) {
      kept.append(row).push_back('\n');
    } else {
      dropped.emplace_back(row);
    }
    if (!whole) break;
    begin = end + 1;
  }
  if (!dropped.empty()) RETURN_IF_ERROR(WriteFileAtomically(path, kept));
  return dropped;
}

absl::StatusOr<std::string> MakeRunDirectory(const std::string& runs_dir, const std::string& name) {
  if (absl::Status valid = ValidateRunName(name); !valid.ok()) return valid;
  const std::string stamp = absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  std::string dir = absl::StrCat(runs_dir, "/", name, "-", stamp);
  std::error_code ec;
  for (int n = 2; std::filesystem::exists(dir, ec); ++n) dir = absl::StrCat(runs_dir, "/", name, "-", stamp, "-", n);
  if (!std::filesystem::create_directories(dir, ec)) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create run directory ", dir, ": ", ec.message()));
  }
  return dir;
}

}  // namespace troupe
