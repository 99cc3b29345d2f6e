#include "replay/server.h"

#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const config::ReplayConfig& config,
                                                      const GrpcCredentials& credentials) {
  auto server = std::unique_ptr<Server>(new Server());
  ASSIGN_OR_RETURN(server->replay_, Replay::Create(config));
  server->service_ = std::make_unique<ReplayService>(server->replay_.get(), config.worker_threads());
  // Listen where configured, with the configured message limit both ways.
  grpc::ServerBuilder builder;
  RETURN_IF_ERROR(AddSecureListeningPort(builder, credentials, config.listen(), "replay.listen", &server->port_));
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes()));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("replay server: cannot listen on '", config.listen(),
                                               "' (in use, or not a host:port this machine has)"));
  }
  const std::string host = config.listen().substr(0, config.listen().rfind(':'));
  server->address_ = absl::StrCat(host, ":", server->port_);
  return server;
}

Server::~Server() { Shutdown(); }

void Server::Wait() { server_->Wait(); }

void Server::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // Wake blocked waiters first so their streams can finish, then stop gRPC
  // (which waits for every reactor to be done), then the workers.
  // (A server that failed to start has no gRPC server to stop.)
  if (replay_) replay_->Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  service_.reset();
}

}  // namespace troupe::replay
