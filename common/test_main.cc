// main() of every troupe_test binary (in place of GoogleTest's gtest_main).
//
// ctest runs each case as its own process, many at once, and a case's files
// go under ::testing::TempDir(): with one /tmp for all, two cases that name
// the same file ("last_run_seconds_metrics.csv") write over each other
// (CI stop 58 failed on exactly that). So each test process gets a folder of
// its own: TEST_TMPDIR, which TempDir() reads, is set to a fresh
// $TMPDIR/troupe-test-XXXXXX before any case runs, and removed when every
// case passed (kept, and named on stderr, when one failed). A process started
// by a test (a rank, a death test, a child binary) inherits TEST_TMPDIR and
// so shares its parent's folder, as it shared /tmp before.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  std::string owned;
  if (const char* given = std::getenv("TEST_TMPDIR"); given == nullptr || *given == '\0') {
    const char* base = std::getenv("TMPDIR");
    owned = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/troupe-test-XXXXXX";
    if (::mkdtemp(owned.data()) == nullptr) {
      std::perror(("test main: cannot make a temporary folder " + owned).c_str());
      return 1;
    }
    ::setenv("TEST_TMPDIR", owned.c_str(), 1);
  }
  ::testing::InitGoogleMock(&argc, argv);
  const int result = RUN_ALL_TESTS();
  if (!owned.empty()) {
    if (result == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(owned, ignored);
    } else {
      std::fprintf(stderr, "test main: the failed run's files are kept in %s\n", owned.c_str());
    }
  }
  return result;
}
