// Crash-consistent checkpoints of a real `troupe run` (common/generations.h):
// the process killed at every point of a checkpoint's sequence, each file of
// the newest checkpoint damaged in turn, and the disk filled up under a
// running experiment. Each resume finds a whole generation whose counters
// match its networks, and says what it passed over.
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "common/build_tree.h"
#include "absl/strings/str_cat.h"
#include "common/generations.h"
#include "common/processes.h"
#include "common/run_layout.h"
#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace troupe::e2e;  // Start, Wait, Read, AwaitMatch, Metrics

constexpr int kBatchSize = 64;
constexpr int kActionRepeat = 4;

// A small state experiment in `dir`, checkpointing every second, replay
// included, into `runs_dir` (default DIR/runs).
std::string WriteConfig(const std::string& dir, int64_t total_frames, const std::string& runs_dir = "") {
  const std::string path = dir + "/small.textproto";
  std::ofstream(path) << R"(name: "ckpt" mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: )" << kActionRepeat << R"( }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [64, 64] v_min: 0 v_max: 200 n_step: 3 }
learner { batch_size: )" << kBatchSize
                      << R"( publish_every: 10 min_replay_size: 300 samples_per_insert: 32 checkpoint_every_s: 1 }
actors { count: 1 random_frames: 2000 }
evaluator { every_frames: 1000000 episodes: 1 }
tensorboard: false
runs_dir: ")" << (runs_dir.empty() ? dir + "/runs" : runs_dir)
                      << "\"\ntotal_frames: " << total_frames << "\n";
  return path;
}

// A 64 MiB tmpfs mounted at `path` (a disk to fill), unmounted when
// destroyed; null, with *why naming the mount's error, where it cannot be
// mounted (the full-disk cases then skip).
struct Tmpfs {
  std::string path;
  static std::unique_ptr<Tmpfs> Mount(const std::string& path, std::string* why) {
    fs::create_directories(path);
    if (::mount("tmpfs", path.c_str(), "tmpfs", 0, "size=64m") != 0) {
      *why = absl::StrCat("cannot mount a 64 MiB tmpfs at ", path, " (", std::strerror(errno),
                          "; needs root or CAP_SYS_ADMIN): the full-disk case is not tested here");
      return nullptr;
    }
    return std::unique_ptr<Tmpfs>(new Tmpfs{path});
  }
  ~Tmpfs() { ::umount2(path.c_str(), MNT_DETACH); }
};

pid_t Troupe(const std::vector<std::string>& args, const std::string& log,
             const std::vector<std::pair<std::string, std::string>>& env = {}) {
  return Start(TROUPE_BINARY, args, log, env);
}

std::string OnlyRunDir(const std::string& runs_dir) {
  std::vector<std::string> runs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runs_dir, ec)) runs.push_back(e.path().string());
  return runs.size() == 1 ? runs[0] : "";
}

// "key value" lines.
std::map<std::string, int64_t> Counters(const std::string& path) {
  std::map<std::string, int64_t> values;
  std::ifstream in(path);
  std::string key;
  int64_t value;
  while (in >> key >> value) values[key] = value;
  return values;
}

// What a resume said: the generation folder it resumed from, the updates
// (the agent's, from agent.ckpt) and frames (counters.txt's) it restored,
// and the items of the replay it restored (replay.ckpt's).
struct Resumed {
  std::string from;
  int64_t updates = -1, frames = -1, replay_items = -1;
};
Resumed ParseResume(const std::string& log) {
  std::smatch m;
  Resumed r;
  if (std::regex_search(log, m, std::regex("resumed from (\\S+): (\\d+) updates, (\\d+) frames"))) {
    r.from = m[1];
    r.updates = std::stoll(m[2]);
    r.frames = std::stoll(m[3]);
  }
  if (std::regex_search(log, m, std::regex("replay restored: (\\d+) items"))) r.replay_items = std::stoll(m[1]);
  return r;
}

