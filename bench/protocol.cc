#include "bench/protocol.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::bench {

std::string ThreadsForBoth::Describe() const {
  const std::string threads = absl::StrCat(count, count == 1 ? " thread" : " threads");
  return pinned_cpus.empty() ? absl::StrCat(threads, " unpinned") : absl::StrCat(threads, " pinned to CPUs ", pinned_cpus);
}

std::string Comparison::Describe() const {
  const std::string warmups =
      warmup_rounds > 0 ? absl::StrCat(" after ", warmup_rounds, " warm-up", warmup_rounds == 1 ? "" : "s") : "";
  return absl::StrCat(rounds, " alternated round", rounds == 1 ? "" : "s", " of at least ",
                      absl::StrFormat("%g", seconds_per_round), " s and ", kMinStepsPerRound, " steps", warmups,
                      ", median [min-max], both ", threads.Describe());
}

SideRates Summarize(std::vector<double> rates) {
  SideRates side;
  side.rates = rates;
  if (rates.empty()) return side;
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  side.median = n % 2 == 1 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
  side.min = rates.front();
  side.max = rates.back();
  return side;
}

absl::StatusOr<Comparison> CompareAlternated(const Side& troupe, const Side& peer, const ProtocolOptions& options) {
  if (options.rounds < 1 || options.warmup_rounds < 0 || !(options.seconds_per_round > 0) ||
      options.threads.count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CompareAlternated: rounds (", options.rounds, ") must be >= 1, warm-up rounds (", options.warmup_rounds,
        ") >= 0, seconds per round (", options.seconds_per_round, ") > 0 and threads (", options.threads.count,
        ") >= 1"));
  }
  if (!troupe || !peer) {
    return absl::InvalidArgumentError(absl::StrCat("CompareAlternated: no ", !troupe ? "troupe" : "peer", " side"));
  }
  const std::pair<const char*, const Side*> sides[] = {{"troupe", &troupe}, {"peer", &peer}};
  std::vector<double> rates[2];
  for (const bool warmup : {true, false}) {
    const int rounds = warmup ? options.warmup_rounds : options.rounds;
    for (int index = 0; index < rounds; ++index) {
      const Round round{index, warmup, options.seconds_per_round, options.threads.count};
      for (int s = 0; s < 2; ++s) {
        const std::string which = absl::StrCat("the ", sides[s].first, " side's ", warmup ? "warm-up " : "",
                                               "round ", index + 1, " of ", rounds);
        absl::StatusOr<double> rate = (*sides[s].second)(round);
        if (!rate.ok()) {
          return absl::Status(rate.status().code(), absl::StrCat(which, ": ", rate.status().message()));
        }
        if (!std::isfinite(*rate) || *rate <= 0) {
          return absl::InternalError(absl::StrCat(which, " measured a rate of ", *rate, " (not finite and > 0)"));
        }
        if (!warmup) rates[s].push_back(*rate);
      }
    }
  }
  Comparison c;
  c.troupe = Summarize(std::move(rates[0]));
  c.peer = Summarize(std::move(rates[1]));
  c.ratio = c.troupe.median / c.peer.median;
  c.rounds = options.rounds;
  c.warmup_rounds = options.warmup_rounds;
  c.seconds_per_round = options.seconds_per_round;
  c.threads = options.threads;
  return c;
}

}  // namespace troupe::bench
