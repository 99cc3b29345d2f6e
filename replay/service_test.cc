// The replay service over real gRPC on loopback.
#include "replay/service.h"

#include <grpcpp/create_channel.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/certificates.h"
#include "common/grpc_security.h"
#include "gtest/gtest.h"
#include "replay/grpc_client.h"
#include "replay/server.h"
#include "replay/test_util.h"

namespace troupe::replay {
namespace {

using testing::TestConfig;

std::unique_ptr<Server> StartServer(config::ReplayConfig config) {
  auto server = Server::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// Polls `cond` for up to 10 s (generous, so a loaded machine cannot flake).
template <typename Cond>
bool Eventually(Cond cond) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

TEST(ServiceTest, BindsLoopbackByDefault) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), absl::StrCat("127.0.0.1:", server->port()));
}

// The standalone server with TLS and a token (troupe replay --certs DIR):
// a client with both is served; without the token every call is
// UNAUTHENTICATED; beyond loopback without credentials it does not start.
TEST(ServiceTest, StandaloneServerWithTlsRefusesClientsWithoutTheToken) {
  const std::string certs = ::testing::TempDir() + "/replay_service_certs_" + std::to_string(getpid());
  std::filesystem::remove_all(certs);
  ASSERT_TRUE(WriteCertificates(certs, {}).ok());
  config::SecurityConfig security;
  security.set_certs_dir(certs);
  auto credentials = LoadGrpcCredentials(security);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto server = Server::Start(TestConfig(), *credentials);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = NewGrpcClient((*server)->address(), {.credentials = *credentials});
  EXPECT_TRUE(client->Info().ok());
  GrpcCredentials no_token = *credentials;
  no_token.token.clear();
  auto refused = NewGrpcClient((*server)->address(), {.credentials = no_token});
  EXPECT_TRUE(absl::IsUnauthenticated(refused->Info().status()));
  auto writer = refused->NewWriter();
  ASSERT_TRUE(writer.ok());
  EXPECT_TRUE(absl::IsUnauthenticated((*writer)->Flush()));
  // Beyond loopback without credentials: refused before it listens.
  config::ReplayConfig everywhere = TestConfig();
  everywhere.set_listen("0.0.0.0:0");
  EXPECT_TRUE(absl::IsFailedPrecondition(Server::Start(everywhere).status()));
}

TEST(ServiceTest, ManyWritersAndOneSamplerSeeEveryItemExactlyOnce) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  constexpr int kWriters = 4, kPerWriter = 150;
  std::vector<float> seen;
  absl::Status sample_status;
  {
    std::vector<std::jthread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        auto writer = *client->NewWriter({.max_items_per_request = 7});
        for (int i = 0; i < kPerWriter; ++i) ASSERT_TRUE(testing::InsertState(*writer, "queue", w * 1000 + i).ok());
        ASSERT_TRUE(writer->Close().ok());
      });
    }
    // The FIFO queue hands each item out once; sample concurrently with the writers.
    threads.emplace_back([&] {
      auto sampler = *client->NewSampler({.table = "queue", .batch_size = 10, .timeout = absl::Seconds(20)});
      SampledBatch batch;
      for (int b = 0; b < kWriters * kPerWriter / 10; ++b) {
        sample_status = sampler->Next(&batch);
        if (!sample_status.ok()) return;
        for (int i = 0; i < 10; ++i) seen.push_back(batch.fields[0].as<float>()[24 * i]);
      }
    });
  }
  ASSERT_TRUE(sample_status.ok()) << sample_status;
  ASSERT_EQ(seen.size(), static_cast<size_t>(kWriters * kPerWriter));
  std::set<float> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), seen.size()) << "an item was sampled twice";
  // Each writer's items come out in the order it wrote them.
  std::vector<float> last(kWriters, -1);
  for (float v : seen) {
    const int w = static_cast<int>(v) / 1000;
    EXPECT_GT(v, last[w]);
    last[w] = v;
  }
  auto info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tables(2).rate_limiter().inserts(), kWriters * kPerWriter);
  EXPECT_EQ(info->tables(2).size(), 0);
}

TEST(ServiceTest, PixelTransitionsComeBackByteIdentical) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/60).ok());
  ASSERT_TRUE(writer->Close().ok());
  auto info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->frames(), 61) << "each frame stored once";
  auto sampler = *client->NewSampler({.table = "pixels", .batch_size = 100, .num_batches = 2});
  SampledBatch batch;
  for (int b = 0; b < 2; ++b) {
    ASSERT_TRUE(sampler->Next(&batch).ok());
    EXPECT_EQ(batch.fields[3].shape, (std::vector<int64_t>{100, 3, 16, 16, 3}));
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(testing::RowMatchesEpisode(batch, i));
  }
  const absl::Status end = sampler->Next(&batch);
  EXPECT_EQ(end.code(), absl::StatusCode::kOutOfRange) << end;
}

