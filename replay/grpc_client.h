// ReplayClient over gRPC (a standalone `troupe replay` server): the same
// API as the embedded client. Writers keep one bidirectional Insert stream,
// samplers one server stream; frames travel zstd-compressed both ways and
// are decoded by the sampler, on the learner's side.
//
// Errors: the server's status comes back as absl::Status with the same code
// and message; a broken connection is UNAVAILABLE (retry).
#ifndef TROUPE_REPLAY_GRPC_CLIENT_H_
#define TROUPE_REPLAY_GRPC_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "common/grpc_security.h"
#include "replay/client.h"

namespace troupe::replay {

// How long Writer::Resume waits for the channel to connect before it opens
// its new stream anyway (which then fails, saying why).
inline constexpr std::chrono::seconds kResumeConnectWait{10};

struct GrpcClientOptions {
  // Largest message sent or received (match the server's max_message_bytes).
  int64_t max_message_bytes = 64 << 20;
  // TLS and the token (common/grpc_security.h); none: loopback only.
  GrpcCredentials credentials;
};

// Connects lazily to `address` ("host:port"). Never fails for an
// unreachable server: the first call reports UNAVAILABLE. Credentials that
// cannot reach `address` (beyond loopback without TLS) make every call
// report FailedPrecondition, saying how to set them up.
std::unique_ptr<ReplayClient> NewGrpcClient(const std::string& address, const GrpcClientOptions& options = {});

// The same on a channel the caller made (NewSecureChannel, with its own
// message limits), e.g. to share one connection with a Parameters stream.
std::unique_ptr<ReplayClient> NewGrpcClient(std::shared_ptr<grpc::Channel> channel);

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_GRPC_CLIENT_H_
