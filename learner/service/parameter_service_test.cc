#include "learner/service/parameter_service.h"

#include <grpcpp/server_builder.h>

#include <thread>

#include "actors/parameter_client.h"
#include "gtest/gtest.h"

namespace troupe::learner {
namespace {

// A Parameters server on a free loopback port.
struct TestServer {
  ParameterStore store;
  std::unique_ptr<ParameterService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  void Start(int fixed_port = 0) {
    service = std::make_unique<ParameterService>(&store);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(fixed_port), grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    ASSERT_GT(port, 0);
  }
  void Stop() {
    store.Close();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Polls TakeNewer until `want` arrives or 5 s pass.
bool WaitForVersion(actors::ParameterClient& client, int64_t want, int64_t* version, std::vector<float>* params) {
  for (int i = 0; i < 500; ++i) {
    client.TakeNewer(version, params);
    if (*version >= want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(ParameterServiceTest, ClientsFollowTheNewestVersion) {
  TestServer server;
  server.Start();
  std::vector<float> p = {1, 2, 3};
  server.store.Publish(/*version=*/1, "policy", p);
  actors::ParameterClient a(server.address()), b(server.address());
  ASSERT_TRUE(a.WaitForFirst(5000).ok());
  int64_t version_a = 0, version_b = 0;
  std::vector<float> got_a, got_b;
  ASSERT_TRUE(WaitForVersion(a, 1, &version_a, &got_a));
  EXPECT_EQ(got_a, p);
  // Many quick versions: each client ends with the newest.
  for (int v = 2; v <= 50; ++v) {
    p[0] = float(v);
    server.store.Publish(v, "policy", p);
  }
  ASSERT_TRUE(WaitForVersion(a, 50, &version_a, &got_a));
  ASSERT_TRUE(WaitForVersion(b, 50, &version_b, &got_b));
  EXPECT_EQ(got_a[0], 50.0f);
  EXPECT_EQ(got_b[0], 50.0f);
  // Nothing newer: TakeNewer says so.
  EXPECT_FALSE(a.TakeNewer(&version_a, &got_a));
  server.Stop();
}

TEST(ParameterServiceTest, OlderVersionsAreIgnored) {
  ParameterStore store;
  std::vector<float> p = {1};
  store.Publish(5, "policy", p);
  store.Publish(3, "policy", p);
  EXPECT_EQ(store.version(), 5);
}

TEST(ParameterServiceTest, ClientReconnectsAfterTheLearnerRestarts) {
  TestServer first;
  first.Start();
  const int port = first.port;
  std::vector<float> p = {7};
  first.store.Publish(3, "policy", p);
  actors::ParameterClient client(first.address());
  int64_t version = 0;
  std::vector<float> got;
  ASSERT_TRUE(WaitForVersion(client, 3, &version, &got));
  first.Stop();
  // The learner comes back on the same port with a newer version.
  TestServer second;
  second.Start(port);
  p[0] = 8;
  second.store.Publish(4, "policy", p);
  ASSERT_TRUE(WaitForVersion(client, 4, &version, &got));
  EXPECT_EQ(got[0], 8.0f);
  EXPECT_GE(client.reconnects(), 1);
  second.Stop();
}

TEST(ParameterServiceTest, NoLearnerIsADeadlineNamingTheAddressAndWhy) {
  actors::ParameterClient client("127.0.0.1:1");
  auto status = client.WaitForFirst(1500);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("127.0.0.1:1"), std::string::npos);
  // gRPC's own reason for the failed connection, as an absl status.
  EXPECT_NE(status.message().find("(last attempt: UNAVAILABLE: "), std::string::npos) << status.message();
}

}  // namespace
}  // namespace troupe::learner