// The frames a resume restored (counters.txt's) against the replay it
// restored from the same generation (replay.ckpt), a source of its own: in
// a run that was never resumed, frames count every transition inserted
// (action_repeat frames each) up to the counters, which are written after
// replay, so replay holds at most frames / action_repeat items.
void ExpectFramesCoverTheReplay(const Resumed& resumed, const std::string& log) {
  EXPECT_GT(resumed.replay_items, 0) << log;
  EXPECT_GE(resumed.frames, resumed.replay_items * kActionRepeat) << "counters.txt's frames fewer than replay's items\n"
                                                                   << log;
}

// `troupe run --resume RUN` that stops at once (max_updates 1: the restored
// agent has more), so only the restore is exercised.
std::string ResumeAndStop(const std::string& run, const std::string& log) {
  const int code = Wait(Troupe({"run", "--resume", run, "--set", "learner.max_updates=1"}, log), 120);
  EXPECT_EQ(code, 0) << Read(log);
  return Read(log);
}

class CheckpointEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("ckpt_e2e_");
  }
  std::string dir_;
};

// The process (learner and launcher are one) killed by the crash injection
// at each point of the third checkpoint: replay, agent and counters written,
// the manifest written, renamed, the oldest generation being removed. The
// resume uses generation 3 exactly when its manifest was renamed, else 2
// (and says 3 was passed over), and the counters it restores are those of
// the networks it loads: samples = updates x batch size, and the updates
// the counters record are the agent's.
TEST_F(CheckpointEndToEndTest, ARunKilledAtAnyPointOfACheckpointResumesAConsistentGeneration) {
  const std::vector<std::string> points = {"begun",          "added:replay.ckpt", "added:agent.ckpt", "added:counters.txt",
                                           "manifest-written", "committed",       "pruning",          "pruned"};
  for (const std::string& point : points) {
    SCOPED_TRACE(point);
    const std::string dir = dir_ + "/" + std::regex_replace(point, std::regex(":"), "_");
    fs::create_directories(dir);
    const std::string config = WriteConfig(dir, /*total_frames=*/10000000);
    const int code = Wait(Troupe({"run", config}, dir + "/run.log", {{kCheckpointCrashVariable, point + "@3"}}), 180);
    ASSERT_EQ(code, 128 + SIGKILL) << Read(dir + "/run.log");
    ASSERT_THAT(Read(dir + "/run.log"), HasSubstr("checkpoint crash injected at " + point + "@3"));
    const std::string run = OnlyRunDir(dir + "/runs");
    ASSERT_NE(run, "");
    const bool committed = point == "committed" || point == "pruning" || point == "pruned";
    const std::string expected = run + "/checkpoints/generation-00000000" + (committed ? "3" : "2");
    const std::map<std::string, int64_t> counters = Counters(absl::StrCat(expected, "/", kCountersFile));
    ASSERT_EQ(counters.size(), 3u) << expected;

    const std::string log = ResumeAndStop(run, dir + "/resume.log");
    const Resumed resumed = ParseResume(log);
    EXPECT_EQ(resumed.from, expected) << log;
    EXPECT_EQ(resumed.updates, counters.at("updates")) << log;  // agent.ckpt's, against counters.txt's
    ExpectFramesCoverTheReplay(resumed, log);
    EXPECT_EQ(counters.at("samples"), counters.at("updates") * kBatchSize);
    if (!committed) {
      EXPECT_THAT(log, HasSubstr("checkpoint passed over: generation 3 (" + run +
                                 "/checkpoints/generation-000000003): not committed (no MANIFEST)"));
    } else {
      EXPECT_THAT(log, ::testing::Not(HasSubstr("passed over")));
    }
    // The resume's own checkpoint left the newest two, all committed.
    for (const auto& [number, folder] : ListGenerations(run + "/checkpoints")) {
      EXPECT_TRUE(fs::exists(folder + "/MANIFEST")) << folder;
    }
    EXPECT_EQ(ListGenerations(run + "/checkpoints").size(), 2u);
    fs::remove_all(dir);
  }
}

