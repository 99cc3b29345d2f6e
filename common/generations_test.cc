#include "common/generations.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GenerationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/generations_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A checkpoint of `step`: two files that must agree (the networks and the
  // counters of one step), as a learner's would.
  absl::Status Save(int step, int keep = 2, const std::vector<std::string>& legacy = {}) {
    absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
    if (!writer.ok()) return writer.status();
    if (absl::Status s = writer->AddText("networks.bin", absl::StrCat("networks of step ", step, "\n")); !s.ok()) {
      return s;
    }
    if (absl::Status s = writer->AddText("counters.txt", absl::StrCat("step ", step, "\n")); !s.ok()) return s;
    absl::StatusOr<std::string> note = writer->Commit(keep, legacy);
    if (!note.ok()) return note.status();
    EXPECT_EQ(*note, "");
    return absl::OkStatus();
  }

  // The step the newest usable generation holds, checking that its two files
  // agree; -1 when none. `why` gets the generations passed over.
  int Resume(std::vector<std::string>* why = nullptr) {
    int step = -1;
    absl::StatusOr<Generation> loaded = LoadNewestGeneration(
        dir_,
        [&](const Generation& g) {
          const std::string networks = ReadFile(g.File("networks.bin")).value_or("");
          const std::string counters = ReadFile(g.File("counters.txt")).value_or("");
          step = std::atoi(counters.substr(5).c_str());
          EXPECT_EQ(networks, absl::StrCat("networks of step ", step, "\n")) << "counters and networks disagree";
          return absl::OkStatus();
        },
        why);
    return loaded.ok() ? step : -1;
  }

  std::vector<int64_t> Numbers() {
    std::vector<int64_t> numbers;
    for (const auto& [number, path] : ListGenerations(dir_)) numbers.push_back(number);
    return numbers;
  }

  std::string dir_;
};

TEST_F(GenerationsTest, ACommittedGenerationResumesWithEveryFileItListed) {
  ASSERT_TRUE(Save(/*step=*/7).ok());
  absl::StatusOr<Generation> g = LoadNewestGeneration(dir_, [](const Generation&) { return absl::OkStatus(); }, nullptr);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->number, 1);
  EXPECT_TRUE(g->Has("networks.bin"));
  EXPECT_TRUE(g->Has("counters.txt"));
  EXPECT_FALSE(g->Has("replay.ckpt"));
  EXPECT_EQ(Resume(), 7);
  EXPECT_TRUE(fs::exists(g->path + "/MANIFEST"));
  EXPECT_FALSE(fs::exists(g->path + "/MANIFEST.tmp"));
}

TEST_F(GenerationsTest, KeepsTheNewestKAndRemovesOlderOnesOnlyOnceANewerIsCommitted) {
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(Save(step, /*keep=*/2).ok());
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{3, 2}));
  // While generation 4 is being written, 2 and 3 are still there.
  absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->AddText("networks.bin", "networks of step 4\n").ok());
  ASSERT_TRUE(writer->AddText("counters.txt", "step 4\n").ok());
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(Resume(), 3);  // 4 is not committed yet
  ASSERT_TRUE(writer->Commit(/*keep=*/2).ok());
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(Resume(), 4);
  // keep 1: only the newest.
  ASSERT_TRUE(Save(5, /*keep=*/1).ok());
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{5}));
}

TEST_F(GenerationsTest, AnAbandonedGenerationLeavesNothingAndTheLastCommittedOneResumes) {
  ASSERT_TRUE(Save(1).ok());
  {
    absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->AddText("networks.bin", "networks of step 2\n").ok());
    // Destroyed uncommitted, as a checkpoint that failed part way.
  }
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{1}));
  EXPECT_EQ(Resume(), 1);
}

