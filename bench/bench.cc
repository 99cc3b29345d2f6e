#include "bench/bench.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/allocator.h"
#include "common/build_info.h"
#include "common/files.h"
#include "common/shell.h"
#include "common/status_macros.h"

namespace troupe::bench {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string JsonNumber(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "null"; }

}  // namespace

bool Figure::has_reference() const { return reference_value != 0 && std::isfinite(reference_value); }

void Report::Add(std::string name, double value, std::string unit, std::string reference, double reference_value) {
  Figure f{std::move(name), value, std::move(unit), std::move(reference), reference_value, 0.0};
  f.ratio = f.has_reference() ? value / reference_value : std::nan("");
  if (f.has_reference()) {
    std::printf("%-52s %12.4g %-10s | %-34s %12.4g | ratio %.3f\n", f.name.c_str(), f.value, f.unit.c_str(),
                f.reference.c_str(), f.reference_value, f.ratio);
  } else {
    std::printf("%-52s %12.4g %-10s | %-34s %12s | ratio -\n", f.name.c_str(), f.value, f.unit.c_str(),
                f.reference.c_str(), "missing");
  }
  std::fflush(stdout);
  figures.push_back(std::move(f));
}

void Report::Add(std::string name, std::string unit, const std::string& reference, const Comparison& comparison) {
  Figure f{std::move(name), comparison.troupe.median, std::move(unit),
           absl::StrCat(reference, ", ", comparison.Describe()), comparison.peer.median, comparison.ratio};
  f.rounds = comparison.rounds;
  f.value_min = comparison.troupe.min;
  f.value_max = comparison.troupe.max;
  f.reference_min = comparison.peer.min;
  f.reference_max = comparison.peer.max;
  std::printf("%-52s %12.4g %-10s [%.4g-%.4g] | %-34s %12.4g [%.4g-%.4g] | ratio %.3f (of medians)\n", f.name.c_str(),
              f.value, f.unit.c_str(), f.value_min, f.value_max, f.reference.c_str(), f.reference_value,
              f.reference_min, f.reference_max, f.ratio);
  std::fflush(stdout);
  figures.push_back(std::move(f));
}

std::string Report::ToJson() const {
  std::string out = absl::StrCat("{\"benchmark\": ", JsonString(benchmark), ", \"build\": ", JsonString(BuildCommit()),
                                 ", \"allocator\": ", JsonString(Allocator()), ", \"figures\": [");
  for (size_t i = 0; i < figures.size(); ++i) {
    const Figure& f = figures[i];
    absl::StrAppend(&out, i ? ",\n  " : "\n  ", "{\"name\": ", JsonString(f.name), ", \"value\": ", JsonNumber(f.value),
                    ", \"unit\": ", JsonString(f.unit), ", \"reference\": ", JsonString(f.reference),
                    ", \"reference_value\": ", f.has_reference() ? JsonNumber(f.reference_value) : "null",
                    ", \"ratio\": ", JsonNumber(f.ratio));
    if (f.rounds > 0) {
      absl::StrAppend(&out, ", \"rounds\": ", f.rounds, ", \"value_min\": ", JsonNumber(f.value_min),
                      ", \"value_max\": ", JsonNumber(f.value_max), ", \"reference_min\": ", JsonNumber(f.reference_min),
                      ", \"reference_max\": ", JsonNumber(f.reference_max));
    }
    absl::StrAppend(&out, "}");
  }
  return out + "\n]}\n";
}

