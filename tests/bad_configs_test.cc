// The corpus of refused configs (tests/bad_configs/*.textproto) run through
// the real `troupe run`: each must exit with a refusal (1 or 2, never a
// crash), say where the field was set (its header's `# expect:` line, with
// {file} for the config's path), start nothing and create nothing: no run
// directory, no file, no process left behind.
//
// Header of a corpus file:
//   # expect: {file}:LINE: FIELD ... (a fragment of stderr)
//   # args: --set k=v ...          (extra arguments; may be empty)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/build_tree.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "common/processes.h"

namespace troupe::e2e {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(TROUPE_SOURCE_DIR) / "tests" / "bad_configs";

struct Refusal {
  int exit_code = -1;  // 128 + signal when killed; -1 on timeout
  std::string stderr_text;
  std::set<std::string> files_left;  // under the scratch folder the run started in
  std::vector<pid_t> children_left;
};

// The pids of this process's children (with this process a subreaper, every
// descendant that outlived its parent is one).
std::vector<pid_t> Children() {
  std::vector<pid_t> children;
  const std::string self = absl::StrCat(getpid());
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "PPid:")) {
        if (std::string(absl::StripAsciiWhitespace(line.substr(5))) == self) children.push_back(std::stoi(pid));
        break;
      }
    }
  }
  return children;
}

// Runs `troupe ARGS...` in a fresh scratch folder (its working directory, so
// the default runs_dir "runs" lands there) and reports what it left.
Refusal RunTroupe(const std::vector<std::string>& args, const std::string& scratch_name) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const fs::path scratch = fs::path(::testing::TempDir()) / absl::StrCat("bad_configs_", getpid(), "_", scratch_name);
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path log = fs::path(::testing::TempDir()) / absl::StrCat("bad_configs_", getpid(), "_", scratch_name, ".log");
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch);
  const pid_t pid = Start(TROUPE_BINARY, args, log.string());
  fs::current_path(cwd);
  Refusal r;
  // Waits in short slices (a refusal takes a fraction of a second); a run
  // that goes on is stopped after a minute.
  int status = 0;
  for (int slice = 0; slice < 12000; ++slice) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    usleep(5 * 1000);
  }
  if (r.exit_code == -1) r.exit_code = Wait(pid, /*seconds=*/0);
  r.stderr_text = Read(log.string());
  // Anything still running (an actor, a worker) is a failure: reap it.
  usleep(20 * 1000);
  r.children_left = Children();
  for (pid_t child : r.children_left) kill(child, SIGKILL);
  for (pid_t child : r.children_left) waitpid(child, nullptr, 0);
  for (const auto& entry : fs::recursive_directory_iterator(scratch)) {
    r.files_left.insert(fs::relative(entry.path(), scratch).string());
  }
  fs::remove_all(scratch);
  fs::remove(log);
  return r;
}

void ExpectRefusedCleanly(const Refusal& r, const std::string& expected) {
  EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2)
      << "exit code " << r.exit_code << " (134: abort, 139: segfault, -1: ran on)\n" << r.stderr_text;
  EXPECT_TRUE(absl::StrContains(r.stderr_text, expected)) << "expected: " << expected << "\nstderr:\n" << r.stderr_text;
  EXPECT_FALSE(absl::StrContains(r.stderr_text, "libprotobuf")) << "protobuf's own log reached stderr:\n"
                                                                 << r.stderr_text;
  EXPECT_TRUE(r.files_left.empty()) << "left behind: " << *r.files_left.begin();
  EXPECT_TRUE(r.children_left.empty()) << r.children_left.size() << " processes left running";
}

std::vector<std::string> CorpusNames() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    if (entry.path().extension() == ".textproto") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class BadConfigTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BadConfigTest, IsRefusedNamingFileLineAndFieldLeavingNothing) {
  const fs::path path = kCorpus / (GetParam() + ".textproto");
  std::ifstream in(path);
  std::string expect_line, args_line;
  std::getline(in, expect_line);
  std::getline(in, args_line);
  ASSERT_TRUE(absl::StartsWith(expect_line, "# expect: ")) << path << ": first line must be '# expect: ...'";
  expect_line = expect_line.substr(10);
  ASSERT_TRUE(absl::StartsWith(args_line, "# args:")) << path << ": second line must be '# args: ...'";
  std::vector<std::string> args = {"run", path.string()};
  for (absl::string_view arg : absl::StrSplit(args_line.substr(7), ' ', absl::SkipEmpty())) args.emplace_back(arg);
  const std::string expected = absl::StrReplaceAll(expect_line, {{"{file}", path.string()}});
  ExpectRefusedCleanly(RunTroupe(args, GetParam()), expected);
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadConfigTest, ::testing::ValuesIn(CorpusNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(BadConfigCorpusTest, HasAtLeastThirtyConfigsEachWithAnExpectation) {
  EXPECT_GE(CorpusNames().size(), 30u);
}

TEST(BadConfigPathTest, ADirectoryOrADeviceIsNotAConfig) {
  ExpectRefusedCleanly(RunTroupe({"run", kCorpus.string()}, "directory"),
                       absl::StrCat("config file ", kCorpus.string(), ": not a regular file (a directory)"));
  ExpectRefusedCleanly(RunTroupe({"run", "/dev/zero"}, "device"), "config file /dev/zero: not a regular file");
  ExpectRefusedCleanly(RunTroupe({"run", "/nonexistent/config.textproto"}, "missing"),
                       "config file not found: /nonexistent/config.textproto");
}

TEST(FailedStartTest, ARunThatCannotListenLeavesNoRunDirectory) {
  // A port taken by someone else: the config is valid, the start fails.
  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  socklen_t size = sizeof(address);
  ASSERT_EQ(getsockname(taken, reinterpret_cast<sockaddr*>(&address), &size), 0);
  const std::string listen = absl::StrCat("learner.listen=127.0.0.1:", ntohs(address.sin_port));
  const Refusal r = RunTroupe({"run", (fs::path(TROUPE_SOURCE_DIR) / "configs" / "cartpole_swingup_state.textproto").string(),
                               "--set", listen},
                              "port_taken");
  close(taken);
  EXPECT_EQ(r.exit_code, 1) << r.stderr_text;
  EXPECT_TRUE(absl::StrContains(r.stderr_text, "cannot listen on 127.0.0.1:")) << r.stderr_text;
  EXPECT_TRUE(r.files_left.empty()) << "left behind: " << *r.files_left.begin();
  EXPECT_TRUE(r.children_left.empty()) << r.children_left.size() << " processes left running";
}

TEST(BadConfigPathTest, ResumeNeedsARunDirectory) {
  ExpectRefusedCleanly(RunTroupe({"run", "--resume", (kCorpus / "syntax_error.textproto").string()}, "resume_file"),
                       "not a run directory");
  ExpectRefusedCleanly(RunTroupe({"run", "--resume", "/nonexistent/run"}, "resume_missing"), "not a run directory");
  // A folder without a config of its own.
  ExpectRefusedCleanly(RunTroupe({"run", "--resume", "/"}, "resume_root"), "config file not found: //config.textproto");
}

}  // namespace
}  // namespace troupe::e2e
