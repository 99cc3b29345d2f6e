// The tests' main() (common/test_main.cc): each test process writes under a
// temporary folder of its own, and a process it starts shares it.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace troupe {
namespace {

std::string Base() {
  const char* tmpdir = std::getenv("TMPDIR");
  return std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/troupe-test-";
}

TEST(TestMainTest, TempDirIsAFreshFolderOfThisProcess) {
  const std::string dir = ::testing::TempDir();
  EXPECT_EQ(dir.rfind(Base(), 0), 0u) << dir << ": not a folder of the test main's";
  EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  EXPECT_NE(std::filesystem::path(dir).lexically_normal(), std::filesystem::path("/tmp/")) << dir;
}

// Started by the case below (through TEST_MAIN_CHILD_OUT): writes its TempDir.
TEST(TestMainTest, ChildWritesItsTempDir) {
  const char* out = std::getenv("TEST_MAIN_CHILD_OUT");
  if (out == nullptr) GTEST_SKIP() << "a child of ProcessesItStartsShareItsTempDir, which starts it";
  std::ofstream(out) << ::testing::TempDir();
}

TEST(TestMainTest, ProcessesItStartsShareItsTempDir) {
  const std::string out = ::testing::TempDir() + "/child_temp_dir.txt";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("TEST_MAIN_CHILD_OUT", out.c_str(), 1);
    ::execl("/proc/self/exe", "test", "--gtest_filter=TestMainTest.ChildWritesItsTempDir", nullptr);
    std::_Exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(out);
  std::string child;
  std::getline(in, child);
  EXPECT_EQ(child, ::testing::TempDir());
}

}  // namespace
}  // namespace troupe
