#include "common/allocator.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <string>

namespace troupe {
namespace {

// The file of the object whose `malloc` this process's calls reach (the
// first definition in the global lookup order), "" when unknown.
std::string MallocFile() {
  Dl_info info{};
  void* const symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

bool IsCLibrary(const std::string& file) {
  const std::string name = file.substr(file.rfind('/') + 1);
  return name.rfind("libc.so", 0) == 0 || name.rfind("libc-", 0) == 0;
}

bool IsTcmalloc(const std::string& file) { return file.find("tcmalloc") != std::string::npos; }

}  // namespace

std::string Allocator() {
  const std::string file = MallocFile();
  if (file.empty() || IsCLibrary(file)) return "glibc";
  if (IsTcmalloc(file)) {
    // gperftools' own version string ("gperftools 2.10").
    using Version = const char* (*)(int*, int*, const char**);
    if (void* version = dlsym(RTLD_DEFAULT, "tc_version"); version != nullptr) {
      int major = 0, minor = 0;
      const char* patch = nullptr;
      return std::string("tcmalloc (") + reinterpret_cast<Version>(version)(&major, &minor, &patch) + ")";
    }
    return "tcmalloc";
  }
  return file.substr(file.rfind('/') + 1);
}

std::string AllocatorLibrary() {
  const std::string file = MallocFile();
  return file.empty() || IsCLibrary(file) ? "" : file;
}

void ReleaseFreeMemory() {
  if (IsTcmalloc(MallocFile())) {
    if (void* release = dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"); release != nullptr) {
      reinterpret_cast<void (*)()>(release)();
    }
    return;
  }
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace troupe
