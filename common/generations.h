// Checkpoint generations: one checkpoint is one generation, a folder of files
// committed all at once, so that a crash, a full disk or a damaged file at
// any moment leaves the last committed generation whole and usable.
//
// Layout of a checkpoint folder DIR:
//   DIR/generation-000000042/   generation 42
//       agent.ckpt, ...         the caller's files, each synced to disk
//       MANIFEST                its commit point (below)
//
// Writing (GenerationWriter): Begin makes the next generation's folder (and
// DIR and the folders above it when missing, each synced in its parent) and
// syncs DIR; the caller writes its files into it and Adds each (synced, its
// size and crc32 recorded); Commit syncs the folder (the files' names), then
// writes MANIFEST.tmp, syncs it, renames it to MANIFEST and syncs the folder
// again. That rename is the one atomic step that commits every file at once:
// a folder without MANIFEST is a checkpoint cut short, never read. After the
// commit the generations older than the newest `keep` go (each loses its
// MANIFEST first, and that is synced before the rest goes, so a removal cut
// short leaves an uncommitted folder, not a damaged generation), with any
// uncommitted folder and the files of the single-file layout that came
// before generations; DIR is synced after. A generation that fails or is
// abandoned removes its own folder.
//
// Every write, fsync, rename, mkdir and removal of this sequence (and of the
// callers' files: WriteFileAtomically, replay's checkpoint) goes through
// common/files.h's file-op seam; common/durability_test.cc records real
// commits through it and checks the order against common/durability_check.h,
// which a killed process (the crash injection below) cannot: its page cache
// survives.
//
// MANIFEST, text:
//   troupe checkpoint generation 42
//   file NAME SIZE CRC32       one line per file, in the order added
//   crc32 CRC32                of every byte before this line
//
// Reading (LoadNewestGeneration): generations newest first; one is used when
// its MANIFEST is there and holds (its own crc32) and every file it lists has
// its size and crc32, and the caller's loader accepts it; each newer one
// passed over is reported with the reason.
//
// Crash injection, for tests: with $TROUPE_TEST_CHECKPOINT_CRASH set to a
// point of the sequence, "POINT" or "POINT@GENERATION", the process kills
// itself (SIGKILL, as `kill -9` would) on reaching it. The points, in order:
// "begun" (the folder made), "added:NAME" (each file synced and recorded),
// "manifest-written" (MANIFEST.tmp synced, not renamed), "committed" (renamed,
// folder synced), "pruning" (an old generation decommitted, its folder not yet
// removed), "pruned". With the variable set to "trace", each point reached is
// printed to stderr as "checkpoint point POINT@GENERATION" instead.
#ifndef TROUPE_COMMON_GENERATIONS_H_
#define TROUPE_COMMON_GENERATIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe {

// The most generations a checkpoint folder keeps (a config's keep_checkpoints).
inline constexpr int kMaxKeptGenerations = 1000;

// The environment variable of the crash injection above.
inline constexpr char kCheckpointCrashVariable[] = "TROUPE_TEST_CHECKPOINT_CRASH";

struct GenerationFile {
  std::string name;
  int64_t size = 0;
  uint32_t crc32 = 0;
};

// A committed generation.
struct Generation {
  int64_t number = 0;
  std::string path;  // DIR/generation-NNNNNNNNN
  std::vector<GenerationFile> files;

  // Whether the generation holds the file `name`.
  bool Has(absl::string_view name) const;
  // path/name.
  std::string File(absl::string_view name) const;
};

// Writes one generation. Not thread-safe; one writer per checkpoint folder
// at a time.
class GenerationWriter {
 public:
  // Begins the generation after every folder in `dir` (which is made when
  // missing): makes its folder and syncs `dir`. Errors: ErrnoStatus naming
  // the path (ResourceExhausted for a full disk).
  static absl::StatusOr<GenerationWriter> Begin(const std::string& dir);
  GenerationWriter(GenerationWriter&& other) noexcept;
  GenerationWriter& operator=(GenerationWriter&&) = delete;
  // An uncommitted generation is abandoned: its folder removed.
  ~GenerationWriter();