// A file whose writer gave its crc32 (not read back): a right one verifies,
// a wrong one makes the generation fail its check at resume.
TEST_F(GenerationsTest, AFileAddedWithItsWritersChecksumIsVerifiedAtResume) {
  ASSERT_TRUE(Save(1).ok());
  for (const bool right : {true, false}) {
    const int step = right ? 2 : 3;
    absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
    ASSERT_TRUE(writer.ok());
    const std::string text = absl::StrCat("networks of step ", step, "\n");
    std::ofstream(writer->File("networks.bin"), std::ios::binary) << text;
    const uint32_t crc = static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(text.data()), text.size()));
    ASSERT_TRUE(writer->AddWritten("networks.bin", text.size(), right ? crc : crc + 1).ok());
    ASSERT_TRUE(writer->AddText("counters.txt", absl::StrCat("step ", step, "\n")).ok());
    ASSERT_TRUE(writer->Commit(/*keep=*/3).ok());
    std::vector<std::string> why;
    EXPECT_EQ(Resume(&why), 2);  // step 3's generation, with a wrong crc32, is passed over
    if (!right) {
      EXPECT_THAT(absl::StrJoin(why, ""), HasSubstr("networks.bin: checksum mismatch"));
    }
  }
  // A size its writer did not write is refused at once.
  absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
  ASSERT_TRUE(writer.ok());
  std::ofstream(writer->File("networks.bin")) << "abc";
  EXPECT_TRUE(absl::IsInternal(writer->AddWritten("networks.bin", 4, 0)));
}

TEST_F(GenerationsTest, TheSingleFileLayoutsFilesGoOnceKeepGenerationsAreCommitted) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/agent.ckpt") << "old";
  std::ofstream(dir_ + "/counters.txt") << "frames 1\n";
  ASSERT_TRUE(Save(1, /*keep=*/2, {"agent.ckpt", "counters.txt", "replay.ckpt"}).ok());
  EXPECT_TRUE(fs::exists(dir_ + "/agent.ckpt"));  // still one of the two kept
  ASSERT_TRUE(Save(2, /*keep=*/2, {"agent.ckpt", "counters.txt", "replay.ckpt"}).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/agent.ckpt"));
  EXPECT_FALSE(fs::exists(dir_ + "/counters.txt"));
}

TEST_F(GenerationsTest, ALoaderThatFindsDataLossPassesOverAndOtherErrorsStop) {
  ASSERT_TRUE(Save(1).ok());
  ASSERT_TRUE(Save(2).ok());
  std::vector<std::string> why;
  absl::StatusOr<Generation> g = LoadNewestGeneration(
      dir_,
      [](const Generation& g) {
        return g.number == 2 ? absl::DataLossError("counters disagree with the networks") : absl::OkStatus();
      },
      &why);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->number, 1);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0], HasSubstr("generation 2"));
  EXPECT_THAT(why[0], HasSubstr("counters disagree with the networks"));
  // A model of another size is the config's fault: no passing over.
  g = LoadNewestGeneration(dir_, [](const Generation&) { return absl::InvalidArgumentError("shape"); }, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(g.status())) << g.status();
  // Nothing at all: NotFound.
  fs::remove_all(dir_);
  g = LoadNewestGeneration(dir_, [](const Generation&) { return absl::OkStatus(); }, nullptr);
  EXPECT_TRUE(absl::IsNotFound(g.status())) << g.status();
}

