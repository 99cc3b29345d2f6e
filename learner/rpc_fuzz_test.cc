// Fuzzing the services a learner serves (replay and parameters) over
// loopback gRPC, in process: a seeded loop that mutates valid requests
// (serialized bytes flipped, cut, grown, varints made huge; or fields set to
// edge values, lists grown and emptied, names made paths) and sends them to
// a real replay::Server and ParameterService. A crash, an abort or a
// sanitizer report fails it; so does a server that stops answering, or a
// file written anywhere but the server's checkpoint directory. Bounded for
// ctest (a few seconds); on demand:
//   TROUPE_FUZZ_ITERATIONS=100000 build/release/learner/rpc_fuzz_test
// (TROUPE_FUZZ_SEED=S to start elsewhere).
#include <grpcpp/create_channel.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fuzz.h"
#include "gtest/gtest.h"
#include "learner/service/parameter_service.h"
#include "proto/parameters.grpc.pb.h"
#include "proto/replay.grpc.pb.h"
#include "replay/server.h"

namespace troupe::learner {
namespace {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

constexpr char kReplayConfig[] = R"pb(
  tables {
    name: "pixels"
    max_size: 500
    fields { name: "obs" dtype: uint8 shape: [16, 16, 3] frames: 3 }
    fields { name: "action" shape: 2 }
    fields { name: "reward" }
    fields { name: "next_obs" dtype: uint8 shape: [16, 16, 3] frames: 3 }
  }
  tables { name: "state" max_size: 500 fields { name: "obs" shape: 24 } fields { name: "action" shape: 2 } }
  tables {
    name: "prioritized"
    max_size: 500
    selector: prioritized
    fields { name: "obs" shape: 24 }
    fields { name: "action" shape: 2 }
  }
  tables { name: "queue" max_size: 500 selector: fifo fields { name: "obs" shape: 24 } fields { name: "action" shape: 2 } }
)pb";

proto::Tensor FloatTensor(std::vector<int64_t> shape, float value) {
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  std::vector<float> values(static_cast<size_t>(n), value);
  t.set_data(values.data(), values.size() * sizeof(float));
  return t;
}

// Valid insert requests: items of a dense table, a column group, frames and
// a pixel item referring to them.
std::vector<proto::InsertRequest> InsertSeeds() {
  std::vector<proto::InsertRequest> seeds;
  for (const char* table : {"state", "prioritized", "queue"}) {
    proto::InsertRequest r;
    for (int i = 0; i < 2; ++i) {
      proto::ItemData* item = r.add_items();
      item->set_table(table);
      item->set_priority(1.0 + i);
      *item->add_fields()->mutable_tensor() = FloatTensor({24}, float(i));
      *item->add_fields()->mutable_tensor() = FloatTensor({2}, float(i));
    }
    r.set_ack(true);
    seeds.push_back(r);
  }
  {
    proto::InsertRequest r;
    proto::ItemGroup* group = r.add_item_groups();
    group->set_table("state");
    for (int64_t size : {24, 2}) {
      proto::FieldLayout* layout = group->add_fields();
      layout->set_dtype(proto::DTYPE_FLOAT32);
      layout->add_shape(size);
    }
    group->add_priorities(1.0);
    group->add_priorities(2.0);
    group->set_dense(std::string(2 * (24 + 2) * sizeof(float), '\0'));
    r.set_ack(true);
    seeds.push_back(r);
  }
  {
    proto::InsertRequest r;
    for (uint64_t key = 0; key < 4; ++key) {
      proto::FrameData* frame = r.add_frames();
      frame->set_key(key);
      proto::Tensor* pixels = frame->mutable_pixels();
      pixels->set_dtype(proto::DTYPE_UINT8);
      for (int d : {16, 16, 3}) pixels->add_shape(d);
      pixels->set_data(std::string(16 * 16 * 3, static_cast<char>(key * 40)));
    }
    proto::ItemData* item = r.add_items();
    item->set_table("pixels");
    item->set_priority(1.0);
    proto::FieldData* obs = item->add_fields();
    for (uint64_t k : {0, 1, 2}) obs->add_frame_keys(k);
    *item->add_fields()->mutable_tensor() = FloatTensor({2}, 0.5f);
    *item->add_fields()->mutable_tensor() = FloatTensor({}, 1.0f);
    proto::FieldData* next_obs = item->add_fields();
    for (uint64_t k : {1, 2, 3}) next_obs->add_frame_keys(k);
    r.set_forget_frames_before(1);
    r.set_ack(true);
    seeds.push_back(r);
  }
  return seeds;
}

// Sets one field somewhere in `message` to an edge value, or grows, shrinks
// or clears a list. Recurses into set sub-messages.
void MutateField(pb::Message* message, fuzz::Mutator& m, int depth = 0) {
  const pb::Descriptor* d = message->GetDescriptor();
  const pb::Reflection* r = message->GetReflection();
  if (d->field_count() == 0) return;
  const pb::FieldDescriptor* f = d->field(static_cast<int>(m.Uniform(0, d->field_count() - 1)));
  if (f->is_repeated()) {
    const int size = r->FieldSize(*message, f);
    const int op = static_cast<int>(m.Uniform(0, 3));
    if (op == 0 && size > 0) {
      r->RemoveLast(message, f);
      return;
    }
    if (op == 1) {
      r->ClearField(message, f);
      return;
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (size > 0 && (op == 2 || m.OneIn(2))) {
        pb::Message* element = r->MutableRepeatedMessage(message, f, static_cast<int>(m.Uniform(0, size - 1)));
        if (depth < 4) MutateField(element, m, depth + 1);
      } else if (size > 0) {
        r->AddMessage(message, f)->CopyFrom(r->GetRepeatedMessage(*message, f, 0));  // duplicate the first
      } else {
        r->AddMessage(message, f);
      }
      return;
    }
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT64: r->AddInt64(message, f, m.EdgeInteger()); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(message, f, static_cast<uint64_t>(m.EdgeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_INT32: r->AddInt32(message, f, static_cast<int32_t>(m.EdgeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(message, f, m.EdgeDouble()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(message, f, static_cast<float>(m.EdgeDouble())); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->AddString(message, f, m.EdgeString()); break;
      default: break;
    }
    return;
  }
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      if (depth < 4) MutateField(r->MutableMessage(message, f), m, depth + 1);
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(message, f, m.EdgeInteger()); break;
    case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(message, f, static_cast<uint64_t>(m.EdgeInteger())); break;
    case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(message, f, static_cast<int32_t>(m.EdgeInteger())); break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(message, f, m.EdgeDouble()); break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(message, f, static_cast<float>(m.EdgeDouble())); break;
    case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(message, f, m.OneIn(2)); break;
    case pb::FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(message, f, static_cast<int>(m.EdgeInteger())); break;
    case pb::FieldDescriptor::CPPTYPE_STRING:
      if (f->type() == pb::FieldDescriptor::TYPE_BYTES && m.OneIn(2)) {
        std::string bytes = r->GetString(*message, f);
        m.MutateBytes(bytes);
        r->SetString(message, f, bytes);
      } else {
        r->SetString(message, f, m.EdgeString());
      }
      break;
    default:
      break;
  }
}

// `seed` mutated 1-3 times: its serialized bytes (kept when they still
// parse) or its fields.
template <typename Message>
Message Mutated(const Message& seed, fuzz::Mutator& m) {
  Message out = seed;
  for (int k = static_cast<int>(m.Uniform(1, 3)); k > 0; --k) {
    if (m.OneIn(2)) {
      std::string bytes = out.SerializeAsString();
      m.MutateBytes(bytes);
      Message parsed;
      if (parsed.ParseFromString(bytes)) {
        out = std::move(parsed);
        continue;
      }
    }
    MutateField(&out, m);
  }
  return out;
}

std::chrono::system_clock::time_point In(int milliseconds) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(milliseconds);
}

TEST(RpcFuzzTest, MutatedReplayAndParameterRequestsNeverCrashTheServersOrWriteOutsideTheCheckpointDirectory) {
  // The servers, in a scratch folder that only the checkpoint dir may change.
  const fs::path scratch = fs::path(::testing::TempDir()) / absl::StrCat("rpc_fuzz_", getpid());
  fs::remove_all(scratch);
  fs::create_directories(scratch / "checkpoints");
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch);
  config::ReplayConfig replay_config;
  ASSERT_TRUE(pb::TextFormat::ParseFromString(kReplayConfig, &replay_config));
  replay_config.set_checkpoint_dir((scratch / "checkpoints").string());
  auto replay_server = replay::Server::Start(replay_config);
  ASSERT_TRUE(replay_server.ok()) << replay_server.status();
  ParameterStore store;
  std::vector<float> policy(1000, 0.25f);
  store.Publish(/*version=*/1000, "policy", policy);
  ParameterService parameter_service(&store);
  int parameter_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &parameter_port);
  builder.RegisterService(&parameter_service);
  std::unique_ptr<grpc::Server> parameter_server = builder.BuildAndStart();
  ASSERT_NE(parameter_server, nullptr);

  auto replay = proto::Replay::NewStub(
      grpc::CreateChannel((*replay_server)->address(), grpc::InsecureChannelCredentials()));
  auto parameters = proto::Parameters::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", parameter_port), grpc::InsecureChannelCredentials()));

  // Seeds, and some data to sample.
  const std::vector<proto::InsertRequest> inserts = InsertSeeds();
  for (int round = 0; round < 20; ++round) {
    for (const proto::InsertRequest& request : inserts) {
      grpc::ClientContext context;
      context.set_deadline(In(5000));
      auto stream = replay->Insert(&context);
      stream->Write(request);
      stream->WritesDone();
      proto::InsertResponse response;
      while (stream->Read(&response)) {
      }
      const grpc::Status status = stream->Finish();
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }
  proto::SampleRequest sample_seed;
  sample_seed.set_table("state");
  sample_seed.set_batch_size(8);
  sample_seed.set_num_batches(2);
  sample_seed.set_timeout_ms(20);
  proto::MutatePrioritiesRequest priorities_seed;
  priorities_seed.set_table("prioritized");
  for (uint64_t key : {1, 2, 3}) {
    priorities_seed.add_keys(key);
    priorities_seed.add_priorities(0.5 * key);
  }
  proto::CheckpointRequest checkpoint_seed;
  checkpoint_seed.set_name("fuzz.ckpt");
  proto::RestoreRequest restore_seed;
  restore_seed.set_name("fuzz.ckpt");
  proto::GetParametersRequest parameters_seed;
  parameters_seed.set_have_version(10);
  parameters_seed.add_names("policy");

  const fuzz::Budget budget = fuzz::Budget::FromEnvironment(/*default_iterations=*/1'000'000, /*default_seconds=*/12);
  int64_t calls_by_kind[7] = {}, ok_by_kind[7] = {};
  // Protobuf's complaints about the invalid UTF-8 the mutations make are
  // expected: kept out of the log.
  const pb::LogSilencer quiet;
  const int64_t iterations = fuzz::Loop(budget, [&](uint64_t seed) {
    fuzz::Mutator m(seed);
    const int kind = static_cast<int>(m.Uniform(0, 99));
    grpc::ClientContext context;
    grpc::Status status;
    int k = 0;
    bool answered = false;  // a stream's first message counts as an answer
    if (kind < 45) {  // Insert: a stream of 1-3 mutated requests
      k = 0;
      context.set_deadline(In(2000));
      auto stream = replay->Insert(&context);
      for (int n = static_cast<int>(m.Uniform(1, 3)); n > 0; --n) {
        proto::InsertRequest request = Mutated(inserts[static_cast<size_t>(m.Uniform(0, inserts.size() - 1))], m);
        request.set_ack(m.OneIn(2));
        if (!stream->Write(request)) break;
      }
      stream->WritesDone();
      proto::InsertResponse response;
      while (stream->Read(&response)) {
      }
      status = stream->Finish();
    } else if (kind < 60) {  // Sample
      k = 1;
      context.set_deadline(In(100));
      proto::SampleRequest request = Mutated(sample_seed, m);
      auto reader = replay->Sample(&context, request);
      proto::SampleResponse response;
      for (int batches = 0; batches < 4 && reader->Read(&response); ++batches) answered = true;
      context.TryCancel();
      status = reader->Finish();
    } else if (kind < 72) {  // MutatePriorities
      k = 2;
      context.set_deadline(In(2000));
      proto::MutatePrioritiesResponse response;
      status = replay->MutatePriorities(&context, Mutated(priorities_seed, m), &response);
    } else if (kind < 77) {  // Info
      k = 3;
      context.set_deadline(In(2000));
      proto::InfoResponse response;
      status = replay->Info(&context, Mutated(proto::InfoRequest(), m), &response);
    } else if (kind < 84) {  // Checkpoint
      k = 4;
      context.set_deadline(In(5000));
      proto::CheckpointResponse response;
      status = replay->Checkpoint(&context, Mutated(checkpoint_seed, m), &response);
    } else if (kind < 91) {  // Restore
      k = 5;
      context.set_deadline(In(5000));
      proto::RestoreResponse response;
      status = replay->Restore(&context, Mutated(restore_seed, m), &response);
    } else {  // Parameters.Get: the first update, if any comes at once
      k = 6;
      context.set_deadline(In(20));
      auto reader = parameters->Get(&context, Mutated(parameters_seed, m));
      proto::ParametersUpdate update;
      answered = reader->Read(&update);
      context.TryCancel();
      status = reader->Finish();
    }
    ++calls_by_kind[k];
    if (status.ok() || answered) ++ok_by_kind[k];
    // A server that dies or stops answering fails at once. One UNAVAILABLE is
    // an answer: a writer session whose previous insert stream is still open
    // is refused until it ends (the writer retries), and mutated writer ids
    // make two streams of one writer likely.
    const bool session_busy = status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                              absl::StrContains(status.error_message(), "previous insert stream is still open");
    ASSERT_TRUE(status.error_code() != grpc::StatusCode::UNAVAILABLE || session_busy)
        << "seed " << seed << ": " << status.error_message();
  });

  // Both servers still answer, and serve what they should.
  {
    grpc::ClientContext context;
    context.set_deadline(In(5000));
    proto::InfoResponse info;
    ASSERT_TRUE(replay->Info(&context, proto::InfoRequest(), &info).ok());
    EXPECT_EQ(info.tables_size(), 4);
  }
  {
    grpc::ClientContext context;
    context.set_deadline(In(5000));
    proto::GetParametersRequest request;
    auto reader = parameters->Get(&context, request);
    proto::ParametersUpdate update;
    ASSERT_TRUE(reader->Read(&update));
    EXPECT_EQ(update.version(), 1000);
    context.TryCancel();
    reader->Finish();
  }
  (*replay_server)->Shutdown();
  store.Close();
  parameter_server->Shutdown(In(500));
  fs::current_path(cwd);
  // Nothing outside the checkpoint directory.
  std::vector<std::string> outside;
  for (const auto& entry : fs::recursive_directory_iterator(scratch)) {
    const std::string relative = fs::relative(entry.path(), scratch).string();
    if (relative != "checkpoints" && relative.rfind("checkpoints/", 0) != 0) outside.push_back(relative);
    if (relative.rfind("checkpoints/", 0) == 0) {
      EXPECT_EQ(relative.find('/', 12), std::string::npos) << "a folder inside the checkpoint dir: " << relative;
    }
  }
  fs::remove_all(scratch);
  for (const std::string& path : outside) ADD_FAILURE() << "written outside the checkpoint directory: " << path;

  const char* names[] = {"Insert", "Sample", "MutatePriorities", "Info", "Checkpoint", "Restore", "Parameters.Get"};
  std::printf("rpc fuzz: %lld iterations from seed %llu:", static_cast<long long>(iterations),
              static_cast<unsigned long long>(budget.seed));
  for (int k = 0; k < 7; ++k) {
    std::printf(" %s %lld (%lld answered)", names[k], static_cast<long long>(calls_by_kind[k]),
                static_cast<long long>(ok_by_kind[k]));
  }
  std::printf("\n");
  EXPECT_GT(iterations, 0);
  EXPECT_GT(ok_by_kind[0], 0) << "no mutated insert was ever accepted: the mutations test nothing past the checks";
}

}  // namespace
}  // namespace troupe::learner
