// The list of benchmarks `troupe bench` knows. Each lives in its own file.
#include "bench/bench.h"

namespace troupe::bench {

absl::StatusOr<Report> RunEnvsBenchmark(const Options& options);    // bench/envs_bench.cc
absl::StatusOr<Report> RunReplayBenchmark(const Options& options);  // bench/replay_bench.cc
absl::StatusOr<Report> RunLearnerBenchmark(const Options& options);  // bench/learner_bench.cc
absl::StatusOr<Report> RunGanBenchmark(const Options& options);  // bench/gan_bench.cc
absl::StatusOr<Report> RunRlBenchmark(const Options& options);   // bench/rl_bench.cc
absl::StatusOr<Report> RunFleetBenchmark(const Options& options);  // bench/fleet_bench.cc
absl::StatusOr<Report> RunScalingBenchmark(const Options& options);  // bench/scaling_bench.cc
absl::StatusOr<Report> RunLearnerInputBenchmark(const Options& options);  // bench/learner_input_bench.cc
absl::StatusOr<Report> RunPythonBenchmark(const Options& options);  // bench/python_bench.cc
absl::StatusOr<Report> RunStragglerBenchmark(const Options& options);  // bench/straggler_bench.cc
absl::StatusOr<Report> RunAppoBenchmark(const Options& options);  // bench/rl_bench.cc

const std::vector<Benchmark>& Benchmarks() {
  static const std::vector<Benchmark> benchmarks = {
      {"envs", "env steps/s per task (state, pixels), single thread and pool, vs raw MuJoCo loops, the machine's "
               "ceiling and EnvPool", RunEnvsBenchmark},
      {"replay", "replay insert/sample items/s and MB/s, in-process and gRPC, vs raw loopback gRPC; bytes per pixel transition",
       RunReplayBenchmark},
      {"learner", "DrQ encoder+MLP fwd+bwd+Adam samples/s vs libtorch, PyTorch 2.x and JAX; engine GFLOP/s vs Eigen "
                  "GEMM; K=2 MPI all-reduce",
       RunLearnerBenchmark},
      {"gan", "classifier-FID vs the libtorch reference GAN at equal images (--only reference_images=N); at equal "
              "images seen for batch 64/256/1024 (K=1, 2) vs the real-vs-real floor; G+D step images/s vs libtorch",
       RunGanBenchmark},
      {"rl", "end to end from pixels (cartpole.swingup 84x84): env frames/s and learner updates/s with 2 actor processes "
             "+ learner, vs each alone; CPU share of actors and learner",
       RunRlBenchmark},
      {"fleet", "many actors, one learner: N simulated actor connections (insert stream + Parameters subscription) "
                "against the learner's services on loopback; inserts kept up, memory per connection, parameter "
                "fan-out, nothing lost, threads and fds back where they were (--only N... picks the sizes)",
       RunFleetBenchmark},
      {"scaling", "projection (a model, not a measurement) of D4PG and GAN data-parallel efficiency for K = 1..256 on "
                  "NVLink / InfiniBand, from the measured K=1 step and gradient size; the ring all-reduce model "
                  "checked against K=2 MPI on this machine",
       RunScalingBenchmark},
      {"learner-input", "D4PG pixel learner input (batch 256, 84x84 stacked 3): bytes uploaded per update and input "
                        "transitions/s with the device frame table vs the host-assembled batch, one thread",
       RunLearnerInputBenchmark},
      {"python", "env pools stepped from Python (the troupe module) vs the same pools from C++, EnvPool and "
                 "dm_control's suite, a process a round (needs BUILD/python: ninja troupe_python)",
       RunPythonBenchmark},
      {"straggler", "K=4 in-process replicas with one slowed 2x: steps/s waiting for it and with a step deadline "
                    "(engine.straggler DEADLINE), each against no replica slowed",
       RunStragglerBenchmark},
      {"appo", "APPO end to end from state (cartpole.balance, 2 actor processes + learner): env frames/s vs a "
               "PyTorch PPO peer (CleanRL-style, dm_control's suite) with the same recipe",
       RunAppoBenchmark},
  };
  return benchmarks;
}

}  // namespace troupe::bench
