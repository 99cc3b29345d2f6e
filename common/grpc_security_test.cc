#include "common/grpc_security.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "common/certificates.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/bench.grpc.pb.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Pull answers with `messages` blobs of `bytes`.
class Blobs final : public proto::RawStream::Service {
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    grpc::ServerWriter<proto::Blob>* writer) override {
    // The token is consumed by the check: handlers never see it.
    if (context->client_metadata().count(kTokenMetadataKey) != 0) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "the handler saw the token");
    }
    proto::Blob blob;
    blob.set_data(std::string(request->bytes(), 'x'));
    for (int64_t i = 0; i < request->messages(); ++i) writer->Write(blob);
    return grpc::Status::OK;
  }
};

struct Served {
  Blobs service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

std::unique_ptr<Served> Serve(const GrpcCredentials& credentials, const std::string& listen = "127.0.0.1:0") {
  auto served = std::make_unique<Served>();
  grpc::ServerBuilder builder;
  EXPECT_TRUE(AddSecureListeningPort(builder, credentials, listen, "test.listen", &served->port).ok());
  builder.RegisterService(&served->service);
  served->server = builder.BuildAndStart();
  EXPECT_NE(served->port, 0);
  return served;
}

// One Pull of 3 blobs through a channel made with `credentials`; its status.
grpc::Status PullThrough(const GrpcCredentials& credentials, const std::string& address) {
  auto channel = NewSecureChannel(credentials, address);
  if (!channel.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(channel.status().message()));
  auto stub = proto::RawStream::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::PullRequest request;
  request.set_bytes(100);
  request.set_messages(3);
  auto reader = stub->Pull(&context, request);
  proto::Blob blob;
  int read = 0;
  while (reader->Read(&blob)) ++read;
  grpc::Status status = reader->Finish();
  if (status.ok() && read != 3) return grpc::Status(grpc::StatusCode::INTERNAL, "short stream");
  return status;
}

class GrpcSecurityTest : public ::testing::Test {
 protected:
  // Two independent CAs (troupe certs, as a user makes them), once.
  static void SetUpTestSuite() {
    root_ = ::testing::TempDir() + "/grpc_security_test_" + std::to_string(getpid());  // ctest runs cases in parallel processes
    fs::remove_all(root_);
    ASSERT_TRUE(WriteCertificates(root_ + "/certs", {"learner-host", "10.1.2.3"}).ok());
    ASSERT_TRUE(WriteCertificates(root_ + "/other", {}).ok());
  }
  static GrpcCredentials Load(const config::SecurityConfig& config) {
    auto loaded = LoadGrpcCredentials(config);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : GrpcCredentials();
  }
  static GrpcCredentials FromDir(const std::string& name) {
    config::SecurityConfig config;
    config.set_certs_dir(root_ + "/" + name);
    return Load(config);
  }
  void TearDown() override { unsetenv(kTokenEnvironmentVariable); }
  static std::string root_;
};
std::string GrpcSecurityTest::root_;

TEST(GrpcSecurity, LoopbackHostsAreLoopbackAndNothingElseIs) {
  for (const char* address : {"127.0.0.1:7000", "127.3.4.5:1", "localhost:80", "[::1]:7000", "LOCALHOST:1"}) {
    EXPECT_TRUE(IsLoopbackHost(HostOf(address))) << address;
  }
  for (const char* address : {"0.0.0.0:7000", "[::]:7000", "10.0.0.1:7000", "learner:7000", "128.0.0.1:1",
                              "localhost.evil.com:1", "dns:///localhost:7000"}) {
    EXPECT_FALSE(IsLoopbackHost(HostOf(address))) << address;
  }
  EXPECT_EQ(HostOf("[::1]:7000"), "::1");
  EXPECT_EQ(HostOf("host:7000"), "host");
}

TEST(GrpcSecurity, TokensCompareByContentWhateverTheirLengths) {
  EXPECT_TRUE(TokensEqual("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("0123456789abcdef", "0123456789abcdeX"));
  EXPECT_FALSE(TokensEqual("0123456789abcdef", "0123456789abcdef0"));
  EXPECT_FALSE(TokensEqual("", "x"));
  auto a = NewToken(), b = NewToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
}

TEST_F(GrpcSecurityTest, CertsDirFillsEveryFileAndTheEnvironmentTokenWins) {
  const GrpcCredentials c = FromDir("certs");
  EXPECT_TRUE(c.server_tls());
  EXPECT_TRUE(c.client_tls());
  EXPECT_FALSE(c.client_cert_pem.empty());
  EXPECT_EQ(c.token.size(), 64u);
  EXPECT_EQ(c.DescribeServer(), "TLS + token");
  setenv(kTokenEnvironmentVariable, "from-the-environment-1234", 1);
  EXPECT_EQ(FromDir("certs").token, "from-the-environment-1234");
  // Nothing configured: nothing loaded (loopback only).
  unsetenv(kTokenEnvironmentVariable);
  const GrpcCredentials none = Load(config::SecurityConfig());
  EXPECT_FALSE(none.server_tls() || none.client_tls() || !none.token.empty());
}

TEST_F(GrpcSecurityTest, BadFilesAndTokensAreRefusedNamingTheFieldNeverShowingTheToken) {
  config::SecurityConfig config;
  config.set_ca_cert(root_ + "/missing.pem");
  EXPECT_THAT(std::string(LoadGrpcCredentials(config).status().message()), HasSubstr("security.ca_cert"));
  // A key that is not its certificate's.
  config.Clear();
  config.set_server_cert(root_ + "/certs/server.pem");
  config.set_server_key(root_ + "/certs/client.key");
  EXPECT_THAT(std::string(LoadGrpcCredentials(config).status().message()),
              HasSubstr("security.server_key is not the private key of security.server_cert"));
  config.clear_server_key();
  EXPECT_THAT(std::string(LoadGrpcCredentials(config).status().message()), HasSubstr("security.server_key is missing"));
  config.Clear();
  config.set_mutual_tls(true);
  EXPECT_THAT(std::string(LoadGrpcCredentials(config).status().message()), HasSubstr("needs security.ca_cert"));
  // A short token, from the environment: refused without being echoed.
  config.Clear();
  setenv(kTokenEnvironmentVariable, "short-secret", 1);
  const absl::Status short_token = LoadGrpcCredentials(config).status();
  EXPECT_TRUE(absl::IsInvalidArgument(short_token));
  EXPECT_THAT(std::string(short_token.message()), ::testing::Not(HasSubstr("short-secret")));
  // certs_dir that is not a folder.
  unsetenv(kTokenEnvironmentVariable);
  config.set_certs_dir(root_ + "/nowhere");
  EXPECT_THAT(std::string(LoadGrpcCredentials(config).status().message()), HasSubstr("troupe certs"));
}

TEST_F(GrpcSecurityTest, CertsRefusesBadHostsAndAnExistingCa) {
  EXPECT_TRUE(absl::IsInvalidArgument(WriteCertificates(root_ + "/bad", {"a;rm -rf /"})));
  EXPECT_TRUE(absl::IsAlreadyExists(WriteCertificates(root_ + "/certs", {})));
  // Keys and the token are their owner's only.
  for (const char* file : {"ca.key", "server.key", "client.key", "token"}) {
    const fs::perms p = fs::status(root_ + "/certs/" + file).permissions();
    EXPECT_EQ(p & (fs::perms::group_all | fs::perms::others_all), fs::perms::none) << file;
  }
}

TEST_F(GrpcSecurityTest, TlsWithTheTokenServesAndEveryOtherClientIsRefused) {
  const GrpcCredentials good = FromDir("certs");
  auto served = Serve(good);
  EXPECT_TRUE(PullThrough(good, served->address()).ok());
  // No token, and a wrong one: UNAUTHENTICATED before the handler runs.
  GrpcCredentials no_token = good;
  no_token.token.clear();
  EXPECT_EQ(PullThrough(no_token, served->address()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  GrpcCredentials wrong_token = good;
  wrong_token.token = "a-wrong-token-of-enough-length";
  const grpc::Status wrong = PullThrough(wrong_token, served->address());
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), HasSubstr("wrong token"));
  EXPECT_THAT(wrong.error_message(), ::testing::Not(HasSubstr(good.token)));
  // Another CA: the handshake fails (the server cannot be verified).
  GrpcCredentials other_ca = good;
  other_ca.ca_pem = FromDir("other").ca_pem;
  EXPECT_EQ(PullThrough(other_ca, served->address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // No TLS at all against a TLS port: no answer.
  GrpcCredentials plain;
  EXPECT_EQ(PullThrough(plain, served->address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // The server certificate names the hosts given: dialled as "localhost" it verifies too.
  EXPECT_TRUE(PullThrough(good, "localhost:" + std::to_string(served->port)).ok());
  served->server->Shutdown();
}

TEST_F(GrpcSecurityTest, MutualTlsRefusesAClientWithoutACertificate) {
  GrpcCredentials server = FromDir("certs");
  server.mutual_tls = true;
  auto served = Serve(server);
  EXPECT_TRUE(PullThrough(FromDir("certs"), served->address()).ok());
  GrpcCredentials no_certificate = FromDir("certs");
  no_certificate.client_cert_pem.clear();
  no_certificate.client_key_pem.clear();
  EXPECT_EQ(PullThrough(no_certificate, served->address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A certificate from another CA is refused as well.
  GrpcCredentials other_certificate = FromDir("certs");
  const GrpcCredentials other = FromDir("other");
  other_certificate.client_cert_pem = other.client_cert_pem;
  other_certificate.client_key_pem = other.client_key_pem;
  EXPECT_EQ(PullThrough(other_certificate, served->address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  served->server->Shutdown();
}

TEST_F(GrpcSecurityTest, BeyondLoopbackWithoutTlsAndATokenIsRefusedUnlessInsecure) {
  grpc::ServerBuilder builder;
  int port = 0;
  const absl::Status refused = AddSecureListeningPort(builder, GrpcCredentials(), "0.0.0.0:0", "learner.listen", &port);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("learner.listen 0.0.0.0:0 is not a loopback address"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("troupe certs DIR --hosts"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--insecure"));
  // TLS without a token, and a token without TLS: refused too.
  GrpcCredentials tls_only = FromDir("certs");
  tls_only.token.clear();
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckServerCredentials(tls_only, "0.0.0.0:0", "f")));
  GrpcCredentials token_only;
  token_only.token = FromDir("certs").token;
  token_only.insecure = true;
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckServerCredentials(token_only, "0.0.0.0:0", "f")));
  // With both it binds every interface (closed at once); --insecure binds too.
  auto secure = Serve(FromDir("certs"), "0.0.0.0:0");
  EXPECT_TRUE(PullThrough(FromDir("certs"), secure->address()).ok());
  secure->server->Shutdown();
  GrpcCredentials insecure;
  insecure.insecure = true;
  auto open = Serve(insecure, "0.0.0.0:0");
  open->server->Shutdown();
  // A client beyond loopback without TLS is refused too, and never sends a token in clear.
  EXPECT_TRUE(absl::IsFailedPrecondition(NewSecureChannel(GrpcCredentials(), "10.1.2.3:7000").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(NewSecureChannel(token_only, "10.1.2.3:7000").status()));
  EXPECT_TRUE(NewSecureChannel(insecure, "10.1.2.3:7000").ok());
}

TEST_F(GrpcSecurityTest, OnLoopbackATokenWithoutTlsIsStillChecked) {
  GrpcCredentials token_only;
  token_only.token = FromDir("certs").token;
  auto served = Serve(token_only);
  EXPECT_EQ(token_only.DescribeServer(), "token, no TLS (loopback)");
  EXPECT_TRUE(PullThrough(token_only, served->address()).ok());
  EXPECT_EQ(PullThrough(GrpcCredentials(), served->address()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  served->server->Shutdown();
  // And the plain local set-up is unchanged: no credentials on either side.
  auto plain = Serve(GrpcCredentials());
  EXPECT_TRUE(PullThrough(GrpcCredentials(), plain->address()).ok());
  plain->server->Shutdown();
}

}  // namespace
}  // namespace troupe
