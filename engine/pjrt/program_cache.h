// Where compiled programs are kept: in memory, the programs one PjrtBackend
// has met, each found by the fingerprint of its text (printed once) with its
// executable; on disk, compiled step programs, so a resumed run or the next
// process loads them instead of compiling them again.
//
// Holds: the programs and their executables, the on-disk files. Not: when a
// program is compiled or what is counted and said about it (the backend's
// Executable and NoteStepCompile), nor a replica group's K-replica
// executables (replica_group.h keeps those, compiling them with
// CompileProgram below).
#ifndef TROUPE_ENGINE_PJRT_PROGRAM_CACHE_H_
#define TROUPE_ENGINE_PJRT_PROGRAM_CACHE_H_

#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "engine/pjrt/plugin.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

class ProgramCache {
 public:
  // A program met: its text, printed once, and its executable, compiled (or
  // loaded) on first use by whoever runs it.
  struct Program {
    Fingerprint fingerprint;  // its key in the cache
    std::string text;
    capi::LoadedExecutable* executable = nullptr;
  };

  explicit ProgramCache(std::shared_ptr<Client> client) : client_(std::move(client)) {}
  // Destroys the programs' executables.
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // The program `f` records, found by its fingerprint; its text is printed
  // (Function::Module) only the first time, which `*met_first` says.
  Program& Of(const Function& f, bool* met_first);

 private:
  std::shared_ptr<Client> client_;
  std::unordered_map<Fingerprint, Program, FingerprintHash> programs_;
};

// A program compiled for `replicas` replicas, from the on-disk cache
// in `cache_dir` when it holds one for this plugin, device kind, XLA_FLAGS and text
// (one file per program, named by a 128-bit hash of them; a file that does
// not load is compiled again and replaced; written to a temporary name and
// renamed, so a killed process leaves no half file), else compiled and, where
// the plugin can serialize it, stored there. `cache_dir` empty: no cache.
// `*seconds`: the compile's (or load's) time; `*from_cache`: it was loaded.
absl::StatusOr<capi::LoadedExecutable*> CompileProgram(Client& client, const std::string& cache_dir,
                                                       const std::string& text, int replicas, double* seconds,
                                                       bool* from_cache);

// $XDG_CACHE_HOME/troupe/pjrt, else $HOME/.cache/troupe/pjrt, else
// /tmp/troupe-pjrt-cache.
std::string DefaultPjrtCacheDir();

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_PROGRAM_CACHE_H_
