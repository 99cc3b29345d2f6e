#include "bench/scaling_model.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::bench {
namespace {

using ::testing::HasSubstr;

// 1 GB/s and 10 us per ring step: round numbers to check the formula by hand.
const Fabric kSimple{"simple", /*bus_bandwidth=*/1e9, /*latency=*/10e-6};

Interconnect OneFabric(const Fabric& f) { return {"one", f, /*replicas_per_node=*/1 << 20, f}; }

StepCost Cost(double compute_seconds, double gradient_bytes) {
  StepCost c;
  c.compute_seconds = compute_seconds;
  c.gradient_bytes = gradient_bytes;
  c.all_reduce_calls = 1;
  c.batch_per_replica = 256;
  c.backward_share = 2.0 / 3.0;
  return c;
}

TEST(RingAllReduceTest, OneReplicaCostsNothing) {
  EXPECT_EQ(RingAllReduceSeconds(/*bytes=*/1e9, /*replicas=*/1, kSimple), 0.0);
  EXPECT_EQ(RingAllReduceSeconds(1e9, 1, kSimple, /*calls=*/5), 0.0);
}

TEST(RingAllReduceTest, TwoReplicasCostBytesOverBandwidthPlusTwoLatencies) {
  // 2 (K-1)/K = 1 at K = 2: 1e6 bytes at 1 GB/s = 1 ms, plus 2 x 10 us.
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e6, 2, kSimple), 1e-3 + 20e-6);
}

TEST(RingAllReduceTest, FollowsTheRingFormulaAtLargerK) {
  // K = 4: 6 steps of latency, 1.5 x bytes / busbw.
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e6, 4, kSimple), 6 * 10e-6 + 1.5e-3);
  // K = 256: 510 steps; the bandwidth term approaches 2 x bytes / busbw.
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e6, 256, kSimple), 510 * 10e-6 + 2.0 * 255 / 256 * 1e-3);
  // Each call pays the latency; the bytes are the same in all.
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e6, 4, kSimple, /*calls=*/3), 3 * 6 * 10e-6 + 1.5e-3);
}

TEST(ProjectTest, OneReplicaIsTheMeasuredStep) {
  const StepCost cost = Cost(/*compute_seconds=*/0.1, /*gradient_bytes=*/16e6);
  for (bool overlap : {false, true}) {
    const Projection p = Project(cost, 1, OneFabric(kSimple), overlap);
    EXPECT_EQ(p.all_reduce_seconds, 0.0);
    EXPECT_DOUBLE_EQ(p.step_seconds, 0.1);
    EXPECT_DOUBLE_EQ(p.efficiency, 1.0);
    EXPECT_DOUBLE_EQ(p.samples_per_second, 256 / 0.1);
  }
}

TEST(ProjectTest, WithoutOverlapTheAllReduceAddsToTheStep) {
  const StepCost cost = Cost(0.1, 16e6);
  const Projection p = Project(cost, 2, OneFabric(kSimple), /*overlap=*/false);
  const double all_reduce = 16e-3 + 20e-6;
  EXPECT_DOUBLE_EQ(p.all_reduce_seconds, all_reduce);
  EXPECT_DOUBLE_EQ(p.step_seconds, 0.1 + all_reduce);
  EXPECT_DOUBLE_EQ(p.efficiency, 0.1 / (0.1 + all_reduce));
  EXPECT_DOUBLE_EQ(p.samples_per_second, 2 * 256 / (0.1 + all_reduce));
}

TEST(ProjectTest, OverlapHidesAnAllReduceShorterThanBackward) {
  // 16 ms of all-reduce inside 67 ms of backward: nothing shows.
  const Projection hidden = Project(Cost(0.1, 16e6), 2, OneFabric(kSimple), /*overlap=*/true);
  EXPECT_DOUBLE_EQ(hidden.step_seconds, 0.1);
  EXPECT_DOUBLE_EQ(hidden.efficiency, 1.0);
  // 160 ms against 67 ms of backward: the step is forward + the all-reduce.
  const Projection exposed = Project(Cost(0.1, 160e6), 2, OneFabric(kSimple), /*overlap=*/true);
  EXPECT_NEAR(exposed.step_seconds, 0.1 / 3 + 0.16 + 20e-6, 1e-12);
  // Never worse than no overlap.
  EXPECT_LT(exposed.step_seconds, Project(Cost(0.1, 160e6), 2, OneFabric(kSimple), false).step_seconds);
}

