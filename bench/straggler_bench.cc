// troupe bench straggler: K=4 replicas training an MLP (straggler_round.h),
// with one replica slowed 2x. Steps/s:
//   - slowed, waiting for it (engine.straggler WAIT, the bucketed reducer),
//   - slowed, with the step deadline (DEADLINE at 1.25 and 1.1),
// each next to no replica slowed, waiting, in the same run by the same
// protocol (alternated rounds). The ratio is the share of the unslowed pace.
// The replicas are threads of this process, then MPI ranks (each round one
// `mpiexec -np 4` of bench/peers/straggler_mpi.cc; missing, saying why,
// where mpiexec is not).
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/protocol.h"
#include "bench/straggler_round.h"
#include "common/status_macros.h"

namespace troupe::bench {
namespace {

using Collectives = replicator::ReplicatorOptions::Backend;

// One round as 4 MPI ranks: each prints "steps_per_s X" (the same steps,
// they stop together); the last line is taken.
absl::StatusOr<double> MpiRound(const Round& round, bool slowed, float deadline) {
  return RunPeerFigure(absl::StrFormat("%s -np %d --oversubscribe --allow-run-as-root --bind-to none %s %.3f %d "
                                       "%.3f 2>&1",
                                       TROUPE_MPIEXEC, kStragglerReplicas, TROUPE_STRAGGLER_MPI_BIN, round.seconds,
                                       slowed ? 1 : 0, deadline),
                       "steps_per_s");
}

// The three rows for one kind of replica: `round(round, slowed, deadline)`.
template <typename RoundFn>
absl::Status AddRows(Report& report, const std::string& replicas, const ProtocolOptions& protocol, RoundFn round) {
  const Side unslowed = [round](const Round& r) { return round(r, /*slowed=*/false, /*deadline=*/0.0f); };
  const std::string reference = "no replica slowed, waiting for every replica";
  const std::string name =
      absl::StrFormat("MLP %d-%d-%d-%d step, %d rows x %d %s, replica %d slowed 2x", kStragglerIn, kStragglerHidden,
                      kStragglerHidden, kStragglerOut, kStragglerRows, kStragglerReplicas, replicas,
                      kStragglerSlowReplica);
  RETURN_IF_ERROR(AddComparison(report, name + ", waiting for it (straggler WAIT)", "steps/s", reference,
                                [round](const Round& r) { return round(r, true, 0.0f); }, unslowed, protocol)
                      .status());
  for (const float deadline : {1.25f, 1.1f}) {
    RETURN_IF_ERROR(AddComparison(report, absl::StrFormat("%s, step deadline %.2fx (straggler DEADLINE)", name, deadline),
                                  "steps/s", reference,
                                  [round, deadline](const Round& r) { return round(r, true, deadline); }, unslowed,
                                  protocol)
                        .status());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Report> RunStragglerBenchmark(const Options& options) {
  Report report;
  const ProtocolOptions protocol = DefaultProtocol(options, kStragglerReplicas, DeviceFigureSeconds(options, 1.0));
  RETURN_IF_ERROR(AddRows(report, "in-process replicas", protocol, [](const Round& r, bool slowed, float deadline) {
    return StragglerRound(Collectives::kInProcess, r.seconds, slowed, deadline);
  }));
  // The same over MPI ranks, where this machine can start them.
  const absl::StatusOr<std::string> mpiexec = RunCommand(absl::StrCat(TROUPE_MPIEXEC, " --version 2>&1"));
  if (!mpiexec.ok() || !std::filesystem::exists(TROUPE_STRAGGLER_MPI_BIN)) {
    std::printf("MPI rows missing: %s\n",
                mpiexec.ok() ? absl::StrCat(TROUPE_STRAGGLER_MPI_BIN, " is not here (a relocated build)").c_str()
                             : absl::StrCat(TROUPE_MPIEXEC, " cannot run here: ", mpiexec.status().ToString()).c_str());
    return report;
  }
  RETURN_IF_ERROR(AddRows(report, "MPI ranks", protocol, MpiRound));
  return report;
}

}  // namespace troupe::bench
