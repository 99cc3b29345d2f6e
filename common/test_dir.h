// A fresh, empty folder for the running test case, for tests that write
// files: ::testing::TempDir()/PREFIX<case name>, emptied, then made.
// Header-only and test-only, like processes.h.
#ifndef TROUPE_COMMON_TEST_DIR_H_
#define TROUPE_COMMON_TEST_DIR_H_

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace troupe {

inline std::string FreshTestDir(const std::string& prefix) {
  const std::string dir =
      ::testing::TempDir() + "/" + prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace troupe

#endif  // TROUPE_COMMON_TEST_DIR_H_
