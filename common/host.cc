#include "common/host.h"

#include <unistd.h>

namespace troupe {

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string ReachableAddress(const std::string& address, const std::string& host) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  const std::string bound = address.substr(0, colon);
  if (bound != "0.0.0.0" && bound != "[::]" && bound != "::" && !bound.empty()) return address;
  return (host.empty() ? HostName() : host) + address.substr(colon);
}

}  // namespace troupe
