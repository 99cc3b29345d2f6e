#include "launch/sweep_local.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "launch/sweep_summary.h"

namespace troupe::launch {

absl::Status RunSweep(const SweepPlan& plan, int parallel, const std::vector<std::string>& runner,
                      const std::atomic<bool>* stop, const std::function<void(const std::string&)>& log) {
  ASSIGN_OR_RETURN(const std::vector<const SweepRun*> pending, PrepareSweep(plan, log));
  // Children, `parallel` at a time.
  std::map<pid_t, const SweepRun*> running;
  std::vector<std::string> failed;
  size_t next = 0;
  bool stopping = false;
  // Once stopping, the runs not started stay for the next sweep: the loop
  // ends when the running ones have stopped.
  while ((!stopping && next < pending.size()) || !running.empty()) {
    if (!stopping && stop != nullptr && stop->load()) {
      stopping = true;
      for (const auto& [pid, run] : running) kill(pid, SIGTERM);
      log(absl::StrCat("stopping: ", running.size(), " runs checkpoint and stop"));
    }
    while (!stopping && next < pending.size() && static_cast<int>(running.size()) < parallel) {
      const SweepRun* run = pending[next++];
      const bool resume = SweepRunHasCheckpoint(run->run_dir, plan.mode);
      const std::string log_path = run->run_dir + "/log.txt";
      const pid_t parent = getpid();
      const pid_t pid = fork();
      if (pid < 0) return absl::InternalError(absl::StrCat("fork failed starting ", run->name));
      if (pid == 0) {
        // The child: dies with the sweep; output to the run's log; exec.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
          dup2(fd, STDOUT_FILENO);
          dup2(fd, STDERR_FILENO);
        }
        std::vector<std::string> args = runner;
        args.push_back(run->run_dir);
        std::vector<char*> argv;
        for (std::string& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        std::perror("execv");
        _exit(127);
      }
      running[pid] = run;
      log(absl::StrCat(resume ? "resume " : "start ", run->name, " (pid ", pid, ")"));
    }
    // Reap whatever ended.
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    auto it = running.find(pid);
    if (it == running.end()) continue;
    const SweepRun* run = it->second;
    running.erase(it);
    if (SweepRunDone(run->run_dir)) {
      log(absl::StrCat("done ", run->name));
    } else if (stopping) {
      log(absl::StrCat("stopped ", run->name, " (resumed by the next sweep)"));
    } else {
      const std::string how = WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                                : absl::StrCat("signal ", WTERMSIG(status));
      failed.push_back(run->name);
      log(absl::StrCat("FAILED ", run->name, " (", how, "): see ", run->run_dir, "/log.txt"));
    }
    if (absl::Status s = WriteSweepSummary(plan); !s.ok()) log(std::string(s.message()));
  }
  RETURN_IF_ERROR(WriteSweepSummary(plan));
  if (stopping) return absl::CancelledError("stopped; rerun the same sweep to resume it");
  if (!failed.empty()) {
    return absl::InternalError(absl::StrCat(failed.size(), " runs failed (", absl::StrJoin(failed, ", "),
                                            "); rerun the sweep to retry them"));
  }
  return absl::OkStatus();
}

}  // namespace troupe::launch
