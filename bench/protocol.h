// The one protocol every comparison of troupe with a peer is measured by
// (STYLE.md, "Measuring"): W warm-up rounds of each side, discarded, then R
// rounds alternated troupe, peer, troupe, peer, ..., each side given the
// same time per round and run on the same threads; each side's figure is
// the median of its R rates, printed with their min-max, and the ratio is
// the ratio of medians. A burst of load on a shared machine lands on one
// round of one side, and the median of alternated rounds shrugs it off,
// where a best-of rewards whichever side is noisier (bench/protocol_test.cc
// shows both).
//
//   ProtocolOptions options;  // rounds 5, warm-up 1, seconds 2
//   options.threads = {.count = 2};  // both sides on 2 threads, unpinned
//   ASSIGN_OR_RETURN(Comparison c, CompareAlternated(troupe_round, peer_round, options));
//   report.Add(name, "samples/s", "JAX jax.jit", c);  // medians, ranges, ratio, protocol label
#ifndef TROUPE_BENCH_PROTOCOL_H_
#define TROUPE_BENCH_PROTOCOL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::bench {

// The threads both sides of a comparison run on, stated once for both: the
// caller runs each side so (a peer process told `count` threads, troupe's
// backend made with them) and the protocol prints it in the row's label.
struct ThreadsForBoth {
  int count = 1;
  // Empty: neither side pinned. Otherwise the CPUs both are pinned to, as
  // taskset lists them ("0-1").
  std::string pinned_cpus;

  // "2 threads unpinned", "1 thread pinned to CPUs 0".
  std::string Describe() const;
};

// Each side times at least this many whole steps (calls, updates, batches)
// in a round, however long they take: where one step outlasts a round's
// seconds, both sides still time the same number of steps, not troupe's one
// or two against a peer's four. The peers hold to it too (peer_timing.py's
// rate, the libtorch peers' loops).
inline constexpr int kMinStepsPerRound = 4;

struct ProtocolOptions {
  int rounds = 5;                 // measured rounds per side, >= 1
  int warmup_rounds = 1;          // discarded rounds per side before them, >= 0
  double seconds_per_round = 2;   // each side's timed window in a round, > 0
  ThreadsForBoth threads;
};

// What one call of a side is asked for: the same for both sides of a round.
struct Round {
  int index = 0;         // 0-based among the warm-up rounds or among the measured ones
  bool warmup = false;   // a warm-up round: its rate is discarded
  double seconds = 0;    // the time to measure for (options.seconds_per_round), and at
                         // least kMinStepsPerRound steps
  int threads = 1;       // options.threads.count
};

// One side: measures ONE round (an in-process loop for `round.seconds`, or a
// peer process run once) and returns its rate in units per second (> 0).
using Side = std::function<absl::StatusOr<double>(const Round& round)>;

// One side's measured rounds.
struct SideRates {
  std::vector<double> rates;  // in the order the rounds ran, warm-ups excluded
  double median = 0;          // the mean of the middle two for an even count
  double min = 0;
  double max = 0;             // a best-of: print it only labelled, and for both sides
};

struct Comparison {
  SideRates troupe;
  SideRates peer;
  double ratio = 0;  // troupe.median / peer.median
  int rounds = 0;
  int warmup_rounds = 0;
  double seconds_per_round = 0;
  ThreadsForBoth threads;

  // The protocol in words for a row's reference label: "5 alternated rounds
  // of at least 2 s and 4 steps after 1 warm-up, median [min-max], both 2
  // threads unpinned".
  std::string Describe() const;
};

// Runs options.warmup_rounds rounds of each side (troupe, peer, troupe, peer,
// ...) and discards them, then options.rounds alternated rounds starting
// with troupe, and returns each side's rates, medians and range and the ratio
// of medians. InvalidArgument for 0 rounds, negative warm-ups, a time per
// round <= 0, a thread count < 1 or a missing side; a side's error (a peer
// not installed) stops the protocol and is returned naming the side and
// round; a rate that is not finite and > 0 is an Internal error.
absl::StatusOr<Comparison> CompareAlternated(const Side& troupe, const Side& peer, const ProtocolOptions& options);

// The median, min and max of `rates` (at least one).
SideRates Summarize(std::vector<double> rates);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_PROTOCOL_H_
