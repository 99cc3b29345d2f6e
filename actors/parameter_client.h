// Follows the learner's Parameters stream from a background thread, so an
// actor can switch to a new policy version between env steps without waiting
// on the network. Reconnects with exponential backoff (0.1 s doubling to
// 5 s) when the learner goes away, and resumes from the version it holds.
//
// Locking: the newest update is kept under an absl::Mutex; TakeNewer copies
// it out.
#ifndef TROUPE_ACTORS_PARAMETER_CLIENT_H_
#define TROUPE_ACTORS_PARAMETER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_security.h"
#include "proto/parameters.grpc.pb.h"

namespace troupe::actors {

class ParameterClient {
 public:
  // Starts following `address` ("host:port") at once, with `credentials`
  // (TLS, the token; none: loopback only). Credentials that cannot reach
  // the address (beyond loopback without TLS) stop the client at once:
  // WaitForFirst reports why.
  explicit ParameterClient(const std::string& address, const GrpcCredentials& credentials = {});
  ~ParameterClient();  // cancels the stream and joins the thread

  // If a version newer than *version arrived, copies its (single, float32)
  // tensor into *parameters, sets *version and returns true. Never blocks on
  // the network.
  bool TakeNewer(int64_t* version, std::vector<float>* parameters);

  // Blocks until a first version arrives or `timeout_ms` passes;
  // DeadlineExceeded naming the address, and why the last attempt to reach
  // it failed, if nothing came. Returns at once, saying why, once no version
  // can come: the learner refused the TLS handshake (Unauthenticated:
  // another CA, a name its certificate lacks), or the credentials cannot
  // make a channel at all (that error).
  absl::Status WaitForFirst(int timeout_ms);

  // Times the stream (re)connected after a failure.
  int64_t reconnects() const { return reconnects_.load(); }

 private:
  void Loop(std::stop_token stop);
  // The version held (0: none yet).
  int64_t latest_version();

  std::string address_;
  GrpcCredentials credentials_;
  absl::Mutex mutex_;
  std::shared_ptr<proto::ParametersUpdate> latest_ ABSL_GUARDED_BY(mutex_);
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mutex_);  // the live call, to cancel it
  absl::Status last_error_ ABSL_GUARDED_BY(mutex_);  // how the last stream ended
  bool hopeless_ ABSL_GUARDED_BY(mutex_) = false;    // no version can come (WaitForFirst)
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;    // the destructor runs: stop backing off
  std::atomic<int64_t> reconnects_{0};
  std::jthread thread_;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_PARAMETER_CLIENT_H_
