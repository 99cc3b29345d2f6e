#include "engine/pjrt/program_cache.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"

namespace troupe::pjrt {

ProgramCache::~ProgramCache() {
  for (auto& [fingerprint, program] : programs_) {
    if (program.executable != nullptr) client_->Destroy(program.executable);
  }
}

ProgramCache::Program& ProgramCache::Of(const Function& f, bool* met_first) {
  const Fingerprint fingerprint = f.fingerprint();
  auto [it, first] = programs_.try_emplace(fingerprint);
  if (first) {
    it->second.fingerprint = fingerprint;
    it->second.text = f.Module();
  }
  *met_first = first;
  return it->second;
}

absl::StatusOr<capi::LoadedExecutable*> CompileProgram(Client& client, const std::string& cache_dir,
                                                       const std::string& text, int replicas, double* seconds,
                                                       bool* from_cache) {
  const auto start = std::chrono::steady_clock::now();
  *from_cache = false;
  std::string path;
  if (!cache_dir.empty()) {
    // XLA_FLAGS change what XLA makes of the same text (a test's
    // --xla_backend_optimization_level=0 program is not a run's).
    const char* xla_flags = std::getenv("XLA_FLAGS");
    const std::string key =
        absl::StrCat(client.plugin().path(), "\n", client.platform(), "\n", client.device_kind(0), "\n", replicas,
                     "\n", xla_flags != nullptr ? xla_flags : "", "\n", text);
    path = absl::StrCat(cache_dir, "/", absl::Hex(Fnv1a64(key.data(), key.size()), absl::kZeroPad16),
                        absl::Hex(Fnv1a64(key.data(), key.size(), kCheckpointFnv1aBasis), absl::kZeroPad16),
                        ".xla");
    std::ifstream in(path, std::ios::binary);
    if (in) {
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (auto loaded = client.Deserialize(bytes); loaded.ok()) {
        *from_cache = true;
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return *loaded;
      }
    }
  }
  auto executable = client.Compile(text, replicas);
  if (!executable.ok()) {
    return absl::Status(executable.status().code(), absl::StrCat("compiling a program for ", replicas, " replica(s) (",
                                                                 text.size() / 1024, " KB of StableHLO): ",
                                                                 executable.status().message()));
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!path.empty()) {
    // Best effort: a cache that cannot be written costs a compile next time.
    if (auto bytes = client.Serialize(*executable); bytes.ok()) {
      std::error_code ignored;
      std::filesystem::create_directories(cache_dir, ignored);
      const std::string temporary = absl::StrCat(path, ".", getpid(), ".tmp");
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      out.close();
      if (out) {
        std::filesystem::rename(temporary, path, ignored);
      } else {
        std::filesystem::remove(temporary, ignored);
      }
    }
  }
  return *executable;
}

std::string DefaultPjrtCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/troupe/pjrt");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/troupe/pjrt");
  }
  return "/tmp/troupe-pjrt-cache";
}

}  // namespace troupe::pjrt
