// Actors through a bad network: the learner in this machine's network
// namespace, two actors in another one the test makes, joined by one link,
// TLS and a token on. The link loses 10% of packets and delays each by
// 200 ms each way; then a partition (100% loss) of 30 s; then the lossy
// link again. The pixel run keeps training, the evaluator keeps
// evaluating, every actor resumes its insert stream after the partition,
// and replay took exactly the transitions the actors say they wrote:
// nothing lost, nothing inserted twice (so no episode is cut short).
//
// The link is a veth pair with `tc netem` on both ends where the kernel has
// the netem qdisc, else two TUN devices with this test's own forwarder
// doing what netem would (tests/tun_link.h). Needs root and iproute2;
// skipped, saying what is missing, without them.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/build_tree.h"
#include "absl/strings/str_cat.h"
#include "common/processes.h"
#include "common/run_layout.h"
#include "common/test_dir.h"
#include "tests/tun_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using namespace troupe::e2e;  // Start, Wait, Read, AwaitMatch, Metrics and its columns
using ::testing::HasSubstr;

struct Shell {
  int code = -1;
  std::string output;
};

// Runs `command` through sh, stdout and stderr together.
Shell Sh(const std::string& command) {
  Shell result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The link's settings: lossy, and a partition.
struct LinkSettings {
  double loss;
  std::chrono::milliseconds delay;
};
constexpr LinkSettings kLossyLink{0.10, std::chrono::milliseconds(200)};
constexpr LinkSettings kPartition{1.0, std::chrono::milliseconds(200)};

class NetworkEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("network_e2e_");
    const int id = static_cast<int>(getpid() % 100000);
    namespace_ = absl::StrCat("troupe-net-", id);
    outside_ = absl::StrCat("trpl", id);
    inside_ = absl::StrCat("trpa", id);
    const int subnet = static_cast<int>(getpid() % 250) + 1;
    learner_host_ = absl::StrCat("10.213.", subnet, ".1");
    actor_host_ = absl::StrCat("10.213.", subnet, ".2");
  }

  void TearDown() override {
    tun_link_.reset();  // its devices go with their fds
    if (made_namespace_) {
      (void)Sh("ip netns del " + namespace_);  // its end of a veth pair goes with it, and so the other
      (void)Sh("ip link del " + outside_);
    }
  }

  // Makes the namespace and the link (lossy) with addresses; an empty
  // string, or why this machine cannot (for GTEST_SKIP).
  std::string MakeNetwork() {
    if (geteuid() != 0) return "making a network namespace needs root (ip netns add)";
    if (Sh("ip -V").code != 0 || Sh("tc -V").code != 0) {
      return "iproute2's ip and tc are missing (tools/install_deps.sh test installs them)";
    }
    if (Shell made = Sh("ip netns add " + namespace_); made.code != 0) {
      return "this machine cannot make a network namespace: " + made.output;
    }
    made_namespace_ = true;
    const std::string in = "ip netns exec " + namespace_ + " ";
    if (Shell lo = Sh(in + "ip link set lo up"); lo.code != 0) return "cannot set up the namespace: " + lo.output;
    // A veth pair with netem on both ends, where the kernel has netem.
    std::string no_netem;
    for (const std::string& command :
         {"ip link add " + outside_ + " type veth peer name " + inside_, "ip link set " + inside_ + " netns " + namespace_,
          "ip addr add " + learner_host_ + "/24 dev " + outside_, "ip link set " + outside_ + " up",
          in + "ip addr add " + actor_host_ + "/24 dev " + inside_, in + "ip link set " + inside_ + " up",
          "tc qdisc add dev " + outside_ + " root " + Netem(kLossyLink),
          in + "tc qdisc add dev " + inside_ + " root " + Netem(kLossyLink)}) {
      if (Shell step = Sh(command); step.code != 0) {
        no_netem = command + ": " + step.output;
        break;
      }
    }
    if (no_netem.empty()) {
      std::printf("link: a veth pair with tc netem on both ends\n");
      return "";
    }
    // Else TUN devices and this test's forwarder.
    (void)Sh("ip link del " + outside_);
    (void)Sh(in + "ip link del " + inside_);
    std::string error;
    const int outside = TunLink::OpenDevice(outside_, &error);
    if (outside < 0) return "no netem (" + no_netem + ") and " + error;
    const int inside = TunLink::OpenDevice(inside_, &error);
    if (inside < 0) {
      close(outside);
      return "no netem (" + no_netem + ") and " + error;
    }
    tun_link_ = std::make_unique<TunLink>(outside, inside);
    for (const std::string& command :
         {"ip link set " + inside_ + " netns " + namespace_,
          "ip addr add " + learner_host_ + "/32 peer " + actor_host_ + "/32 dev " + outside_,
          "ip link set " + outside_ + " up",
          in + "ip addr add " + actor_host_ + "/32 peer " + learner_host_ + "/32 dev " + inside_,
          in + "ip link set " + inside_ + " up"}) {
      if (Shell step = Sh(command); step.code != 0) return "cannot set up TUN devices: " + command + ": " + step.output;
    }
    tun_link_->Set(kLossyLink.loss, kLossyLink.delay);
    std::printf("link: TUN devices and the test's forwarder (this kernel has no netem qdisc: %s)\n",
                no_netem.c_str());
    return "";
  }

  static std::string Netem(const LinkSettings& settings) {
    return absl::StrCat("netem delay ", settings.delay.count(), "ms loss ", settings.loss * 100, "%");
  }

  // Both ends of the link.
  void SetLink(const LinkSettings& settings) {
    if (tun_link_) {
      tun_link_->Set(settings.loss, settings.delay);
      return;
    }
    ASSERT_EQ(Sh("tc qdisc change dev " + outside_ + " root " + Netem(settings)).code, 0);
    ASSERT_EQ(Sh("ip netns exec " + namespace_ + " tc qdisc change dev " + inside_ + " root " + Netem(settings)).code,
              0);
  }

  // Packets the link has dropped so far, both ends together: the netem
  // qdiscs' drop counters (`tc -s qdisc show`), or the forwarder's count;
  // -1 with `why` set where they cannot be read (no netem qdisc on an end).
  int64_t PacketsDropped(std::string* why) {
    if (tun_link_) return tun_link_->packets_dropped();
    int64_t dropped = 0;
    for (const std::string& command : {"tc -s qdisc show dev " + outside_,
                                       "ip netns exec " + namespace_ + " tc -s qdisc show dev " + inside_}) {
      const Shell shown = Sh(command);
      static const std::regex kNetemDropped(R"(qdisc netem [^\n]*\n\s*Sent \d+ bytes \d+ pkt \(dropped (\d+))");
      std::smatch m;
      if (shown.code != 0 || !std::regex_search(shown.output, m, kNetemDropped)) {
        *why = command + ": no netem qdisc with its counters: " + shown.output;
        return -1;
      }
      dropped += std::stoll(m[1]);
    }
    return dropped;
  }

  std::string dir_, namespace_, outside_, inside_, learner_host_, actor_host_;
  bool made_namespace_ = false;
  std::unique_ptr<TunLink> tun_link_;
};

