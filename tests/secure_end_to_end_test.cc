// End to end over TLS with a token: `troupe certs`, then `troupe learner`
// and two `troupe actor` processes on 127.0.0.1 with --certs; calls without
// the token are refused by each service (replay, Parameters, the episode
// stream), a client of another CA fails its handshake, and the token shows
// up in no log, command line or run directory file. Also: listening beyond
// loopback without credentials is refused before anything starts.
#include <chrono>
#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "common/build_tree.h"
#include "common/grpc_security.h"
#include "common/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/episodes.grpc.pb.h"
#include "proto/parameters.grpc.pb.h"
#include "proto/replay.grpc.pb.h"
#include "common/processes.h"
#include "common/run_layout.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using namespace troupe::e2e;  // Start, Wait, Read, Metrics and its columns
using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteConfig(const std::string& dir) {
  const std::string path = dir + "/small.textproto";
  std::ofstream(path) << R"(name: "secure" mode: RL
env { task: "cartpole.swingup" observation: STATE action_repeat: 4 }
pool { num_envs: 1 num_threads: 1 }
d4pg { hidden: [64, 64] v_max: 200 }
# 400 updates: the rate limiter lets ~1,100 transitions in, enough for each
# of the two actors to end an episode (250 transitions) whichever is faster.
learner { batch_size: 64 publish_every: 10 min_replay_size: 300 samples_per_insert: 32 max_updates: 400 }
actors { count: 2 random_frames: 2000 }
evaluator { every_frames: 0 }
total_frames: 1000000
)";
  return path;
}

GrpcCredentials Load(const std::string& certs_dir) {
  config::SecurityConfig config;
  config.set_certs_dir(certs_dir);
  auto loaded = LoadGrpcCredentials(config);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *loaded : GrpcCredentials();
}

// The status of one call to each service at `address` with `credentials`.
struct Answers {
  grpc::StatusCode replay, parameters, episodes;
};
Answers CallEachService(const GrpcCredentials& credentials, const std::string& address) {
  auto channel = NewSecureChannel(credentials, address);
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };
  Answers answers;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    proto::InfoResponse info;
    answers.replay = proto::Replay::NewStub(*channel)->Info(&context, proto::InfoRequest(), &info).error_code();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    auto reader = proto::Parameters::NewStub(*channel)->Get(&context, proto::GetParametersRequest());
    proto::ParametersUpdate update;
    if (reader->Read(&update)) context.TryCancel();  // a first version came: the call was let in
    const grpc::Status status = reader->Finish();
    answers.parameters = status.error_code() == grpc::StatusCode::CANCELLED ? grpc::StatusCode::OK : status.error_code();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    auto reader = proto::EpisodeStream::NewStub(*channel)->Follow(&context, proto::FollowRequest());
    proto::EpisodeState state;
    if (reader->Read(&state)) context.TryCancel();  // the greeting came: let in
    const grpc::Status status = reader->Finish();
    answers.episodes = status.error_code() == grpc::StatusCode::CANCELLED ? grpc::StatusCode::OK : status.error_code();
  }
  return answers;
}

class SecureEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("secure_e2e_");
  }
  std::string dir_;
};

