// Not a plugin: libraries for the loader's error paths (pjrt_test.cc). Built
// plain, it exports no GetPjrtApi; with TROUPE_FAKE_PJRT_MAJOR, it exports
// one whose table claims that API major version.
#include "engine/pjrt/pjrt_c_api.h"

#ifdef TROUPE_FAKE_PJRT_MAJOR
extern "C" __attribute__((visibility("default"))) const troupe::pjrt::capi::Api* GetPjrtApi() {
  static troupe::pjrt::capi::Api api = [] {
    troupe::pjrt::capi::Api a{};
    a.struct_size = sizeof(a);
    a.pjrt_api_version.major_version = TROUPE_FAKE_PJRT_MAJOR;
    a.pjrt_api_version.minor_version = 0;
    return a;
  }();
  return &api;
}
#else
extern "C" __attribute__((visibility("default"))) int NotAPjrtPlugin() { return 0; }
#endif
