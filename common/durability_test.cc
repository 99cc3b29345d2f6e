// A checkpoint generation's durability past the page cache: the file
// operations of real commits, recorded through common/files.h's seam, held
// to common/durability_check.h's rules (each file's bytes fsynced before its
// rename, its folder fsynced after, the MANIFEST renamed last and synced).
// The crash-injection tests in generations_test.cc kill the process, which
// leaves the page cache behind: only these fail when a sync goes.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/durability_check.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using ::testing::IsEmpty;
using ::testing::Not;

// One checkpoint as the trainers write theirs: a network file as
// nn::WriteCheckpoint writes it (WriteFileAtomically, then Add), and the
// counters (AddText). Returns the generation's number.
int64_t Save(const std::string& dir, int step, int keep, const std::vector<std::string>& legacy = {}) {
  absl::StatusOr<GenerationWriter> generation = GenerationWriter::Begin(dir);
  EXPECT_TRUE(generation.ok()) << generation.status();
  if (!generation.ok()) return -1;
  EXPECT_TRUE(WriteFileAtomically(generation->File("networks.bin"), std::string(4096, static_cast<char>(step))).ok());
  EXPECT_TRUE(generation->Add("networks.bin").ok());
  EXPECT_TRUE(generation->AddText("counters.txt", absl::StrCat("step ", step, "\n")).ok());
  absl::StatusOr<std::string> note = generation->Commit(keep, legacy);
  EXPECT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note.value_or("failed"), "");
  return generation->number();
}

// Writes `bytes` to `path` with no fsync, as a careless caller of Add might.
void WriteUnsynced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(WriteAll(fd, bytes), 0) << path;
  NoteFileOp(FileOp::kWritten, path);
  ASSERT_EQ(::close(fd), 0) << path;
}

// Whether the fsync ops[i] had something to flush: its file written, or a
// name made, renamed into or removed from its folder, since that path's
// last fsync. (A second fsync of a file already synced, as Add's of a file
// WriteFileAtomically wrote, flushes nothing.)
bool Flushes(const std::vector<RecordedFileOp>& ops, size_t i) {
  const std::string& path = ops[i].path;
  for (size_t j = i; j-- > 0;) {
    const RecordedFileOp& op = ops[j];
    if (op.op == FileOp::kSynced && op.path == path) return false;
    if (op.op == FileOp::kWritten && op.path == path) return true;
    const std::string& named = op.op == FileOp::kRenamed ? op.to : op.path;
    if (op.op != FileOp::kSynced && fs::path(named).parent_path() == path) return true;
  }
  return false;
}

TEST(DurabilityTest, FirstGenerationIsSyncedFileByFileThenCommittedByItsManifest) {
  // The checkpoint folder is new: its own name, too, is synced.
  const std::string dir = FreshTestDir("durability_") + "/checkpoints";
  FileOpRecorder recorder;
  ASSERT_EQ(Save(dir, 1, /*keep=*/2), 1);
  const DurabilityReport report = CheckDurability(recorder.ops(), dir);
  EXPECT_EQ(report.commits, 1) << report.trace;
  EXPECT_THAT(report.violations, IsEmpty()) << report.trace;
}

TEST(DurabilityTest, PruningDecommitsEachOldGenerationDurablyBeforeRemovingIt) {
  const std::string dir = FreshTestDir("durability_") + "/checkpoints";
  ASSERT_EQ(Save(dir, 1, /*keep=*/5), 1);
  ASSERT_EQ(Save(dir, 2, /*keep=*/5), 2);
  // An uncommitted folder (a checkpoint cut short) and a file of the layout
  // before generations: both go with the next commit.
  fs::create_directories(dir + "/generation-000000003");
  ASSERT_TRUE(WriteFileAtomically(dir + "/agent.ckpt", "old layout").ok());
  FileOpRecorder recorder;
  ASSERT_EQ(Save(dir, 4, /*keep=*/1, {"agent.ckpt"}), 4);
  EXPECT_EQ(ListGenerations(dir).size(), 1u);
  EXPECT_FALSE(fs::exists(dir + "/agent.ckpt"));
  const DurabilityReport report = CheckDurability(recorder.ops(), dir);
  EXPECT_EQ(report.commits, 1) << report.trace;
  // Two MANIFESTs and their folders, the uncommitted folder, the old file.
  EXPECT_EQ(report.removals, 6) << report.trace;
  EXPECT_THAT(report.violations, IsEmpty()) << report.trace;
}

