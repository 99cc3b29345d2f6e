// The credential flags every serving or connecting subcommand takes (run,
// learner, actor, replay, view --live), written into the config's security
// section (proto/config.proto SecurityConfig; common/grpc_security.h). The
// token itself never goes on a command line: --token-file names a file, or
// $TROUPE_TOKEN carries it.
#ifndef TROUPE_CLI_SECURITY_FLAGS_H_
#define TROUPE_CLI_SECURITY_FLAGS_H_

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "proto/config.pb.h"

namespace troupe::cli {

struct SecurityFlags {
  std::string certs_dir, token_file;
  bool mutual_tls = false, insecure = false;

  // Adds --certs, --token-file, --mtls and --insecure to `cmd`.
  void AddTo(CLI::App* cmd) {
    cmd->add_option("--certs", certs_dir,
                    "TLS and token from a folder made by `troupe certs` (sets security.certs_dir)");
    cmd->add_option("--token-file", token_file,
                    "File holding the shared token (sets security.token_file; $TROUPE_TOKEN wins over it)");
    cmd->add_flag("--mtls", mutual_tls, "Servers require client certificates (sets security.mutual_tls)");
    cmd->add_flag("--insecure", insecure,
                  "Serve or connect beyond loopback without TLS and a token: trusted private networks only "
                  "(sets security.insecure)");
  }
  // Writes the flags given into `security`, over the config's values.
  void ApplyTo(config::SecurityConfig* security) const {
    if (!certs_dir.empty()) security->set_certs_dir(certs_dir);
    if (!token_file.empty()) security->set_token_file(token_file);
    if (mutual_tls) security->set_mutual_tls(true);
    if (insecure) security->set_insecure(true);
  }
};

}  // namespace troupe::cli

#endif  // TROUPE_CLI_SECURITY_FLAGS_H_
