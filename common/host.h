// This machine's name, and the address other machines reach a server on.
#ifndef TROUPE_COMMON_HOST_H_
#define TROUPE_COMMON_HOST_H_

#include <string>

namespace troupe {

// This machine's host name (gethostname); "localhost" when it has none.
std::string HostName();

// `address` (HOST:PORT) with an every-interface host (0.0.0.0, ::, [::],
// empty) replaced by `host`, or by HostName() when `host` is empty: what a
// server bound to every interface tells others to dial. Any other address,
// and one without a port, comes back as it is.
std::string ReachableAddress(const std::string& address, const std::string& host = "");

}  // namespace troupe

#endif  // TROUPE_COMMON_HOST_H_