// Each file of the newest checkpoint flipped by a byte, cut in half, or
// deleted, in a copy of a finished run each time: the resume uses the
// generation before and says which file was wrong and how.
TEST_F(CheckpointEndToEndTest, ADamagedNewestCheckpointIsPassedOverSayingWhy) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/4000);
  ASSERT_EQ(Wait(Troupe({"run", config}, dir_ + "/run.log"), 240), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_ + "/runs");
  // A second generation: a resume's final checkpoint.
  ResumeAndStop(run, dir_ + "/second.log");
  const auto generations = ListGenerations(run + "/checkpoints");
  ASSERT_EQ(generations.size(), 2u);
  const std::string newest = fs::path(generations[0].second).filename(), previous = fs::path(generations[1].second).filename();

  struct Damage {
    const char* name;
    void (*apply)(const std::string& path);
    const char* says;  // for the files the manifest lists
  };
  const Damage damages[] = {
      {"flip a byte",
       [](const std::string& path) {
         std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(fs::file_size(path) / 2);
         const char c = static_cast<char>(f.get());
         f.seekp(fs::file_size(path) / 2);
         f.put(static_cast<char>(c ^ 0x10));
       },
       "checksum mismatch"},
      {"cut in half", [](const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); },
       "the manifest says"},
      {"delete", [](const std::string& path) { fs::remove(path); }, "missing"},
  };
  for (const char* file : {"agent.ckpt", "counters.txt", "replay.ckpt", "MANIFEST"}) {
    for (const Damage& damage : damages) {
      SCOPED_TRACE(std::string(damage.name) + " " + file);
      const std::string copy = dir_ + "/copy";
      fs::remove_all(copy);
      fs::copy(run, copy, fs::copy_options::recursive);
      damage.apply(copy + "/checkpoints/" + newest + "/" + file);
      const std::string log = ResumeAndStop(copy, dir_ + "/resume.log");
      EXPECT_EQ(ParseResume(log).from, copy + "/checkpoints/" + previous) << log;
      const std::string said = "checkpoint passed over: generation " + std::to_string(generations[0].first);
      EXPECT_THAT(log, HasSubstr(said)) << log;
      // ...and on the status line.
      EXPECT_THAT(log, HasSubstr("| resumed from " + previous + ", 1 newer checkpoint(s) damaged or unfinished")) << log;
      if (std::string(file) != "MANIFEST") {
        EXPECT_THAT(log, HasSubstr(std::string(file) + ": ")) << log;
        EXPECT_THAT(log, HasSubstr(damage.says)) << log;
      } else {
        EXPECT_THAT(log, HasSubstr("MANIFEST")) << log;
      }
    }
  }
}

// A run directory from before generations (agent.ckpt, counters.txt and
// replay.ckpt directly in checkpoints/, counters without "updates") resumes
// from those files; its checkpoints from then on are generations, and the
// old files go once keep_checkpoints (2) generations are committed.
TEST_F(CheckpointEndToEndTest, ARunDirectoryFromBeforeGenerationsStillResumes) {
  const std::string config = WriteConfig(dir_, /*total_frames=*/4000);
  ASSERT_EQ(Wait(Troupe({"run", config}, dir_ + "/run.log"), 240), 0) << Read(dir_ + "/run.log");
  const std::string run = OnlyRunDir(dir_ + "/runs");
  // The old layout, made from the newest generation.
  const std::string newest = NewestCommittedGeneration(run + "/checkpoints");
  ASSERT_NE(newest, "");
  std::map<std::string, int64_t> counters = Counters(absl::StrCat(newest, "/", kCountersFile));
  for (const char* file : {"agent.ckpt", "replay.ckpt"}) fs::rename(newest + "/" + file, run + "/checkpoints/" + file);
  std::ofstream(absl::StrCat(RunLayout(run).checkpoints(), "/", kCountersFile))
      << "frames " << counters["frames"] << "\nsamples " << counters["samples"] << "\n";
  for (const auto& [number, folder] : ListGenerations(run + "/checkpoints")) fs::remove_all(folder);

  std::string log = ResumeAndStop(run, dir_ + "/resume1.log");
  Resumed resumed = ParseResume(log);
  EXPECT_EQ(resumed.from, run + "/checkpoints") << log;
  EXPECT_EQ(resumed.updates, counters["updates"]) << log;  // agent.ckpt's, against the generation's counters.txt
  ExpectFramesCoverTheReplay(resumed, log);
  EXPECT_THAT(log, HasSubstr("replay restored: ")) << log;
  EXPECT_EQ(ListGenerations(run + "/checkpoints").size(), 1u);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/agent.ckpt"));  // still one of the two kept
  // The second generation: the old files go, and the newest resumes.
  log = ResumeAndStop(run, dir_ + "/resume2.log");
  EXPECT_THAT(ParseResume(log).from, ::testing::EndsWith("generation-000000001")) << log;
  EXPECT_EQ(ListGenerations(run + "/checkpoints").size(), 2u);
  for (const char* file : {"agent.ckpt", "counters.txt", "replay.ckpt"}) {
    EXPECT_FALSE(fs::exists(run + "/checkpoints/" + file)) << file;
  }
}