// Each file of the newest generation, MANIFEST included, flipped by a byte,
// truncated, or deleted in turn: the previous generation resumes, and the
// reason names the file.
TEST_F(GenerationsTest, ADamagedNewestGenerationIsReportedAndThePreviousOneResumes) {
  struct Damage {
    const char* name;
    void (*apply)(const std::string& path);
    const char* says;
  };
  const Damage damages[] = {
      {"flip a byte",
       [](const std::string& path) {
         std::string bytes = ReadFile(path).value_or("");
         bytes[bytes.size() / 2] ^= 0x20;
         std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
       },
       "checksum mismatch"},
      {"truncate", [](const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); }, ""},
      {"delete", [](const std::string& path) { fs::remove(path); }, ""},
  };
  for (const char* file : {"networks.bin", "counters.txt", "MANIFEST"}) {
    for (const Damage& damage : damages) {
      SCOPED_TRACE(absl::StrCat(damage.name, " ", file));
      fs::remove_all(dir_);
      ASSERT_TRUE(Save(1).ok());
      ASSERT_TRUE(Save(2).ok());
      ASSERT_EQ(Resume(), 2);
      damage.apply(ListGenerations(dir_).front().second + "/" + file);
      std::vector<std::string> why;
      EXPECT_EQ(Resume(&why), 1);
      ASSERT_EQ(why.size(), 1u);
      EXPECT_THAT(why[0], HasSubstr("generation 2"));
      if (std::string(file) != "MANIFEST") {
        EXPECT_THAT(why[0], HasSubstr(file));
      }
      EXPECT_THAT(why[0], HasSubstr(damage.says));
    }
  }
  // Both damaged: nothing usable, each reason given.
  fs::remove_all(dir_);
  ASSERT_TRUE(Save(1).ok());
  ASSERT_TRUE(Save(2).ok());
  for (const auto& [number, path] : ListGenerations(dir_)) fs::remove(path + "/counters.txt");
  absl::StatusOr<Generation> none =
      LoadNewestGeneration(dir_, [](const Generation&) { return absl::OkStatus(); }, nullptr);
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_THAT(none.status().message(), HasSubstr("generation 2"));
  EXPECT_THAT(none.status().message(), HasSubstr("generation 1"));
  EXPECT_THAT(none.status().message(), HasSubstr("counters.txt: missing"));
}

// The points of the checkpoint sequence, as the crash injection names them.
std::vector<std::string> TracedPoints() {
  return {"begun", "added:networks.bin", "added:counters.txt", "manifest-written", "committed", "pruning", "pruned"};
}

// A child process killed (SIGKILL, by the crash injection) at each point of
// the third checkpoint's sequence: each resume finds a whole generation whose
// files agree, the new one exactly when its MANIFEST was renamed, and the
// next checkpoint cleans up what the killed one left.
TEST_F(GenerationsTest, AProcessKilledAtAnyPointOfACheckpointResumesAWholeGeneration) {
  for (const std::string& point : TracedPoints()) {
    SCOPED_TRACE(point);
    fs::remove_all(dir_);
    ASSERT_TRUE(Save(1).ok());
    ASSERT_TRUE(Save(2).ok());
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      setenv(kCheckpointCrashVariable, (point + "@3").c_str(), 1);
      (void)Save(3);
      _exit(0);  // not reached when the point is
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed at " << point;
    const bool committed = point == "committed" || point == "pruning" || point == "pruned";
    std::vector<std::string> why;
    EXPECT_EQ(Resume(&why), committed ? 3 : 2) << absl::StrJoin(why, "\n");
    if (!committed) {
      ASSERT_EQ(why.size(), 1u);
      EXPECT_THAT(why[0], HasSubstr("not committed (no MANIFEST)"));
    }
    // The next checkpoint goes on from there and leaves only the newest two.
    ASSERT_TRUE(Save(4).ok());
    EXPECT_EQ(Resume(), 4);
    EXPECT_EQ(Numbers().size(), 2u);
  }
}