TEST_F(SecureEndToEndTest, LearnerAndTwoActorsTrainOverTlsAndCallsWithoutTheTokenAreRefused) {
  // Certificates for 127.0.0.1, and another CA.
  ASSERT_EQ(Wait(Start(TROUPE_BINARY, {"certs", dir_ + "/certs", "--hosts", "127.0.0.1"}, dir_ + "/certs.log"), 30), 0)
      << Read(dir_ + "/certs.log");
  ASSERT_EQ(Wait(Start(TROUPE_BINARY, {"certs", dir_ + "/other"}, dir_ + "/other.log"), 30), 0);
  const GrpcCredentials good = Load(dir_ + "/certs");
  ASSERT_EQ(good.token.size(), 64u);

  const std::string config = WriteConfig(dir_);
  const std::string run = dir_ + "/run";
  const pid_t learner = Start(TROUPE_BINARY, {"learner", "--config", config, "--run-dir", run, "--certs",
                                              dir_ + "/certs", "--mtls"},
                              dir_ + "/learner.log");
  const std::string address =
      AwaitMatch(dir_ + "/learner.log", R"(serving replay and parameters on (127\.0\.0\.1:[0-9]+) \(mutual TLS \+ token\))", 60);
  ASSERT_FALSE(address.empty()) << Read(dir_ + "/learner.log");

  // Each service: without the token UNAUTHENTICATED; with it, let in.
  GrpcCredentials no_token = good;
  no_token.token.clear();
  const Answers refused = CallEachService(no_token, address);
  EXPECT_EQ(refused.replay, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused.parameters, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused.episodes, grpc::StatusCode::UNAUTHENTICATED);
  const Answers let_in = CallEachService(good, address);
  EXPECT_EQ(let_in.replay, grpc::StatusCode::OK);
  EXPECT_EQ(let_in.parameters, grpc::StatusCode::OK);
  EXPECT_EQ(let_in.episodes, grpc::StatusCode::OK);
  // Another CA, and (mutual TLS) no client certificate: the handshake fails.
  GrpcCredentials other_ca = good;
  other_ca.ca_pem = Load(dir_ + "/other").ca_pem;
  EXPECT_EQ(CallEachService(other_ca, address).replay, grpc::StatusCode::UNAVAILABLE);
  GrpcCredentials no_certificate = good;
  no_certificate.client_cert_pem.clear();
  no_certificate.client_key_pem.clear();
  EXPECT_EQ(CallEachService(no_certificate, address).replay, grpc::StatusCode::UNAVAILABLE);

  // Two actors: one with the token in its environment, one from the certs folder's file.
  const pid_t actor0 = Start(TROUPE_BINARY, {"actor", "--learner", address, "--config", config, "--index", "0",
                                             "--certs", dir_ + "/certs"},
                             dir_ + "/actor0.log", {{"TROUPE_TOKEN", good.token}});
  const pid_t actor1 = Start(TROUPE_BINARY, {"actor", "--learner", address, "--config", config, "--index", "1",
                                             "--certs", dir_ + "/certs"},
                             dir_ + "/actor1.log");
  const int learner_exit = Wait(learner, /*seconds=*/180);
  Stop(actor0);
  Stop(actor1);
  ASSERT_EQ(learner_exit, 0) << Read(dir_ + "/learner.log") << Read(dir_ + "/actor0.log");
  const auto rows = Metrics(run);
  ASSERT_FALSE(rows.empty());
  EXPECT_GE(rows.back()[kUpdates], 150);
  EXPECT_GT(rows.back()[kVersion], 10);  // parameter versions advanced
  for (const char* log : {"/actor0.log", "/actor1.log"}) {
    EXPECT_THAT(Read(dir_ + log), HasSubstr("episode")) << log;
    EXPECT_THAT(Read(dir_ + log), Not(HasSubstr("params v0 "))) << Read(dir_ + log);
  }
  // The learner logged the refused calls, and the token is nowhere.
  EXPECT_THAT(Read(dir_ + "/learner.log"), HasSubstr("refused a call to /troupe.proto.Replay/Info carrying no token"));
  for (const std::string& file : {dir_ + "/learner.log", dir_ + "/actor0.log", dir_ + "/actor1.log",
                                 RunLayout(run).config(), RunLayout(run).metrics_csv()}) {
    EXPECT_THAT(Read(file), Not(HasSubstr(good.token))) << file;
  }
  EXPECT_THAT(Read(RunLayout(run).config()), HasSubstr("certs_dir"));
}

