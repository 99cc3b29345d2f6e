// The standalone replay server (`troupe replay --listen ADDR`): a Replay
// behind ReplayService on one gRPC port. Binds 127.0.0.1 unless the config
// says otherwise; port 0 picks a free port (see port()). Its credentials
// (TLS, the token; common/grpc_security.h) come from the caller.
//
// Locking: Start/Shutdown from one owning thread; Wait may be called from
// another.
#ifndef TROUPE_REPLAY_SERVER_H_
#define TROUPE_REPLAY_SERVER_H_

#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "common/grpc_security.h"
#include "proto/config.pb.h"
#include "replay/replay.h"
#include "replay/service.h"

namespace troupe::replay {

class Server {
 public:
  // Creates the tables (restoring config.restore_path if set) and listens on
  // config.listen with `credentials` (none: loopback only). InvalidArgument
  // for a bad config; FailedPrecondition for an address beyond loopback
  // without TLS and a token (AddSecureListeningPort); Unavailable if the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const config::ReplayConfig& config,
                                                       const GrpcCredentials& credentials = {});
  // Shuts down.
  ~Server();

  // The bound port and "host:port".
  int port() const { return port_; }
  const std::string& address() const { return address_; }
  Replay* replay() { return replay_.get(); }

  // Blocks until Shutdown() is called (by another thread).
  void Wait();
  // Stops accepting calls, wakes blocked inserts and samples (they end with
  // UNAVAILABLE), waits up to `grace` for calls to finish, then cancels the
  // rest. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  Server() = default;

  std::unique_ptr<Replay> replay_;
  std::unique_ptr<ReplayService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SERVER_H_
