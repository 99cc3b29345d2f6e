// `troupe bench replay`: insert and sample throughput of the replay
// service, in-process and over loopback gRPC, for state transitions (24
// floats) and pixel transitions (3 stacked 84x84x3 frames), next to a raw
// gRPC stream of the same message sizes (and, for pixel inserts, of the
// same decoded bytes) measured in the same run; and the resident memory per
// stored pixel transition, with frames rendered from real episodes of
// cartpole.swingup and walker.walk and written as an actor does
// (Writer::AppendFrame: LZ4, against a recent similar frame when that pays).
// Sampling is also given per CPU-second of the sampling thread, since these
// machines are shared. Inserts over TLS with a token (common/grpc_security.h)
// are measured against the same inserts without them, in alternated rounds
// (`--only tls` runs just those rows). A checkpoint of the pixel
// transitions held (learner.checkpoint_replay) is written and restored next
// to plain write()+fsync() and read() of as many bytes, and the learner's
// whole checkpoint of the default pixel config as one generation against the
// single files it wrote before (`--only checkpoint` runs the rows up to
// those).
#include <grpcpp/create_channel.h>
#include <fcntl.h>
#include <grpcpp/server_builder.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agents/d4pg_agent.h"
#include "agents/transition.h"
#include "bench/bench.h"
#include "common/certificates.h"
#include "common/config.h"
#include "common/files.h"
#include "common/grpc_security.h"
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
  // Bytes/s pushing blobs of `bytes` for about `seconds`; also bytes per
  // CPU-second of this process (client and server together).
  double PushRate(int64_t bytes, double seconds, double* per_cpu_second = nullptr) {
    proto::Blob blob;
    blob.mutable_data()->assign(bytes, 'x');
    return MeasureRate(seconds, [&](long n) {
      const double cpu = ProcessCpuSeconds();
      absl::Cleanup per_cpu = [&] {
        if (per_cpu_second != nullptr) *per_cpu_second = n * static_cast<double>(bytes) / (ProcessCpuSeconds() - cpu);
      };
      grpc::ClientContext context;
      proto::BlobCount count;
      auto writer = stub->Push(&context, &count);
      for (long i = 0; i < n; ++i) writer->Write(blob);
      writer->WritesDone();
      (void)writer->Finish();
    }) * static_cast<double>(bytes);
  }
  // Bytes/s pulling blobs of `bytes`.
  double PullRate(int64_t bytes, double seconds) {
    return MeasureRate(seconds, [&](long n) {
      grpc::ClientContext context;
      proto::PullRequest request;
      request.set_bytes(bytes);
      request.set_messages(n);
      auto reader = stub->Pull(&context, request);
      proto::Blob blob;
      while (reader->Read(&blob)) {
      }
      (void)reader->Finish();
    }) * static_cast<double>(bytes);
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
// gRPC: two fresh servers, a writer on each, `rounds` alternated windows of
// each and the best window of each. Three kinds of inserts: pixel
// transitions as an actor writes them (raw frames: AppendFrame compresses
// each on the writer's thread, actors/transition_writer.cc), the same with
// frames compressed beforehand (the transport alone), and state
// transitions. Certificates are made for the run (troupe certs).
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
  const int rounds = 5;
  enum Kind { kPixelsAsActorsWrite, kPixelsPrecompressed, kState };
  for (const Kind kind : {kPixelsAsActorsWrite, kPixelsPrecompressed, kState}) {
    const bool pixels = kind != kState;
    const int items_per_request = pixels ? 16 : 64;
    ASSIGN_OR_RETURN(auto plain_writer, plain_client->NewWriter({.max_items_per_request = items_per_request}));
    ASSIGN_OR_RETURN(auto tls_writer, tls_client->NewWriter({.max_items_per_request = items_per_request}));
    long plain_cursor = 0, tls_cursor = 0;
    double best_plain = 0, best_tls = 0;
    // Items per CPU-second of the whole process (writer and server threads),
    // the best window of each: what TLS costs, apart from how the two cores
    // were shared in a window.
    double best_plain_cpu = 0, best_tls_cpu = 0;
    absl::Status error;
    for (int round = 0; round < rounds && error.ok(); ++round) {
      for (const bool use_tls : {false, true}) {
        replay::Writer& writer = use_tls ? *tls_writer : *plain_writer;
        long* cursor = use_tls ? &tls_cursor : &plain_cursor;
        double per_cpu_second = 0;
        const double rate = MeasureRate(options.seconds_per_figure, [&](long n) {
          if (!error.ok()) return;
          const double cpu = ProcessCpuSeconds();
          error = kind == kPixelsAsActorsWrite  ? InsertPixels(writer, &raw, nullptr, n, cursor)
                  : kind == kPixelsPrecompressed ? InsertPixels(writer, nullptr, &wire, n, cursor)
                                                 : InsertState(writer, n);
          if (error.ok()) error = writer.Flush();
          per_cpu_second = static_cast<double>(n) / std::max(ProcessCpuSeconds() - cpu, 1e-9);
        });
        double& best = use_tls ? best_tls : best_plain;
        double& best_cpu = use_tls ? best_tls_cpu : best_plain_cpu;
        best = std::max(best, rate);
        best_cpu = std::max(best_cpu, per_cpu_second);
      }
    }
    RETURN_IF_ERROR(error);
    RETURN_IF_ERROR(plain_writer->Close());
    RETURN_IF_ERROR(tls_writer->Close());
    const char* what = kind == kPixelsAsActorsWrite  ? "pixel transitions as actors write them (LZ4 on the writer)"
                       : kind == kPixelsPrecompressed ? "pixel transitions, frames compressed beforehand"
                                                      : "state transitions";
    report.Add(absl::StrFormat("gRPC insert, %s, TLS + token (bar: 0.8x)", what), best_tls, "items/s",
               "the same inserts without TLS or token, same run", best_plain);
    report.Add(absl::StrFormat("gRPC insert, %s, per CPU-second (writer + server), TLS + token", what), best_tls_cpu,
               "items/CPU-s", "the same inserts without TLS or token, same run", best_plain_cpu);
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
// learner.checkpoint_replay writes) and its restore, next to writing and
// reading as many bytes with plain write()+fsync() and read() in the same
// folder; best of 2 rounds each (the disk is shared).
absl::Status AddCheckpointFigures(Report& report, replay::Replay& replay, long held) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("troupe_bench_checkpoint_", getpid())).string();
  std::filesystem::create_directories(dir);
  absl::Cleanup remove = [&dir] { std::filesystem::remove_all(dir); };
  const std::string path = dir + "/replay.ckpt";
  double write_seconds = 1e30, restore_seconds = 1e30, raw_write = 1e30, raw_read = 1e30;
  int64_t bytes = 0;
  for (int round = 0; round < 2; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(bytes, replay.Checkpoint(path));
    write_seconds = std::min(write_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const int64_t items, replay.Restore(path));
    restore_seconds =
        std::min(restore_seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (items != held) return absl::InternalError(absl::StrCat("restored ", items, " of ", held, " transitions"));
    double read_seconds = 0;
    ASSIGN_OR_RETURN(const double seconds, RawFileSeconds(dir + "/raw", bytes, &read_seconds));
    raw_write = std::min(raw_write, seconds);
    raw_read = std::min(raw_read, read_seconds);
  }
  report.Add(absl::StrFormat("replay checkpoint bytes per pixel transition (%ld held)", held),
             static_cast<double>(bytes) / held, "bytes", "raw frame", kH * kW * kC);
  report.Add(absl::StrFormat("replay checkpoint write, %.0f MB, fsync'd", bytes / kMB), bytes / kMB / write_seconds,
             "MB/s", "write()+fsync() of as many bytes", bytes / kMB / raw_write);
  report.Add("replay checkpoint restore (read, checked, frames and tables rebuilt)", bytes / kMB / restore_seconds,
             "MB/s", "read() of as many bytes", bytes / kMB / raw_read);
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
  RETURN_IF_ERROR(AddCheckpointFigures(report, *pixel_replay, held));
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

  // 3. Over loopback gRPC, next to the raw stream of the same message sizes.
  config::ReplayConfig grpc_config = BenchConfig(options.quick ? 20000 : 200000);
  ASSIGN_OR_RETURN(auto server, replay::Server::Start(grpc_config));
  auto remote = replay::NewGrpcClient(server->address());
  RawServer raw_server;
  // Inserts: ours and the raw stream alternate for 3 rounds and the best of
  // each counts, so load from other processes on a shared machine hits both
  // alike. Two comparisons:
  //  - wire bytes: our requests' serialized bytes/s against the raw stream
  //    pushing messages of the same size (the service's overhead over
  //    moving those bytes at all);
  //  - decoded bytes (pixels; the bar): the transitions' content as a writer
  //    that sends each frame once would send it uncompressed (every new
  //    frame's H*W*C bytes + the dense fields; frame keys and framing not
  //    counted) per second, against the raw stream pushing those same
  //    decoded bytes in messages of the same number of transitions. The
  //    writer compresses frames (LZ4, against a key frame when that pays),
  //    so ours carries fewer wire bytes for the same transitions: that is
  //    the design (Reverb's chunker compresses on the client too), and the
  //    wire-byte figure above shows what the service itself costs.
  auto insert_figures = [&](const char* what, int items_per_request,
                            const std::function<absl::Status(replay::Writer&, long)>& insert,
                            const std::function<double()>& decoded_bytes_per_item) -> absl::Status {
    ASSIGN_OR_RETURN(auto writer, remote->NewWriter({.max_items_per_request = items_per_request}));
    double best = 0, best_raw = 0, request_bytes = 0, bytes_per_item = 0;
    double best_per_cpu = 0, best_raw_per_cpu = 0;  // items and bytes per process CPU-second
    double best_raw_decoded = 0, decoded_request_bytes = 0, decoded_per_item = 0;
    for (int round = 0; round < 3; ++round) {
      absl::Status error;
      double per_cpu = 0;
      best = std::max(best, MeasureRate(seconds, [&](long n) {
                        const double cpu = ProcessCpuSeconds();
                        if (error.ok()) error = insert(*writer, n);
                        per_cpu = n / (ProcessCpuSeconds() - cpu);
                      }));
      RETURN_IF_ERROR(error);
      best_per_cpu = std::max(best_per_cpu, per_cpu);
      request_bytes = static_cast<double>(writer->bytes_sent()) / (writer->items_sent() / double(items_per_request));
      bytes_per_item = static_cast<double>(writer->bytes_sent()) / writer->items_sent();
      double raw_per_cpu = 0;
      best_raw = std::max(best_raw, raw_server.PushRate(static_cast<int64_t>(request_bytes), seconds, &raw_per_cpu));
      best_raw_per_cpu = std::max(best_raw_per_cpu, raw_per_cpu);
      if (decoded_bytes_per_item) {
        decoded_per_item = decoded_bytes_per_item();
        decoded_request_bytes = decoded_per_item * items_per_request;
        best_raw_decoded = std::max(best_raw_decoded,
                                    raw_server.PushRate(static_cast<int64_t>(decoded_request_bytes), seconds));
      }
    }
    RETURN_IF_ERROR(writer->Close());
    report.Add(absl::StrCat("gRPC insert, ", what), best, "items/s", "-", 0);
    report.Add(absl::StrCat("gRPC insert, ", what, " (wire bytes)"), best * bytes_per_item / kMB, "MB/s",
               absl::StrFormat("raw gRPC push, %.0f B msgs", request_bytes), best_raw / kMB);
    report.Add(absl::StrCat("  the same per CPU-second of client + server"), best_per_cpu * bytes_per_item / kMB,
               "MB/s", "raw gRPC push per CPU-second", best_raw_per_cpu / kMB);
    if (decoded_bytes_per_item) {
      report.Add(absl::StrFormat("gRPC insert, %s (decoded bytes, %.0f B each; bar: 0.7x)", what,
                                 decoded_per_item),
                 best * decoded_per_item / kMB, "MB/s",
                 absl::StrFormat("raw gRPC push of them, %.0f B msgs", decoded_request_bytes), best_raw_decoded / kMB);
    }
    return absl::OkStatus();
  };
  // Pixels: frames compressed before the timed loop (FrameEncoder, as a
  // writer codes them) and appended with AppendCompressedFrame, so these
  // rows are the transport and the service alone. No actor writes this way:
  // an actor's AppendFrame compresses each frame on its own thread, which the
  // TLS rows' "as actors write them" (AddTlsInsertFigures) include.
  long cursor = 0, pixel_items = 0;
  RETURN_IF_ERROR(insert_figures(
      "pixel transitions, frames compressed beforehand", 16,
      [&](replay::Writer& writer, long n) {
        pixel_items += n;
        return InsertPixels(writer, nullptr, &wire, n, &cursor);
      },
      // Every frame appended (its raw size) and each transition's dense fields.
      [&] { return (static_cast<double>(cursor) * kH * kW * kC) / pixel_items + (kActionSize + 2) * 4.0; }));
  RETURN_IF_ERROR(insert_figures(
      "state transitions", 64, [&](replay::Writer& writer, long n) { return InsertState(writer, n); }, nullptr));
  for (const char* table : {"state", "pixels"}) {
    // Sample: the response carries compressed frames; the client decodes.
    ASSIGN_OR_RETURN(auto sampler, remote->NewSampler({.table = table, .batch_size = kBatch}));
    ASSIGN_OR_RETURN(double rate, SampleRate(*sampler, seconds, &batch_bytes));
    // Wire size of one response, measured on a raw stub.
    grpc::ClientContext context;
    proto::SampleRequest request;
    request.set_table(table);
    request.set_batch_size(kBatch);
    request.set_num_batches(1);
    ASSIGN_OR_RETURN(auto channel, NewSecureChannel(GrpcCredentials(), server->address(), [] {
                       grpc::ChannelArguments a;
                       a.SetMaxReceiveMessageSize(256 << 20);
                       return a;
                     }()));
    auto stub = proto::Replay::NewStub(channel);
    auto reader = stub->Sample(&context, request);
    proto::SampleResponse response;
    reader->Read(&response);
    while (reader->Read(&response)) {
    }
    (void)reader->Finish();
    const double wire = static_cast<double>(response.ByteSizeLong());
    const double raw_rate = raw_server.PullRate(static_cast<int64_t>(wire), seconds);
    report.Add(absl::StrCat("gRPC sample, ", table, " transitions (batch 256)"), rate, "items/s", "-", 0);
    report.Add(absl::StrCat("gRPC sample, ", table, " transitions (wire bytes)"), rate / kBatch * wire / kMB, "MB/s",
               absl::StrFormat("raw gRPC pull, %.0f B msgs", wire), raw_rate / kMB);
  }
  server->Shutdown();
  RETURN_IF_ERROR(AddTlsInsertFigures(report, raw, wire, options));
  return report;
}

}  // namespace troupe::bench
