// `troupe bench python`: troupe's env pools stepped from Python (the
// `troupe` module, docs/python.md) against the same pools stepped from C++,
// against EnvPool and against dm_control's own suite, every row a
// comparison by the protocol of bench/protocol.h (warm-up rounds discarded,
// then rounds alternated troupe, reference, troupe, ..., each side given the
// same seconds a round and the same threads; medians with their min-max,
// the ratio of the medians). Each round of each side is one process run for
// the round's seconds after its own warm-up, on the round's threads:
//   * troupe from Python: bench/python_bench.py --side python (a loop of
//     pool.step(actions)), with the Python the troupe module is built for;
//   * the same pool from C++: bench/python_bench.py --side cpp (the same
//     envs::EnvPool stepped from C++, bench_cpp_pool), both on all cores;
//   * EnvPool: bench/peers/envpool_dmc.py (PyPI envpool 1.2.5 as its wheel
//     ships it), the same number of envs on as many threads; for pixels
//     "does not render here" where its renderer fails on this machine;
//   * dm_control's suite: bench/peers/dm_control_suite.py (PyPI dm_control
//     1.0.50), its envs stepped one after another in one Python thread as
//     its users do, pixels rendered as troupe renders them (84x84, camera 0,
//     no MSAA, no shadows, no reflections, llvmpipe on the calling thread),
//     against troupe's pool of as many envs on 1 thread.
// The peers run in BUILD/python-bench-venv (made on first use from PyPI);
// without PyPI, and in --quick runs, their rows say they are missing.
// Bars (issue 24): Python >= 0.9x C++ for pixels, >= 0.7x for state.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/bench.h"
#include "common/files.h"
#include "common/shell.h"
#include "common/status_macros.h"