TEST(ServiceTest, WrongShapeEndsThatStreamOnlyWithInvalidArgument) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto good = *client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*good, "state", 1).ok());
  ASSERT_TRUE(good->Flush().ok());
  auto bad = *client->NewWriter();
  std::vector<float> obs(25, 0.f);
  const float action[2] = {0, 0};
  ASSERT_TRUE(bad->Insert("state", 1, {FieldValue::Dense(proto::DTYPE_FLOAT32, {25}, obs.data()),
                                        FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action)})
                  .ok());
  const absl::Status status = bad->Flush();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "item 0 (table 'state') field 'obs': expected float32[24], got float32[25]");
  // The other stream keeps working.
  ASSERT_TRUE(testing::InsertState(*good, "state", 2).ok());
  ASSERT_TRUE(good->Close().ok());
  EXPECT_EQ(client->Info()->tables(1).size(), 2);
}

TEST(ServiceTest, UnknownTableIsNotFoundForWritersAndSamplers) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*writer, "nope", 1).ok());
  absl::Status status = writer->Flush();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "item 0: unknown table 'nope'; tables: pixels, state, queue");
  auto sampler = *client->NewSampler({.table = "nope", .batch_size = 4});
  SampledBatch batch;
  status = sampler->Next(&batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "unknown table 'nope'; tables: pixels, state, queue");
}

TEST(ServiceTest, OversizedMessageIsRefusedAndServerKeepsServing) {
  config::ReplayConfig config = TestConfig();
  config.set_max_message_bytes(64 << 10);
  auto server = StartServer(config);
  auto client = NewGrpcClient(server->address(), {.max_message_bytes = 8 << 20});
  auto writer = *client->NewWriter();
  // 300 KB of noise does not compress: the request exceeds 64 KiB.
  std::vector<uint8_t> noise(100 * 1000 * 3);
  std::mt19937 rng(/*seed=*/1);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(writer->AppendFrame(noise.data(), 100, 1000, 3).ok());
  const absl::Status status = writer->Flush();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("larger than max"), std::string::npos) << status.message();
  auto ok_writer = *client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*ok_writer, "state", 1).ok());
  EXPECT_TRUE(ok_writer->Close().ok());
  EXPECT_EQ(client->Info()->tables(1).size(), 1);
}

TEST(ServiceTest, ClientCancelledMidStreamLeavesNothingHalfInserted) {
  auto server = StartServer(TestConfig());
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Replay::NewStub(channel);
  // A raw stream: 4 frames and one complete transition (acked), then the
  // frames of the next transitions, then the client vanishes.
  {
    grpc::ClientContext context;
    auto stream = stub->Insert(&context);
    auto frame = [](uint64_t key) {
      proto::FrameData f;
      f.set_key(key);
      auto* t = f.mutable_pixels();
      t->set_dtype(proto::DTYPE_UINT8);
      for (int d : {testing::kH, testing::kW, testing::kC}) t->add_shape(d);
      const std::vector<uint8_t> pixels = testing::TestFrame(static_cast<int>(key));
      t->set_data(pixels.data(), pixels.size());
      return f;
    };
    proto::InsertRequest first;
    for (uint64_t k = 0; k < 4; ++k) *first.add_frames() = frame(k);
    auto* item = first.add_items();
    item->set_table("pixels");
    auto* obs = item->add_fields();
    for (uint64_t k : {0, 1, 2}) obs->add_frame_keys(k);
    auto* action = item->add_fields()->mutable_tensor();
    action->set_dtype(proto::DTYPE_FLOAT32);
    action->add_shape(2);
    action->set_data(std::string(8, '\0'));
    auto* reward = item->add_fields()->mutable_tensor();
    reward->set_dtype(proto::DTYPE_FLOAT32);
    reward->set_data(std::string(4, '\0'));
    auto* next = item->add_fields();
    for (uint64_t k : {1, 2, 3}) next->add_frame_keys(k);
    first.set_ack(true);
    ASSERT_TRUE(stream->Write(first));
    proto::InsertResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.items_inserted(), 1);
    proto::InsertRequest partial;
    for (uint64_t k = 4; k < 10; ++k) *partial.add_frames() = frame(k);
    ASSERT_TRUE(stream->Write(partial));
    context.TryCancel();
    (void)stream->Finish();
  }
  auto client = NewGrpcClient(server->address());
  // Once the server drops the stream, only the 4 frames of the inserted item remain.
  EXPECT_TRUE(Eventually([&] { return client->Info()->frames() == 4; })) << client->Info()->frames();
  EXPECT_EQ(client->Info()->tables(0).size(), 1);
  // And everyone else is still served.
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*writer, "state", 3).ok());
  EXPECT_TRUE(writer->Close().ok());
}

