// Quoting for command lines that go through a shell (Slurm job scripts, the
// bench's peers run with popen).
#ifndef TROUPE_COMMON_SHELL_H_
#define TROUPE_COMMON_SHELL_H_

#include <string>

namespace troupe {

// `text` single-quoted for sh/bash: any character stands for itself, a
// single quote included ('\'').
inline std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace troupe

#endif  // TROUPE_COMMON_SHELL_H_
