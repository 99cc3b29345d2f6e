// The malloc a troupe process runs on. troupe's programs that run a learner
// link tcmalloc (TROUPE_TCMALLOC, CMakeLists.txt; cmake/TroupeHelpers.cmake
// troupe_program); libraries, the Python module, the env worker, the tests
// and sanitizer builds keep glibc's.
#ifndef TROUPE_COMMON_ALLOCATOR_H_
#define TROUPE_COMMON_ALLOCATOR_H_

#include <string>

namespace troupe {

// From the library that provides this process's `malloc`: "tcmalloc
// (gperftools 2.10)", "glibc", else that library's file name.
std::string Allocator();

// The shared library that provides this process's `malloc` when it is not
// the C library's ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
// else "": what a peer preloads to run on the same allocator.
std::string AllocatorLibrary();

// Hands memory malloc holds free back to the system: tcmalloc's free pages
// (MallocExtension_ReleaseFreeMemory), glibc's arenas' free tops and pages
// (malloc_trim). For after a burst of temporary memory (an evaluation).
void ReleaseFreeMemory();

}  // namespace troupe

#endif  // TROUPE_COMMON_ALLOCATOR_H_