// A frame of the pixels table (16x16x3, raw) for raw-stub requests.
proto::FrameData RawFrame(uint64_t key) {
  proto::FrameData f;
  f.set_key(key);
  auto* t = f.mutable_pixels();
  t->set_dtype(proto::DTYPE_UINT8);
  for (int d : {testing::kH, testing::kW, testing::kC}) t->add_shape(d);
  const std::vector<uint8_t> pixels = testing::TestFrame(static_cast<int>(key));
  t->set_data(pixels.data(), pixels.size());
  return f;
}

// Adds a pixels item to `request` (k >= 2) whose obs are frames k-2, k-2,
// k-1 and next_obs k-2..k, reward `reward`.
void AddPixelItem(proto::InsertRequest* request, uint64_t k, float reward) {
  auto* item = request->add_items();
  item->set_table("pixels");
  auto* obs = item->add_fields();
  for (uint64_t j : {k - 2, k - 2, k - 1}) obs->add_frame_keys(j);
  auto* action = item->add_fields()->mutable_tensor();
  action->set_dtype(proto::DTYPE_FLOAT32);
  action->add_shape(2);
  action->set_data(std::string(8, '\0'));
  auto* r = item->add_fields()->mutable_tensor();
  r->set_dtype(proto::DTYPE_FLOAT32);
  r->set_data(reinterpret_cast<const char*>(&reward), sizeof(reward));
  auto* next = item->add_fields();
  for (uint64_t j = k - 2; j <= k; ++j) next->add_frame_keys(j);
}

// A writer session over raw streams: a request re-sent on a new stream
// after its ack was lost is skipped, frames included; a re-send that
// overlaps what was inserted inserts only the rest; a second stream while
// the first holds the session is refused UNAVAILABLE; resuming a session the
// server never had is FAILED_PRECONDITION.
TEST(ServiceTest, AWriterSessionResumedOnANewStreamInsertsEachItemOnce) {
  auto server = StartServer(TestConfig());
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Replay::NewStub(channel);
  constexpr uint64_t kWriter = 0x5eed;
  auto numbered = [](proto::InsertRequest r, int64_t sequence, int64_t first_item, bool ack, bool resume = false) {
    r.set_writer(kWriter);
    r.set_sequence(sequence);
    r.set_first_item(first_item);
    r.set_ack(ack);
    r.set_resume(resume);
    return r;
  };
  // Request 1: frames 0..3, items 0 and 1 (frames up to 3). Request 2:
  // frames 4, 5, items 2 and 3.
  proto::InsertRequest one, two, three;
  for (uint64_t k = 0; k < 4; ++k) *one.add_frames() = RawFrame(k);
  AddPixelItem(&one, 2, 0.0f);
  AddPixelItem(&one, 3, 1.0f);
  for (uint64_t k = 4; k < 6; ++k) *two.add_frames() = RawFrame(k);
  AddPixelItem(&two, 4, 2.0f);
  AddPixelItem(&two, 5, 3.0f);
  // Request 3 re-sends item 3 (its ack "lost") with a new one: frame 6, item 4.
  *three.add_frames() = RawFrame(6);
  AddPixelItem(&three, 5, 3.0f);
  AddPixelItem(&three, 6, 4.0f);
  proto::InsertResponse response;
  grpc::ClientContext first_context;
  auto first = stub->Insert(&first_context);
  ASSERT_TRUE(first->Write(numbered(one, 1, 0, /*ack=*/true)));
  ASSERT_TRUE(first->Read(&response));
  ASSERT_TRUE(first->Write(numbered(two, 2, 2, /*ack=*/true)));
  ASSERT_TRUE(first->Read(&response));
  EXPECT_EQ(response.items_inserted(), 4);
  {
    // While the first stream holds the session, another is refused.
    grpc::ClientContext context;
    auto second = stub->Insert(&context);
    ASSERT_TRUE(second->Write(numbered(proto::InsertRequest(), 3, 4, /*ack=*/true, /*resume=*/true)));
    EXPECT_FALSE(second->Read(&response));
    const grpc::Status refused = second->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_TRUE(absl::StrContains(refused.error_message(), "still open")) << refused.error_message();
  }
  // The writer lost request 2's ack: it cancels that stream and re-sends 2
  // (sequence 2, first item 2) and then 3 (first item 3: item 3 again, and 4).
  first_context.TryCancel();
  (void)first->Finish();
  auto client = NewGrpcClient(server->address());
  bool resumed = false;
  for (int attempt = 0; attempt < 200 && !resumed; ++attempt) {
    grpc::ClientContext context;
    auto stream = stub->Insert(&context);
    proto::InsertRequest resend = numbered(two, 2, 2, /*ack=*/false, /*resume=*/true);
    proto::InsertRequest next = numbered(three, 3, 3, /*ack=*/true);
    if (stream->Write(resend) && stream->Write(next) && stream->Read(&response)) {
      resumed = true;
      EXPECT_EQ(response.items_inserted(), 5) << "items 0..4, each once";
      stream->WritesDone();
    }
    const grpc::Status status = stream->Finish();
    if (!resumed) {
      // Only "the old stream is still open" may refuse it, until the server lets it go.
      ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  ASSERT_TRUE(resumed);
  auto info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tables(0).size(), 5);
  EXPECT_EQ(info->tables(0).rate_limiter().inserts(), 5);
  EXPECT_EQ(info->frames(), 7) << "re-sent frames are not stored twice";
  // Every item once: rewards 0..4.
  auto sampler = *client->NewSampler({.table = "pixels", .batch_size = 200, .num_batches = 1});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  std::set<float> rewards;
  for (int i = 0; i < 200; ++i) rewards.insert(batch.fields[2].as<float>()[i]);
  EXPECT_EQ(rewards, (std::set<float>{0, 1, 2, 3, 4}));
  // A session the server never had cannot be resumed.
  grpc::ClientContext context;
  auto stream = stub->Insert(&context);
  proto::InsertRequest unknown = numbered(proto::InsertRequest(), 9, 40, /*ack=*/true, /*resume=*/true);
  unknown.set_writer(0xdead);
  ASSERT_TRUE(stream->Write(unknown));
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "no session of writer 000000000000dead to resume"))
      << status.error_message();
}

