// Credentials of troupe's gRPC servers and clients, in one place: every
// server listens through AddSecureListeningPort and every client connects
// through NewSecureChannel, so replay, Parameters, the episode stream, the
// standalone replay server, MPI ranks, actors and the viewer all follow the
// same rules (config: proto/config.proto SecurityConfig).
//
// Server side:
//  1. With a server certificate, the port speaks TLS; with mutual_tls it
//     also requires a client certificate signed by the CA.
//  2. With a token, gRPC's auth metadata processor runs on every call before
//     any handler does: the call's `authorization: Bearer TOKEN` header is
//     hashed (SHA-256) and compared with the server's in constant time; a
//     call without it or with another token ends UNAUTHENTICATED, and the
//     first refused call of each connection is logged to stderr (the token
//     never is). The header is consumed: handlers never see it.
//  3. A listen address beyond loopback without TLS and a token is refused,
//     saying how to set them up, unless `insecure` (which warns).
//  4. On loopback a token without TLS is still checked (gRPC's local
//     credentials), for machines shared with other users.
// Client side: TLS against the CA when there is one (the server's
// certificate must name the host dialled, or `server_name`), a client
// certificate when there is one, and the token added to every call by a
// client interceptor. Reaching beyond loopback without TLS is refused
// unless `insecure`, and a token is never sent in clear beyond loopback.
//
// Thread-safety: GrpcCredentials is a value; the functions are thread-safe.
#ifndef TROUPE_COMMON_GRPC_SECURITY_H_
#define TROUPE_COMMON_GRPC_SECURITY_H_

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"

namespace troupe {

// The environment variable that carries the token (`troupe run` passes it
// to its actors this way, never on their command line).
inline constexpr char kTokenEnvironmentVariable[] = "TROUPE_TOKEN";
// The call metadata that carries it ("Bearer TOKEN").
inline constexpr char kTokenMetadataKey[] = "authorization";
// The fewest characters a token may have (`troupe certs` writes 64).
inline constexpr size_t kMinTokenLength = 16;

// Connections that stop answering: every client channel pings after
// kClientKeepaliveTime without traffic and every server after
// kServerKeepaliveTime; a ping unanswered for kKeepaliveTimeout ends the
// connection and its calls (UNAVAILABLE: callers retry). Reconnecting
// backs off to kMaxReconnectBackoff at most.
inline constexpr absl::Duration kClientKeepaliveTime = absl::Seconds(10);
inline constexpr absl::Duration kServerKeepaliveTime = absl::Seconds(20);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(10);
inline constexpr absl::Duration kMaxReconnectBackoff = absl::Seconds(5);

// SecurityConfig resolved: the PEM files' contents and the token.
struct GrpcCredentials {
  std::string ca_pem;                            // clients verify servers (and servers clients) against it
  std::string server_cert_pem, server_key_pem;   // what a server presents
  std::string client_cert_pem, client_key_pem;   // what a client presents (mutual TLS)
  bool mutual_tls = false;                       // servers require a client certificate
  std::string server_name;                       // checked instead of the dialled host when set
  bool insecure = false;                         // beyond loopback without TLS and a token
  std::string token;                             // the shared secret; never print it

  bool server_tls() const { return !server_cert_pem.empty(); }
  bool client_tls() const { return !ca_pem.empty(); }
  // What a server on this port (or a client) uses, for start-up lines:
  // "TLS + token", "mutual TLS + token", "token (loopback)", "none".
  std::string DescribeServer() const;
  std::string DescribeClient() const;
};

// Reads the files `config` names (certs_dir filling the empty ones) and the
// token ($TROUPE_TOKEN, else the first line of token_file). A config with
// nothing set and no $TROUPE_TOKEN gives empty credentials (loopback only).
// Errors: NotFound naming the field and file that cannot be read;
// InvalidArgument for a PEM that does not parse, a key that does not match
// its certificate, half a pair (a certificate without its key), mutual_tls
// without ca_cert, or a token shorter than kMinTokenLength or holding
// characters other than printable ASCII (the message never shows it).
absl::StatusOr<GrpcCredentials> LoadGrpcCredentials(const config::SecurityConfig& config);

// When `status` (a failed call or stream to `address`) is a TLS handshake
// that failed, troupe's words for it: which side could not verify which, and
// what would fix it (the CA that must have signed the server's certificate,
// the host it must name, a client certificate for mutual TLS); gRPC's own
// message follows in parentheses. "" for any other status (a server that is
// down or unreachable is not an authentication failure).
std::string ExplainTlsFailure(const absl::Status& status, const GrpcCredentials& credentials,
                              absl::string_view address);

// The host of "host:port" ("[::1]:7000" -> "::1"), and whether it is a
// loopback address: 127.0.0.0/8, ::1, ::ffff:127.x.y.z or "localhost".
// 0.0.0.0, [::] and every other name or address are not.
std::string HostOf(absl::string_view address);
bool IsLoopbackHost(absl::string_view host);

// Whether a server may listen on `listen` with `credentials`: the checks of
// AddSecureListeningPort, for refusing before anything starts.
absl::Status CheckServerCredentials(const GrpcCredentials& credentials, const std::string& listen,
                                    absl::string_view field);

// Adds `listen` ("host:port"; port 0 = any free one, written to *port once
// the server starts) to `builder` with the credentials above. `field` names
// where the address came from, for messages ("learner.listen").
// Errors: FailedPrecondition when `listen` is beyond loopback without TLS and
// a token and not `insecure` (the message says how to set them up), or with
// a token but no TLS; InvalidArgument for mutual_tls without TLS.
absl::Status AddSecureListeningPort(grpc::ServerBuilder& builder, const GrpcCredentials& credentials,
                                    const std::string& listen, absl::string_view field, int* port);

// A channel to `target` ("host:port") with `args` and the credentials
// above. Connects lazily, like grpc::CreateCustomChannel. Errors:
// FailedPrecondition when `target` is beyond loopback and there is no TLS
// (unless `insecure`, and never with a token: it would travel in clear).
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewSecureChannel(const GrpcCredentials& credentials,
                                                                const std::string& target,
                                                                grpc::ChannelArguments args = {});

// Whether two tokens are equal, in time that does not depend on where they
// differ or on their lengths (both SHA-256-hashed, digests compared with
// CRYPTO_memcmp).
bool TokensEqual(absl::string_view a, absl::string_view b);

// 32 random bytes from the kernel as 64 hex characters (a new token).
absl::StatusOr<std::string> NewToken();

}  // namespace troupe

#endif  // TROUPE_COMMON_GRPC_SECURITY_H_
