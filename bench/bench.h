// Benchmarks: each measures troupe's figure next to a reference measured in
// the same run (the raw MuJoCo loop, raw loopback gRPC, Eigen's GEMM, ...)
// and reports the ratio, because shared machines drift. `troupe bench NAME`
// prints the table; `--json PATH` also writes
//   {"benchmark": NAME, "build": COMMIT, "figures": [{"name", "value", "unit",
//    "reference", "reference_value", "ratio"}]}
// COMMIT is the commit the binary was built at (common/build_info.h).
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
#include "common/cpu_time.h"

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
  int rounds = 0;                    // protocol rounds per side (DefaultProtocol); 0: 5, or 3 with quick
};

// The seconds a figure that needs time to settle (a GPU's, threads taking
// turns on cores) is measured for: at least `floor`, or seconds_per_figure
// as given with --quick (smoke tests and the lease's dry run, whose figures
// are not kept).
double DeviceFigureSeconds(const Options& options, double floor);

struct Benchmark {
  std::string name;
  std::string description;
  std::function<absl::StatusOr<Report>(const Options&)> run;
};

// Every benchmark, in a fixed order (bench/registry.cc).
const std::vector<Benchmark>& Benchmarks();

// Runs `body(iterations)` repeatedly, growing the iteration count until a
// call takes at least `seconds` and runs at least kMinStepsPerRound
// iterations (bench/protocol.h); returns iterations per second of the last
// call. `body` runs `iterations` units of work.
double MeasureRate(double seconds, const std::function<void(long iterations)>& body);

// A timed loop that keeps its state from call to call: `run(n)` does its
// next n units of work (control steps, batches of steps).
using Loop = std::function<absl::Status(long n)>;

enum class Clock {
  kThreadCpu,  // the calling thread's CPU time: single-threaded loops
  kWall,       // wall-clock time: loops that use several cores
};

// One side of the comparison protocol (bench/protocol.h) made of `loop`:
// each round runs the loop's next units, in chunks, until `clock` has
// advanced round.seconds, and returns units per second times `scale` (e.g.
// the envs of a batch). The loop goes on where it left off from round to
// round (the same episodes, continued); a chunk grows (doubling) until one
// takes 1/50 of a round, so reading the clock costs nothing and a round
// overshoots by at most about 4%. The loop's error is returned as is.
Side LoopSide(Loop loop, Clock clock, double scale = 1);

// The calling thread's CPU clock, in seconds (common/cpu_time.h). Rates of
// single-threaded loops (rendering included, with llvmpipe on the calling
// thread) timed on it hold up on a loaded machine, where wall-clock rates
// measure the neighbours as much as the code.
using troupe::ThreadCpuSeconds;

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

// The python of the venv the EnvPool and dm_control peers run in,
// BUILD/python-bench-venv, holding PyPI's envpool 1.2.5, dm_control 1.0.50
// and mujoco 3.17.0 (the pins of bench/python_bench.py) as their authors
// ship them, no library of theirs swapped or patched; made on first use (a
// minute or two, once). Unavailable, saying why, when it cannot be made
// (offline, no python3-venv).
absl::StatusOr<std::string> PythonBenchVenvPython();

// One round of EnvPool for the protocol: bench/peers/envpool_dmc.py run once
// with PythonBenchVenvPython(), stepping EnvPool's dm_control task `task_id`
// (e.g. "CheetahRun-v1") through its Python API with random actions:
// `num_envs` envs on `threads` threads, all stepped per batch, each agent
// step `action_repeat` EnvPool steps of the same actions (with `pixels`,
// then every env rendered at 84x84), for `seconds` after a short warm-up;
// returns agent steps per second (wall clock). Unavailable, saying why, when
// the venv cannot be made (offline); FailedPrecondition, starting "EnvPool
// does not render here", when pixels were asked for and EnvPool steps the
// task but its renderer fails on this machine.
absl::StatusOr<double> RunEnvPoolPeer(const std::string& task_id, int num_envs, int threads, double seconds,
                                      bool pixels = false, int action_repeat = 1);

// The CPUs this process may run on (its affinity mask): the threads XLA's CPU
// client (the PJRT CPU plugin, jax on the CPU) sizes its pools to.
int SchedulableCpus();

