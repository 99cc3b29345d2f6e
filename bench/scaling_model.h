// A paper model of data-parallel scaling, for `troupe bench scaling`: the
// step time of K replicas from the measured one-replica step and a ring
// all-reduce of the gradient over a fabric described by two published (or
// calibrated) figures, its bus bandwidth and its latency per ring step.
//
// Ring all-reduce (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations"; Thakur, Rabenseifner & Gropp
// 2005): a reduce-scatter and an all-gather, each K - 1 steps in which every
// replica sends and receives bytes / K, so
//   T(K) = 2 (K - 1) x latency + 2 (K - 1) / K x bytes / bus_bandwidth,
// 0 at K = 1. "Bus bandwidth" is nccl-tests' busbw (doc/PERFORMANCE.md:
// busbw = algbw x 2 (K - 1) / K for all-reduce), the figure NCCL reports and
// vendors publish, so T = bytes x 2 (K - 1) / K / busbw is its definition.
// The latency term of a ring grows with K; NCCL switches to trees for
// latency-bound sizes at large K, so this term is an upper bound there.
//
// Weak scaling: every replica keeps its batch, so compute per step stays the
// measured K = 1 step and only the all-reduce is added:
//   no overlap:   step(K) = compute + all_reduce(K)
//   bucket overlap (gradients all-reduced in buckets while backward still
//   runs, as GradientReducer and DDP do): the backward share b of compute
//   hides the all-reduce up to its own length,
//                 step(K) = (1 - b) x compute + max(b x compute, all_reduce(K))
// efficiency(K) = step(1) / step(K); throughput(K) = K x batch / step(K).
#ifndef TROUPE_BENCH_SCALING_MODEL_H_
#define TROUPE_BENCH_SCALING_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::bench {

// One link type as a ring all-reduce sees it.
struct Fabric {
  std::string name;
  double bus_bandwidth = 0;  // bytes/s, nccl-tests' busbw
  double latency = 0;        // seconds per ring step
};

// Replicas grouped in nodes of `replicas_per_node`: within a node they
// reduce over `within_node`, between nodes over `between_nodes`.
struct Interconnect {
  std::string name;
  Fabric within_node;
  int replicas_per_node = 1;
  Fabric between_nodes;

  // The fabric whose bandwidth bounds a ring over `replicas` replicas (the
  // slowest link it crosses).
  const Fabric& For(int replicas) const;
};

// Seconds of `calls` ring all-reduces over `replicas` replicas on one
// fabric, moving `bytes` in all (each call pays the latency term; the bytes
// are split among them). 0 for one replica. Requires replicas >= 1, bytes >= 0.
double RingAllReduceSeconds(double bytes, int replicas, const Fabric& fabric, int calls = 1);

// The same over nodes, as NCCL's own cost model prices a ring that crosses
// nodes (NVIDIA/nccl src/graph/tuning.cc): of its 2 (K - 1) steps, 2 (N - 1)
// go between the N nodes at between_nodes.latency and the rest at
// within_node.latency; the bandwidth term runs at the slowest link's busbw.
double AllReduceSeconds(double bytes, int replicas, const Interconnect& interconnect, int calls = 1);

// What one replica's step costs, measured at K = 1.
struct StepCost {
  double compute_seconds = 0;  // the whole step at K = 1 (no collective)
  double gradient_bytes = 0;   // all-reduced per step
  int all_reduce_calls = 1;    // gradient all-reduces per step, each paying the latency
  int64_t batch_per_replica = 0;
  double backward_share = 2.0 / 3.0;  // of compute, that bucketed all-reduces can overlap
};

struct Projection {
  int replicas = 1;
  double all_reduce_seconds = 0;
  double step_seconds = 0;
  double efficiency = 1;          // step(1) / step(K)
  double samples_per_second = 0;  // K x batch / step(K)
};

// The step of `replicas` replicas on `interconnect`, with or without bucket overlap.
Projection Project(const StepCost& cost, int replicas, const Interconnect& interconnect, bool overlap);

// Projections for K = 1, 2, 4, ..., max_replicas.
std::vector<Projection> ProjectPowersOfTwo(const StepCost& cost, int max_replicas, const Interconnect& interconnect,
                                           bool overlap);

// The K = 1 compute time below which `replicas` replicas would fall under
// `efficiency` (a GPU step that short is where scaling stops paying).
double ComputeSecondsForEfficiency(const StepCost& cost, int replicas, const Interconnect& interconnect, bool overlap,
                                   double efficiency);

// Latency and bus bandwidth of a K = 2 fabric from two timed all-reduces of
// one call each: a tiny buffer (its time is the latency term, 2 steps) and a
// large one of `large_bytes` (at K = 2, T = 2 latency + bytes / busbw).
// InvalidArgument if the large one is not slower than the tiny one.
absl::StatusOr<Fabric> FitFabricAtTwoReplicas(std::string name, double tiny_seconds, double large_seconds,
                                              double large_bytes);

// Published figures (see the definitions in scaling_model.cc for sources).
Interconnect NvlinkSwitchSystem();  // NVLink 4 between all replicas (H100; an NVLink Switch System reaches 256)
Interconnect NvlinkNodesOverInfiniband();  // 8 H100 per node on NVLink 4, NDR InfiniBand (400 Gb/s per GPU) between

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_SCALING_MODEL_H_
