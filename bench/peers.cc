#include "bench/peers.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/fnv1a.h"
#include "common/shell.h"
#include "common/status_macros.h"

namespace troupe::bench {

absl::StatusOr<std::string> RunCommand(const std::string& command,
                                       const std::function<void(const std::string&)>& on_line) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  char buf[4096];
  size_t line_start = 0;
  // read() rather than fread(): fread waits until its buffer is full, which
  // would hold a slow command's progress lines back.
  for (ssize_t n; (n = read(fileno(p), buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
    // Complete lines to on_line as they arrive.
    for (size_t end; on_line && (end = out.find('\n', line_start)) != std::string::npos; line_start = end + 1) {
      on_line(out.substr(line_start, end - line_start));
    }
  }
  const int rc = pclose(p);
  if (rc != 0) return absl::InternalError(absl::StrCat("`", command, "` exited with ", rc, ": ", out));
  return out;
}

absl::StatusOr<std::string> CompileLibtorchPeer(const std::string& name) {
  if (!std::filesystem::exists(kLibtorchHeader)) {
    return absl::NotFoundError("libtorch-dev not installed (apt-get install libtorch-dev to compare)");
  }
  const std::string source = ProjectPath("bench/peers/" + name + ".cc");
  ASSIGN_OR_RETURN(std::string text, ReadFile(source));
  // The one troupe header a peer includes (header-only, no dependencies).
  ASSIGN_OR_RETURN(const std::string header, ReadFile(ProjectPath(std::string(kPeerSharedHeader))));
  text += header;
  // Named for the source's contents (and the header's): checkouts of other
  // versions sharing the temp dir each get their own binary, and an edit
  // recompiles.
  const std::string binary = (std::filesystem::temp_directory_path() /
                              absl::StrFormat("troupe_%s_%016x", name, Fnv1a64(text.data(), text.size())))
                                 .string();
  if (std::filesystem::exists(binary)) return binary;
  // Tests run side by side (ctest -j) ask for the same peer at once: one
  // compiles it, the others wait on its lock and find the binary (two
  // compiles of a minute each were a minute of CI's 20 thrown away).
  const int lock = open(absl::StrCat(binary, ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0) return absl::InternalError(absl::StrCat("cannot open ", binary, ".lock: ", std::strerror(errno)));
  absl::Cleanup unlock = [lock] { close(lock); };
  while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {
  }
  if (std::filesystem::exists(binary)) return binary;
  std::printf("(compiling the libtorch peer %s, about a minute)\n", source.c_str());
  std::fflush(stdout);
  // zlib: the GAN peer reads Fashion-MNIST's gzipped IDX files itself. A
  // temporary, then a rename: the binary appears whole or not at all.
  const std::string temporary = absl::StrCat(binary, ".", getpid(), ".tmp");
  auto built = RunCommand(absl::StrCat("g++ -O2 -std=c++17 -I/usr/include/torch/csrc/api/include -I",
                                       ShellQuote(ProjectPath(".")), " ", source, " -o ",
                                       temporary, " -ltorch -ltorch_cpu -lc10 -lz 2>&1 && mv ", temporary, " ",
                                       binary));
  if (!built.ok()) return built.status();
  return binary;
}

}  // namespace troupe::bench
