#include "common/status_line.h"

#include <unistd.h>

#include <cstdio>

namespace troupe {

StatusLine::StatusLine(std::chrono::milliseconds interval)
    : terminal_(isatty(STDERR_FILENO)), interval_(terminal_ ? interval : interval * 4) {}

StatusLine::~StatusLine() {
  if (drawn_ && terminal_) std::fputc('\n', stderr);
}

void StatusLine::Update(const std::string& text, bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_ < interval_) return;
  last_ = now;
  drawn_ = true;
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

}  // namespace troupe
