// `troupe bench replay`: insert and sample throughput of the replay
// service, in-process and over loopback gRPC, for state transitions (24
// floats) and pixel transitions (3 stacked 84x84x3 frames), and the resident
// memory per stored pixel transition, with frames rendered from real
// episodes of cartpole.swingup and walker.walk.
//
// Every comparison with a peer is measured by the one protocol
// (bench/protocol.h: a warm-up round of each side, then 5 rounds alternated
// troupe, peer, ..., the same seconds each, medians and their ratio):
//  - gRPC inserts as actors make them (ActorStream below: one env's steps
//    through actors::TransitionWriter on a resumable writer session, each
//    new frame compressed by Writer::AppendFrame INSIDE the timed loop)
//    against raw loopback gRPC pushing messages of the size troupe's
//    requests had, on one stream held open across the rounds as the
//    writer's session is: the same wire bytes an item (the headline, in
//    wire MB/s; items/s and per CPU-second rows from the same rounds). The decoded
//    bytes (each new frame's 21,168 B and the dense fields) against a raw
//    push of those is a second protocol run, named "decoded bytes". The
//    same inserts with an actor's Flush every 16 steps (one writer waiting
//    for each request's ack, as actors/actor.cc does) are a row of their
//    own, and so are frames compressed before the timed loop
//    (AppendCompressedFrame, which no actor does): the transport and the
//    service alone.
//  - gRPC sampling against a raw pull of messages of the response's size.
//  - Inserts over TLS with a token (common/grpc_security.h) against the same
//    inserts without them (`--only tls` runs just those rows).
//  - A checkpoint of the pixel transitions held (learner.checkpoint_replay)
//    written and restored, against plain write()+fsync() and read() of as
//    many bytes (`--only checkpoint` runs the rows up to those).
// Sampling is also given per CPU-second of the sampling thread, since these
// machines are shared. Single figures (in-process rates, sizes) and the
// learner's whole checkpoint of the default pixel config as one generation
// against the single files it wrote before (troupe against troupe, best of
// 3) are measured once.
#include <grpcpp/create_channel.h>
#include <fcntl.h>
#include <grpcpp/server_builder.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/transition_writer.h"
#include "agents/d4pg_agent.h"
#include "agents/transition.h"
#include "bench/bench.h"
#include "common/certificates.h"
#include "common/config.h"
#include "common/files.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "envs/env.h"
#include "learner/rl_learner.h"
#include "proto/bench.grpc.pb.h"
#include "replay/client.h"
#include "replay/grpc_client.h"
#include "replay/server.h"

namespace troupe::bench {
namespace {

using replay::FieldValue;

constexpr int kH = 84, kW = 84, kC = 3, kStack = 3;
constexpr int kStateSize = 24, kActionSize = 6;
constexpr int kBatch = 256;
constexpr double kMB = 1e6;

// Resident set size of this process, from /proc/self/statm.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// CPU seconds of the whole process (client and server threads of a
// loopback figure).
double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Renders `frames` 84x84 RGB frames from random-action episodes of `task`.
absl::Status RenderFrames(const std::string& task, int action_repeat, int frames, uint64_t seed,
                          std::vector<std::vector<uint8_t>>* out) {
  envs::EnvOptions options;
  options.task = task;
  options.seed = seed;
  options.pixels = true;
  options.action_repeat = action_repeat;
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(auto env, envs::MakeEnv(options));
  const envs::EnvSpec& spec = env->spec();
  if (spec.height != kH || spec.width != kW || spec.channels != kC) {
    return absl::FailedPreconditionError(absl::StrCat(task, ": expected 84x84x3 pixels"));
  }
  std::vector<float> state(spec.state_size), action(spec.action_size);
  std::vector<uint8_t> pixels(spec.pixel_bytes());
  envs::ObservationBuffers buffers{state.data(), pixels.data()};
  std::mt19937 rng(seed);
  RETURN_IF_ERROR(env->Reset(buffers).status());
  for (int i = 0; i < frames; ++i) {
    out->push_back(pixels);
    for (int a = 0; a < spec.action_size; ++a) {
      action[a] = std::uniform_real_distribution<float>(spec.action_minimum[a], spec.action_maximum[a])(rng);
    }
    ASSIGN_OR_RETURN(envs::TimeStep t, env->Step(action, buffers));
    if (t.step_type == envs::StepType::kLast) RETURN_IF_ERROR(env->Reset(buffers).status());
  }
  return absl::OkStatus();
}

config::ReplayConfig BenchConfig(int64_t max_size) {
  config::ReplayConfig c;
  c.set_worker_threads(2);
  for (const char* name : {"state", "pixels"}) {
    auto* t = c.add_tables();
    t->set_name(name);
    t->set_max_size(max_size);
    // The D4PG transition (agents/transition.h).
    const bool pixels = std::string(name) == "pixels";
    agents::AddTransitionFields(pixels ? agents::ObservationSpec{.frames = kStack, .height = kH, .width = kW}
                                       : agents::ObservationSpec{.state_size = kStateSize},
                                kActionSize, t);
  }
  return c;
}

constexpr double kStateBytes = (2 * kStateSize + kActionSize + 2) * 4.0;
constexpr double kPixelRawBytes = 2.0 * kStack * kH * kW * kC + (kActionSize + 2) * 4.0;

absl::Status InsertState(replay::Writer& writer, long n) {
  std::vector<float> obs(kStateSize, 0.5f), next(kStateSize, 0.25f), action(kActionSize, 0.1f);
  const float reward = 1, discount = 0.99f;
  for (long i = 0; i < n; ++i) {
    obs[0] = static_cast<float>(i);
    RETURN_IF_ERROR(writer.Insert("state", 1.0,
                                  {FieldValue::Dense(proto::DTYPE_FLOAT32, {kStateSize}, obs.data()),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {kActionSize}, action.data()),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {kStateSize}, next.data())}));
  }
  return absl::OkStatus();
}

