// `troupe certs DIR --hosts A,B,...`: a CA, a server and a client
// certificate and a token for TLS between machines (common/certificates.h).
#include <cstdio>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "common/certificates.h"

namespace troupe::cli {

void AddCertsCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string dir;
    std::vector<std::string> hosts;
    int days = 825;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "certs", "Make a CA, server and client certificates and a token for TLS between machines (then --certs DIR)");
  cmd->add_option("dir", args->dir, "Folder to write (ca.pem, ca.key, server.pem/.key, client.pem/.key, token)")
      ->required();
  cmd->add_option("--hosts", args->hosts,
                  "Names and addresses clients dial the learner or replay server by (comma-separated); "
                  "localhost and 127.0.0.1 are always added")
      ->delimiter(',');
  cmd->add_option("--days", args->days, "How long the certificates hold")->check(CLI::PositiveNumber);
  cmd->callback([args, exit_code] {
    if (absl::Status s = WriteCertificates(args->dir, args->hosts, args->days); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      *exit_code = absl::IsInvalidArgument(s) || absl::IsAlreadyExists(s) ? 2 : 1;
      return;
    }
    const std::string hosts = absl::StrJoin(args->hosts, ", ");
    std::printf(
        "wrote %s: ca.pem, ca.key (keep it here: it signs certificates), server.pem/.key (for localhost, "
        "127.0.0.1%s%s), client.pem/.key, token\n"
        "copy %s to every machine (ca.key need not go), then pass --certs %s to troupe learner, actor, replay, run "
        "and view --live\n",
        args->dir.c_str(), hosts.empty() ? "" : ", ", hosts.c_str(), args->dir.c_str(), args->dir.c_str());
  });
}

}  // namespace troupe::cli