TEST_F(SecureEndToEndTest, ListeningBeyondLoopbackWithoutCredentialsIsRefused) {
  const std::string config = WriteConfig(dir_);
  // troupe learner on every interface, no credentials: refused, saying how.
  EXPECT_NE(Wait(Start(TROUPE_BINARY, {"learner", "--config", config, "--run-dir", dir_ + "/run", "--listen",
                                       "0.0.0.0:0"},
                       dir_ + "/learner.log"),
                 60),
            0);
  EXPECT_THAT(Read(dir_ + "/learner.log"), HasSubstr("learner.listen 0.0.0.0:0 is not a loopback address"));
  EXPECT_THAT(Read(dir_ + "/learner.log"), HasSubstr("troupe certs DIR --hosts"));
  EXPECT_FALSE(fs::exists(dir_ + "/run")) << "the refused learner left its run directory";
  // troupe run: refused before a run directory exists.
  EXPECT_EQ(Wait(Start(TROUPE_BINARY, {"run", config, "--set", "learner.listen=0.0.0.0:0", "--set",
                                       "runs_dir=" + dir_ + "/runs"},
                       dir_ + "/run.log"),
                 60),
            2);
  EXPECT_THAT(Read(dir_ + "/run.log"), HasSubstr("is not a loopback address"));
  EXPECT_FALSE(fs::exists(dir_ + "/runs"));
  // An actor dialling beyond loopback without TLS: refused at once.
  EXPECT_NE(Wait(Start(TROUPE_BINARY, {"actor", "--learner", "10.255.255.1:7000", "--config", config},
                       dir_ + "/actor.log"),
                 60),
            0);
  EXPECT_THAT(Read(dir_ + "/actor.log"), HasSubstr("without TLS"));
  // --insecure opts in, with a warning (the standalone replay server, on every interface, then stopped).
  const std::string replay_config = dir_ + "/replay.textproto";
  std::ofstream(replay_config) << R"(replay { tables { name: "t" max_size: 10 fields { name: "x" shape: [1] } } })";
  const pid_t replay = Start(TROUPE_BINARY, {"replay", "--config", replay_config, "--listen", "0.0.0.0:0", "--insecure"},
                             dir_ + "/replay.log");
  EXPECT_FALSE(AwaitMatch(dir_ + "/replay.log", R"(listening on (0\.0\.0\.0:[0-9]+))", 30).empty())
      << Read(dir_ + "/replay.log");
  Stop(replay);
  EXPECT_THAT(Read(dir_ + "/replay.log"), HasSubstr("WARNING: serving replay.listen 0.0.0.0:0 with no TLS, no token"));
}

// An actor given another CA than the one that signed the learner's
// certificate says so in troupe's words (not only gRPC's) and gives up after
// actors.authentication_timeout_s instead of retrying forever.
TEST_F(SecureEndToEndTest, AnActorThatCannotAuthenticateTheLearnerSaysWhyAndGivesUp) {
  ASSERT_EQ(Wait(Start(TROUPE_BINARY, {"certs", dir_ + "/certs", "--hosts", "127.0.0.1"}, dir_ + "/certs.log"), 30), 0)
      << Read(dir_ + "/certs.log");
  ASSERT_EQ(Wait(Start(TROUPE_BINARY, {"certs", dir_ + "/other"}, dir_ + "/other.log"), 30), 0);
  const std::string config = WriteConfig(dir_);
  const pid_t learner = Start(TROUPE_BINARY, {"learner", "--config", config, "--run-dir", dir_ + "/run", "--certs",
                                              dir_ + "/certs"},
                              dir_ + "/learner.log");
  const std::string address =
      AwaitMatch(dir_ + "/learner.log", R"(serving replay and parameters on (127\.0\.0\.1:[0-9]+))", 60);
  ASSERT_FALSE(address.empty()) << Read(dir_ + "/learner.log");
  // The other folder's CA (and its token, which never gets sent).
  const auto start = std::chrono::steady_clock::now();
  const pid_t actor = Start(TROUPE_BINARY, {"actor", "--learner", address, "--config", config, "--certs",
                                            dir_ + "/other", "--set", "actors.authentication_timeout_s=5"},
                            dir_ + "/actor.log");
  const int code = Wait(actor, /*seconds=*/150);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Stop(learner);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "the actor retried on past its bound:\n" << Read(dir_ + "/actor.log");
  // Its bound, not its 30 s wait for a first policy on top: a refused
  // handshake ends that wait at once.
  EXPECT_LT(seconds, 20) << Read(dir_ + "/actor.log");
  const std::string log = Read(dir_ + "/actor.log");
  EXPECT_THAT(log, HasSubstr("cannot authenticate the connection to " + address + " over TLS"));
  EXPECT_THAT(log, HasSubstr("not signed by this side's CA")) << log;
  EXPECT_THAT(log, HasSubstr("gave up after 5 s (actors.authentication_timeout_s)")) << log;
}

}  // namespace
}  // namespace troupe
