#include "common/limits.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace troupe {

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) * page;
}

absl::Status CheckFitsInMemory(absl::string_view what, double bytes) {
  const int64_t memory = PhysicalMemoryBytes();
  if (memory <= 0 || (std::isfinite(bytes) && bytes <= static_cast<double>(memory))) return absl::OkStatus();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: needs ~%.3g GiB up front, more than this machine's %.1f GiB of memory; make it smaller", what,
      bytes / kGiB, memory / kGiB));
}

namespace {

bool IsHostName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

bool IsIpv6(absl::string_view host) {
  if (host.size() < 2 || host.size() > 47) return false;
  int colons = 0;
  for (char c : host) {
    if (c == ':') {
      ++colons;
    } else if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != '.') {
      return false;
    }
  }
  return colons >= 2 && colons <= 7;
}

}  // namespace

absl::Status ValidateHostPort(absl::string_view address, absl::string_view field) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " \"", absl::CHexEscape(address.substr(0, 80)), "\": ", why,
                                                   "; expected HOST:PORT, e.g. 127.0.0.1:7000 (port 0 = any free port)"));
  };
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == absl::string_view::npos) return bad("no ':PORT'");
  const absl::string_view host = address.substr(0, colon), port = address.substr(colon + 1);
  // The port: 1 to 5 decimal digits, at most 65535.
  if (port.empty() || port.size() > 5) return bad("the port must be 1 to 5 digits");
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return bad("the port must be decimal digits only");
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 0 || number > 65535) {
    return bad(absl::StrCat("port ", port, " is outside [0, 65535]"));
  }
  // The host: [IPv6], or a name / dotted IPv4 address.
  if (!host.empty() && host.front() == '[') {
    if (host.back() != ']' || !IsIpv6(host.substr(1, host.size() - 2))) return bad("not a valid [IPv6] host");
    return absl::OkStatus();
  }
  if (host.find(':') != absl::string_view::npos) return bad("an IPv6 host must be in brackets, [::1]:PORT");
  if (!IsHostName(host)) return bad("the host must be a name or an address ([A-Za-z0-9.-])");
  return absl::OkStatus();
}

}  // namespace troupe