// Idle writer sessions are kept up to kMaxIdleWriterSessions, the oldest
// dropped first: a writer whose session went cannot resume it (and says
// so), a newer one can.
TEST(ServiceTest, IdleWriterSessionsBeyondTheBoundAreDroppedOldestFirst) {
  auto server = StartServer(TestConfig());
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Replay::NewStub(channel);
  // One request (an ack) on a stream of writer `writer`; the status it ended with.
  auto one_stream = [&](uint64_t writer, int64_t sequence, bool resume) {
    grpc::ClientContext context;
    auto stream = stub->Insert(&context);
    proto::InsertRequest request;
    request.set_writer(writer);
    request.set_sequence(sequence);
    request.set_resume(resume);
    request.set_ack(true);
    proto::InsertResponse response;
    if (stream->Write(request) && stream->Read(&response)) stream->WritesDone();
    return stream->Finish();
  };
  for (uint64_t writer = 1; writer <= kMaxIdleWriterSessions + 1; ++writer) {
    ASSERT_TRUE(one_stream(writer, 1, /*resume=*/false).ok()) << writer;
  }
  // Each stream's end lets its session go once the server is done with
  // the stream (at once; a second is generous). Which session is oldest is
  // the server's order of letting them go, which a loaded machine may
  // shuffle among the first streams; so every writer is probed once, in
  // order (a probe that finds its session refreshes it, one that does not
  // adds none): exactly one was dropped, among the first, and the newest
  // was kept.
  absl::SleepFor(absl::Seconds(1));
  std::vector<uint64_t> refused;
  for (uint64_t writer = 1; writer <= kMaxIdleWriterSessions + 1; ++writer) {
    const grpc::Status status = one_stream(writer, 2, /*resume=*/true);
    if (status.ok()) continue;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "was idle longer than")) << status.error_message();
    refused.push_back(writer);
  }
  ASSERT_EQ(refused.size(), 1u) << "one session beyond the bound, one dropped";
  EXPECT_LE(refused[0], 16u) << "the dropped session was among the first let go";
}

