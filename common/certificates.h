// `troupe certs DIR --hosts A,B,...`: a self-signed CA and certificates for
// troupe's gRPC services (common/grpc_security.h), made with Debian's
// openssl command (EC P-256 keys, SHA-256 signatures):
//   ca.pem, ca.key          the CA (ca.key signs new certificates: keep it
//                           on the machine that made them)
//   server.pem, server.key  one server certificate naming every host given
//                           (DNS names and IP addresses; localhost and
//                           127.0.0.1 always), for learners and replay servers
//   client.pem, client.key  a client certificate (mutual TLS)
//   token                   a fresh 64-character shared secret
// Keys and the token are written with mode 0600.
#ifndef TROUPE_COMMON_CERTIFICATES_H_
#define TROUPE_COMMON_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace troupe {

// Writes the files above into `dir` (created if missing). `days`: how long
// the certificates hold. Errors: InvalidArgument for a host that is not a
// DNS name or an IP address; AlreadyExists when `dir` already holds ca.pem
// (so a running set-up is never overwritten by accident); FailedPrecondition
// when the openssl command is missing; Internal with openssl's own message
// when it fails.
absl::Status WriteCertificates(const std::string& dir, const std::vector<std::string>& hosts, int days = 825);

}  // namespace troupe

#endif  // TROUPE_COMMON_CERTIFICATES_H_
