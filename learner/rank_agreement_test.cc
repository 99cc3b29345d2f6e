#include "learner/rank_agreement.h"

#include <memory>
#include <vector>

#include "engine/engine_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::learner {
namespace {

using ::testing::HasSubstr;

// Three in-process replicas, standing for three ranks.
std::unique_ptr<replicator::Replicator> ThreeReplicas() {
  config::EngineConfig engine;
  engine.set_replicas(3);
  engine.set_threads(3);
  absl::StatusOr<std::unique_ptr<replicator::Replicator>> replicator = engine::MakeReplicator(engine);
  EXPECT_TRUE(replicator.ok()) << replicator.status();
  return replicator.ok() ? std::move(*replicator) : nullptr;
}

TEST(RankAgreementTest, ReplicasThatAgreePassAndOneThatDivergedIsNamed) {
  std::unique_ptr<replicator::Replicator> replicator = ThreeReplicas();
  ASSERT_NE(replicator, nullptr);
  // Checksums that use every one of the 64 bits (three 22-bit floats each).
  const uint64_t same = 0xfedcba9876543210ull;
  EXPECT_TRUE(CheckReplicasAgree(*replicator, [&](int) { return same; }, 10).ok());
  const absl::Status diverged =
      CheckReplicasAgree(*replicator, [&](int replica) { return replica == 2 ? same ^ (1ull << 63) : same; }, 10);
  EXPECT_TRUE(absl::IsInternal(diverged)) << diverged;
  EXPECT_THAT(diverged.message(), HasSubstr("rank 2's state checksum 7edcba9876543210 differs from rank 0's "
                                            "fedcba9876543210 after 10 updates"));
}

// Each replica starts from values of its own (as each rank does); all end
// with replica 0's. (AgreeOnStep in process gives every replica the same
// start, so its result alone would not show the broadcast.)
TEST(RankAgreementTest, EveryRankGetsRankZerosStep) {
  std::unique_ptr<replicator::Replicator> replicator = ThreeReplicas();
  ASSERT_NE(replicator, nullptr);
  std::vector<std::vector<float>> copies = {{2.0f, 0.5f}, {0.0f, 1.0f}, {1.0f, 3.0f}};
  ASSERT_TRUE(BroadcastFromReplicaZero(*replicator, copies).ok());
  EXPECT_EQ(copies, std::vector<std::vector<float>>(3, {2.0f, 0.5f}));
  const absl::StatusOr<int> step = AgreeOnStep(*replicator, 2);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
}

TEST(RankAgreementTest, TheChiefsAddressOrErrorReachesTheOtherRanks) {
  const absl::StatusOr<std::string> address = DecodeChiefStart(EncodeChiefStart(true, "node-7:40123"));
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "node-7:40123");
  const absl::StatusOr<std::string> failed =
      DecodeChiefStart(EncodeChiefStart(false, "learner.listen: cannot listen on 127.0.0.1:1 (port in use?)"));
  EXPECT_TRUE(absl::IsFailedPrecondition(failed.status()));
  EXPECT_EQ(failed.status().message(),
            "learner rank 0 failed to start: learner.listen: cannot listen on 127.0.0.1:1 (port in use?)");
  // Long messages are cut, not overrun.
  const absl::StatusOr<std::string> long_text = DecodeChiefStart(EncodeChiefStart(true, std::string(5000, 'x')));
  ASSERT_TRUE(long_text.ok());
  EXPECT_EQ(long_text->size(), 1000u);
  EXPECT_FALSE(DecodeChiefStart({1.0f, 7.0f}).ok()) << "a length past the message is malformed";

  // Over the collectives: the chief keeps its own address (or its error).
  std::unique_ptr<replicator::Replicator> replicator = ThreeReplicas();
  ASSERT_NE(replicator, nullptr);
  const absl::StatusOr<std::string> shared = ShareChiefAddress(*replicator, true, absl::OkStatus(), "127.0.0.1:5000");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(*shared, "127.0.0.1:5000");
  const absl::StatusOr<std::string> chief_failed =
      ShareChiefAddress(*replicator, true, absl::UnavailableError("port in use"), "");
  EXPECT_TRUE(absl::IsUnavailable(chief_failed.status()));
}

TEST(RankAgreementTest, ReplicasThatDisagreeWithTheRankCountAreRefused) {
  config::EngineConfig engine;
  engine.set_collectives(config::EngineConfig::MPI);
  EXPECT_TRUE(CheckRanksMatchReplicas(engine, 4).ok()) << "replicas 1: one per rank, whatever mpirun started";
  engine.set_replicas(4);
  EXPECT_TRUE(CheckRanksMatchReplicas(engine, 4).ok());
  const absl::Status refused = CheckRanksMatchReplicas(engine, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_THAT(refused.message(), HasSubstr("learner.engine.replicas 4 with learner.engine.collectives MPI: mpirun "
                                           "started 2 ranks"));
}

}  // namespace
}  // namespace troupe::learner
