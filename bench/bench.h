// Benchmarks: each measures troupe's figure next to a reference measured in
// the same run (the raw MuJoCo loop, raw loopback gRPC, Eigen's GEMM, ...)
// and reports the ratio, because shared machines drift. `troupe bench NAME`
// prints the table; `--json PATH` also writes
//   {"benchmark": NAME, "figures": [{"name", "value", "unit", "reference",
//                                    "reference_value", "ratio"}]}
// A figure whose reference could not be measured (a peer not installed) or
// has none prints "missing" for it and no ratio, and its JSON
// reference_value and ratio are null: never a ratio of 0.
// A figure measured by the comparison protocol (bench/protocol.h: rounds
// alternated with the peer's, the same time and threads for both) has value
// and reference_value the two medians, ratio their ratio, and after "ratio"
//   "rounds", "value_min", "value_max", "reference_min", "reference_max"
// (the rounds each side ran and the range of each side's rates); its table
// row prints each median with its [min-max].
#ifndef TROUPE_BENCH_BENCH_H_
#define TROUPE_BENCH_BENCH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/peers.h"  // RunCommand, CompileLibtorchPeer
#include "bench/protocol.h"  // CompareAlternated, Comparison

namespace troupe::bench {

struct Figure {
  std::string name;        // e.g. "cartpole.swingup state env steps/s (1 thread)"
  double value = 0;        // troupe's figure
  std::string unit;        // e.g. "steps/s"
  std::string reference;   // what it is compared with, e.g. "raw mj_step x substeps"
  double reference_value = 0;  // 0: missing (not measured, or no reference)
  double ratio = 0;        // value / reference_value (higher is better for rates); NaN when missing
  // Measured by the protocol (bench/protocol.h): the rounds each side ran,
  // and the range of each side's rates (value and reference_value are then
  // the medians). 0 rounds: one figure each, no ranges.
  int rounds = 0;
  double value_min = 0, value_max = 0, reference_min = 0, reference_max = 0;

  bool has_reference() const;
};

// The figures one benchmark run produced.
struct Report {
  std::string benchmark;
  std::vector<Figure> figures;

  // Adds a figure; ratio = value / reference_value (a reference_value of 0
  // is a missing reference). Prints it as one table row at once so long
  // benchmarks show progress.
  void Add(std::string name, double value, std::string unit, std::string reference, double reference_value);

  // Adds a figure the protocol measured: the medians, their ratio and each
  // side's range, the reference labelled "REFERENCE, " and the protocol
  // (comparison.Describe()).
  void Add(std::string name, std::string unit, const std::string& reference, const Comparison& comparison);

