// Running comparison peers: shell commands, and the libtorch peers
// (bench/peers/NAME.cc) compiled at run time against Debian's libtorch-dev.
// libtorch is never a dependency of troupe: without it these return NotFound
// and the figures that need a peer say "missing".
#ifndef TROUPE_BENCH_PEERS_H_
#define TROUPE_BENCH_PEERS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::bench {

// The header whose presence means libtorch-dev is installed.
inline constexpr char kLibtorchHeader[] = "/usr/include/torch/csrc/api/include/torch/torch.h";
// The troupe header the libtorch peers include (from the project root, -I).
inline constexpr char kPeerSharedHeader[] = "common/fnv1a.h";

// Runs a shell command; returns its stdout. `on_line`, when given, also gets
// each line of it (without the newline) as it comes, for progress of a long
// run. Internal naming the command and its exit status (with its output) if
// it fails.
absl::StatusOr<std::string> RunCommand(const std::string& command,
                                       const std::function<void(const std::string&)>& on_line = {});

// bench/peers/NAME.cc compiled into the temp dir against libtorch-dev (once
// per version of the source: the binary is named for its contents; about a
// minute, several on a loaded machine); returns the binary's path. NotFound when libtorch-dev is not installed,
// Internal with the compiler's output when it does not compile.
absl::StatusOr<std::string> CompileLibtorchPeer(const std::string& name);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_PEERS_H_
