// The PJRT tests' plugin: the XLA CPU plugin the ctest fixture fetched
// (tools/pjrt_cpu_plugin.sh), named by TROUPE_PJRT_PLUGIN.
#ifndef TROUPE_ENGINE_PJRT_PJRT_TESTING_H_
#define TROUPE_ENGINE_PJRT_PJRT_TESTING_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace troupe::pjrt {

// The fetched CPU plugin, or "" (the tests that need it skip).
inline std::string CpuPlugin() {
  const char* path = std::getenv("TROUPE_PJRT_PLUGIN");
  return path != nullptr && std::filesystem::exists(path) ? path : "";
}

}  // namespace troupe::pjrt

// Declares `plugin` (CpuPlugin()), or skips the test saying why.
#define REQUIRE_PLUGIN()                                                                                    \
  const std::string plugin = ::troupe::pjrt::CpuPlugin();                                                   \
  if (plugin.empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)"

#endif  // TROUPE_ENGINE_PJRT_PJRT_TESTING_H_
