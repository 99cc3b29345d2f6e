// Paths of this build and its source tree, for the tests that start troupe's
// programs or read the source tree. CMake gives each (TROUPE_BINARY,
// TROUPE_SOURCE_DIR, ...: troupe_test_paths in cmake/TroupeHelpers.cmake) as
// a path relative to the test binary's own folder, resolved here when the
// test runs: a test's object then compiles to the same bytes in every
// checkout, and a fresh clone's build (CI's) comes from ccache.
// Header-only and test-only, like processes.h.
#ifndef TROUPE_COMMON_BUILD_TREE_H_
#define TROUPE_COMMON_BUILD_TREE_H_

#include <filesystem>
#include <string>

namespace troupe {

// `relative` resolved against the folder of the running program.
inline std::string BesideThisBinary(const char* relative) {
  static const std::filesystem::path folder = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  return (folder / relative).lexically_normal().string();
}

}  // namespace troupe

#endif  // TROUPE_COMMON_BUILD_TREE_H_