namespace {

// Seconds on `clock_id` (CLOCK_MONOTONIC or CLOCK_THREAD_CPUTIME_ID).
double Now(clockid_t clock_id) {
  timespec t;
  clock_gettime(clock_id, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

double Measure(clockid_t clock_id, double seconds, const std::function<void(long iterations)>& body) {
  long iterations = kMinStepsPerRound;
  for (;;) {
    const double start = Now(clock_id);
    body(iterations);
    const double elapsed = Now(clock_id) - start;
    if (elapsed >= seconds) return iterations / elapsed;
    // Aim for the target time with some headroom, growing at least 2x.
    const double scale = elapsed > 0 ? 1.2 * seconds / elapsed : 10.0;
    iterations = static_cast<long>(iterations * std::max(2.0, std::min(scale, 100.0)));
  }
}

}  // namespace

double MeasureRate(double seconds, const std::function<void(long iterations)>& body) {
  return Measure(CLOCK_MONOTONIC, seconds, body);
}

Side LoopSide(Loop loop, Clock clock, double scale) {
  const clockid_t clock_id = clock == Clock::kThreadCpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  return [loop = std::move(loop), clock_id, scale, chunk = 1L](const Round& round) mutable -> absl::StatusOr<double> {
    long units = 0;
    const double start = Now(clock_id);
    double elapsed = 0;
    while (elapsed < round.seconds || units < kMinStepsPerRound) {
      const double chunk_start = Now(clock_id);
      RETURN_IF_ERROR(loop(chunk));
      const double now = Now(clock_id);
      units += chunk;
      elapsed = now - start;
      if (now - chunk_start < round.seconds / 50) chunk *= 2;
    }
    return scale * double(units) / elapsed;
  };
}

absl::StatusOr<MpiAllReduceTimes> MeasureMpiAllReduce(int64_t floats, int reps) {
  ASSIGN_OR_RETURN(const std::string out,
                   RunCommand(absl::StrCat(TROUPE_MPIEXEC, " -np 2 --oversubscribe --allow-run-as-root ",
                                           TROUPE_MPI_ALLREDUCE_BIN, " ", floats, " ", reps, " 2>&1")));
  MpiAllReduceTimes times;
  const size_t at = out.find("troupe_ms");
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at, "troupe_ms %lf raw_ms %lf", &times.troupe_ms, &times.raw_ms) != 2) {
    return absl::InternalError(absl::StrCat("mpi all-reduce peer printed: ", out));
  }
  return times;
}

absl::StatusOr<double> RunPeerFigure(const std::string& command, const std::string& key) {
  ASSIGN_OR_RETURN(const std::string out, RunCommand(command));
  const size_t at = out.rfind(key + " ");
  double value = 0;
  if (at == std::string::npos || std::sscanf(out.c_str() + at + key.size(), " %lf", &value) != 1) {
    return absl::InternalError(absl::StrCat("`", command, "` printed no '", key, " NUMBER' line: ", out));
  }
  return value;
}

namespace {

// The PyTorch release the Python peers run: 2.x for CPU, pinned so figures
// compare; with dm_control's suite for the RL peers (torch_ppo.py).
constexpr char kPytorchRequirement[] = "torch==2.5.1 numpy dm_control==1.0.50 mujoco==3.17.0";

// The JAX release the JAX peers run on the CPU, pinned so figures compare:
// 0.11.2, the release of the XLA CPU PJRT plugin troupe's PJRT backend loads
// (lammps-jax-pjrt-cpu==0.11.2, tools/pjrt_cpu_plugin.sh), so `jax.jit` and
// troupe's PJRT rows run the same XLA. Its wheels need Python 3.12 or newer.
constexpr char kJaxRequirement[] = "jax==0.11.2 jaxlib==0.11.2";

// The python of a virtual environment at `venv` holding the pip
// `requirement`, made by `base_python` and filled from PyPI on first use
// (`why` says what for and how long); VENV/`marker` records the requirement,
// so a changed pin installs again. Unavailable, saying why, when it cannot be
// made (no python3-venv, offline).
absl::StatusOr<std::string> PeerVenv(const std::string& venv, const std::string& requirement,
                                     const std::string& marker, const std::string& why,
                                     const std::string& base_python = "python3") {
  const std::string python = venv + "/bin/python";
  std::ifstream marker_in(venv + "/" + marker);
  std::string installed_requirement;
  std::getline(marker_in, installed_requirement);
  if (installed_requirement == requirement) return python;
  std::printf("(installing %s into %s %s)\n", requirement.c_str(), venv.c_str(), why.c_str());
  std::fflush(stdout);
  if (!std::filesystem::exists(python)) {
    if (auto made = RunCommand(absl::StrCat(base_python, " -m venv ", venv, " 2>&1")); !made.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot make the venv ", venv, " (apt-get install python3-venv): ", made.status().message()));
    }
  }
  if (auto installed = RunCommand(
          absl::StrCat(python, " -m pip install --quiet --disable-pip-version-check ", requirement, " 2>&1"));
      !installed.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot install ", requirement, " into ", venv, " (offline?): ",
                                               installed.status().message().substr(0, 400)));
  }
  std::ofstream(venv + "/" + marker) << requirement << "\n";
  return python;
}