// The resumable client writer: a stream the server ends mid-request (the
// rate limiter's insert timeout, a partial insert) is resumed, and the
// sampler sees every item exactly once and in order.
TEST(ServiceTest, AResumableWriterLosesNothingAndInsertsNothingTwiceWhenItsStreamEnds) {
  auto server = StartServer(TestConfig("max_size: 1000", R"pb(
    tables { name: "limited" max_size: 100 selector: fifo
             rate_limiter { samples_per_insert: 1 error_buffer: 2 insert_timeout_ms: 200 }
             fields { name: "x" } })pb"));
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter({.max_items_per_request = 10, .resumable = true});
  constexpr int kItems = 20;
  for (int i = 0; i < kItems; ++i) {
    const float x = static_cast<float>(i);
    // A send may fail (the stream ended): the item is kept all the same.
    (void)writer->Insert("limited", 1, {FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &x)});
  }
  // Only 3 fit before a sample: the server ends the stream after 200 ms.
  const absl::Status flushed = writer->Flush();
  ASSERT_EQ(flushed.code(), absl::StatusCode::kDeadlineExceeded) << flushed;
  EXPECT_EQ(writer->items_queued(), kItems);
  EXPECT_EQ(writer->items_unacknowledged(), kItems);
  // A sampler drains the table while the writer resumes until all is in.
  std::vector<float> seen;
  absl::Status sample_status;
  {
    std::jthread sampler_thread([&] {
      auto sampler = *client->NewSampler({.table = "limited", .batch_size = 1, .timeout = absl::Seconds(20)});
      SampledBatch batch;
      while (seen.size() < kItems) {
        sample_status = sampler->Next(&batch);
        if (!sample_status.ok()) return;
        seen.push_back(batch.fields[0].as<float>()[0]);
      }
    });
    absl::Status resumed = flushed;
    for (int attempt = 0; attempt < 100 && !resumed.ok(); ++attempt) {
      resumed = writer->Resume();
      ASSERT_TRUE(resumed.ok() || absl::IsDeadlineExceeded(resumed) || absl::IsUnavailable(resumed)) << resumed;
      if (!resumed.ok()) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(resumed.ok()) << resumed;
    EXPECT_EQ(writer->items_unacknowledged(), 0);
    ASSERT_TRUE(writer->Close().ok());
  }
  ASSERT_TRUE(sample_status.ok()) << sample_status;
  std::vector<float> expected(kItems);
  for (int i = 0; i < kItems; ++i) expected[i] = static_cast<float>(i);
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(client->Info()->tables(3).rate_limiter().inserts(), kItems);
}

// A server that restarted (a learner killed and started again) has no
// session to resume: Resume says so, and what was not acknowledged is
// counted (the actor then starts a new writer).
TEST(ServiceTest, AResumableWriterIsToldWhenTheServerNoLongerHasItsSession) {
  config::ReplayConfig config = TestConfig();
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  const std::string address = server->address();
  auto client = NewGrpcClient(address);
  auto writer = *client->NewWriter({.resumable = true});
  ASSERT_TRUE(testing::InsertState(*writer, "state", 1).ok());
  ASSERT_TRUE(writer->Flush().ok());
  // The server goes, and another starts on the same port.
  server.reset();
  config.set_listen(address);
  server = StartServer(config);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(testing::InsertState(*writer, "state", 2).ok());
  const absl::Status flushed = writer->Flush();
  EXPECT_FALSE(flushed.ok());
  EXPECT_EQ(writer->items_unacknowledged(), 1);
  const absl::Status resumed = writer->Resume();
  EXPECT_TRUE(absl::IsFailedPrecondition(resumed)) << resumed;
  EXPECT_TRUE(absl::StrContains(resumed.message(), "to resume (the server restarted")) << resumed;
  EXPECT_EQ(writer->items_unacknowledged(), 1);
  EXPECT_EQ(client->Info()->tables(1).rate_limiter().inserts(), 0);
}

// A writer that is not resumable says so.
TEST(ServiceTest, ResumeOfAWriterThatIsNotResumableIsUnimplemented) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter();
  EXPECT_TRUE(absl::IsUnimplemented(writer->Resume()));
  EXPECT_TRUE(writer->Close().ok());
}

TEST(ServiceTest, SampleTimesOutWithDeadlineExceededNamingTheTable) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto sampler = *client->NewSampler({.table = "state", .batch_size = 4, .timeout = absl::Milliseconds(50)});
  SampledBatch batch;
  const absl::Status status = sampler->Next(&batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("table 'state': no full batch of 4 within 50 ms"), std::string::npos)
      << status.message();
}

