// The list of benchmarks `troupe bench` knows. Each lives in its own file.
#include "bench/bench.h"

namespace troupe::bench {

absl::StatusOr<Report> RunEnvsBenchmark(const Options& options);  // bench/envs_bench.cc

const std::vector<Benchmark>& Benchmarks() {
  static const std::vector<Benchmark> benchmarks = {
      {"envs", "env steps/s per task (state, pixels), single thread and pool, vs raw MuJoCo loops", RunEnvsBenchmark},
  };
  return benchmarks;
}

}  // namespace troupe::bench