// A full disk under a running experiment (a 64 MiB tmpfs the test mounts as
// its runs_dir, filled up once the run has a checkpoint): checkpoints fail,
// saying so in the log and on the status line, leave no partial generation,
// and training goes on; metrics rows that cannot be written are warned
// about, never left cut. Space freed, the next checkpoint commits; the run
// stops cleanly and resumes from its newest generation.
TEST_F(CheckpointEndToEndTest, AFullDiskLosesNothingAndTheRunGoesOn) {
  const std::string disk = dir_ + "/disk";
  std::string why;
  const auto tmpfs = Tmpfs::Mount(disk, &why);
  if (!tmpfs) GTEST_SKIP() << why;
  const std::string config = WriteConfig(dir_, /*total_frames=*/10000000, disk + "/runs");
  const std::string log = dir_ + "/run.log";
  const pid_t pid = Troupe({"run", config}, log);
  std::string run;
  for (int i = 0; i < 1200 && (run.empty() || NewestCommittedGeneration(run + "/checkpoints").empty()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (run.empty()) run = OnlyRunDir(disk + "/runs");
  }
  ASSERT_FALSE(run.empty() || NewestCommittedGeneration(run + "/checkpoints").empty()) << Read(log);

  // Fill the disk to its last byte.
  const std::string filler = disk + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(1 << 16, 'x');
    while (out.write(block.data(), block.size())) {
    }
  }
  EXPECT_NE(AwaitMatch(log, "checkpoint at [0-9,]+ frames failed: .*(No space left on device)", 60), "") << Read(log);
  EXPECT_NE(AwaitMatch(log, "(checkpoint FAILED) \\(\\d+x\\)", 30), "") << Read(log);  // the status line
  const int64_t updates_when_full = int64_t(LastMetrics(run)[2]);
  std::this_thread::sleep_for(std::chrono::seconds(3));

  // Space again: a checkpoint commits, and training went on throughout.
  fs::remove(filler);
  EXPECT_NE(AwaitMatch(log, "checkpoint: generation \\d+ committed at [0-9,]+ frames (after) \\d+ failed", 60), "")
      << Read(log);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(pid, SIGINT);
  ASSERT_EQ(Wait(pid, 60), 0) << Read(log);
  const std::string text = Read(log);
  // A metrics row that met the full disk (tmpfs fills page by page, so which
  // log meets it first varies) was said, and so was the recovery.
  if (text.find("failed: No space left on device; the run goes on") != std::string::npos) {
    EXPECT_THAT(text, ::testing::ContainsRegex("metrics\\.(csv|jsonl): appends work again \\([0-9]+ lost\\)"));
  }
  const auto rows = Metrics(run);
  ASSERT_FALSE(rows.empty());
  EXPECT_GT(int64_t(rows.back()[2]), updates_when_full) << "training stalled";
  // Every row whole (as many columns as the header), nothing partial or
  // temporary left.
  std::ifstream csv(RunLayout(run).metrics_csv());
  std::string line;
  ASSERT_TRUE(std::getline(csv, line));
  const auto columns = std::count(line.begin(), line.end(), ',');
  EXPECT_GE(columns, 11) << line;
  while (std::getline(csv, line)) EXPECT_EQ(std::count(line.begin(), line.end(), ','), columns) << line;
  for (const auto& [number, folder] : ListGenerations(run + "/checkpoints")) {
    EXPECT_TRUE(fs::exists(folder + "/MANIFEST")) << folder;
  }
  for (const auto& entry : fs::recursive_directory_iterator(run + "/checkpoints")) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path();
  }
  // It resumes from its newest generation.
  const std::string newest = NewestCommittedGeneration(run + "/checkpoints");
  const std::string resume_log = ResumeAndStop(run, dir_ + "/resume.log");
  EXPECT_EQ(ParseResume(resume_log).from, newest) << resume_log;
}

