// ActorFleet in process: its actors are shell scripts standing in for
// `troupe actor` (the fleet's wrapper runs `sh -c SCRIPT` before the actor's
// command, whose words become the script's arguments), so what the fleet
// does with a process — what it passes, restarting, the stop sequence — is
// seen without a learner or MuJoCo.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/run_layout.h"
#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/launcher.h"

namespace troupe::launch {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

class ActorFleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = FreshTestDir("actor_fleet_");
  }
  // A fleet of `count` actors, each `sh -c script sh ACTOR-COMMAND...`.
  std::unique_ptr<ActorFleet> Start(int count, int max_restarts, const std::string& script,
                                    const std::atomic<bool>* stop = nullptr, int stop_signal = SIGTERM) {
    config::ExperimentConfig config;
    config.mutable_actors()->set_count(count);
    config.mutable_actors()->set_max_restarts(max_restarts);
    ActorWrapper wrapper;
    wrapper.argv = [script](int) { return std::vector<std::string>{"/bin/sh", "-c", script, "sh"}; };
    wrapper.stop_signal = stop_signal;
    absl::StatusOr<std::unique_ptr<ActorFleet>> fleet =
        ActorFleet::Start(config, run_dir_, "learner.example:7001", stop, "secret-token", wrapper);
    EXPECT_TRUE(fleet.ok()) << fleet.status();
    return fleet.ok() ? std::move(*fleet) : nullptr;
  }
  // Actor `index`'s log so far ("" before it exists).
  std::string Log(int index) const { return ReadFile(RunLayout(run_dir_).actor_log(index)).value_or(""); }
  // Waits up to `seconds` for `done`.
  template <typename F>
  static bool Await(F done, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  std::string run_dir_;
};

TEST_F(ActorFleetTest, EachActorGetsItsCommandAndItsLogAndTheTokenOnlyInItsEnvironment) {
  // Prints its arguments and its token, then waits to be stopped.
  auto fleet = Start(3, 0, "echo \"args $*\"; echo \"token $TROUPE_TOKEN\"; exec sleep 30");
  ASSERT_NE(fleet, nullptr);
  EXPECT_EQ(fleet->count(), 3);
  ASSERT_TRUE(Await([&] { return Log(2).find("token") != std::string::npos; }, 10));
  EXPECT_EQ(fleet->alive(), 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Await([&] { return Log(i).find("token") != std::string::npos; }, 10)) << i;
    const std::string log = Log(i);
    EXPECT_THAT(log, HasSubstr(absl::StrCat("actor --learner learner.example:7001 --config ",
                                            RunLayout(run_dir_).config(), " --index ", i)));
    EXPECT_THAT(log, HasSubstr("token secret-token"));
    EXPECT_THAT(log.substr(0, log.find("token ")), Not(HasSubstr("secret-token")));  // not on the command line
  }
  // sleep ends at SIGTERM: no one is killed, and nothing says so.
  ::testing::internal::CaptureStdout();
  fleet->Stop();
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), Not(HasSubstr("killed")));
  EXPECT_EQ(fleet->alive(), 0);
}

TEST_F(ActorFleetTest, AnActorThatDiesIsRestartedUpToMaxRestartsAndThenLeft) {
  // Each start leaves a line in its log and exits 3 at once.
  auto fleet = Start(2, 2, "echo started; exit 3");
  ASSERT_NE(fleet, nullptr);
  // 2 actors x 2 restarts; then none is alive and none restarts again.
  ASSERT_TRUE(Await([&] { return fleet->restarts() == 4 && fleet->alive() == 0; }, 10))
      << fleet->restarts() << " restarts, " << fleet->alive() << " alive";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(fleet->restarts(), 4);
  ASSERT_TRUE(Await([&] { return fleet->given_up() == 2; }, 10)) << "both gave up after their last restart";
  for (int i = 0; i < 2; ++i) {
    const std::string log = Log(i);
    size_t starts = 0;
    for (size_t at = log.find("started"); at != std::string::npos; at = log.find("started", at + 1)) ++starts;
    EXPECT_EQ(starts, 3u) << "actor " << i << ": the first start and 2 restarts, appended to one log";
  }
}

TEST_F(ActorFleetTest, OnceTheRunStopsADeadActorIsNotRestarted) {
  std::atomic<bool> stop{false};
  // Actor 0 waits; actor 1 runs until the file `die` exists.
  const std::string die = run_dir_ + "/die";
  auto fleet = Start(2, 5, absl::StrCat("while [ ! -e ", die, " ]; do sleep 0.05; done; exit 1"), &stop);
  ASSERT_NE(fleet, nullptr);
  ASSERT_TRUE(Await([&] { return fleet->alive() == 2; }, 10));
  stop = true;
  std::ofstream(die) << "now";
  ASSERT_TRUE(Await([&] { return fleet->alive() == 0; }, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(fleet->restarts(), 0);
  EXPECT_EQ(fleet->alive(), 0);
}

TEST_F(ActorFleetTest, StopSendsTheWrappersSignalThenSigtermThenSigkill) {
  // Each actor logs the signals it gets and ignores SIGUSR1 and SIGTERM, so
  // only the last step, SIGKILL, ends it.
  auto fleet = Start(2, 0,
                     "trap 'echo got USR1' USR1; trap 'echo got TERM' TERM; echo ready; "
                     "while true; do sleep 0.05; done",
                     nullptr, SIGUSR1);
  ASSERT_NE(fleet, nullptr);
  ASSERT_TRUE(Await([&] { return Log(0).find("ready") != std::string::npos &&
                                 Log(1).find("ready") != std::string::npos; }, 10));
  const std::vector<pid_t> pids = fleet->pids();
  ASSERT_EQ(pids.size(), 2u);
  const auto start = Clock::now();
  ::testing::internal::CaptureStdout();
  fleet->Stop();
  const std::string said = ::testing::internal::GetCapturedStdout();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double grace = static_cast<double>(ActorFleet::kStopGrace.count());
  EXPECT_EQ(fleet->alive(), 0);
  EXPECT_GE(seconds, grace + 1.5) << "kStopGrace after the wrapper's signal, then 2 s after SIGTERM";
  EXPECT_LT(seconds, grace + 5.0);
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(said, ContainsRegex(absl::StrCat("actor ", i, " still running [0-9]+ s after its stop signal; killed")));
  }
  for (int i = 0; i < 2; ++i) {
    const std::string log = Log(i);
    ASSERT_THAT(log, HasSubstr("got USR1")) << i;
    ASSERT_THAT(log, HasSubstr("got TERM")) << i;
    EXPECT_LT(log.find("got USR1"), log.find("got TERM")) << i;
  }
  for (pid_t pid : pids) EXPECT_NE(kill(pid, 0), 0) << "pid " << pid << " is still there";
}

}  // namespace
}  // namespace troupe::launch
