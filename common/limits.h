// Limits a config is checked against before anything is allocated: the
// machine's memory, and strict HOST:PORT addresses.
#ifndef TROUPE_COMMON_LIMITS_H_
#define TROUPE_COMMON_LIMITS_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace troupe {

// This machine's physical memory in bytes (sysconf); 0 if unknown.
int64_t PhysicalMemoryBytes();

// OK when `bytes` (what `what` would allocate up front, an estimate) fits in
// this machine's physical memory; InvalidArgument "WHAT needs ~N GiB up
// front, more than this machine's M GiB" otherwise. `what` should start
// with the config field that sets the size. Never allocates anything.
absl::Status CheckFitsInMemory(absl::string_view what, double bytes);

// OK when `address` is HOST:PORT: HOST a dotted IPv4 address, a host name
// ([A-Za-z0-9.-], labels not starting or ending with '-') or a bracketed
// IPv6 address ("[::1]"); PORT decimal digits in [0, 65535] (0 = any free
// port). InvalidArgument naming `field` and what is wrong otherwise.
absl::Status ValidateHostPort(absl::string_view address, absl::string_view field);

}  // namespace troupe

#endif  // TROUPE_COMMON_LIMITS_H_