TEST(ProjectTest, EfficiencyNeverRisesWithMoreReplicas) {
  for (const Interconnect& net : {NvlinkSwitchSystem(), NvlinkNodesOverInfiniband(), OneFabric(kSimple)}) {
    for (bool overlap : {false, true}) {
      for (double compute : {1e-3, 0.02, 1.0}) {
        const auto projections = ProjectPowersOfTwo(Cost(compute, 17e6), 256, net, overlap);
        ASSERT_EQ(projections.size(), 9u);  // 1, 2, ..., 256
        EXPECT_EQ(projections.back().replicas, 256);
        for (size_t i = 1; i < projections.size(); ++i) {
          EXPECT_LE(projections[i].efficiency, projections[i - 1].efficiency)
              << net.name << " overlap " << overlap << " compute " << compute << " K " << projections[i].replicas;
          EXPECT_GT(projections[i].efficiency, 0.0);
        }
      }
    }
  }
}

TEST(AllReduceOverNodesTest, OneNodeIsTheRingOnItsFabric) {
  const Fabric slow{"slow", 1e8, 100e-6};
  const Interconnect nodes{"nodes", kSimple, /*replicas_per_node=*/8, slow};
  for (int k : {1, 2, 4, 8}) EXPECT_DOUBLE_EQ(AllReduceSeconds(1e6, k, nodes), RingAllReduceSeconds(1e6, k, kSimple));
}

TEST(AllReduceOverNodesTest, OnlyTheStepsBetweenNodesPayTheirLatency) {
  const Fabric slow{"slow", 1e8, 100e-6};
  const Interconnect nodes{"nodes", kSimple, /*replicas_per_node=*/8, slow};
  // K = 16 on 2 nodes: 30 steps, 2 of them between the nodes; the bandwidth
  // is the slow link's: 2 x 15/16 x 1e6 bytes at 1e8 B/s.
  EXPECT_DOUBLE_EQ(AllReduceSeconds(1e6, 16, nodes), 2 * 100e-6 + 28 * 10e-6 + 1.875e-2);
  // K = 12: 2 nodes (one not full).
  EXPECT_DOUBLE_EQ(AllReduceSeconds(1e6, 12, nodes, /*calls=*/2), 2 * (2 * 100e-6 + 20 * 10e-6) + 2.0 * 11 / 12 * 1e-2);
}

TEST(AllReduceOverNodesTest, LeavingTheNodeSlowsTheAllReduceDown) {
  const Interconnect cluster = NvlinkNodesOverInfiniband();
  EXPECT_EQ(&cluster.For(8), &cluster.within_node);
  EXPECT_EQ(&cluster.For(16), &cluster.between_nodes);
  const StepCost cost = Cost(0.01, 17e6);
  EXPECT_GT(Project(cost, 16, cluster, false).all_reduce_seconds,
            2 * Project(cost, 16, NvlinkSwitchSystem(), false).all_reduce_seconds);
  EXPECT_DOUBLE_EQ(Project(cost, 8, cluster, false).all_reduce_seconds,
                   Project(cost, 8, NvlinkSwitchSystem(), false).all_reduce_seconds);
}

TEST(ComputeForEfficiencyTest, ThatComputeGivesExactlyThatEfficiency) {
  for (bool overlap : {false, true}) {
    StepCost cost = Cost(0, 17e6);
    cost.compute_seconds = ComputeSecondsForEfficiency(cost, 256, NvlinkNodesOverInfiniband(), overlap, 0.9);
    EXPECT_NEAR(Project(cost, 256, NvlinkNodesOverInfiniband(), overlap).efficiency, 0.9, 1e-12) << overlap;
  }
}

TEST(FitFabricTest, RecoversTheFabricThatProducedTheTimes) {
  const double tiny = RingAllReduceSeconds(4, 2, kSimple);
  const double large = RingAllReduceSeconds(64e6, 2, kSimple);
  auto fit = FitFabricAtTwoReplicas("fit", tiny, large, 64e6);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->latency, kSimple.latency, 1e-8);        // the tiny buffer's 4 bytes are not subtracted
  EXPECT_NEAR(fit->bus_bandwidth, kSimple.bus_bandwidth, 1e3);
  // Its prediction for another size matches the original fabric.
  EXPECT_NEAR(RingAllReduceSeconds(17e6, 2, *fit), RingAllReduceSeconds(17e6, 2, kSimple), 1e-8);
}

TEST(FitFabricTest, RefusesALargeBufferNoSlowerThanTheTinyOne) {
  auto fit = FitFabricAtTwoReplicas("MPI K=2", 1e-3, 1e-3, 64e6);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fit.status().message(), HasSubstr("MPI K=2"));
}

}  // namespace
}  // namespace troupe::bench
