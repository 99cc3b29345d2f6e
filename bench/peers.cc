#include "bench/peers.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace troupe::bench {

absl::StatusOr<std::string> RunCommand(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return absl::InternalError(absl::StrCat("`", command, "` exited with ", rc, ": ", out));
  return out;
}

absl::StatusOr<std::string> CompileLibtorchPeer(const std::string& name) {
  if (!std::filesystem::exists(kLibtorchHeader)) {
    return absl::NotFoundError("libtorch-dev not installed (apt-get install libtorch-dev to compare)");
  }
  const std::string binary = (std::filesystem::temp_directory_path() / ("troupe_" + name)).string();
  const std::string source = ProjectPath("bench/peers/" + name + ".cc");
  if (std::filesystem::exists(binary) &&
      std::filesystem::last_write_time(binary) >= std::filesystem::last_write_time(source)) {
    return binary;
  }
  std::printf("(compiling the libtorch peer %s, about a minute)\n", source.c_str());
  std::fflush(stdout);
  // zlib: the GAN peer reads Fashion-MNIST's gzipped IDX files itself.
  auto built = RunCommand(absl::StrCat("g++ -O2 -std=c++17 -I/usr/include/torch/csrc/api/include ", source, " -o ",
                                       binary, ".tmp -ltorch -ltorch_cpu -lc10 -lz 2>&1 && mv ", binary, ".tmp ",
                                       binary));
  if (!built.ok()) return built.status();
  return binary;
}

}  // namespace troupe::bench
