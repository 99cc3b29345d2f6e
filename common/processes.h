// Helpers for the tests that run real troupe processes (the end-to-end tests
// in tests/, the sweep test in launch/): start one in its own process group
// with its output in a log, wait for it with a deadline, read its logs and
// the run directory's metrics.csv. Header-only and test-only, like fuzz.h.
#ifndef TROUPE_COMMON_PROCESSES_H_
#define TROUPE_COMMON_PROCESSES_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/run_layout.h"

namespace troupe::e2e {

// Starts `binary ARGS...` in its own process group (so Wait/Stop reach its
// children too) with stdout and stderr in `log` and `env` added to its
// environment; returns its pid.
inline pid_t Start(const std::string& binary, const std::vector<std::string>& args, const std::string& log,
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    FILE* out = std::fopen(log.c_str(), "w");
    dup2(fileno(out), STDOUT_FILENO);
    dup2(fileno(out), STDERR_FILENO);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    std::string name = binary;
    argv.push_back(name.data());
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pid` up to `seconds`; returns its exit status (128 + signal when
// killed), or -1 on timeout, after killing its process group.
inline int Wait(pid_t pid, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// SIGTERM to the process group, SIGKILL if it has not exited within 5 s.
inline void Stop(pid_t pid) {
  kill(-pid, SIGTERM);
  if (Wait(pid, 5) == -1) kill(-pid, SIGKILL);
}

inline std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Polls `log` until `pattern` matches and returns its first group; "" after
// `seconds`.
inline std::string AwaitMatch(const std::string& log, const std::string& pattern, int seconds) {
  const std::regex re(pattern);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string text = Read(log);
    if (std::regex_search(text, m, re)) return m[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// A run directory's metrics.csv (or another of its CSV files) as rows of
// numbers (header dropped), with its columns. A row the run is still writing
// (fewer or more cells than the header, or a cell that is not a number yet)
// is left out.
inline std::vector<std::vector<double>> Metrics(const std::string& run_dir, const char* file = kMetricsCsvFile) {
  std::vector<std::vector<double>> rows;
  std::ifstream in(RunLayout(run_dir).File(file));
  std::string line;
  std::getline(in, line);
  const size_t columns = std::count(line.begin(), line.end(), ',') + 1;
  while (std::getline(in, line)) {
    std::vector<double> row;
    std::stringstream cells(line);
    bool numbers = true;
    for (std::string cell; numbers && std::getline(cells, cell, ',');) {
      char* end = nullptr;
      row.push_back(std::strtod(cell.c_str(), &end));
      numbers = !cell.empty() && *end == '\0';
    }
    if (numbers && row.size() == columns) rows.push_back(row);
  }
  return rows;
}

// metrics.csv's columns of a run whose agent has three metrics of its own
// (kCriticLoss..kQ, between the platform's: the default agent's).
enum MetricsColumn { kSeconds, kFrames, kUpdates, kUpdatesPerS, kFramesPerS, kReplaySize, kSpi, kCriticLoss,
                     kActorLoss, kQ, kEval, kVersion };

// The last row of Metrics(run_dir, file), or a row of zeros when there is
// none yet (no file, a header alone): a test then reads "nothing happened"
// and fails on its own terms, where .back() of an empty table would read
// past it (a SIGSEGV that hides the failure).
inline std::vector<double> LastMetrics(const std::string& run_dir, const char* file = kMetricsCsvFile) {
  std::vector<std::vector<double>> rows = Metrics(run_dir, file);
  return rows.empty() ? std::vector<double>(kVersion + 1, 0.0) : rows.back();
}

}  // namespace troupe::e2e

#endif  // TROUPE_COMMON_PROCESSES_H_
