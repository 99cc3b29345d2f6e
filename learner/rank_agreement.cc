#include "learner/rank_agreement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host.h"
#include "common/status_macros.h"

namespace troupe::learner {
namespace {

constexpr int kMaxChars = 1000;

// Broadcasts `data` from replica 0 to every replica (one per rank under
// MPI): `data` becomes the first local one's.
absl::Status BroadcastFromRankZero(replicator::Replicator& replicator, std::vector<float>& data) {
  std::vector<std::vector<float>> copies(replicator.local_replicas().size(), data);
  RETURN_IF_ERROR(BroadcastFromReplicaZero(replicator, copies));
  data = std::move(copies.front());
  return absl::OkStatus();
}

}  // namespace

absl::Status BroadcastFromReplicaZero(replicator::Replicator& replicator, std::vector<std::vector<float>>& copies) {
  TROUPE_CHECK(copies.size() == replicator.local_replicas().size());
  return replicator.RunReplicas([&](replicator::ReplicaContext& ctx) {
    return ctx.Broadcast(copies[ctx.local_index()], /*root=*/0);
  });
}

absl::Status CheckRanksMatchReplicas(const config::EngineConfig& engine, int num_ranks) {
  if (engine.replicas() <= 1 || engine.replicas() == num_ranks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "learner.engine.replicas ", engine.replicas(), " with learner.engine.collectives ",
      config::EngineConfig::Collectives_Name(engine.collectives()), ": mpirun started ", num_ranks,
      " ranks (one replica each); leave learner.engine.replicas at 1 or make it match `mpirun -np`"));
}

std::vector<float> EncodeChiefStart(bool ok, const std::string& text) {
  std::vector<float> message(2 + kMaxChars, 0.0f);
  const size_t length = std::min<size_t>(text.size(), kMaxChars);
  message[0] = ok ? 1.0f : 0.0f;
  message[1] = float(length);
  for (size_t i = 0; i < length; ++i) message[2 + i] = float(static_cast<unsigned char>(text[i]));
  return message;
}

absl::StatusOr<std::string> DecodeChiefStart(const std::vector<float>& message) {
  if (message.size() < 2 || message[1] < 0 || size_t(message[1]) > message.size() - 2) {
    return absl::InternalError("learner rank 0's start-up message is malformed");
  }
  std::string text(size_t(message[1]), ' ');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(int(message[2 + i]));
  if (message[0] != 1.0f) return absl::FailedPreconditionError(absl::StrCat("learner rank 0 failed to start: ", text));
  return text;
}

absl::StatusOr<std::string> ShareChiefAddress(replicator::Replicator& replicator, bool chief,
                                              const absl::Status& chief_status, const std::string& address) {
  std::vector<float> message;
  if (chief) {
    message = EncodeChiefStart(chief_status.ok(),
                               chief_status.ok() ? ReachableAddress(address) : std::string(chief_status.message()));
  } else {
    message = EncodeChiefStart(false, "");
  }
  RETURN_IF_ERROR(BroadcastFromRankZero(replicator, message));
  if (chief) {
    RETURN_IF_ERROR(chief_status);
    return address;
  }
  return DecodeChiefStart(message);
}

absl::StatusOr<int> AgreeOnStep(replicator::Replicator& replicator, int step) {
  std::vector<float> value = {float(step)};
  RETURN_IF_ERROR(BroadcastFromRankZero(replicator, value));
  return int(value[0]);
}

absl::Status CheckReplicasAgree(replicator::Replicator& replicator, absl::FunctionRef<uint64_t(int replica)> checksum,
                                int64_t updates) {
  const int n = replicator.num_replicas();
  const std::vector<int>& local = replicator.local_replicas();
  // Each 64-bit checksum as three exact floats of 22 bits each; every local
  // replica gathers into its own buffer.
  std::vector<std::vector<float>> gathered(local.size(), std::vector<float>(3 * size_t(n)));
  RETURN_IF_ERROR(replicator.RunReplicas([&](replicator::ReplicaContext& ctx) {
    const uint64_t mine = checksum(ctx.replica_id());
    const float parts[3] = {float(mine & 0x3fffff), float((mine >> 22) & 0x3fffff), float(mine >> 44)};
    return ctx.AllGather(parts, gathered[ctx.local_index()]);
  }));
  const std::vector<float>& all = gathered.front();
  auto checksum_of = [&](int r) {
    return uint64_t(all[3 * r]) | uint64_t(all[3 * r + 1]) << 22 | uint64_t(all[3 * r + 2]) << 44;
  };
  for (int r = 1; r < n; ++r) {
    if (checksum_of(r) != checksum_of(0)) {
      return absl::InternalError(absl::StrFormat(
          "learner replicas diverged: rank %d's state checksum %016x differs from rank 0's %016x after %d updates", r,
          checksum_of(r), checksum_of(0), updates));
    }
  }
  return absl::OkStatus();
}

}  // namespace troupe::learner