// A frame as a writer sends it: compressed, maybe against the frame
// `reference_back` positions earlier in the sequence.
struct WireFrame {
  std::string data;  // LZ4 (replay::FrameEncoder's default codec)
  int reference_back = 0;  // 0: compressed alone
};

// Inserts `n` pixel transitions, one new frame each, cycling through the
// frames (`raw`: AppendFrame compresses them, as an actor's writer does;
// else AppendCompressedFrame of `wire`, compressed before the timed loop,
// which no actor does: the transport alone); stacks are the last
// frames of the stream. *cursor counts the writer's frames (it starts at 0
// with the writer, so it is also the next frame's key).
absl::Status InsertPixels(replay::Writer& writer, const std::vector<std::vector<uint8_t>>* raw,
                          const std::vector<WireFrame>* wire, long n, long* cursor) {
  std::vector<float> action(kActionSize, 0.1f);
  const float reward = 1, discount = 0.99f;
  const size_t size = raw != nullptr ? raw->size() : wire->size();
  auto append = [&]() -> absl::StatusOr<uint64_t> {
    const uint64_t key = static_cast<uint64_t>(*cursor);
    const size_t i = (*cursor)++ % size;
    if (raw != nullptr) return writer.AppendFrame((*raw)[i].data(), kH, kW, kC);
    const WireFrame& w = (*wire)[i];
    if (w.reference_back == 0) return writer.AppendCompressedFrame(w.data, proto::COMPRESSION_LZ4, kH, kW, kC);
    return writer.AppendCompressedFrame(w.data, proto::COMPRESSION_LZ4, kH, kW, kC,
                                        /*reference_key=*/key - w.reference_back);
  };
  for (long i = 0; i < n; ++i) {
    // A new episode every 1000 steps starts with 3 frames.
    if (*cursor % 1000 == 0) {
      for (int k = 0; k < kStack; ++k) RETURN_IF_ERROR(append().status());
    }
    ASSIGN_OR_RETURN(uint64_t key, append());
    RETURN_IF_ERROR(writer.Insert("pixels", 1.0,
                                  {FieldValue::Frames({key - 3, key - 2, key - 1}),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {kActionSize}, action.data()),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                                   FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount),
                                   FieldValue::Frames({key - 2, key - 1, key})}));
  }
  return absl::OkStatus();
}

// An actor's insert path (actors/actor.cc): one env's steps (the default
// pixel config's pool) through actors::TransitionWriter, n-step 3, each new
// frame appended once with Writer::AppendFrame (compressed on this thread,
// against a recent similar frame when that pays), on the writer the caller
// made as actors make theirs (resumable over gRPC: the writer asks for an
// ack itself once 64 MiB wait). With `flush_every` 16 it also flushes every
// 16 steps, as actors/actor.cc does (kFlushEvery pool steps, the default
// pixel config's 1 env: one writer waits for replay's ack of each request);
// 0: the writer's stream alone, as many actors' streams together keep
// replay busy. Episodes of 1000 steps. `frames`: the rendered frames,
// cycled through; nullptr: state transitions (24 floats).
class ActorStream {
 public:
  static constexpr int kActorFlushEvery = 16, kEpisodeSteps = 1000;

  ActorStream(replay::Writer* writer, const std::vector<std::vector<uint8_t>>* frames,
              const actors::TransitionLayout& layout, int flush_every = 0)
      : writer_(writer),
        frames_(frames),
        flush_every_(flush_every),
        transitions_(writer, /*num_envs=*/1, layout),
        state_(kStateSize, 0.5f),
        action_(kActionSize, 0.1f) {}

  // The layout of `table` of BenchConfig: pixel or state transitions.
  static absl::StatusOr<actors::TransitionLayout> Layout(bool pixels) {
    actors::TransitionLayout layout;
    ASSIGN_OR_RETURN(layout.signature,
                     agents::TransitionSignature(pixels ? agents::ObservationSpec{.frames = kStack, .height = kH,
                                                                                  .width = kW}
                                                        : agents::ObservationSpec{.state_size = kStateSize},
                                                 kActionSize));
    layout.n_step = 3;
    layout.table = pixels ? "pixels" : "state";
    return layout;
  }

  // The next `n` env steps.
  absl::Status Steps(long n) {
    for (long i = 0; i < n; ++i) {
      const uint8_t* frame = frames_ != nullptr ? (*frames_)[steps_ % frames_->size()].data() : nullptr;
      state_[0] = static_cast<float>(steps_);
      if (steps_ % kEpisodeSteps == 0) {
        RETURN_IF_ERROR(transitions_.Start(0, state_.data(), frame));
      } else {
        const bool last = (steps_ + 1) % kEpisodeSteps == 0;
        RETURN_IF_ERROR(transitions_.Step(0, action_.data(), /*reward=*/1, /*discount=*/1, last, state_.data(), frame));
      }
      ++steps_;
      if (flush_every_ > 0 && steps_ % flush_every_ == 0) RETURN_IF_ERROR(writer_->Flush());
    }
    return absl::OkStatus();
  }

  // Env steps so far: frames appended, for pixels.
  long steps() const { return steps_; }

 private:
  replay::Writer* writer_;
  const std::vector<std::vector<uint8_t>>* frames_;
  int flush_every_;
  actors::TransitionWriter transitions_;
  std::vector<float> state_, action_;
  long steps_ = 0;
};