namespace troupe::bench {
namespace {

struct Case {
  const char* name;  // the row's name: "walker.walk pixels (repeat 2, stack 3)"
  const char* task;  // troupe's
  bool pixels;
  int action_repeat;
  int frame_stack;
  const char* envpool_id;  // EnvPool's id of the task
  const char* dm_domain;   // dm_control's suite.load(domain, task)
  const char* dm_task;
};

constexpr Case kCases[] = {
    {"cartpole.swingup state", "cartpole.swingup", false, 1, 1, "CartpoleSwingup-v1", "cartpole", "swingup"},
    {"cheetah.run state", "cheetah.run", false, 1, 1, "CheetahRun-v1", "cheetah", "run"},
    {"walker.walk pixels (repeat 2, stack 3)", "walker.walk", true, 2, 3, "WalkerWalk-v1", "walker", "walk"},
};

constexpr int kNumEnvs = 64;         // the pools compared with C++ and EnvPool
constexpr int kDmControlEnvs = 8;    // envs stepped one after another (dm_control's suite and troupe on 1 thread)

// The Python the troupe module is built for ($TROUPE_PYTHON if set), finding
// the module in this build tree.
std::string TroupePython() {
  const char* env = std::getenv("TROUPE_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : TROUPE_BENCH_MODULE_PYTHON;
  return absl::StrCat("PYTHONPATH=", ShellQuote(TROUPE_BENCH_MODULE_DIR), " ", python);
}

// One round of a troupe side: python_bench.py --side `side` run once.
Side TroupeSide(const std::string& side, const Case& c, int num_envs) {
  return [=](const Round& round) {
    return RunPeerFigure(absl::StrCat(TroupePython(), " ", ShellQuote(ProjectPath("bench/python_bench.py")), " --side ",
                                 side, " --task ", c.task, " --observation ", c.pixels ? "pixels" : "state",
                                 " --action-repeat ", c.action_repeat, " --frame-stack ", c.frame_stack,
                                 " --num-envs ", num_envs, " --threads ", round.threads, " --seconds ", round.seconds,
                                 " 2>&1"),
                    "steps_per_second");
  };
}

}  // namespace

absl::StatusOr<Report> RunPythonBenchmark(const Options& options) {
  // troupe's Python module must be built (it is not part of troupe_cli).
  if (auto imported = RunCommand(absl::StrCat(TroupePython(), " -c 'import troupe._native' 2>&1")); !imported.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("troupe bench python steps troupe's pools from Python, and the troupe module does not import "
                     "from ", TROUPE_BENCH_MODULE_DIR, " (build it: ninja troupe_python): ", imported.status().message()));
  }
  Report report;
  const int threads = SchedulableCpus();
  auto protocol = [&options](int count) {
    ProtocolOptions p = DefaultProtocol(options, count);
    if (options.quick) p.seconds_per_round = std::min(p.seconds_per_round, 0.3);
    return p;
  };
  const int num_envs = options.quick ? 16 : kNumEnvs;
  // Why the PyPI peers are missing (empty: they run), and whether EnvPool
  // renders here (probed once, at the first pixel case).
  std::string peers_missing = options.quick ? "not in --quick runs" : "";
  std::optional<std::string> envpool_pixels_missing;
  for (const Case& c : kCases) {
    if (!options.filter.empty() && std::none_of(options.filter.begin(), options.filter.end(), [&](const std::string& f) {
          return f == c.task || absl::StrContains(c.name, f);
        })) {
      continue;
    }
    const Side python = TroupeSide("python", c, num_envs);
    const std::string name = absl::StrCat(c.name, " from Python, ", threads, threads == 1 ? " thread, " : " threads, ",
                                          num_envs, " envs");

    // Python against C++: the same pool, the same threads.
    ASSIGN_OR_RETURN(Comparison cpp, CompareAlternated(python, TroupeSide("cpp", c, num_envs), protocol(threads)));
    report.Add(name, "steps/s", "the same envs::EnvPool stepped from C++ (bench_cpp_pool)", cpp);
    const double bar = c.pixels ? 0.9 : 0.7;
    if (cpp.ratio < bar) std::printf("  below the bar: Python / C++ %.2f < %.1f\n", cpp.ratio, bar);

    // Against EnvPool: as many envs on as many threads, each agent step
    // action_repeat EnvPool steps; for pixels rendering every env once.
    if (c.pixels && peers_missing.empty() && !envpool_pixels_missing.has_value()) {
      absl::StatusOr<double> probe = RunEnvPoolPeer(c.envpool_id, 1, 1, 0.1, /*pixels=*/true);
      envpool_pixels_missing =
          probe.status().code() == absl::StatusCode::kFailedPrecondition ? std::string(probe.status().message()) : "";
      if (!envpool_pixels_missing->empty()) std::printf("(%s)\n", envpool_pixels_missing->c_str());
    }
    const bool renders = !c.pixels || !envpool_pixels_missing.has_value() || envpool_pixels_missing->empty();
    const Side envpool = [&](const Round& round) -> absl::StatusOr<double> {
      if (!peers_missing.empty()) return absl::UnavailableError(peers_missing);
      if (!renders) return absl::FailedPreconditionError(*envpool_pixels_missing);
      absl::StatusOr<double> rate =
          RunEnvPoolPeer(c.envpool_id, num_envs, round.threads, round.seconds, c.pixels, c.action_repeat);
      if (rate.status().code() == absl::StatusCode::kUnavailable) peers_missing = std::string(rate.status().message());
      return rate;
    };
    const std::string envpool_reference =
        !renders ? "EnvPool: does not render here (PyPI envpool 1.2.5 as shipped)"
                 : absl::StrCat("EnvPool 1.2.5 (PyPI, as shipped) from Python, its dm_control task (MuJoCo 3.17)",
                                c.pixels ? ", rendering each env at 84x84 once an agent step (frames not stacked)" : "",
                                ", the same envs on as many threads");
    RETURN_IF_ERROR(
        AddComparison(report, name + ", against EnvPool", "steps/s", envpool_reference, python, envpool, protocol(threads))
            .status());

    // Against dm_control's suite: its envs stepped one after another in one
    // Python thread, against troupe's pool of as many envs on 1 thread.
    const Side dm_control = [&](const Round& round) -> absl::StatusOr<double> {
      if (!peers_missing.empty()) return absl::UnavailableError(peers_missing);
      absl::StatusOr<std::string> venv_python = PythonBenchVenvPython();
      if (!venv_python.ok()) {
        peers_missing = std::string(venv_python.status().message());
        return venv_python.status();
      }
      return RunPeerFigure(absl::StrCat(*venv_python, " ", ShellQuote(ProjectPath("bench/peers/dm_control_suite.py")), " ",
                                   c.dm_domain, " ", c.dm_task, " ", c.pixels ? "pixels" : "state", " ",
                                   c.action_repeat, " ", kDmControlEnvs, " ", round.seconds, " 2>&1"),
                      "steps_per_second");
    };
    RETURN_IF_ERROR(
        AddComparison(report,
                      absl::StrCat(c.name, " from Python, 1 thread, ", kDmControlEnvs, " envs, against dm_control"),
                      "steps/s",
                      absl::StrCat("dm_control 1.0.50's suite (MuJoCo 3.17, its own MJCF), its envs stepped one after "
                                   "another in one Python thread",
                                   c.pixels ? ", physics.render 84x84 from camera 0 with MSAA, shadows and "
                                              "reflections off, llvmpipe on the calling thread, as troupe renders (frames not stacked)"
                                            : ""),
                      TroupeSide("python", c, kDmControlEnvs), dm_control, protocol(1))
            .status());
  }
  return report;
}

}  // namespace troupe::bench