// What an actor logs when its insert stream is back, and how often `text` says it.
constexpr char kResumed[] = "replay insert stream resumed after";
int Count(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// The run's latest updates (metrics.csv's last row), 0 before the first row.
int64_t Updates(const std::string& run) {
  const auto rows = Metrics(run);
  return rows.empty() ? 0 : int64_t(rows.back()[kUpdates]);
}

// Polls until the run has at least `updates` updates; false after `seconds`.
bool AwaitUpdates(const std::string& run, int64_t updates, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Updates(run) >= updates) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return false;
}

TEST_F(NetworkEndToEndTest, APixelRunTrainsThroughLossDelayAndAPartitionAndReplayAccountsForEveryTransition) {
  if (const std::string why = MakeNetwork(); !why.empty()) GTEST_SKIP() << why;
  // Certificates naming the learner's address on the link.
  ASSERT_EQ(Wait(Start(TROUPE_BINARY, {"certs", dir_ + "/certs", "--hosts", learner_host_}, dir_ + "/certs.log"), 30),
            0)
      << Read(dir_ + "/certs.log");
  const std::string config = dir_ + "/pixels.textproto";
  std::ofstream(config) << R"(name: "network" mode: RL
env { task: "cartpole.swingup" observation: PIXELS render { width: 32 height: 32 } action_repeat: 8 frame_stack: 2 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [32, 32] v_max: 800 conv_channels: 8 encoder_features: 16 augment_pad: 2 }
learner { batch_size: 16 publish_every: 20 min_replay_size: 100 samples_per_insert: 4 checkpoint_every_s: 3600 }
actors { count: 2 random_frames: 400 }
evaluator { every_frames: 1000 episodes: 1 }
total_frames: 100000000
)";
  const std::string run = dir_ + "/run";
  const pid_t learner = Start(TROUPE_BINARY, {"learner", "--config", config, "--run-dir", run, "--certs",
                                              dir_ + "/certs", "--listen", learner_host_ + ":0"},
                              dir_ + "/learner.log");
  const std::string address = AwaitMatch(
      dir_ + "/learner.log", "serving replay and parameters on ([0-9.]+:[0-9]+) \\(TLS \\+ token\\)", 60);
  ASSERT_FALSE(address.empty()) << Read(dir_ + "/learner.log");
  EXPECT_EQ(address.substr(0, address.rfind(':')), learner_host_);
  // Two actors on the far side of the link.
  const std::string ip = Sh("command -v ip").output.substr(0, Sh("command -v ip").output.find('\n'));
  std::vector<pid_t> actors;
  for (int i = 0; i < 2; ++i) {
    actors.push_back(Start(ip, {"netns", "exec", namespace_, TROUPE_BINARY, "actor", "--learner", address, "--config",
                                config, "--index", std::to_string(i), "--certs", dir_ + "/certs"},
                           absl::StrCat(dir_, "/actor", i, ".log")));
  }
  auto logs = [&] {
    return absl::StrCat("--- learner\n", Read(dir_ + "/learner.log"), "--- actor 0\n", Read(dir_ + "/actor0.log"),
                        "--- actor 1\n", Read(dir_ + "/actor1.log"));
  };
  auto stop_all = [&] {
    for (pid_t actor : actors) Stop(actor);
    Stop(learner);
  };

  // 1. Training through 10% loss and 200 ms delay each way, for 20 s at least.
  const auto lossy_since = std::chrono::steady_clock::now();
  if (!AwaitUpdates(run, 30, /*seconds=*/120)) {
    stop_all();
    FAIL() << "no training through the lossy link\n" << logs();
  }
  std::this_thread::sleep_until(lossy_since + std::chrono::seconds(20));
  // The link did lose packets (10% of the traffic so far): a link that
  // dropped none (netem not applied) would make this test prove nothing.
  std::string why_no_count;
  const int64_t dropped_lossy = PacketsDropped(&why_no_count);
  EXPECT_GT(dropped_lossy, 0) << "the lossy link dropped no packet " << why_no_count;
  // 2. A partition of 30 s. (A stream may also have broken and resumed on
  // the lossy link: resumptions are counted from here.)
  std::vector<int> resumed_before(2);
  for (int i = 0; i < 2; ++i) resumed_before[i] = Count(Read(absl::StrCat(dir_, "/actor", i, ".log")), kResumed);
  SetLink(kPartition);
  const int64_t before_partition = Updates(run);
  std::this_thread::sleep_for(std::chrono::seconds(30));
  // The partition dropped what was sent across it (retransmissions,
  // reconnection attempts).
  const int64_t dropped_partition = PacketsDropped(&why_no_count);
  EXPECT_GT(dropped_partition, dropped_lossy) << "the partition dropped no packet " << why_no_count;
  std::printf("link: %ld packets dropped through the lossy phase, %ld more in the partition\n", long(dropped_lossy),
              long(dropped_partition - dropped_lossy));
  // 3. The lossy link again: both actors resume their insert streams, and
  // training goes on past where it was.
  SetLink(kLossyLink);
  const int64_t at_heal = Updates(run);
  const auto healed = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    const std::string log = absl::StrCat(dir_, "/actor", i, ".log");
    bool resumed = false;
    for (int wait = 0; wait < 480 && !resumed; ++wait) {
      resumed = Count(Read(log), kResumed) > resumed_before[i];
      if (!resumed) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    EXPECT_TRUE(resumed) << "actor " << i << " did not resume its stream after the partition\n" << logs();
  }
  const bool trained_on = AwaitUpdates(run, at_heal + 30, /*seconds=*/120);
  // The evaluator goes on too: an evaluation of a policy trained after the partition.
  bool evaluated_on = false;
  for (int i = 0; i < 480 && !evaluated_on; ++i) {
    const auto evaluations = Metrics(run, kEvalCsvFile);  // frames, updates, return, ...
    evaluated_on = !evaluations.empty() && evaluations.back()[1] > double(at_heal);
    if (!evaluated_on) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const double resumed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - healed).count();
  // 4. The actors stop first (their last transitions delivered and
  // acknowledged), then the learner, which says what replay took.
  for (pid_t actor : actors) kill(-actor, SIGTERM);
  std::vector<int> actor_exits;
  for (pid_t actor : actors) actor_exits.push_back(Wait(actor, 90));
  kill(-learner, SIGTERM);
  const int learner_exit = Wait(learner, 90);
  const std::string all = logs();
  std::printf("training before the partition: %ld updates, at its end %ld, %.1f s after it %ld\n",
              long(before_partition), long(at_heal), resumed_after, long(Updates(run)));
  EXPECT_TRUE(trained_on) << "training did not go on after the partition\n" << all;
  EXPECT_EQ(learner_exit, 0) << all;
  // Each actor saw replay go away and came back, and lost nothing.
  int64_t written = 0;
  const std::regex summary(R"(actor \d: \d+ frames, \d+ episodes, params v\d+, (\d+) reconnects, (\d+) transitions written, (\d+) lost)");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(actor_exits[i], 0) << all;
    const std::string log = Read(absl::StrCat(dir_, "/actor", i, ".log"));
    EXPECT_THAT(log, HasSubstr("replay unavailable")) << log;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, summary)) << log;
    EXPECT_GE(std::stoll(m[1]), 1) << log;
    EXPECT_EQ(std::stoll(m[3]), 0) << "transitions lost\n" << log;
    written += std::stoll(m[2]);
    std::printf("actor %d: %s\n", i, m[0].str().c_str());
  }
  // Replay took exactly what the actors wrote: no transition lost, none twice.
  std::smatch m;
  const std::string learner_log = Read(dir_ + "/learner.log");
  ASSERT_TRUE(std::regex_search(learner_log, m, std::regex(R"(replay took (\d+) transitions from the actors)")))
      << learner_log;
  std::printf("replay took %s transitions; the actors wrote %ld\n", m[1].str().c_str(), long(written));
  EXPECT_EQ(std::stoll(m[1]), written) << all;
  EXPECT_GT(written, 0);
  // ...because replay kept each actor's writer session for it to resume.
  EXPECT_THAT(learner_log, HasSubstr("resumed its session on a new insert stream")) << learner_log;
  if (tun_link_) {
    std::printf("link: %ld packets carried, %ld dropped\n", long(tun_link_->packets_carried()),
                long(tun_link_->packets_dropped()));
  }
  EXPECT_TRUE(evaluated_on) << "no evaluation after the partition\n" << Read(RunLayout(run).eval_csv());
}

}  // namespace
}  // namespace troupe