// One timed window of inserts: `insert(64)` until `seconds` passed, then a
// Flush (timed: the items are in their tables); what went on the wire.
struct InsertWindow {
  double seconds = 0, items = 0, wire_bytes = 0, cpu_seconds = 0;  // CPU: the whole process
};
absl::StatusOr<InsertWindow> TimeInserts(replay::Writer& writer, const std::function<absl::Status(long)>& insert,
                                         double seconds) {
  const int64_t items = writer.items_queued(), bytes = writer.bytes_sent();
  const double cpu = ProcessCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  do {
    RETURN_IF_ERROR(insert(64));
  } while (elapsed() < seconds);
  RETURN_IF_ERROR(writer.Flush());
  InsertWindow w;
  w.seconds = elapsed();
  w.cpu_seconds = std::max(ProcessCpuSeconds() - cpu, 1e-9);
  w.items = static_cast<double>(writer.items_queued() - items);
  w.wire_bytes = static_cast<double>(writer.bytes_sent() - bytes);
  if (w.items <= 0 || w.wire_bytes <= 0) return absl::InternalError("an insert window sent nothing");
  return w;
}

// Another figure of the same alternated rounds as `measured` (per
// CPU-second, in other units): its rates, ranges and ratio of medians, the
// protocol's rounds and label.
Comparison SameRounds(const Comparison& measured, std::vector<double> troupe, std::vector<double> peer) {
  Comparison c = measured;
  c.troupe = Summarize(std::move(troupe));
  c.peer = Summarize(std::move(peer));
  c.ratio = c.peer.median > 0 ? c.troupe.median / c.peer.median : 0;
  return c;
}

// The protocol of every comparison here (bench.h's DefaultProtocol: 5
// rounds, or --rounds): both sides share the machine's CPUs (a client
// thread and the servers' threads), unpinned.
ProtocolOptions ReplayProtocol(const Options& options) { return DefaultProtocol(options, SchedulableCpus()); }

// The raw reference: a callback service that drops what it is pushed and
// streams back fixed-size blobs.
class RawService final : public proto::RawStream::CallbackService {
  grpc::ServerReadReactor<proto::Blob>* Push(grpc::CallbackServerContext*, proto::BlobCount* count) override {
    class Reader : public grpc::ServerReadReactor<proto::Blob> {
     public:
      explicit Reader(proto::BlobCount* count) : count_(count) { StartRead(&blob_); }
      void OnReadDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::OK);
        count_->set_messages(count_->messages() + 1);
        count_->set_bytes(count_->bytes() + static_cast<int64_t>(blob_.data().size()));
        StartRead(&blob_);
      }
      void OnDone() override { delete this; }
     private:
      proto::BlobCount* count_;
      proto::Blob blob_;
    };
    return new Reader(count);
  }
  grpc::ServerWriteReactor<proto::Blob>* Pull(grpc::CallbackServerContext*, const proto::PullRequest* request) override {
    class Writer : public grpc::ServerWriteReactor<proto::Blob> {
     public:
      explicit Writer(const proto::PullRequest& r) : left_(r.messages()) {
        blob_.mutable_data()->assign(r.bytes(), 'x');
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::CANCELLED);
        Next();
      }
      void OnDone() override { delete this; }
     private:
      void Next() {
        if (left_-- <= 0) return Finish(grpc::Status::OK);
        StartWrite(&blob_);
      }
      int64_t left_;
      proto::Blob blob_;
    };
    return new Writer(*request);
  }
};

struct RawServer {
  RawServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(256 << 20);
    builder.SetMaxSendMessageSize(256 << 20);
    server = builder.BuildAndStart();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    stub = proto::RawStream::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  }
  struct Window {
    double rate = 0, per_cpu_second = 0;
  };
  // A push stream held open across the rounds of a comparison, as a replay
  // writer holds its session: a window counts the blobs written in it,
  // neither the stream's setup nor the flow-control window's growth that a
  // fresh stream goes through in its first second (a stream opened per
  // round made the raw push faster the longer the round).
  class PushStream {
   public:
    explicit PushStream(proto::RawStream::Stub& stub) : writer_(stub.Push(&context_, &count_)) {}
    ~PushStream() {
      writer_->WritesDone();
      (void)writer_->Finish();
    }
    // Blobs of `bytes` for `seconds`: bytes/s, and bytes per CPU-second of
    // this process (client and server together).
    Window For(int64_t bytes, double seconds) {
      if (static_cast<int64_t>(blob_.data().size()) != bytes) blob_.mutable_data()->assign(bytes, 'x');
      const double cpu = ProcessCpuSeconds();
      const auto start = std::chrono::steady_clock::now();
      auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
      long n = 0;
      do {
        writer_->Write(blob_);
        ++n;
      } while (elapsed() < seconds);
      const double total = static_cast<double>(n) * static_cast<double>(bytes);
      return {total / elapsed(), total / std::max(ProcessCpuSeconds() - cpu, 1e-9)};
    }

   private:
    grpc::ClientContext context_;
    proto::BlobCount count_;
    std::unique_ptr<grpc::ClientWriter<proto::Blob>> writer_;
    proto::Blob blob_;
  };
  // One window pulling blobs of `bytes` on one stream for `seconds` (its
  // setup included); bytes/s.
  double PullFor(int64_t bytes, double seconds) {
    grpc::ClientContext context;
    proto::PullRequest request;
    request.set_bytes(bytes);
    request.set_messages(int64_t{1} << 40);
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    auto reader = stub->Pull(&context, request);
    proto::Blob blob;
    long n = 0;
    while (elapsed() < seconds && reader->Read(&blob)) ++n;
    const double rate = static_cast<double>(n) * static_cast<double>(bytes) / elapsed();
    context.TryCancel();
    while (reader->Read(&blob)) {
    }
    (void)reader->Finish();
    return rate;
  }
  RawService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<proto::RawStream::Stub> stub;
};

