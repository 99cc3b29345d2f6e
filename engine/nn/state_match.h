// Whole-state equivalence, for tests that compare two ways of computing the
// same training (the CPU against PJRT, CUDA or the strict device; K=2
// replicas against K=1; compiled against kernel at a time). Every tensor of
// the two states is compared, as a checkpoint holds them: the networks, the
// target networks, the optimizer's moments and the counters. Comparing the
// moments is what lets such a test see a gradient's magnitude: after an
// update from fresh moments Adam's m is (1 - beta1) g and v is
// (1 - beta2) g^2, while the weights move by about lr * sign(g) whatever g's
// size, so a sum where a mean belongs or a missing 1/K is invisible in the
// weights and plain in the moments.
//
// Each tensor's difference is taken relative to its scale (the largest
// |value| of the two), so a tolerance means the same for a weight of 0.3 and
// a second moment of 1e-9. Each group (a name up to its last '/', as
// "param/critic" or "generator.ckpt/adam.m") must have moved from the start
// by at least `movement` tolerances, so a path that skips a network's update
// cannot pass by a hair. Counters (int64 bits in floats) compare exactly.
#ifndef TROUPE_ENGINE_NN_STATE_MATCH_H_
#define TROUPE_ENGINE_NN_STATE_MATCH_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/nn/checkpoint.h"
#include "gtest/gtest.h"

namespace troupe::nn {

struct StateMatch {
  // The largest difference allowed, relative to the tensor's scale.
  double tolerance = 1e-4;
  // How far each group must have moved from the start (relative to its
  // scale); unset: 10 tolerances (a bit-for-bit comparison sets it).
  std::optional<double> moved_at_least;
  // Groups that may stay where they started (the caller says why).
  std::vector<std::string> unmoved;
};

namespace internal {

inline std::string GroupOf(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

// Counters are int64s stored as float bits: compared exactly, never moved.
inline bool IsCounter(const std::string& name) {
  return absl::EndsWith(name, ".steps") || absl::StrContains(name, "counters");
}

inline double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double{x}));
  return m;
}

// max |a - b| over the scale max(max |a|, max |b|); 0 when both are 0.
inline double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  const double scale = std::max(MaxAbs(a), MaxAbs(b));
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return scale == 0 ? 0 : worst / scale;
}

}  // namespace internal

// `got` equals `want` within match.tolerance, tensor by tensor, and every
// group of `want` moved from `start` by at least match.moved_at_least.
// The three states hold the same names and shapes in the same order. The
// message names each tensor that differs (and by how many tolerances) and
// each group that did not move.
inline ::testing::AssertionResult SameState(const std::vector<CheckpointTensor>& start,
                                            const std::vector<CheckpointTensor>& want,
                                            const std::vector<CheckpointTensor>& got, const StateMatch& match) {
  if (want.size() != got.size() || want.size() != start.size()) {
    return ::testing::AssertionFailure() << "states of " << start.size() << ", " << want.size() << " and "
                                         << got.size() << " tensors";
  }
  std::string failures;
  int differing = 0;
  double worst = 0;
  std::map<std::string, double> moved;  // group -> its largest relative movement
  for (size_t i = 0; i < want.size(); ++i) {
    const CheckpointTensor &w = want[i], &g = got[i], &s = start[i];
    if (w.name != g.name || w.name != s.name || w.values.size() != g.values.size() ||
        w.values.size() != s.values.size()) {
      return ::testing::AssertionFailure() << "tensor " << i << " is " << s.name << " (" << s.values.size()
                                           << "), " << w.name << " (" << w.values.size() << ") and " << g.name
                                           << " (" << g.values.size() << ")";
    }
    if (internal::IsCounter(w.name)) {
      // Bytes, not floats: the int64s' bits are denormal floats, which a
      // backend's flush-to-zero mode would compare as equal.
      if (std::memcmp(w.values.data(), g.values.data(), sizeof(float) * w.values.size()) != 0) {
        ++differing;
        absl::StrAppend(&failures, "\n  ", w.name, ": counters differ");
      }
      continue;
    }
    const double difference = internal::RelativeDifference(w.values, g.values);
    worst = std::max(worst, difference);
    if (!(difference <= match.tolerance)) {
      ++differing;
      absl::StrAppend(&failures, "\n  ", w.name, ": ", absl::StrFormat("%.3g", difference), " (",
                      absl::StrFormat("%.3g", difference / match.tolerance), "x the tolerance)");
    }
    double& m = moved[internal::GroupOf(w.name)];
    m = std::max(m, internal::RelativeDifference(s.values, w.values));
  }
  const double least = match.moved_at_least.value_or(10 * match.tolerance);
  std::string least_group;
  double least_moved = std::numeric_limits<double>::infinity();
  for (const auto& [group, movement] : moved) {
    if (std::find(match.unmoved.begin(), match.unmoved.end(), group) != match.unmoved.end()) continue;
    if (movement < least_moved) least_moved = movement, least_group = group;
    if (!(movement >= least)) {
      ++differing;
      absl::StrAppend(&failures, "\n  group ", group, " moved ", absl::StrFormat("%.3g", movement),
                      " from the start: less than ", absl::StrFormat("%.3g", least),
                      " (the comparison would be vacuous)");
    }
  }
  if (differing > 0) {
    return ::testing::AssertionFailure() << differing << " of " << want.size()
                                         << " tensors or groups fail (tolerance "
                                         << absl::StrFormat("%.3g", match.tolerance) << " relative):" << failures;
  }
  return ::testing::AssertionSuccess() << "worst relative difference " << absl::StrFormat("%.3g", worst)
                                       << "; least movement " << absl::StrFormat("%.3g", least_moved) << " ("
                                       << least_group << ")";
}

// EXPECT_TRUE(SameState(...)), and the margins printed when it holds (the
// worst difference and the least movement), so a tolerance can be judged.
#define TROUPE_EXPECT_SAME_STATE(start, want, got, ...)                                 \
  do {                                                                                  \
    const ::testing::AssertionResult same_state_ =                                      \
        ::troupe::nn::SameState((start), (want), (got), ::troupe::nn::StateMatch{__VA_ARGS__}); \
    EXPECT_TRUE(same_state_);                                                           \
    if (same_state_) std::printf("whole state: %s\n", same_state_.message());          \
  } while (false)

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_STATE_MATCH_H_