// Cancel from another thread ends a Next blocked on the rate limiter (an
// empty table) within its latency, and every later Next, for the embedded
// and the gRPC sampler alike; a sampler nobody cancels still waits.
TEST(ServiceTest, CancelEndsABlockedSampleAndEveryLaterOne) {
  auto server = StartServer(TestConfig());
  std::unique_ptr<ReplayClient> clients[] = {NewLocalClient(server->replay()), NewGrpcClient(server->address())};
  for (auto& client : clients) {
    auto sampler = *client->NewSampler({.table = "state", .batch_size = 4});
    auto waiting = *client->NewSampler({.table = "state", .batch_size = 4, .timeout = absl::Milliseconds(400)});
    absl::Status blocked, waited;
    absl::Time returned;
    std::thread sampling([&] {
      SampledBatch batch;
      blocked = sampler->Next(&batch);
      returned = absl::Now();
    });
    std::thread other([&] {
      SampledBatch batch;
      waited = waiting->Next(&batch);
    });
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time cancelled = absl::Now();
    sampler->Cancel();
    sampling.join();
    other.join();
    EXPECT_TRUE(absl::IsCancelled(blocked)) << blocked;
    EXPECT_LT(returned - cancelled, absl::Seconds(1)) << "a cancelled Next returned late";
    EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << "the other sampler was not cancelled: " << waited;
    EXPECT_TRUE(absl::StrContains(waited.message(), "table 'state': no full batch of 4 within 400")) << waited;
    SampledBatch batch;
    const absl::Status later = sampler->Next(&batch);
    EXPECT_TRUE(absl::IsCancelled(later)) << later;
  }
}

TEST(ServiceTest, RateLimitedInsertWaitsWithoutStallingOtherStreams) {
  // "state" allows 3 inserts ahead of samples (spi 1, buffer 2).
  auto server = StartServer(TestConfig("max_size: 1000", R"pb(
    tables { name: "limited" max_size: 100 rate_limiter { samples_per_insert: 1 error_buffer: 2 }
             fields { name: "x" } })pb"));
  auto client = NewGrpcClient(server->address());
  // More workers' worth of blocked streams than the pool has threads (4).
  std::vector<std::jthread> blocked;
  std::atomic<int> done{0};
  for (int w = 0; w < 6; ++w) {
    blocked.emplace_back([&] {
      auto writer = *client->NewWriter();
      const float x = 1;
      for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(writer->Insert("limited", 1, {FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &x)}).ok());
      }
      EXPECT_TRUE(writer->Close().ok());
      ++done;
    });
  }
  EXPECT_TRUE(Eventually([&] { return client->Info()->tables(3).rate_limiter().blocked_inserts() > 0; }));
  // Meanwhile other tables are served.
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*writer, "state", 1).ok());
  ASSERT_TRUE(writer->Flush().ok());
  auto state = *client->NewSampler({.table = "state", .batch_size = 1, .num_batches = 1});
  SampledBatch batch;
  ASSERT_TRUE(state->Next(&batch).ok());
  EXPECT_LE(done.load(), 1) << "only 3 inserts fit before any sample";
  // Sampling the limited table releases the writers.
  auto limited = *client->NewSampler({.table = "limited", .batch_size = 3, .timeout = absl::Seconds(20)});
  for (int b = 0; b < 6 && done.load() < 6; ++b) ASSERT_TRUE(limited->Next(&batch).ok());
  blocked.clear();
  EXPECT_EQ(done.load(), 6);
  EXPECT_EQ(client->Info()->tables(3).rate_limiter().inserts(), 18);
}

TEST(ServiceTest, CheckpointAndRestoreOverGrpc) {
  // Two servers sharing one checkpoint directory.
  const std::string dir = absl::StrCat(::testing::TempDir(), "/service_test_", ::getpid(), "_shared");
  std::filesystem::create_directories(dir);
  config::ReplayConfig config = TestConfig();
  config.set_checkpoint_dir(dir);
  auto server = StartServer(config);
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/12).ok());
  auto bytes = client->Checkpoint("episode.ckpt");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto other = StartServer(config);
  auto other_client = NewGrpcClient(other->address());
  auto items = other_client->Restore("episode.ckpt");
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 12);
  auto missing = other_client->Restore("episode.ckpt.nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(ServiceTest, ShutdownEndsBlockedSamplersWithUnavailable) {
  auto server = StartServer(TestConfig());
  auto client = NewGrpcClient(server->address());
  auto sampler = *client->NewSampler({.table = "state", .batch_size = 1});
  absl::Status status;
  std::jthread t([&] {
    SampledBatch batch;
    status = sampler->Next(&batch);
  });
  EXPECT_TRUE(Eventually([&] { return client->Info()->tables(1).rate_limiter().blocked_samples() > 0; }));
  server->Shutdown();
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST(ServiceTest, ReferenceCodedFramesCrossTheWireAndSampleByteIdentical) {
  auto server = StartServer(testing::SceneConfig(/*max_size=*/1000));
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter({.max_items_per_request = 5});
  ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/60).ok());
  ASSERT_TRUE(writer->Close().ok());
  auto info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->frames(), 61);
  EXPECT_LT(info->frame_bytes(), 61 * 7700 / 3) << "frames are stored as the writer coded them";
  auto sampler = *client->NewSampler({.table = "scene", .batch_size = 100, .num_batches = 2});
  SampledBatch batch;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(sampler->Next(&batch).ok());
    EXPECT_TRUE(testing::SceneBatchMatches(batch));
  }
}