// Samples/s of `sampler` over about `seconds`; also the batch bytes and,
// when `cpu_rate` is set, samples per CPU-second of this thread (what one
// core would do on a machine shared with other work).
absl::StatusOr<double> SampleRate(replay::Sampler& sampler, double seconds, double* batch_bytes,
                                  double* cpu_rate = nullptr) {
  replay::SampledBatch batch;
  absl::Status error;
  long batches = 0;
  double cpu = 0;
  const double rate = MeasureRate(seconds, [&](long n) {
    const double start = ThreadCpuSeconds();
    for (long i = 0; i < n && error.ok(); ++i) error = sampler.Next(&batch);
    cpu = ThreadCpuSeconds() - start;
    batches = n;
  });
  if (cpu_rate != nullptr) *cpu_rate = cpu > 0 ? static_cast<double>(batches) * kBatch / cpu : 0;
  RETURN_IF_ERROR(error);
  *batch_bytes = 0;
  for (const auto& f : batch.fields) *batch_bytes += static_cast<double>(f.data.size());
  return rate * kBatch;
}

// Inserts over TLS + token against the same inserts over plain loopback
// gRPC, by the protocol (TLS the troupe side, plain the peer): two fresh
// servers, a writer on each made as actors make theirs (resumable), for
// three kinds of inserts: pixel transitions as actors write them
// (ActorStream: AppendFrame compresses each frame on the writer's thread),
// the same transitions with frames compressed
// beforehand (the transport alone; no actor inserts so), and state
// transitions as actors write them. Each with items per CPU-second of the
// whole process (writer and both servers) from the same rounds: what TLS
// costs, apart from how the two cores were shared in a round. Certificates
// are made for the run (troupe certs).
absl::Status AddTlsInsertFigures(Report& report, const std::vector<std::vector<uint8_t>>& raw,
                                 const std::vector<WireFrame>& wire, const Options& options) {
  char dir_template[] = "/tmp/troupe-bench-certs-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  absl::Cleanup remove_dir = [&] { std::filesystem::remove_all(dir); };
  RETURN_IF_ERROR(WriteCertificates(dir + "/certs", {}));
  config::SecurityConfig security;
  security.set_certs_dir(dir + "/certs");
  ASSIGN_OR_RETURN(const GrpcCredentials tls, LoadGrpcCredentials(security));
  const config::ReplayConfig replay_config = BenchConfig(options.quick ? 20000 : 200000);
  ASSIGN_OR_RETURN(auto plain_server, replay::Server::Start(replay_config));
  ASSIGN_OR_RETURN(auto tls_server, replay::Server::Start(replay_config, tls));
  auto plain_client = replay::NewGrpcClient(plain_server->address());
  auto tls_client = replay::NewGrpcClient(tls_server->address(), {.credentials = tls});
  const ProtocolOptions protocol = ReplayProtocol(options);
  enum Kind { kPixelsAsActorsWrite, kPixelsPrecompressed, kState };
  for (const Kind kind : {kPixelsAsActorsWrite, kPixelsPrecompressed, kState}) {
    const replay::WriterOptions writer_options{.resumable = true};
    ASSIGN_OR_RETURN(auto plain_writer, plain_client->NewWriter(writer_options));
    ASSIGN_OR_RETURN(auto tls_writer, tls_client->NewWriter(writer_options));
    ASSIGN_OR_RETURN(const actors::TransitionLayout layout, ActorStream::Layout(kind != kState));
    const auto* frames = kind == kPixelsAsActorsWrite ? &raw : nullptr;
    ActorStream plain_stream(plain_writer.get(), frames, layout), tls_stream(tls_writer.get(), frames, layout);
    long plain_cursor = 0, tls_cursor = 0;
    std::vector<double> per_cpu[2];  // TLS, plain: items per process CPU-second
    auto side = [&](bool use_tls) -> Side {
      return [&, use_tls](const Round& round) -> absl::StatusOr<double> {
        replay::Writer& writer = use_tls ? *tls_writer : *plain_writer;
        ActorStream& stream = use_tls ? tls_stream : plain_stream;
        long* cursor = use_tls ? &tls_cursor : &plain_cursor;
        ASSIGN_OR_RETURN(const InsertWindow w, TimeInserts(
                                                   writer,
                                                   [&](long n) {
                                                     return kind == kPixelsPrecompressed
                                                                ? InsertPixels(writer, nullptr, &wire, n, cursor)
                                                                : stream.Steps(n);
                                                   },
                                                   round.seconds));
        if (!round.warmup) per_cpu[use_tls ? 0 : 1].push_back(w.items / w.cpu_seconds);
        return w.items / w.seconds;
      };
    };
    ASSIGN_OR_RETURN(const Comparison c, CompareAlternated(side(true), side(false), protocol));
    RETURN_IF_ERROR(plain_writer->Close());
    RETURN_IF_ERROR(tls_writer->Close());
    const char* what = kind == kPixelsAsActorsWrite
                           ? "pixel transitions as actors write them (LZ4 on the writer)"
                       : kind == kPixelsPrecompressed
                           ? "pixel transitions, frames compressed beforehand (the transport alone)"
                           : "state transitions as actors write them";
    report.Add(absl::StrFormat("gRPC insert, %s, TLS + token (bar: 0.8x)", what), "items/s",
               "the same inserts without TLS or token", c);
    report.Add(absl::StrFormat("gRPC insert, %s, per CPU-second (writer + server), TLS + token", what),
               "items/CPU-s", "the same inserts without TLS or token",
               SameRounds(c, std::move(per_cpu[0]), std::move(per_cpu[1])));
  }
  tls_server->Shutdown();
  plain_server->Shutdown();
  return absl::OkStatus();
}

}  // namespace

