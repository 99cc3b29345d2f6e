// Status conversion at the service boundary: absl::Status inside, grpc::Status
// on the wire (same codes and message).
#ifndef TROUPE_COMMON_GRPC_STATUS_H_
#define TROUPE_COMMON_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace troupe {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace troupe

#endif  // TROUPE_COMMON_GRPC_STATUS_H_