TEST(ServiceTest, FrameWithAReferenceNotHeldIsRefused) {
  auto server = StartServer(testing::SceneConfig(/*max_size=*/10));
  auto client = NewGrpcClient(server->address());
  auto writer = *client->NewWriter();
  const std::vector<uint8_t> a = testing::SceneFrame(0), b = testing::SceneFrame(1);
  FrameCompressor compressor;
  std::string z;
  compressor.Compress(b.data(), b.size(), &z, a.data());
  // The writer refuses a reference to a key it has not appended yet.
  EXPECT_EQ(writer->AppendCompressedFrame(z, proto::COMPRESSION_LZ4, 64, 64, 3, /*reference_key=*/0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Over the wire: a reference to a frame forgotten by the server.
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Replay::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Insert(&context);
  proto::InsertRequest request;
  auto* frame = request.add_frames();
  frame->set_key(5);
  frame->set_reference_key(3);
  auto* t = frame->mutable_pixels();
  t->set_dtype(proto::DTYPE_UINT8);
  for (int d : {64, 64, 3}) t->add_shape(d);
  t->set_compression(proto::COMPRESSION_LZ4);
  t->set_data(z);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "frame key 5: reference frame key 3 was not sent on this stream (or was forgotten)");
}

TEST(ServiceTest, CorruptCompressedFrameIsRefusedWithAClearStatusAndTheServerKeepsServing) {
  auto server = StartServer(testing::SceneConfig(/*max_size=*/10));
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Replay::NewStub(channel);
  const std::vector<uint8_t> pixels = testing::SceneFrame(0);
  FrameCompressor compressor;
  std::string block;
  compressor.Compress(pixels.data(), pixels.size(), &block);
  // Each bad frame ends its stream with INVALID_ARGUMENT naming the frame.
  struct Case {
    proto::Compression codec;
    std::string data;
    std::string message_start;
  };
  const Case cases[] = {
      {proto::COMPRESSION_LZ4, block.substr(0, block.size() / 2), "frame key 0: LZ4 block ("},
      {proto::COMPRESSION_LZ4, block + "trailing", "frame key 0: LZ4 block ("},
      {proto::COMPRESSION_LZ4, std::string(1 << 16, '\xff'), "frame key 0: LZ4 frame of 65536 bytes for 12288 raw"},
      {proto::COMPRESSION_ZSTD, "not zstd at all", "frame key 0: zstd frame content size does not match shape"},
      {static_cast<proto::Compression>(9), block, "frame key 0: unknown compression 9"},
  };
  for (const Case& c : cases) {
    grpc::ClientContext context;
    auto stream = stub->Insert(&context);
    proto::InsertRequest request;
    auto* frame = request.add_frames();
    frame->set_key(0);
    auto* t = frame->mutable_pixels();
    t->set_dtype(proto::DTYPE_UINT8);
    for (int d : {testing::kSceneSize, testing::kSceneSize, 3}) t->add_shape(d);
    t->set_compression(c.codec);
    t->set_data(c.data);
    stream->Write(request);
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message_start;
    EXPECT_TRUE(absl::StartsWith(status.error_message(), c.message_start)) << status.error_message();
  }
  auto client = NewGrpcClient(server->address());
  auto info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->frames(), 0) << "nothing of a refused request is stored";
  // A good writer still inserts and samples byte-identical frames.
  auto writer = *client->NewWriter();
  ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/12).ok());
  ASSERT_TRUE(writer->Close().ok());
  auto sampler = *client->NewSampler({.table = "scene", .batch_size = 32, .num_batches = 1});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_TRUE(testing::SceneBatchMatches(batch));
}

// A fresh folder under the test temp dir with a `checkpoints` folder (the
// server's) and an `outside` folder beside it.
std::filesystem::path CheckpointSandbox(const std::string& name) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("service_test_", ::getpid(), "_", name);
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "checkpoints");
  std::filesystem::create_directories(root / "outside");
  return root;
}

// Every regular file under `root`, relative to it.
std::set<std::string> FilesUnder(const std::filesystem::path& root) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_directory()) files.insert(std::filesystem::relative(entry.path(), root).string());
  }
  return files;
}