  // The JSON document described at the top of this file.
  std::string ToJson() const;
};

// Options every benchmark understands.
struct Options {
  double seconds_per_figure = 1.0;   // measurement time per timed loop
  std::vector<std::string> filter;   // e.g. task names; empty = all
  bool quick = false;                // smaller sizes, for smoke tests
  std::string device = "cpu";        // cpu, cuda (learner, gan: the step on GPU 0), pjrt (learner, gan)
  std::string pjrt_plugin;           // --device pjrt: the plugin's .so
};

struct Benchmark {
  std::string name;
  std::string description;
  std::function<absl::StatusOr<Report>(const Options&)> run;
};

// Every benchmark, in a fixed order (bench/registry.cc).
const std::vector<Benchmark>& Benchmarks();

// Runs `body(iterations)` repeatedly, growing the iteration count until a
// call takes at least `seconds`; returns iterations per second of the last
// call. `body` runs `iterations` units of work.
double MeasureRate(double seconds, const std::function<void(long iterations)>& body);

// A timed loop that keeps its state from call to call: `run(n)` does its
// next n units of work (control steps, batches of steps).
using Loop = std::function<absl::Status(long n)>;

enum class Clock {
  kThreadCpu,  // the calling thread's CPU time: single-threaded loops
  kWall,       // wall-clock time: loops that use several cores
};

// Alternates `attempts` windows of `n` units of each loop, in turn, each
// timed on `clock`, and returns the best rate (units per second) of each.
// Each loop goes on where it left off, so window k of all covers the same
// units of work (the same steps of the same episodes). A neighbour on a
// shared machine only ever slows a window down, so the best of many short
// windows taken in turn compares the codes rather than the moments they
// ran in.
absl::StatusOr<std::vector<double>> BestOfAlternated(const std::vector<Loop>& loops, long n, int attempts,
                                                     Clock clock);

// The calling thread's CPU clock, in seconds. Rates of single-threaded loops
// (rendering included, with llvmpipe on the calling thread) timed on it hold
// up on a loaded machine, where wall-clock rates measure the neighbours as
// much as the code.
double ThreadCpuSeconds();

// `reps` all-reduces of `floats` floats between 2 MPI processes (mpiexec -np
// 2 of bench/peers/mpi_allreduce.cc): milliseconds each through troupe's MPI
// collectives (ReplicaContext::AllReduce, mean) and through a raw blocking
// MPI_Allreduce of the same buffer. Internal when mpiexec or the peer cannot
// run (a relocated bundle carries neither).
struct MpiAllReduceTimes {
  double troupe_ms = 0;
  double raw_ms = 0;
};
absl::StatusOr<MpiAllReduceTimes> MeasureMpiAllReduce(int64_t floats, int reps);

// A libtorch comparison peer, bench/peers/NAME.cc: compiled once into the
// temp dir against Debian's libtorch-dev (CompileLibtorchPeer), run as `peer THREADS ARGS` with 1
// and 2 threads; returns the better number of the "KEY NUMBER" line it
// prints. NotFound when libtorch-dev is not installed.
absl::StatusOr<double> RunLibtorchPeer(const std::string& name, const std::string& args, const std::string& key);

// A Python comparison peer, bench/peers/NAME.py, run with the virtual
// environment build/<preset>/peers-venv, which the first call makes and
// fills with PyTorch 2.x for CPU from PyPI (minutes, once; never a
// dependency of troupe), as `python NAME.py THREADS ARGS` with 1 and 2
// threads; returns the better number of its "KEY NUMBER" line. Unavailable,
// saying why, when the environment cannot be made (offline, no python3-venv).
absl::StatusOr<double> RunPytorchPeer(const std::string& name, const std::string& args, const std::string& key);

// EnvPool (PyPI envpool 1.2.5 with dm_control 1.0.50 and mujoco 3.17.0, the
// pins of bench/python_bench.py, in its venv BUILD/python-bench-venv, made on
// first use) stepping its dm_control task `task_id` (e.g. "CheetahRun-v1")
// with random actions: `num_envs` envs on `threads` threads, all stepped per
// batch (with `pixels`, each also rendered at 84x84 every step), for
// `seconds`; returns env steps per second (wall clock). Unavailable, saying
// why, when the venv cannot be made (offline).
absl::StatusOr<double> RunEnvPoolPeer(const std::string& task_id, int num_envs, int threads, double seconds,
                                      bool pixels = false);

// A JAX comparison peer, bench/peers/NAME.py, run as RunPytorchPeer runs
// its peers, with the virtual environment build/<preset>/jax-peers-venv,
// which the first call makes (from $TROUPE_JAX_PYTHON, else the first of
// python3.13, python3.12, python3 that is Python 3.12 or newer, as the
// wheels need) and fills with the jax and jaxlib CPU wheels from PyPI
// (a minute or two, once; never a dependency of troupe). Unavailable, saying
// why, when the environment cannot be made (no Python 3.12, offline).
absl::StatusOr<double> RunJaxPeer(const std::string& name, const std::string& args, const std::string& key);

// One round of a Python peer for the protocol (bench/protocol.h): the peer
// bench/peers/NAME.py run ONCE as `python NAME.py THREADS ARGS`, with the
// virtual environment RunPytorchPeer or RunJaxPeer runs it with (made on
// first use as they make it); returns the number of its "KEY NUMBER" line.
// No best-of over thread counts: the caller gives both sides the same.
enum class PythonPeer { kPytorch, kJax };
absl::StatusOr<double> RunPythonPeerOnce(PythonPeer framework, const std::string& name, int threads,
                                         const std::string& args, const std::string& key);

// The CPUs this process may run on (its affinity mask): the threads XLA's CPU
// client (the PJRT CPU plugin, jax on the CPU) sizes its pools to.
int SchedulableCpus();

// The same peer on a GPU machine, run once as `python3 NAME.py 1 ARGS` with
// the machine's python3 ($TROUPE_PYTHON if set), which must import torch
// and see a GPU: Unavailable saying which is missing otherwise.
absl::StatusOr<double> RunGpuPytorchPeer(const std::string& name, const std::string& args, const std::string& key);
// The same for a JAX peer: the machine's python3 must import jax and see a
// GPU through it (its default backend "gpu").
absl::StatusOr<double> RunGpuJaxPeer(const std::string& name, const std::string& args, const std::string& key);
// The PyTorch modes a GPU bench runs the peer in at `batch`: eager always,
// torch.compile at batch 256 only (the bars' point; each compile costs tens
// of seconds of a short GPU lease); PytorchPeerModes(those).
std::vector<std::string> GpuPeerModes(int64_t batch);
// `defaults`, unless TROUPE_PYTORCH_MODES names the modes to run instead
// (comma-separated: eager, compile, reduce-overhead; run.sh --fast-peers
// sets it to eager for a GPU lease).
std::vector<std::string> PytorchPeerModes(std::vector<std::string> defaults);
// True when the benchmarks measure a backend named `backend_name` ("cuda",
// "pjrt:cuda ...", "pjrt:cpu ...") as a GPU: GPU rows, GPU peers. A CPU
// plugin counts as one where TROUPE_BENCH_STAND_IN=1 (a lease's dry run,
// run.sh --dry-run: the lease's code paths on a machine without a GPU).
bool MeasuredAsGpu(const std::string& backend_name);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_BENCH_H_