TEST(DurabilityTest, FilesTheCallerWroteWithoutSyncingAreSyncedByAddAndAddWritten) {
  const std::string dir = FreshTestDir("durability_") + "/checkpoints";
  FileOpRecorder recorder;
  absl::StatusOr<GenerationWriter> generation = GenerationWriter::Begin(dir);
  ASSERT_TRUE(generation.ok()) << generation.status();
  const std::string added(1000, 'a'), written(2000, 'w');
  WriteUnsynced(generation->File("added.bin"), added);
  WriteUnsynced(generation->File("written.bin"), written);
  ASSERT_TRUE(generation->Add("added.bin").ok());
  const uint32_t crc =
      static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(written.data()), written.size()));
  ASSERT_TRUE(generation->AddWritten("written.bin", static_cast<int64_t>(written.size()), crc).ok());
  ASSERT_TRUE(generation->Commit(1).ok());
  ASSERT_TRUE(VerifyGeneration(generation->path()).ok());
  const DurabilityReport report = CheckDurability(recorder.ops(), dir);
  EXPECT_EQ(report.commits, 1) << report.trace;
  EXPECT_THAT(report.violations, IsEmpty()) << report.trace;
}

// The check itself: three commits (a new folder, then one that prunes),
// recorded; every fsync in it that flushes something, dropped from the
// recording or delayed to its end, is reported.
TEST(DurabilityTest, DroppingOrDelayingAnySyncOfARecordedCommitIsReported) {
  const std::string dir = FreshTestDir("durability_") + "/checkpoints";
  FileOpRecorder recorder;
  ASSERT_EQ(Save(dir, 1, /*keep=*/5), 1);
  ASSERT_EQ(Save(dir, 2, /*keep=*/5), 2);
  ASSERT_EQ(Save(dir, 3, /*keep=*/1), 3);
  const std::vector<RecordedFileOp> ops = recorder.ops();
  const DurabilityReport whole = CheckDurability(ops, dir);
  ASSERT_EQ(whole.commits, 3) << whole.trace;
  ASSERT_THAT(whole.violations, IsEmpty()) << whole.trace;
  int checked = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].op != FileOp::kSynced || !Flushes(ops, i)) continue;
    ++checked;
    std::vector<RecordedFileOp> dropped = ops;
    dropped.erase(dropped.begin() + static_cast<std::ptrdiff_t>(i));
    EXPECT_THAT(CheckDurability(dropped, dir).violations, Not(IsEmpty()))
        << "fsync " << ops[i].path << " (op " << i << ") dropped, not reported; the recording:\n" << whole.trace;
    if (i + 1 == ops.size()) continue;
    std::vector<RecordedFileOp> delayed = dropped;
    delayed.push_back(ops[i]);
    EXPECT_THAT(CheckDurability(delayed, dir).violations, Not(IsEmpty()))
        << "fsync " << ops[i].path << " (op " << i << ") delayed to the end, not reported; the recording:\n"
        << whole.trace;
  }
  // The new checkpoint folder's name; per commit the generation's folder's
  // name, two files and the MANIFEST (its temporary) before their renames,
  // the generation's folder before and after the MANIFEST's rename; the
  // third commit's two decommitted generations, and the checkpoint folder
  // after their removal.
  EXPECT_EQ(checked, 1 + 3 * 6 + 2 + 1) << whole.trace;
}

TEST(DurabilityTest, NoObserverByDefaultAndTheRecorderRestoresTheOneBefore) {
  const std::string dir = FreshTestDir("durability_");
  {
    FileOpRecorder outer;
    {
      FileOpRecorder inner;
      ASSERT_TRUE(WriteFileAtomically(dir + "/a", "a").ok());
      EXPECT_EQ(inner.ops().size(), 3u);  // write, fsync, rename
    }
    ASSERT_TRUE(WriteFileAtomically(dir + "/b", "b").ok());
    EXPECT_EQ(outer.ops().size(), 3u);
  }
  EXPECT_EQ(SetFileOpObserver(nullptr), nullptr);
}

}  // namespace
}  // namespace troupe
