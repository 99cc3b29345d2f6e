// Small file helpers.
#ifndef TROUPE_COMMON_FILES_H_
#define TROUPE_COMMON_FILES_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe {

// The whole file at `path`. Errors: ErrnoStatus "cannot read PATH" (NotFound
// for a missing file), DataLoss when reading fails part way.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `text` to `path` via path.tmp, an fsync and a rename, so readers
// never see a half-written file, and after a crash or power loss `path` holds
// either its old contents or all of `text` (never an empty file). A write that
// fails leaves no path.tmp behind. Errors name the path and the system's
// reason (ErrnoStatus: a full disk is ResourceExhausted).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// The error `error` (an errno value) as a Status whose message is
// "WHAT: strerror": ENOSPC, EDQUOT and EFBIG ResourceExhausted, EIO DataLoss,
// EACCES, EPERM and EROFS PermissionDenied, ENOENT and ENOTDIR NotFound,
// others Internal.
absl::Status ErrnoStatus(int error, absl::string_view what);

// Writes all of `bytes` to `fd` (write(2) may take fewer, or be
// interrupted): 0, or the errno of the write that failed (ENOSPC for one
// that wrote nothing).
int WriteAll(int fd, absl::string_view bytes);

// Flushes the file or folder at `path` to stable storage (fsync): for a
// folder, the names made, renamed or removed in it. Noted (kSynced) when it
// worked. Errors: ErrnoStatus naming the path.
absl::Status SyncPath(const std::string& path);

// fsync(2) of `fd`, the file open as `path`; noted (kSynced) when it worked.
// 0, or the errno of the failed fsync.
int SyncFile(int fd, absl::string_view path);

// rename(2) of `from` to `to`; noted (kRenamed) when it worked. 0, or the
// errno of the failed rename.
int RenamePath(const std::string& from, const std::string& to);

// The seam under the durable writes (a checkpoint generation's files, its
// MANIFEST, its folder, the removal of old ones): each operation that
// durability depends on is noted, after it worked, to the process's
// FileOpObserver. Tests set one to record the order, which
// common/durability_check.h checks (bytes written, fsynced, renamed, the
// folder fsynced, the MANIFEST last); with none set, the default, a note is
// one atomic load.
enum class FileOp {
  kMadeFolder,  // mkdir of `path`
  kWritten,     // all of the file `path`'s bytes handed to the kernel
  kSynced,      // fsync of `path`: a file's bytes, or a folder's names
  kRenamed,     // rename of `path` to `to`
  kRemoved,     // `path` removed (a folder with all it held)
};

class FileOpObserver {
 public:
  virtual ~FileOpObserver() = default;
  // Called on the thread that did the operation, possibly on several
  // threads at once. `to` is empty but for kRenamed.
  virtual void Observe(FileOp op, absl::string_view path, absl::string_view to) = 0;
};

// Makes `observer` (nullptr: none) the process's; returns the one before.
// For tests: it must outlive every operation noted while it is set.
FileOpObserver* SetFileOpObserver(FileOpObserver* observer);

// Notes `op` to the observer, if one is set.
void NoteFileOp(FileOp op, absl::string_view path, absl::string_view to = "");

// Appends `rows` to the file at `path`, with `header` first when the file is
// missing or empty: all of it or nothing, so a write that fails part way (a
// full disk) is undone by truncating the file back, and no cut row is left
// for the next append to run into. Errors: ErrnoStatus naming the path
// (ResourceExhausted for a full disk).
absl::Status AppendToFile(const std::string& path, absl::string_view rows, absl::string_view header = "");

// An append-only log (a run's logs: common/run_layout.h's RunLog) that a
// failing disk does not stop: Append writes whole rows or nothing
// (AppendToFile); the first failure of a streak is said on stderr ("PATH:
// append failed: WHY; the run goes on, rows are lost until it works
// again"), and the first success after it says how many appends were lost.
// Not thread-safe: one thread appends to one log.
class AppendLog {
 public:
  AppendLog() = default;
  AppendLog(std::string path, std::string header = "") : path_(std::move(path)), header_(std::move(header)) {}
  // Whether `rows` were written.
  bool Append(absl::string_view rows);
  const std::string& path() const { return path_; }
  // Appends lost in the current streak of failures (0 when the last worked).
  int64_t lost() const { return lost_; }

 private:
  std::string path_, header_;
  int64_t lost_ = 0;
};

// A path under the folder holding troupe's own files (configs/, envs/assets/,
// test data, bench/peers/): under $TROUPE_HOME when set; else under
// share/troupe beside this binary's folder when that exists (a relocated
// bundle, tools/bundle.sh); else under the source tree it was built from.
std::string ProjectPath(const std::string& relative);

// The folder for troupe's caches (the FID classifier, the bench's reference
// comparison): $XDG_CACHE_HOME/troupe when set, else ~/.cache/troupe, else
// /tmp/troupe. Not created here.
std::string CacheDirectory();

// A resumed run goes on from its checkpoint, so the rows its logs got after
// that checkpoint (a killed run writes on until it dies) are written again.
// This rewrites the log at `path` (a CSV whose first line, with `header`, is
// kept, or JSON lines) without them: every row whose `progress` (frames,
// images; CsvNumber, JsonNumber) is past `limit`, every row `progress` cannot
// read, and a last line with no newline (cut off by the killed writer). The
// file is replaced atomically, and only when a row goes; a missing file
// drops nothing. Returns the rows dropped, in order; errors name the path.
absl::StatusOr<std::vector<std::string>> DropRowsPast(
    const std::string& path, double limit, bool header,
    absl::FunctionRef<std::optional<double>(std::string_view row)> progress);
// The number in column `index` (from 0) of a CSV row; nullopt when the row
// has no such column or it is not a finite number.
std::optional<double> CsvNumber(std::string_view row, int index);
// The number after "\"key\": " in a JSON line; nullopt when there is none.
std::optional<double> JsonNumber(std::string_view row, std::string_view key);

// The longest run name.
inline constexpr size_t kMaxRunNameBytes = 100;

// OK when `name` (an experiment's `name`) is one plain path component:
// 1 to kMaxRunNameBytes characters of [A-Za-z0-9_.-], not starting with '.'
// (so no "..", no '/', nothing hidden). InvalidArgument "name \"...\": why".
absl::Status ValidateRunName(const std::string& name);

// Creates and returns a fresh run directory RUNS_DIR/NAME-YYYYmmdd-HHMMSS
// (with -2, -3, ... if taken). InvalidArgument for a name ValidateRunName
// refuses; PermissionDenied naming it if it cannot be made.
absl::StatusOr<std::string> MakeRunDirectory(const std::string& runs_dir, const std::string& name);

}  // namespace troupe

#endif  // TROUPE_COMMON_FILES_H_