// Seconds to write `bytes` bytes to `path` with write() in 1 MiB pieces and
// fsync(), and (in *read_seconds) to read them back with read(): what a
// checkpoint of that size costs at least, on the same disk.
absl::StatusOr<double> RawFileSeconds(const std::string& path, int64_t bytes, double* read_seconds) {
  std::vector<char> piece(1 << 20, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  const int out = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = write(out, piece.data(), static_cast<size_t>(std::min<int64_t>(piece.size(), bytes - done)));
    if (n <= 0) {
      close(out);
      return absl::DataLossError(absl::StrCat("write failed: ", path));
    }
    done += n;
  }
  const bool synced = fsync(out) == 0;
  close(out);
  if (!synced) return absl::DataLossError(absl::StrCat("fsync failed: ", path));
  const auto t1 = std::chrono::steady_clock::now();
  const int in = open(path.c_str(), O_RDONLY);
  if (in < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  while (read(in, piece.data(), piece.size()) > 0) {
  }
  close(in);
  *read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return std::chrono::duration<double>(t1 - t0).count();
}

// A checkpoint of `replay`'s `held` pixel transitions (what
// learner.checkpoint_replay writes) and its restore, against writing and
// reading as many bytes with plain write()+fsync() and read() in the same
// folder, by the protocol: each round writes and restores (or writes and
// reads) until its seconds have passed, at least once; the write is the
// protocol's figure and the restore (read) another of the same rounds.
absl::Status AddCheckpointFigures(Report& report, replay::Replay& replay, long held, const Options& options) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("troupe_bench_checkpoint_", getpid())).string();
  std::filesystem::create_directories(dir);
  absl::Cleanup remove = [&dir] { std::filesystem::remove_all(dir); };
  const std::string path = dir + "/replay.ckpt";
  int64_t bytes = 0;
  std::vector<double> restores, reads;  // MB/s, measured rounds
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const Side troupe = [&](const Round& round) -> absl::StatusOr<double> {
    double write_seconds = 0, restore_seconds = 0, written = 0, restored = 0;
    do {
      auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(bytes, replay.Checkpoint(path));
      write_seconds += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(const int64_t items, replay.Restore(path));
      restore_seconds += seconds_since(t0);
      if (items != held) return absl::InternalError(absl::StrCat("restored ", items, " of ", held, " transitions"));
      written += static_cast<double>(bytes);
      restored += static_cast<double>(bytes);
    } while (write_seconds + restore_seconds < round.seconds);
    if (!round.warmup) restores.push_back(restored / kMB / restore_seconds);
    return written / kMB / write_seconds;
  };
  const Side peer = [&](const Round& round) -> absl::StatusOr<double> {
    double write_seconds = 0, read_seconds = 0;
    long n = 0;
    do {
      double read = 0;
      ASSIGN_OR_RETURN(const double write, RawFileSeconds(dir + "/raw", bytes, &read));
      write_seconds += write;
      read_seconds += read;
      ++n;
    } while (write_seconds + read_seconds < round.seconds);
    const double total = static_cast<double>(n) * static_cast<double>(bytes) / kMB;
    if (!round.warmup) reads.push_back(total / read_seconds);
    return total / write_seconds;
  };
  ASSIGN_OR_RETURN(const Comparison c, CompareAlternated(troupe, peer, ReplayProtocol(options)));
  report.Add(absl::StrFormat("replay checkpoint bytes per pixel transition (%ld held)", held),
             static_cast<double>(bytes) / held, "bytes", "raw frame", kH * kW * kC);
  report.Add(absl::StrFormat("replay checkpoint write, %.0f MB, fsync'd", bytes / kMB), "MB/s",
             "write()+fsync() of as many bytes", c);
  report.Add("replay checkpoint restore (read, checked, frames and tables rebuilt)", "MB/s",
             "read() of as many bytes", SameRounds(c, std::move(restores), std::move(reads)));
  return absl::OkStatus();
}