// The PyTorch peers' python (their venv, made on first use).
absl::StatusOr<std::string> PytorchPython() {
  return PeerVenv(TROUPE_PEERS_VENV, kPytorchRequirement, ".torch-installed",
                  "for CPU for the PyTorch peer: a few minutes, once");
}

}  // namespace

namespace {

// The Python that makes the JAX peers' venv: $TROUPE_JAX_PYTHON, else the
// first of python3.13, python3.12, python3 that runs and is 3.12 or newer.
absl::StatusOr<std::string> JaxBasePython() {
  const char* env = std::getenv("TROUPE_JAX_PYTHON");
  if (env != nullptr && *env != '\0') return std::string(env);
  for (const char* candidate : {"python3.13", "python3.12", "python3"}) {
    if (RunCommand(absl::StrCat(candidate, " -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>&1")).ok()) {
      return std::string(candidate);
    }
  }
  return absl::UnavailableError(absl::StrCat("the JAX peers' wheels (", kJaxRequirement,
                                             ") need Python 3.12 or newer, and none of python3.13, python3.12, "
                                             "python3 is; set TROUPE_JAX_PYTHON to one"));
}

// The JAX peers' python (their venv, made on first use).
absl::StatusOr<std::string> JaxPython() {
  // The base Python matters only when the venv is made.
  std::string base_python = "python3";
  if (!std::filesystem::exists(std::string(TROUPE_JAX_PEERS_VENV) + "/bin/python")) {
    ASSIGN_OR_RETURN(base_python, JaxBasePython());
  }
  return PeerVenv(TROUPE_JAX_PEERS_VENV, kJaxRequirement, ".jax-installed",
                  "from PyPI for the JAX peer: a minute or two, once", base_python);
}

}  // namespace

int SchedulableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

absl::StatusOr<std::string> PythonBenchVenvPython() {
  return PeerVenv(TROUPE_PYTHON_BENCH_VENV, "envpool==1.2.5 dm_control==1.0.50 mujoco==3.17.0", ".installed",
                  "from PyPI for the EnvPool and dm_control peers: a minute or two, once");
}

namespace {

// bench/peers/envpool_dmc.py run once: its {"steps_per_second": N}.
absl::StatusOr<double> RunEnvPoolOnce(const std::string& python, const std::string& task_id, int num_envs,
                                      int threads, double seconds, bool pixels, int action_repeat) {
  // In the temp dir: where its renderer fails, MuJoCo writes MUJOCO_LOG.TXT into the working directory.
  ASSIGN_OR_RETURN(const std::string out,
                   RunCommand(absl::StrCat("cd ", ShellQuote(std::filesystem::temp_directory_path().string()), " && ",
                                           python, " ", ProjectPath("bench/peers/envpool_dmc.py"), " ", task_id, " ",
                                           num_envs, " ", seconds, " ", threads, pixels ? " pixels " : " state ",
                                           action_repeat, " 2>&1")));
  const std::string key = "\"steps_per_second\":";
  const size_t at = out.rfind(key);
  double value = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(out.substr(at + key.size(), out.find('}', at) - at - key.size())),
                        &value)) {
    return absl::InternalError(absl::StrCat("envpool_dmc.py printed no steps_per_second: ", out.substr(0, 400)));
  }
  return value;
}

}  // namespace