  int64_t number() const { return number_; }
  // The generation's folder, where the caller writes its files.
  const std::string& path() const { return path_; }
  // path()/name.
  std::string File(absl::string_view name) const;

  // Records the file `name` the caller has written into path(): syncs it,
  // and reads it back for its size and crc32. Errors: NotFound for a missing
  // file, ErrnoStatus for one that cannot be read or synced;
  // InvalidArgument for a name that is not one plain file name.
  absl::Status Add(absl::string_view name);
  // Records the file `name` whose writer computed its size and crc32 as it
  // wrote it (a large file is then not read back): syncs it and checks its
  // size. Errors: as Add; Internal when the size on disk differs.
  absl::Status AddWritten(absl::string_view name, int64_t size, uint32_t crc32);
  // Writes `text` as path()/name and Adds it.
  absl::Status AddText(absl::string_view name, const std::string& text);

  // Commits the generation (MANIFEST, as above), then keeps only the newest
  // `keep` generations of the folder (from 1), removing older ones,
  // uncommitted folders and, once `keep` generations are committed, the
  // `legacy_files` directly in the folder (a single-file layout's files,
  // which count as one generation older than all). Returns the removal
  // errors as a note ("" when none): a generation is committed even when
  // an old one could not go. Errors: ErrnoStatus of the manifest's write,
  // sync or rename; the generation is then abandoned.
  absl::StatusOr<std::string> Commit(int keep, const std::vector<std::string>& legacy_files = {});

  // Removes the uncommitted generation's folder (what a failed checkpoint
  // does); a no-op once committed or abandoned.
  void Abandon();

 private:
  GenerationWriter(std::string dir, int64_t number);

  std::string dir_;
  int64_t number_ = 0;
  std::string path_;
  std::vector<GenerationFile> files_;
  bool done_ = false;  // committed or abandoned
};

// The generations of `dir` (committed or not), newest first, as (number,
// folder); none when `dir` is missing.
std::vector<std::pair<int64_t, std::string>> ListGenerations(const std::string& dir);

// The folder of the newest committed generation of `dir` (the newest with a
// MANIFEST; its files are not read), or "" when there is none. For a quick
// look (troupe status, the viewer); a resume uses LoadNewestGeneration.
std::string NewestCommittedGeneration(const std::string& dir);

// The file `name` of the newest committed generation of `dir` that has one
// (its contents are not checked), else dir/name when that exists (a run from
// before generations), else "". For "is there a checkpoint" and "when was it
// written"; a resume uses LoadNewestGeneration.
std::string NewestCheckpointFile(const std::string& dir, absl::string_view name);

// Checks the generation folder `path`: MANIFEST there and whole, each file
// it lists of its size and crc32. Returns the generation, or DataLoss saying
// what is wrong ("not committed (no MANIFEST): a checkpoint cut short",
// "agent.ckpt: checksum mismatch", "counters.txt: 12 bytes, the manifest
// says 30", "replay.ckpt: missing").
absl::StatusOr<Generation> VerifyGeneration(const std::string& path);

// Resumes from the newest usable generation of `dir`: checks each newest
// first (VerifyGeneration) and calls `load` on the first that holds; a
// `load` that fails with DataLoss passes over that generation too. Each one
// passed over is appended to `passed_over` as "generation N (PATH): why".
// Returns the generation loaded. Errors: NotFound when no generation is
// usable (or there is none), its message listing why each was passed over;
// the first error of `load` that is not DataLoss (a model of another size
// is a config error, not a damaged generation).
absl::StatusOr<Generation> LoadNewestGeneration(const std::string& dir,
                                                absl::FunctionRef<absl::Status(const Generation&)> load,
                                                std::vector<std::string>* passed_over);

// The crash injection's point, for writers outside this file: kills the
// process when $TROUPE_TEST_CHECKPOINT_CRASH names `point` (at `generation`),
// prints it with "trace". A no-op when the variable is unset.
void CheckpointCrashPoint(absl::string_view point, int64_t generation);

}  // namespace troupe

#endif  // TROUPE_COMMON_GENERATIONS_H_