// The learner's whole checkpoint for the default pixel config
// (configs/cartpole_swingup.textproto: its D4PG agent, networks and Adam
// state, beside `replay`'s `held` pixel transitions and the counters) as one
// generation (learner::WriteLearnerCheckpoint: every file fsync'd, the
// agent's written beside replay's on a thread of its own, a manifest renamed
// into place, folders synced), against what the learner did before generations: the
// same three files side by side, only replay's fsync'd (the agent's and
// counters' written into the page cache, as the agent's save to /dev/shm
// is). Seconds, best of 3; ratio = generation / before (the bar: <= 1.2).
absl::Status AddLearnerCheckpointFigures(Report& report, replay::Replay& replay) {
  ASSIGN_OR_RETURN(config::ExperimentConfig config,
                   LoadExperimentConfig(ProjectPath("configs/cartpole_swingup.textproto"), {}));
  ASSIGN_OR_RETURN(const envs::EnvSpec env, envs::DescribeEnv(config.env()));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(env);
  ASSIGN_OR_RETURN(auto replicator, engine::MakeReplicator(config.learner().engine()));
  ASSIGN_OR_RETURN(auto agent, agents::D4pgAgent::Create(config, spec, env.action_size, replicator.get()));
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("troupe_bench_generation_", getpid())).string();
  const std::string memory = absl::StrCat("/dev/shm/troupe_bench_agent_", getpid(), ".ckpt");
  std::filesystem::create_directories(dir + "/before");
  absl::Cleanup remove = [&] {
    std::filesystem::remove_all(dir);
    std::filesystem::remove(memory);
  };
  const std::string counters = "frames 500000\nsamples 8000000\nupdates 31250\n";
  const std::string before_counters = absl::StrCat(dir, "/before/", kCountersFile);
  double generation_seconds = 1e30, before_seconds = 1e30;
  int64_t bytes = 0;
  for (int round = 0; round < 3; ++round) {
    // Before: replay fsync'd, the agent and counters only into the page cache.
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(bytes, replay.Checkpoint(absl::StrCat(dir, "/before/", kReplayCheckpointFile)));
    RETURN_IF_ERROR(agent->Save(memory));
    {
      std::ofstream out(before_counters + ".tmp", std::ios::trunc);
      out << counters;
    }
    std::filesystem::rename(before_counters + ".tmp", before_counters);
    before_seconds = std::min(before_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    // Now: one generation, as RlLearner::Checkpoint writes it.
    t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(learner::WriteLearnerCheckpoint(RunLayout(dir).checkpoints(), *agent, &replay,
                                                    [&] { return counters; }, /*keep=*/1)
                        .status());
    generation_seconds =
        std::min(generation_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double agent_mb = static_cast<double>(std::filesystem::file_size(memory)) / kMB;
  report.Add(absl::StrFormat("learner checkpoint, default pixel config (agent %.0f MB + replay %.0f MB): one "
                             "generation, all fsync'd + manifest (s)",
                             agent_mb, bytes / kMB),
             generation_seconds, "s", "before: single files, agent and counters not fsync'd (bar: ratio <= 1.2)",
             before_seconds);
  return absl::OkStatus();
}

absl::StatusOr<Report> RunReplayBenchmark(const Options& options) {
  Report report;
  const double seconds = options.seconds_per_figure;
  const long held = options.quick ? 10000 : 100000;  // pixel transitions for the memory figure
  const int frames_per_task = options.quick ? 500 : 4000;

  // Real frames: random-action episodes (DrQ action repeats).
  std::printf("rendering %d frames each of cartpole.swingup and walker.walk ...\n", frames_per_task);
  std::fflush(stdout);
  std::vector<std::vector<uint8_t>> raw;
  RETURN_IF_ERROR(RenderFrames("cartpole.swingup", /*action_repeat=*/8, frames_per_task, /*seed=*/1, &raw));
  RETURN_IF_ERROR(RenderFrames("walker.walk", /*action_repeat=*/2, frames_per_task, /*seed=*/2, &raw));
  // Each frame compressed alone (LZ4, the writer's default codec), and the
  // frames as a writer sends them: compressed against a similar recent
  // frame when that pays (replay::FrameEncoder).
  replay::FrameCompressor compressor(/*level=*/1);
  double alone_total = 0;
  std::string alone;
  for (const auto& frame : raw) {
    compressor.Compress(frame.data(), frame.size(), &alone);
    alone_total += static_cast<double>(alone.size());
  }
  std::vector<WireFrame> wire(raw.size());
  replay::FrameEncoder encoder({.level = 1});
  replay::FrameEncoder::Encoded encoded;
  double wire_total = 0, referenced = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    encoder.Encode(i, raw[i].data(), kH, kW, kC, &encoded);
    wire[i].data = encoded.data;
    wire[i].reference_back = encoded.has_reference ? static_cast<int>(i - encoded.reference_key) : 0;
    wire_total += static_cast<double>(encoded.data.size());
    referenced += encoded.has_reference;
  }
  const double compress_rate = MeasureRate(seconds / 2, [&](long n) {
    replay::FrameEncoder e({.level = 1});
    for (long i = 0; i < n; ++i) e.Encode(i, raw[i % raw.size()].data(), kH, kW, kC, &encoded);
  });
  report.Add("frame size compressed alone (mean, rendered 84x84x3)", alone_total / raw.size(), "bytes", "raw frame",
             kH * kW * kC);
  report.Add(absl::StrFormat("frame size as written (%.0f%% against a reference)", 100 * referenced / raw.size()),
             wire_total / raw.size(), "bytes", "raw frame", kH * kW * kC);
  report.Add("frame compress (writer side, FrameEncoder)", compress_rate, "frames/s", "-", 0);
  if (std::find(options.filter.begin(), options.filter.end(), "tls") != options.filter.end()) {
    RETURN_IF_ERROR(AddTlsInsertFigures(report, raw, wire, options));
    return report;
  }

  // 1. Memory: `held` pixel transitions in-process.
  const int64_t rss_before = ResidentBytes();
  ASSIGN_OR_RETURN(auto pixel_replay, replay::Replay::Create(BenchConfig(held)));
  auto local = replay::NewLocalClient(pixel_replay.get());
  {
    ASSIGN_OR_RETURN(auto writer, local->NewWriter({.max_items_per_request = 64}));
    long cursor = 0;
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(InsertPixels(*writer, &raw, nullptr, held, &cursor));
    RETURN_IF_ERROR(writer->Close());
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.Add("in-process insert, pixel transitions (incl. writer compression)", held / elapsed, "items/s", "-", 0);
    report.Add("in-process insert, pixel transitions (raw stack bytes)", held * kPixelRawBytes / elapsed / kMB,
               "MB/s", "-", 0);
  }
  const int64_t rss_after = ResidentBytes();
  const proto::InfoResponse info = pixel_replay->Info();
  report.Add(absl::StrFormat("resident bytes per pixel transition (%ld held)", held),
             static_cast<double>(rss_after - rss_before) / held, "bytes", "bar: at most 4 KiB", 4096);
  report.Add("  of which stored frame bytes per transition", static_cast<double>(info.frame_bytes()) / held, "bytes",
             "raw stacks (obs + next_obs)", 2.0 * kStack * kH * kW * kC);
  RETURN_IF_ERROR(AddCheckpointFigures(report, *pixel_replay, held, options));
  RETURN_IF_ERROR(AddLearnerCheckpointFigures(report, *pixel_replay));
  if (std::find(options.filter.begin(), options.filter.end(), "checkpoint") != options.filter.end()) return report;

  // 2. In-process sampling, batch 256, uniform, one thread.
  double batch_bytes = 0;
  {
    ASSIGN_OR_RETURN(auto sampler, local->NewSampler({.table = "pixels", .batch_size = kBatch}));
    double cpu_rate = 0;
    ASSIGN_OR_RETURN(double rate, SampleRate(*sampler, seconds, &batch_bytes, &cpu_rate));
    report.Add("in-process sample, pixel transitions (batch 256, 1 thread)", rate, "items/s", "bar: 20,000/s", 20000);
    report.Add("  the same per CPU-second of the sampling thread", cpu_rate, "items/s", "bar: 20,000/s", 20000);
  }
  ASSIGN_OR_RETURN(auto state_replay, replay::Replay::Create(BenchConfig(1000000)));
  auto state_local = replay::NewLocalClient(state_replay.get());
  {
    ASSIGN_OR_RETURN(auto writer, state_local->NewWriter({.max_items_per_request = 64}));
    absl::Status error;
    const double rate = MeasureRate(seconds, [&](long n) {
      if (error.ok()) error = InsertState(*writer, n);
    });
    RETURN_IF_ERROR(error);
    RETURN_IF_ERROR(writer->Close());
    report.Add("in-process insert, state transitions", rate, "items/s", "-", 0);
    ASSIGN_OR_RETURN(auto sampler, state_local->NewSampler({.table = "state", .batch_size = kBatch}));
    ASSIGN_OR_RETURN(double sample_rate, SampleRate(*sampler, seconds, &batch_bytes));
    report.Add("in-process sample, state transitions (batch 256, 1 thread)", sample_rate, "items/s",
               "bar: 200,000/s", 200000);
  }

  // 3. Over loopback gRPC, against raw loopback gRPC carrying the same
  // bytes, by the protocol.
  config::ReplayConfig grpc_config = BenchConfig(options.quick ? 20000 : 200000);
  ASSIGN_OR_RETURN(auto server, replay::Server::Start(grpc_config));
  auto remote = replay::NewGrpcClient(server->address());
  RawServer raw_server;
  const ProtocolOptions protocol = ReplayProtocol(options);
  constexpr int kItemsPerRequest = 16;  // WriterOptions' default, which actors keep
  constexpr double kDenseBytes = (kActionSize + 2) * 4.0;  // a transition's action, reward and discount
  // Inserts by `insert` on `writer` against raw gRPC pushing messages of
  // the size troupe's requests had in its latest round (16 items' wire
  // bytes): the wire-bytes row (the ratio on wire bytes), and items/s and
  // per CPU-second rows of the same rounds. With `frames_appended` (the
  // writer's frames so far), a second protocol run on decoded bytes: each
  // new frame's H*W*C bytes and the dense fields an item (frame keys and
  // framing not counted), against raw gRPC pushing 16 items' decoded bytes.
  auto insert_figures = [&](const std::string& what, replay::Writer& writer,
                            const std::function<absl::Status(long)>& insert,
                            const std::function<long()>& frames_appended) -> absl::Status {
    double wire_per_item = 0;
    std::vector<double> items[2], per_cpu[2];  // troupe, peer
    const Side troupe = [&](const Round& round) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(const InsertWindow w, TimeInserts(writer, insert, round.seconds));
      wire_per_item = w.wire_bytes / w.items;
      if (!round.warmup) {
        items[0].push_back(w.items / w.seconds);
        per_cpu[0].push_back(w.wire_bytes / w.cpu_seconds / kMB);
      }
      return w.wire_bytes / w.seconds / kMB;
    };
    RawServer::PushStream push(*raw_server.stub);
    const Side peer = [&](const Round& round) -> absl::StatusOr<double> {
      const RawServer::Window w = push.For(std::llround(wire_per_item * kItemsPerRequest), round.seconds);
      if (!round.warmup) {
        items[1].push_back(w.rate / wire_per_item);
        per_cpu[1].push_back(w.per_cpu_second / kMB);
      }
      return w.rate / kMB;
    };
    ASSIGN_OR_RETURN(const Comparison c, CompareAlternated(troupe, peer, protocol));
    report.Add(absl::StrFormat("gRPC insert, %s (wire bytes: %.0f B an item, %d a request)", what, wire_per_item,
                               kItemsPerRequest),
               "MB/s",
               absl::StrFormat("raw loopback gRPC push of messages of the same size (%.0f B)",
                               wire_per_item * kItemsPerRequest),
               c);
    report.Add("  the same in items/s", "items/s", "raw gRPC carrying the same wire bytes an item",
               SameRounds(c, std::move(items[0]), std::move(items[1])));
    report.Add("  the same per CPU-second of client + server", "MB/CPU-s", "raw gRPC push per CPU-second",
               SameRounds(c, std::move(per_cpu[0]), std::move(per_cpu[1])));
    if (!frames_appended) return absl::OkStatus();
    double decoded_per_item = 0;
    const Side troupe_decoded = [&](const Round& round) -> absl::StatusOr<double> {
      const long frames = frames_appended();
      ASSIGN_OR_RETURN(const InsertWindow w, TimeInserts(writer, insert, round.seconds));
      decoded_per_item = static_cast<double>(frames_appended() - frames) * kH * kW * kC / w.items + kDenseBytes;
      return w.items * decoded_per_item / w.seconds / kMB;
    };
    const Side peer_decoded = [&](const Round& round) -> absl::StatusOr<double> {
      return push.For(std::llround(decoded_per_item * kItemsPerRequest), round.seconds).rate / kMB;
    };
    ASSIGN_OR_RETURN(const Comparison d, CompareAlternated(troupe_decoded, peer_decoded, protocol));
    report.Add(absl::StrFormat("gRPC insert, %s (decoded bytes: %.0f B an item, each new frame raw + dense fields)",
                               what, decoded_per_item),
               "MB/s",
               absl::StrFormat("raw loopback gRPC push of those decoded bytes (%.0f B msgs)",
                               decoded_per_item * kItemsPerRequest),
               d);
    return absl::OkStatus();
  };
  const replay::WriterOptions actor_writer{.resumable = true};  // as actors/actor.cc makes its writer
  ASSIGN_OR_RETURN(const actors::TransitionLayout pixel_layout, ActorStream::Layout(/*pixels=*/true));
  ASSIGN_OR_RETURN(const actors::TransitionLayout state_layout, ActorStream::Layout(/*pixels=*/false));
  {
    // The headline: frames compressed in the timed loop through the actors'
    // TransitionWriter, on a writer session, the stream's own acks.
    ASSIGN_OR_RETURN(auto writer, remote->NewWriter(actor_writer));
    ActorStream stream(writer.get(), &raw, pixel_layout);
    RETURN_IF_ERROR(insert_figures("pixel transitions as actors make them (frames compressed in the timed loop)",
                                   *writer, [&](long n) { return stream.Steps(n); }, [&] { return stream.steps(); }));
    RETURN_IF_ERROR(writer->Close());
  }
  {
    // The same with an actor's Flush every 16 steps: one writer waiting on
    // each request's ack, as one actor of the default pixel config does.
    ASSIGN_OR_RETURN(auto writer, remote->NewWriter(actor_writer));
    ActorStream stream(writer.get(), &raw, pixel_layout, ActorStream::kActorFlushEvery);
    RETURN_IF_ERROR(insert_figures(
        "pixel transitions as actors make them, one writer waiting for an ack every 16 (actor.cc's flush)", *writer,
        [&](long n) { return stream.Steps(n); }, nullptr));
    RETURN_IF_ERROR(writer->Close());
  }
  {
    // Frames compressed before the timed loop (FrameEncoder, as a writer
    // codes them) and appended with AppendCompressedFrame: the transport and
    // the service alone. No actor inserts so.
    ASSIGN_OR_RETURN(auto writer, remote->NewWriter(actor_writer));
    long cursor = 0;
    RETURN_IF_ERROR(insert_figures(
        "pixel transitions, frames compressed beforehand (the transport and service alone)", *writer,
        [&](long n) { return InsertPixels(*writer, nullptr, &wire, n, &cursor); }, nullptr));
    RETURN_IF_ERROR(writer->Close());
  }
  {
    ASSIGN_OR_RETURN(auto writer, remote->NewWriter(actor_writer));
    ActorStream stream(writer.get(), nullptr, state_layout);
    RETURN_IF_ERROR(insert_figures("state transitions as actors make them", *writer,
                                   [&](long n) { return stream.Steps(n); }, nullptr));
    RETURN_IF_ERROR(writer->Close());
  }
  for (const char* table : {"state", "pixels"}) {
    // The wire size of a response (the batch's items, pixel batches their
    // frames compressed as stored; the client decodes), the mean of 8 read
    // on a raw stub.
    grpc::ClientContext context;
    proto::SampleRequest request;
    request.set_table(table);
    request.set_batch_size(kBatch);
    request.set_num_batches(8);
    ASSIGN_OR_RETURN(auto channel, NewSecureChannel(GrpcCredentials(), server->address(), [] {
                       grpc::ChannelArguments a;
                       a.SetMaxReceiveMessageSize(256 << 20);
                       return a;
                     }()));
    auto stub = proto::Replay::NewStub(channel);
    auto reader = stub->Sample(&context, request);
    proto::SampleResponse response;
    double wire_total = 0;
    int responses = 0;
    while (reader->Read(&response)) {
      wire_total += static_cast<double>(response.ByteSizeLong());
      ++responses;
    }
    RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    if (responses == 0) return absl::InternalError(absl::StrCat("no sample response from table ", table));
    const double wire = wire_total / responses;
    // Each troupe round samples on a new stream, as each raw round pulls on
    // one: the stream's setup in both.
    std::vector<double> items[2];  // troupe, peer
    const Side troupe = [&](const Round& round) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(auto sampler, remote->NewSampler({.table = table, .batch_size = kBatch}));
      replay::SampledBatch batch;
      long batches = 0;
      const auto start = std::chrono::steady_clock::now();
      double elapsed = 0;
      do {
        RETURN_IF_ERROR(sampler->Next(&batch));
        ++batches;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < round.seconds);
      if (!round.warmup) items[0].push_back(static_cast<double>(batches) * kBatch / elapsed);
      return static_cast<double>(batches) * wire / elapsed / kMB;
    };
    const Side peer = [&](const Round& round) -> absl::StatusOr<double> {
      const double rate = raw_server.PullFor(std::llround(wire), round.seconds);
      if (!round.warmup) items[1].push_back(rate / wire * kBatch);
      return rate / kMB;
    };
    ASSIGN_OR_RETURN(const Comparison c, CompareAlternated(troupe, peer, protocol));
    report.Add(absl::StrFormat("gRPC sample, %s transitions (batch 256, wire bytes: %.0f B a batch)",
                               std::string(table) == "pixels" ? "pixel" : "state", wire),
               "MB/s", "raw loopback gRPC pull of messages of the same size", c);
    report.Add("  the same in items/s", "items/s", "raw gRPC carrying the same wire bytes a batch",
               SameRounds(c, std::move(items[0]), std::move(items[1])));
  }
  server->Shutdown();
  RETURN_IF_ERROR(AddTlsInsertFigures(report, raw, wire, options));
  return report;
}

}  // namespace troupe::bench