absl::StatusOr<double> RunEnvPoolPeer(const std::string& task_id, int num_envs, int threads, double seconds,
                                      bool pixels, int action_repeat) {
  ASSIGN_OR_RETURN(const std::string python, PythonBenchVenvPython());
  absl::StatusOr<double> rate = RunEnvPoolOnce(python, task_id, num_envs, threads, seconds, pixels, action_repeat);
  if (rate.ok() || !pixels) return rate;
  // Whether it is the renderer that fails: the same envs without it.
  if (!RunEnvPoolOnce(python, task_id, 1, 1, 0.05, /*pixels=*/false, 1).ok()) return rate;
  // RunCommand's message is "`COMMAND` exited with N: OUTPUT", the output's last line MuJoCo's error.
  absl::string_view out = absl::StripAsciiWhitespace(rate.status().message());
  if (const size_t exited = out.find("` exited with "); exited != absl::string_view::npos) {
    if (const size_t colon = out.find(": ", exited); colon != absl::string_view::npos) out.remove_prefix(colon + 2);
  }
  return absl::FailedPreconditionError(absl::StrCat("EnvPool does not render here (it steps ", task_id,
                                                    " without rendering): ", out.substr(out.rfind('\n') + 1)));
}

namespace {

// The machine's python3 ($TROUPE_PYTHON if set), which the GPU peers run with.
std::string MachinePython() {
  const char* env = std::getenv("TROUPE_PYTHON");
  return env != nullptr && *env != '\0' ? env : "python3";
}

// OK when `python` runs `check` (Python that imports a framework, asserts it
// sees a GPU and prints its version); Unavailable saying why otherwise.
absl::Status ProbeGpuPython(const std::string& python, const std::string& framework, const std::string& check) {
  auto probe = RunCommand(absl::StrCat(python, " -c '", check, "' 2>&1"));
  if (probe.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(python, " cannot run the ", framework, " peer on a GPU: ",
                                             probe.status().message().substr(0, 300)));
}

// The machine's python3 once it is known to see a GPU through `framework`
// (probed once per process: importing torch takes seconds, and a bench runs
// its peers many times).
absl::StatusOr<std::string> GpuPython(Peer peer) {
  static const absl::Status torch_usable = ProbeGpuPython(
      MachinePython(), "PyTorch",
      "import torch; assert torch.cuda.is_available(), \"torch sees no GPU\"; print(torch.__version__)");
  static const absl::Status jax_usable = ProbeGpuPython(
      MachinePython(), "JAX",
      "import jax; assert jax.default_backend() == \"gpu\", \"jax sees no GPU\"; print(jax.__version__)");
  RETURN_IF_ERROR(peer == Peer::kGpuPytorch ? torch_usable : jax_usable);
  return MachinePython();
}

}  // namespace

absl::StatusOr<double> RunPeerOnce(Peer peer, const std::string& name, int threads, const std::string& args,
                                   const std::string& key) {
  if (threads < 1) return absl::InvalidArgumentError(absl::StrCat("RunPeerOnce: threads ", threads, " < 1"));
  std::string program;
  switch (peer) {
    case Peer::kLibtorch: {
      ASSIGN_OR_RETURN(program, CompileLibtorchPeer(name));
      break;
    }
    case Peer::kPytorch:
    case Peer::kJax:
    case Peer::kJaxOnTroupesRuntime:
    case Peer::kGpuPytorch:
    case Peer::kGpuJax: {
      std::string python;
      if (peer == Peer::kPytorch) {
        ASSIGN_OR_RETURN(python, PytorchPython());
      } else if (peer == Peer::kJax || peer == Peer::kJaxOnTroupesRuntime) {
        ASSIGN_OR_RETURN(python, JaxPython());
      } else {
        ASSIGN_OR_RETURN(python, GpuPython(peer));
      }
      program = absl::StrCat(python, " ", ProjectPath("bench/peers/" + name + ".py"));
      if (const std::string malloc = AllocatorLibrary(); peer == Peer::kJaxOnTroupesRuntime && !malloc.empty()) {
        program = absl::StrCat("LD_PRELOAD=", ShellQuote(malloc), " ", program);
      }
      break;
    }
  }
  return RunPeerFigure(absl::StrCat(program, " ", threads, " ", args, " 2>&1"), key);
}

Side PeerSide(Peer peer, std::string name, std::function<std::string(const Round&)> args, std::string key) {
  return [=](const Round& round) { return RunPeerOnce(peer, name, round.threads, args(round), key); };
}

