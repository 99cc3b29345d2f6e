// What this build of troupe is: the commit its sources were at when it was
// built (cmake/build_info.cmake), so that a figure, a run or a report can
// say which code made it, and the malloc it runs on.
#ifndef TROUPE_COMMON_BUILD_INFO_H_
#define TROUPE_COMMON_BUILD_INFO_H_

#include <string>

namespace troupe {

// "0123abcdef01", "0123abcdef01+changes" (sources edited since that commit;
// changes to docs/, tests/ and Markdown do not count) or "unknown" (built
// outside a git checkout, e.g. from a pip sdist).
const char* BuildCommit();

// The malloc this process runs on, from the library that provides `malloc`:
// "tcmalloc (gperftools 2.10)" in troupe's programs (linked with it where
// TROUPE_TCMALLOC, CMakeLists.txt), "glibc" elsewhere (the Python module,
// the tests, sanitizer builds), else that library's file name.
std::string Allocator();

// The shared library that provides this process's `malloc` when it is not
// the C library's ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
// else "": what a peer preloads to run on the same allocator.
std::string AllocatorLibrary();

}  // namespace troupe

#endif  // TROUPE_COMMON_BUILD_INFO_H_
