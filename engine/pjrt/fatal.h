// How the PJRT backend's parts stop on a device error: the nn::Backend
// interface returns no errors, so a plugin's error inside a kernel, a step or
// an allocation aborts with the plugin's message, as a CUDA error does in the
// CUDA backend. Holds nothing else; errors a caller can act on (a plugin that
// does not load, a device it lacks) are absl::Status (plugin.h).
#ifndef TROUPE_ENGINE_PJRT_FATAL_H_
#define TROUPE_ENGINE_PJRT_FATAL_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

namespace troupe::pjrt {

// "PJRT backend: <what>: <status>" on stderr, then abort.
[[noreturn]] inline void Fatal(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "PJRT backend: %s: %s\n", what, status.ToString().c_str());
  std::abort();
}
inline void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Fatal(status, what);
}

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_FATAL_H_
