// Recording the file operations of durable writes (common/files.h's seam)
// and checking their order, for tests. Header-only and test-only, like
// test_dir.h.
//
// A killed process leaves the page cache behind, so crash-injection tests
// pass with every fsync deleted; a power loss does not. CheckDurability
// holds a recording of checkpoint commits to the rules that make a
// committed generation survive a power loss:
//   1. A file is renamed only after its bytes were fsynced (under the name
//      it had then): a rename before the fsync can leave the new name on an
//      empty or partial file.
//   2. At the MANIFEST's rename (the commit point) every file of the
//      generation has its bytes fsynced and its name synced in the folder
//      (the folder fsynced after the file was renamed or made there), and
//      the generation's folder, and each folder above it made in the
//      recording, has its name synced in its parent. Every file the
//      MANIFEST on disk lists must have a recorded write: a writer that
//      goes around the seam is reported.
//   3. The MANIFEST's rename is synced (its folder fsynced) before anything
//      is removed.
//   4. A generation's folder is removed only after the removal of its
//      MANIFEST was synced, so a crash leaves it uncommitted, not a
//      committed generation with files missing.
//   5. By the end every file written is fsynced, and every name made and
//      every removal is synced in its folder.
// Only operations on the checkpoint folder, under it, or on a folder above
// it count.
#ifndef TROUPE_COMMON_DURABILITY_CHECK_H_
#define TROUPE_COMMON_DURABILITY_CHECK_H_

#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/generations.h"

namespace troupe {

struct RecordedFileOp {
  FileOp op;
  std::string path;
  std::string to;  // a rename's target
};

// Records every file operation noted while it lives: it is the process's
// FileOpObserver from construction to destruction. Thread-safe.
class FileOpRecorder final : public FileOpObserver {
 public:
  FileOpRecorder() : previous_(SetFileOpObserver(this)) {}
  ~FileOpRecorder() override { SetFileOpObserver(previous_); }
  FileOpRecorder(const FileOpRecorder&) = delete;
  FileOpRecorder& operator=(const FileOpRecorder&) = delete;

  void Observe(FileOp op, absl::string_view path, absl::string_view to) override {
    absl::MutexLock lock(&mutex_);
    ops_.push_back(RecordedFileOp{op, std::string(path), std::string(to)});
  }
  // The operations so far, in the order they were done.
  std::vector<RecordedFileOp> ops() const {
    absl::MutexLock lock(&mutex_);
    return ops_;
  }

