#include "bench/scaling_model.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::bench {

const Fabric& Interconnect::For(int replicas) const {
  return replicas <= replicas_per_node ? within_node : between_nodes;
}

double RingAllReduceSeconds(double bytes, int replicas, const Fabric& fabric, int calls) {
  TROUPE_CHECK(replicas >= 1 && bytes >= 0 && calls >= 1);
  if (replicas == 1) return 0;
  const double steps = 2.0 * (replicas - 1);
  return calls * steps * fabric.latency + steps / replicas * bytes / fabric.bus_bandwidth;
}

double AllReduceSeconds(double bytes, int replicas, const Interconnect& interconnect, int calls) {
  TROUPE_CHECK(replicas >= 1 && bytes >= 0 && calls >= 1 && interconnect.replicas_per_node >= 1);
  if (replicas == 1) return 0;
  const int nodes = (replicas + interconnect.replicas_per_node - 1) / interconnect.replicas_per_node;
  const double steps = 2.0 * (replicas - 1);
  const double between_steps = 2.0 * (nodes - 1);
  const double latency = between_steps * interconnect.between_nodes.latency +
                         (steps - between_steps) * interconnect.within_node.latency;
  return calls * latency + steps / replicas * bytes / interconnect.For(replicas).bus_bandwidth;
}

namespace {

// The step's seconds, given the all-reduce's.
double StepSeconds(const StepCost& cost, double all_reduce, bool overlap) {
  if (!overlap) return cost.compute_seconds + all_reduce;
  const double backward = cost.backward_share * cost.compute_seconds;
  return cost.compute_seconds - backward + std::max(backward, all_reduce);
}

}  // namespace

Projection Project(const StepCost& cost, int replicas, const Interconnect& interconnect, bool overlap) {
  Projection p;
  p.replicas = replicas;
  p.all_reduce_seconds = AllReduceSeconds(cost.gradient_bytes, replicas, interconnect, cost.all_reduce_calls);
  p.step_seconds = StepSeconds(cost, p.all_reduce_seconds, overlap);
  p.efficiency = cost.compute_seconds / p.step_seconds;
  p.samples_per_second = replicas * static_cast<double>(cost.batch_per_replica) / p.step_seconds;
  return p;
}

std::vector<Projection> ProjectPowersOfTwo(const StepCost& cost, int max_replicas, const Interconnect& interconnect,
                                           bool overlap) {
  std::vector<Projection> out;
  for (int k = 1; k <= max_replicas; k *= 2) out.push_back(Project(cost, k, interconnect, overlap));
  return out;
}

double ComputeSecondsForEfficiency(const StepCost& cost, int replicas, const Interconnect& interconnect, bool overlap,
                                   double efficiency) {
  TROUPE_CHECK(efficiency > 0 && efficiency < 1);
  const double a = AllReduceSeconds(cost.gradient_bytes, replicas, interconnect, cost.all_reduce_calls);
  // No overlap: c / (c + a) = e  =>  c = e a / (1 - e).
  if (!overlap) return efficiency * a / (1 - efficiency);
  // Overlap, all-reduce longer than backward: c / ((1 - b) c + a) = e  =>  c = e a / (1 - e (1 - b)).
  // (Shorter than backward, the efficiency is 1: that c is the largest that falls short.)
  return efficiency * a / (1 - efficiency * (1 - cost.backward_share));
}

absl::StatusOr<Fabric> FitFabricAtTwoReplicas(std::string name, double tiny_seconds, double large_seconds,
                                              double large_bytes) {
  if (!(tiny_seconds > 0) || !(large_seconds > tiny_seconds) || !(large_bytes > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a tiny all-reduce of ", tiny_seconds * 1e6,
                                                   " us and a large one of ", large_seconds * 1e6, " us over ",
                                                   large_bytes, " bytes fit no fabric (the large one must take longer)"));
  }
  // K = 2: T = 2 latency + bytes / busbw; the tiny buffer's bytes are negligible.
  Fabric f;
  f.name = std::move(name);
  f.latency = tiny_seconds / 2;
  f.bus_bandwidth = large_bytes / (large_seconds - tiny_seconds);
  return f;
}

// Published figures. Bus bandwidths are nccl-tests' busbw for a ring
// all-reduce of large buffers; latencies are NCCL's own per-ring-step
// figures for its Simple protocol (the one it picks for MB-sized buckets),
// from its cost model (NVIDIA/nccl src/graph/tuning.cc, hwLat, Ring/Simple:
// NVLink 3.4 us, network 14 us; that model adds a base latency per call,
// left out here).
//  - NVLink 4 (H100 SXM): 450 GB/s per direction per GPU is the line rate;
//    NCCL's ring reaches ~370 GB/s of busbw on it (S. Jeaugey, NVIDIA,
//    NVIDIA/nccl-tests issue #212; ~480 GB/s with NVLink SHARP, not
//    modelled). The NVLink Switch System connects up to 256 H100 on NVLink
//    (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022).
//  - InfiniBand NDR, one 400 Gb/s ConnectX-7 per GPU (DGX H100): 50 GB/s
//    line rate, 46-48 GB/s of busbw per NIC measured with nccl-tests
//    (NVIDIA, NVIDIA/nccl-tests issue #290).
namespace {
constexpr double kGB = 1e9;
constexpr double kUs = 1e-6;
const Fabric kNvlink4{"NVLink 4", 370 * kGB, 3.4 * kUs};
const Fabric kInfinibandNdr{"InfiniBand NDR 400 Gb/s", 46 * kGB, 14 * kUs};
}  // namespace

Interconnect NvlinkSwitchSystem() { return {"NVLink 4", kNvlink4, 256, kNvlink4}; }

Interconnect NvlinkNodesOverInfiniband() { return {"NVLink 4 x8 + IB NDR", kNvlink4, 8, kInfinibandNdr}; }

}  // namespace troupe::bench
