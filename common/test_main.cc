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

#if defined(__SANITIZE_ADDRESS__)
// In AddressSanitizer builds, LeakSanitizer's defaults for every test
// binary: what XLA's CPU PJRT plugin (which the PJRT tests load) allocates
// and keeps past the process's exit is the plugin's: its compiler's objects,
// tens of bytes a program, made under troupe's Client::Compile or on the
// plugin's own threads with no troupe frame at all. So a leak whose stack
// passes through the plugin is not reported, and stacks are deep enough to
// show it. Troupe's own allocations are checked as before; a PJRT object
// troupe failed to destroy (a buffer, an executable, an event) would be
// hidden too, its memory being the plugin's: the memory soak's growth bound
// (tools/soak.sh) is what watches those. A run's own ASAN_OPTIONS and
// LSAN_OPTIONS still apply.
extern "C" const char* __asan_default_options() { return "malloc_context_size=64"; }
extern "C" const char* __lsan_default_suppressions() { return "leak:pjrt_cpu_plugin\n"; }
#endif

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