TEST(ServiceTest, CheckpointAndRestoreTakeOnlyANameInsideTheServersCheckpointDirectory) {
  const std::filesystem::path root = CheckpointSandbox("names");
  config::ReplayConfig config = TestConfig();
  config.set_checkpoint_dir((root / "checkpoints").string());
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto client = NewGrpcClient(server->address());
  {
    auto writer = *client->NewWriter();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(testing::InsertState(*writer, "state", i).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  // A plain name round-trips, inside the directory.
  auto bytes = client->Checkpoint("snapshot-1.ckpt");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, 0);
  auto items = client->Restore("snapshot-1.ckpt");
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 5);
  // Anything that is not one plain file name is refused, both ways.
  const std::string absolute = (root / "outside" / "absolute.ckpt").string();
  const std::string names[] = {"../outside/escape.ckpt", "..", ".", "../escape.ckpt", absolute, "sub/dir.ckpt",
                               "/etc/passwd", ".hidden", "", std::string(300, 'a'), "tab\tname", "new\nline",
                               "back\\slash", std::string("nul\0byte", 8)};
  for (const std::string& name : names) {
    for (const bool restore : {false, true}) {
      const absl::Status status = restore ? client->Restore(name).status() : client->Checkpoint(name).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << (restore ? "Restore " : "Checkpoint ") << name;
      EXPECT_EQ(status.message().find((root / "checkpoints").string()), std::string::npos)
          << "the server's folder is not told: " << status;
    }
  }
  // Nothing was written anywhere but the one checkpoint, and the data is kept.
  EXPECT_EQ(FilesUnder(root), (std::set<std::string>{"checkpoints/snapshot-1.ckpt"}));
  EXPECT_EQ(client->Info()->tables(1).size(), 5);
  std::filesystem::remove_all(root);
}

TEST(ServiceTest, RestoreQuotesNothingOfFilesTheServerDidNotWriteAndFollowsNoLink) {
  const std::filesystem::path root = CheckpointSandbox("foreign");
  std::ofstream(root / "checkpoints" / "notes.txt") << "SECRET-TOKEN-1234 a file an operator left here\n";
  std::ofstream(root / "outside" / "secret.txt") << "SECRET-TOKEN-5678\n";
  std::filesystem::create_symlink(root / "outside" / "secret.txt", root / "checkpoints" / "link.ckpt");
  std::filesystem::create_directories(root / "checkpoints" / "folder.ckpt");
  config::ReplayConfig config = TestConfig();
  config.set_checkpoint_dir((root / "checkpoints").string());
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto client = NewGrpcClient(server->address());
  const struct {
    const char* name;
    absl::StatusCode code;
  } cases[] = {{"notes.txt", absl::StatusCode::kDataLoss},
               {"link.ckpt", absl::StatusCode::kFailedPrecondition},
               {"folder.ckpt", absl::StatusCode::kFailedPrecondition},
               {"missing.ckpt", absl::StatusCode::kNotFound}};
  for (const auto& c : cases) {
    const absl::Status status = client->Restore(c.name).status();
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.name)) << status;
    EXPECT_FALSE(absl::StrContains(status.message(), "SECRET")) << status;
    EXPECT_FALSE(absl::StrContains(status.message(), root.string())) << status;
  }
  // Checkpoint over the link writes a new file in place of the link, never
  // through it.
  ASSERT_TRUE(client->Checkpoint("link.ckpt").ok());
  EXPECT_FALSE(std::filesystem::is_symlink(root / "checkpoints" / "link.ckpt"));
  std::ifstream secret(root / "outside" / "secret.txt");
  std::string line;
  std::getline(secret, line);
  EXPECT_EQ(line, "SECRET-TOKEN-5678");
  std::filesystem::remove_all(root);
}

TEST(ServiceTest, WithoutACheckpointDirectoryCheckpointAndRestoreAreRefused) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto client = NewGrpcClient(server->address());
  const std::string name = absl::StrCat("no_dir_", ::getpid(), ".ckpt");
  EXPECT_EQ(client->Checkpoint(name).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->Restore(name).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(name));
}

TEST(ServiceTest, AServerIsNotStartedOnAMissingCheckpointDirectory) {
  config::ReplayConfig config = TestConfig();
  config.set_checkpoint_dir(absl::StrCat(::testing::TempDir(), "/no_such_dir_", ::getpid()));
  auto server = Server::Start(config);
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StartsWith(server.status().message(), "replay.checkpoint_dir")) << server.status();
}

}  // namespace
}  // namespace troupe::replay