 private:
  FileOpObserver* const previous_;
  mutable absl::Mutex mutex_;
  std::vector<RecordedFileOp> ops_ ABSL_GUARDED_BY(mutex_);
};

struct DurabilityReport {
  int commits = 0;   // MANIFEST renames seen
  int removals = 0;  // files and folders removed
  // What breaks the rules above, each once, in the order found; none when
  // the recording is durable.
  std::vector<std::string> violations;
  // The operations that counted, one a line, numbered: for failure messages.
  std::string trace;
};

namespace durability_internal {

inline std::string Normal(const std::string& path) {
  std::string normal = std::filesystem::path(path).lexically_normal().string();
  if (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}
inline std::string Parent(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}
inline std::string Base(const std::string& path) { return std::filesystem::path(path).filename().string(); }
// Whether `path` is strictly inside the folder `folder`.
inline bool Under(const std::string& path, const std::string& folder) {
  if (folder == "/") return path.size() > 1 && path[0] == '/';
  return path.size() > folder.size() && path.compare(0, folder.size(), folder) == 0 && path[folder.size()] == '/';
}
// Drops `gone` and every path under it.
inline void Forget(std::set<std::string>& paths, const std::string& gone) {
  for (auto it = paths.begin(); it != paths.end();) {
    it = *it == gone || Under(*it, gone) ? paths.erase(it) : std::next(it);
  }
}
inline void Forget(std::map<std::string, bool>& paths, const std::string& gone) {
  for (auto it = paths.begin(); it != paths.end();) {
    it = it->first == gone || Under(it->first, gone) ? paths.erase(it) : std::next(it);
  }
}
inline const char* OpName(FileOp op) {
  switch (op) {
    case FileOp::kMadeFolder:
      return "mkdir";
    case FileOp::kWritten:
      return "write";
    case FileOp::kSynced:
      return "fsync";
    case FileOp::kRenamed:
      return "rename";
    case FileOp::kRemoved:
      return "remove";
  }
  return "?";
}

}  // namespace durability_internal

// Checks `ops` (a FileOpRecorder's) against the rules above for the
// checkpoint folder `checkpoint_dir`. The files of each generation
// committed in the recording are read from its MANIFEST on disk when the
// generation is still there (rule 2's "every file listed").
inline DurabilityReport CheckDurability(const std::vector<RecordedFileOp>& ops, const std::string& checkpoint_dir) {
  using namespace durability_internal;
  const std::string dir = Normal(checkpoint_dir);
  const std::string shown_from = Parent(dir) + "/";
  auto show = [&](const std::string& path) {
    return path.rfind(shown_from, 0) == 0 ? path.substr(shown_from.size()) : path;
  };
  auto in_scope = [&](const std::string& path) { return path == dir || Under(path, dir) || Under(dir, path); };
  auto is_manifest = [&](const std::string& path) {
    const std::string generation = Parent(path);
    return Base(path) == "MANIFEST" && Parent(generation) == dir && Base(generation).rfind("generation-", 0) == 0;
  };

  DurabilityReport report;
  auto violation = [&](std::string what) {
    for (const std::string& seen : report.violations) {
      if (seen == what) return;
    }
    report.violations.push_back(std::move(what));
  };
  std::map<std::string, bool> bytes_synced;  // a file written: whether fsynced since
  std::map<std::string, bool> name_synced;   // a name made here: whether its folder fsynced since
  std::set<std::string> removals_unsynced;   // removed, their folder not fsynced since
  std::set<std::string> decommitted;         // folders whose MANIFEST's removal is not synced yet

  // Rule 2 at the commit of `generation`.
  auto check_commit = [&](const std::string& generation) {
    const std::string manifest = generation + "/MANIFEST";
    std::error_code ec;
    if (std::filesystem::is_directory(generation, ec)) {
      absl::StatusOr<Generation> on_disk = VerifyGeneration(generation);
      if (!on_disk.ok()) {
        violation(absl::StrCat(show(generation), ": committed in the recording, unreadable now: ",
                               on_disk.status().message()));
      } else {
        for (const GenerationFile& file : on_disk->files) {
          const std::string path = generation + "/" + file.name;
          if (!bytes_synced.count(path)) {
            violation(absl::StrCat(show(path), ": listed in the MANIFEST, but no write of it was recorded (written "
                                   "around common/files.h's seam: WriteFileAtomically, SyncFile, RenamePath)"));
          }
        }
      }
    }
    for (const auto& [path, synced] : bytes_synced) {
      if (Parent(path) != generation || path == manifest) continue;
      if (!synced) {
        violation(absl::StrCat(show(path), ": its bytes not fsynced before the MANIFEST rename committed it"));
      }
      if (const auto name = name_synced.find(path); name == name_synced.end() || !name->second) {
        violation(absl::StrCat(show(path), ": its name not synced in ", show(generation), " (no fsync of the folder "
                               "after the file was renamed into it) before the MANIFEST rename committed it"));
      }
    }
    if (!name_synced.count(generation)) {
      violation(absl::StrCat(show(generation), ": no mkdir of it recorded (made around common/files.h's seam)"));
    }
    // The generation's folder, and each folder above it made in the recording.
    for (const auto& [folder, synced] : name_synced) {
      if (!synced && (folder == generation || Under(generation, folder))) {
        violation(absl::StrCat(show(folder), ": its name not synced in ", show(Parent(folder)), " (no fsync of ",
                               show(Parent(folder)), " after its mkdir) before the MANIFEST rename committed ",
                               show(generation)));
      }
    }
  };

  int line = 0;
  for (const RecordedFileOp& recorded : ops) {
    const std::string path = Normal(recorded.path);
    const std::string to = recorded.to.empty() ? "" : Normal(recorded.to);
    if (!in_scope(path) && !(recorded.op == FileOp::kRenamed && in_scope(to))) continue;
    absl::StrAppend(&report.trace, "  ", ++line, ". ", OpName(recorded.op), " ", show(path),
                    to.empty() ? "" : " -> ", to.empty() ? "" : show(to), "\n");
    switch (recorded.op) {
      case FileOp::kMadeFolder:
        name_synced[path] = false;
        break;
      case FileOp::kWritten:
        bytes_synced[path] = false;
        name_synced.emplace(path, false);  // a new name, unless already made
        break;
      case FileOp::kSynced:
        if (auto it = bytes_synced.find(path); it != bytes_synced.end()) it->second = true;
        for (auto& [name, synced] : name_synced) {
          if (Parent(name) == path) synced = true;
        }
        for (auto it = removals_unsynced.begin(); it != removals_unsynced.end();) {
          it = Parent(*it) == path ? removals_unsynced.erase(it) : std::next(it);
        }
        decommitted.erase(path);
        break;
      case FileOp::kRenamed: {
        // Rule 1.
        const auto from = bytes_synced.find(path);
        if (from == bytes_synced.end()) {
          violation(absl::StrCat(show(to), ": renamed from ", show(path), ", whose write was not recorded (written "
                                 "around common/files.h's seam)"));
        } else if (!from->second) {
          violation(absl::StrCat(show(to), ": renamed into place from ", show(path), " before ", show(path),
                                 " was fsynced"));
        }
        bytes_synced[to] = from != bytes_synced.end() && from->second;
        if (from != bytes_synced.end()) bytes_synced.erase(from);
        name_synced.erase(path);
        name_synced[to] = false;
        if (is_manifest(to)) {
          ++report.commits;
          check_commit(Parent(to));
        }
        break;
      }
      case FileOp::kRemoved: {
        ++report.removals;
        // Rule 3.
        for (const auto& [name, synced] : name_synced) {
          if (!synced && is_manifest(name)) {
            violation(absl::StrCat(show(path), ": removed before the commit of ", show(Parent(name)),
                                   " was synced (no fsync of the folder after its MANIFEST rename)"));
          }
        }
        // Rule 4.
        for (const std::string& folder : decommitted) {
          if (path == folder || Under(path, folder)) {
            violation(absl::StrCat(show(path), ": removed before the removal of ", show(folder),
                                   "/MANIFEST was synced (no fsync of ", show(folder), " in between): a crash "
                                   "could leave ", show(folder), " committed with files missing"));
          }
        }
        Forget(bytes_synced, path);
        Forget(name_synced, path);
        Forget(removals_unsynced, path);
        Forget(decommitted, path);
        if (Base(path) == "MANIFEST") decommitted.insert(Parent(path));
        removals_unsynced.insert(path);
        break;
      }
    }
  }
  // Rule 5.
  for (const auto& [path, synced] : bytes_synced) {
    if (!synced) violation(absl::StrCat(show(path), ": written, never fsynced"));
  }
  for (const auto& [path, synced] : name_synced) {
    if (!synced) {
      violation(absl::StrCat(show(path), ": its name never synced in ", show(Parent(path)), " (no fsync of ",
                             show(Parent(path)), " after it was made or renamed there)"));
    }
  }
  for (const std::string& path : removals_unsynced) {
    violation(absl::StrCat(show(path), ": removed, and ", show(Parent(path)), " never fsynced after"));
  }
  return report;
}

}  // namespace troupe

#endif  // TROUPE_COMMON_DURABILITY_CHECK_H_