ProtocolOptions DefaultProtocol(const Options& options, int threads, double seconds) {
  ProtocolOptions protocol;
  protocol.rounds = options.rounds > 0 ? options.rounds : options.quick ? 3 : 5;
  protocol.warmup_rounds = 1;
  protocol.seconds_per_round = seconds > 0 ? seconds : options.seconds_per_figure;
  protocol.threads.count = threads;
  return protocol;
}

ProtocolOptions GpuProtocol(const Options& options, double seconds) {
  ProtocolOptions protocol;
  protocol.rounds = options.rounds > 0 ? options.rounds : options.quick ? 1 : 3;
  protocol.warmup_rounds = 0;
  protocol.seconds_per_round = seconds > 0 ? seconds : options.seconds_per_figure;
  return protocol;
}

absl::StatusOr<double> AddComparison(Report& report, const std::string& name, const std::string& unit,
                                     const std::string& reference, const Side& troupe, const Side& peer,
                                     const ProtocolOptions& options) {
  // The peer's own error, kept as it happens: which side failed is known,
  // not read back out of the protocol's message.
  absl::Status peer_error;
  const Side watched_peer = [&](const Round& round) -> absl::StatusOr<double> {
    absl::StatusOr<double> rate = peer(round);
    if (!rate.ok()) peer_error = rate.status();
    return rate;
  };
  absl::StatusOr<Comparison> comparison = CompareAlternated(troupe, watched_peer, options);
  if (comparison.ok()) {
    report.Add(name, unit, reference, *comparison);
    return comparison->troupe.median;
  }
  if (peer_error.ok()) return comparison.status();
  std::printf("%s: %s\n", reference.c_str(), comparison.status().ToString().c_str());
  // troupe's side alone, by the same rounds: its median and range, the peer missing.
  std::vector<double> rates;
  for (int warmup : {1, 0}) {
    for (int i = 0; i < (warmup ? options.warmup_rounds : options.rounds); ++i) {
      ASSIGN_OR_RETURN(const double rate,
                       troupe(Round{i, warmup == 1, options.seconds_per_round, options.threads.count}));
      if (!warmup) rates.push_back(rate);
    }
  }
  const SideRates alone = Summarize(std::move(rates));
  report.Add(name, alone.median, unit, absl::StrCat(reference, " (missing)"), 0);
  Figure& f = report.figures.back();
  f.rounds = options.rounds;
  f.value_min = alone.min;
  f.value_max = alone.max;
  return alone.median;
}

double DeviceFigureSeconds(const Options& options, double floor) {
  return options.quick ? options.seconds_per_figure : std::max(options.seconds_per_figure, floor);
}

absl::Status SetPeersPjrtPlugin(const std::string& plugin) {
  std::error_code error;
  if (plugin.empty() || !std::filesystem::is_regular_file(plugin, error)) {
    return absl::InvalidArgumentError(absl::StrCat("the JAX peer on the PJRT plugin: '", plugin, "' is no file"));
  }
  const std::string path = std::filesystem::absolute(plugin, error).string();
  if (setenv("TROUPE_PJRT_PLUGIN", path.c_str(), 1) != 0) {
    return absl::InternalError(absl::StrCat("setenv TROUPE_PJRT_PLUGIN: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<std::string> PytorchPeerModes(std::vector<std::string> defaults) {
  const char* env = std::getenv("TROUPE_PYTORCH_MODES");
  if (env == nullptr || *env == '\0') return defaults;
  return absl::StrSplit(env, ',', absl::SkipWhitespace());
}

std::vector<std::string> GpuPeerModes(int64_t batch) {
  return PytorchPeerModes(batch == 256 ? std::vector<std::string>{"eager", "compile"} : std::vector<std::string>{"eager"});
}

bool MeasuredAsGpu(const std::string& backend_name) {
  const bool cpu = !absl::StartsWith(backend_name, "cuda") && !absl::StartsWith(backend_name, "pjrt:");
  if (cpu) return false;
  if (!absl::StartsWith(backend_name, "pjrt:cpu")) return true;
  const char* stand_in = std::getenv("TROUPE_BENCH_STAND_IN");
  return stand_in != nullptr && std::string(stand_in) == "1";
}

}  // namespace troupe::bench