TEST_F(GenerationsTest, TraceListsEveryPointTheCrashInjectionNames) {
  ASSERT_TRUE(Save(1).ok());
  ASSERT_TRUE(Save(2).ok());  // the third commit prunes the first
  const std::string log = dir_ + ".log";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv(kCheckpointCrashVariable, "trace", 1);
    if (freopen(log.c_str(), "w", stderr) == nullptr) _exit(3);
    _exit(Save(3).ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string trace = ReadFile(log).value_or("");
  // Every point the trace names, in its order: exactly the listed ones (a
  // point missing from the list is one the crash test never kills at).
  std::vector<std::string> traced;
  std::istringstream lines(trace);
  for (std::string line; std::getline(lines, line);) {
    constexpr absl::string_view kPrefix = "checkpoint point ";
    if (!absl::StartsWith(line, kPrefix)) continue;
    line = line.substr(kPrefix.size());
    EXPECT_TRUE(absl::EndsWith(line, "@3")) << line;
    traced.push_back(line.substr(0, line.rfind('@')));
  }
  EXPECT_THAT(traced, ::testing::ElementsAreArray(TracedPoints())) << trace;
  fs::remove(log);
}

TEST(ErrnoStatusTest, AFullDiskIsResourceExhaustedAndNamesWhat) {
  const absl::Status full = ErrnoStatus(ENOSPC, "write to /x failed");
  EXPECT_TRUE(absl::IsResourceExhausted(full));
  EXPECT_THAT(full.message(), HasSubstr("write to /x failed: No space left on device"));
  EXPECT_TRUE(absl::IsDataLoss(ErrnoStatus(EIO, "x")));
  EXPECT_TRUE(absl::IsNotFound(ErrnoStatus(ENOENT, "x")));
}

// A small file system of its own (a 1 MiB tmpfs the test mounts; skipped
// where mounting is not permitted).
class FullDiskTest : public GenerationsTest {
 protected:
  void SetUp() override {
    GenerationsTest::SetUp();
    mount_ = ::testing::TempDir() + "/generations_tmpfs_" + std::to_string(getpid());
    fs::create_directories(mount_);
    if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=1m") != 0) {
      const std::string why = std::strerror(errno);
      fs::remove(mount_);
      GTEST_SKIP() << "cannot mount a 1 MiB tmpfs at " << mount_ << " (" << why
                   << "; needs root or CAP_SYS_ADMIN): the full-disk case is not tested here";
    }
    mounted_ = true;
    dir_ = mount_ + "/checkpoints";
  }
  void TearDown() override {
    if (mounted_) ::umount(mount_.c_str());
    fs::remove(mount_);
  }
  std::string mount_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, ACheckpointThatFindsTheDiskFullLeavesNothingAndTheLastGoodOneResumes) {
  ASSERT_TRUE(Save(1).ok());
  // A checkpoint too big for what is left: ResourceExhausted naming the
  // file, its generation removed, no .tmp left anywhere.
  absl::StatusOr<GenerationWriter> writer = GenerationWriter::Begin(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Status full = writer->AddText("networks.bin", std::string(2 << 20, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("networks.bin"));
  EXPECT_THAT(full.message(), HasSubstr("No space left on device"));
  writer->Abandon();
  EXPECT_EQ(Numbers(), (std::vector<int64_t>{1}));
  EXPECT_EQ(Resume(), 1);
  // The disk has room again: the next checkpoint commits.
  ASSERT_TRUE(Save(3).ok());
  EXPECT_EQ(Resume(), 3);
  // A log on a full disk: the append fails whole (nothing cut is left), is
  // counted, and the next append after space is freed works.
  const std::string filler = mount_ + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(1 << 12, 'x');
    while (out.write(block.data(), block.size())) {
    }
  }
  AppendLog log(mount_ + "/metrics.csv", "a,b\n");
  const std::string row(8192, '1');
  EXPECT_FALSE(log.Append(row + "\n"));
  EXPECT_FALSE(log.Append(row + "\n"));
  EXPECT_EQ(log.lost(), 2);
  EXPECT_EQ(ReadFile(mount_ + "/metrics.csv").value_or(""), "");
  fs::remove(filler);
  EXPECT_TRUE(log.Append("1,2\n"));
  EXPECT_EQ(log.lost(), 0);
  EXPECT_EQ(ReadFile(mount_ + "/metrics.csv").value_or(""), "a,b\n1,2\n");
  // WriteFileAtomically on a full disk leaves the old file and no .tmp.
  ASSERT_TRUE(WriteFileAtomically(mount_ + "/note.txt", "old\n").ok());
  EXPECT_TRUE(absl::IsResourceExhausted(WriteFileAtomically(mount_ + "/note.txt", std::string(2 << 20, 'y'))));
  EXPECT_EQ(ReadFile(mount_ + "/note.txt").value_or(""), "old\n");
  EXPECT_FALSE(fs::exists(mount_ + "/note.txt.tmp"));
}

}  // namespace
}  // namespace troupe