// A disk with room for the networks, optimizer and counters (a few hundred
// KB here) but not for replay's checkpoint: generations without replay keep
// committing, said in the log and on the status line, so a crash loses
// replay, not training; a resume from one says replay starts empty.
TEST_F(CheckpointEndToEndTest, ADiskTooFullForReplayStillCommitsTheNetworksAndCounters) {
  const std::string disk = dir_ + "/small_disk";
  std::string why;
  const auto tmpfs = Tmpfs::Mount(disk, &why);
  if (!tmpfs) GTEST_SKIP() << why;
  const std::string config = WriteConfig(dir_, /*total_frames=*/10000000, disk + "/runs");
  const std::string log = dir_ + "/small_disk.log";
  const pid_t pid = Troupe({"run", config}, log);
  // Until a committed generation's replay is much larger than its networks and counters.
  std::string run;
  uintmax_t networks = 0, replay = 0;
  for (int i = 0; i < 1200 && !(networks > 0 && replay > 4 * networks + (512 << 10)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (run.empty()) run = OnlyRunDir(disk + "/runs");
    const std::string newest = run.empty() ? "" : NewestCommittedGeneration(run + "/checkpoints");
    std::error_code ec;
    if (newest.empty() || !fs::exists(newest + "/replay.ckpt", ec)) continue;
    networks = fs::file_size(newest + "/agent.ckpt", ec) + fs::file_size(newest + "/counters.txt", ec);
    replay = fs::file_size(newest + "/replay.ckpt", ec);
  }
  ASSERT_GT(replay, 4 * networks + (512 << 10)) << "networks " << networks << " B, replay " << replay << " B\n"
                                                << Read(log);
  // Keep the disk full but for room for three networks-only generations,
  // whatever a commit's pruning frees, for a few checkpoints (one a second).
  const uintmax_t room = 3 * networks + (256 << 10);
  int fillers = 0;
  auto fill = [&] {
    struct statvfs st;
    if (::statvfs(disk.c_str(), &st) != 0) return;
    const uintmax_t free = uintmax_t(st.f_bavail) * st.f_bsize;
    if (free <= room) return;
    std::ofstream out(disk + "/filler-" + std::to_string(fillers++), std::ios::binary);
    const std::string block(1 << 16, 'x');
    for (uintmax_t left = free - room; left >= block.size() && out.write(block.data(), block.size());) left -= block.size();
  };
  fill();
  EXPECT_NE(AwaitMatch(log, "(writing it without replay)", 60), "") << Read(log);
  for (int i = 0; i < 40; ++i) {
    fill();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(AwaitMatch(log, "(committed without replay): the disk is full", 30), "") << Read(log);
  EXPECT_NE(AwaitMatch(log, "(checkpoint without replay \\(disk full\\))", 30), "") << Read(log);  // the status line
  fill();
  // A crash on the full disk: the newest committed generation holds the
  // networks and counters, not replay.
  kill(pid, SIGKILL);
  Wait(pid, 60);
  const std::string newest = NewestCommittedGeneration(run + "/checkpoints");
  ASSERT_FALSE(newest.empty());
  EXPECT_TRUE(fs::exists(newest + "/agent.ckpt") && fs::exists(newest + "/counters.txt")) << newest;
  EXPECT_FALSE(fs::exists(newest + "/replay.ckpt")) << newest;
  for (int i = 0; i < fillers; ++i) fs::remove(disk + "/filler-" + std::to_string(i));
  const std::string resume_log = ResumeAndStop(run, dir_ + "/small_disk_resume.log");
  const Resumed resumed = ParseResume(resume_log);
  EXPECT_EQ(resumed.from, newest) << resume_log;
  EXPECT_GT(resumed.updates, 0) << resume_log;
  EXPECT_THAT(resume_log, HasSubstr("replay starts empty (the checkpoint has no replay.ckpt)")) << resume_log;
}

}  // namespace
}  // namespace troupe