// A comparison peer: the program that runs bench/peers/NAME.
enum class Peer {
  // bench/peers/NAME.cc compiled once into the temp dir against Debian's
  // libtorch-dev (CompileLibtorchPeer); NotFound when it is not installed.
  kLibtorch,
  // bench/peers/NAME.py with the virtual environment build/<preset>/peers-venv,
  // which the first call makes and fills with PyTorch 2.x for CPU from PyPI
  // (minutes, once; never a dependency of troupe).
  kPytorch,
  // bench/peers/NAME.py with build/<preset>/jax-peers-venv, made on first use
  // (from $TROUPE_JAX_PYTHON, else the first of python3.13, python3.12,
  // python3 that is 3.12 or newer, as the wheels need) with the jax and
  // jaxlib CPU wheels from PyPI.
  kJax,
  // kJax's program run as troupe's side runs: on the PJRT plugin troupe
  // loads (SetPeersPjrtPlugin) and on the malloc troupe's program runs on
  // (AllocatorLibrary preloaded: tcmalloc where troupe links it). The same
  // compiler, runtime and allocator on both sides: the programs alone.
  kJaxOnTroupesRuntime,
  // bench/peers/NAME.py with the machine's python3 ($TROUPE_PYTHON if set),
  // which must import torch (kGpuPytorch) or jax (kGpuJax) and see a GPU.
  kGpuPytorch,
  kGpuJax,
};

// Runs `command` (a shell command line) and returns the number of the last
// "KEY NUMBER" line it printed; Internal, with its output, when it printed
// none (RunCommand's error when it failed).
absl::StatusOr<double> RunPeerFigure(const std::string& command, const std::string& key);

// One round of a peer for the protocol (bench/protocol.h): the peer run ONCE
// as `PEER THREADS ARGS`; returns the number of its "KEY NUMBER" line. Each
// peer warms up before it times (a fresh process per round, as troupe's side
// warms its step before the rounds). Unavailable or NotFound, saying why,
// when the peer cannot run here (its venv cannot be made offline, no
// libtorch-dev, no GPU); Internal when it ran and printed no figure.
absl::StatusOr<double> RunPeerOnce(Peer peer, const std::string& name, int threads, const std::string& args,
                                   const std::string& key);
// The same as a protocol Side: each round runs the peer once with
// round.threads threads and args(round) (which holds round.seconds).
Side PeerSide(Peer peer, std::string name, std::function<std::string(const Round&)> args, std::string key);

// The protocol as a benchmark runs it by default: options.rounds measured
// rounds per side (5; 3 with --quick) after 1 warm-up round each, of
// `seconds` (default options.seconds_per_figure: a benchmark may ask for
// more), both sides on `threads` threads, unpinned.
ProtocolOptions DefaultProtocol(const Options& options, int threads, double seconds = 0);
// The protocol of GPU rows, where a lease's minutes are few: options.rounds
// measured rounds per side (3; 1 with --quick, the lease's dry run) and no
// warm-up round (each peer round is a process that warms up before it
// times, and troupe's step is warmed before its first round); 1 host thread;
// rounds of `seconds` as DefaultProtocol's.
ProtocolOptions GpuProtocol(const Options& options, double seconds = 0);

// Compares `troupe` with `peer` by the protocol and adds the row (Report::Add
// with the comparison); returns troupe's median. Where the peer cannot run
// (not installed, offline: its error printed), troupe's side runs the same
// rounds alone and the row holds its median and range with the reference
// "REFERENCE (missing)". An error of troupe's side is returned.
absl::StatusOr<double> AddComparison(Report& report, const std::string& name, const std::string& unit,
                                     const std::string& reference, const Side& troupe, const Side& peer,
                                     const ProtocolOptions& options);

// The PyTorch modes a GPU bench runs the peer in at `batch`: eager always,
// torch.compile at batch 256 only (the bars' point; each compile costs tens
// of seconds of a short GPU lease); PytorchPeerModes(those).
std::vector<std::string> GpuPeerModes(int64_t batch);
// `defaults`, unless TROUPE_PYTORCH_MODES names the modes to run instead
// (comma-separated: eager, compile, reduce-overhead; run.sh --fast-peers
// sets it to eager for a GPU lease).
std::vector<std::string> PytorchPeerModes(std::vector<std::string> defaults);
// Names `plugin` (made absolute) to the JAX peers' device pjrt, the PJRT
// plugin troupe's side loads ($TROUPE_PJRT_PLUGIN in this process, which
// the peers inherit); InvalidArgument when it is no file.
absl::Status SetPeersPjrtPlugin(const std::string& plugin);
// True when the benchmarks measure a backend named `backend_name` ("cuda",
// "pjrt:cuda ...", "pjrt:cpu ...") as a GPU: GPU rows, GPU peers. A CPU
// plugin counts as one where TROUPE_BENCH_STAND_IN=1 (a lease's dry run,
// run.sh --dry-run: the lease's code paths on a machine without a GPU).
bool MeasuredAsGpu(const std::string& backend_name);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_BENCH_H_
