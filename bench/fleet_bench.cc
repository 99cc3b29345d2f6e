// `troupe bench fleet`: many actors, one learner. A server process (forked
// before this process touches gRPC) serves the learner's replay and
// Parameters services on loopback, as `troupe learner` does; this process
// opens N simulated actor connections, each its own TCP connection (as N
// actor processes would have) carrying an insert stream at a state actor's
// pace (kActorRate transitions/s, sent kItemsPerRequest at a time, the
// writer's default) and a Parameters subscription. For each N it reports:
//  - inserts/s reaching replay against the rate offered (kept up: >= 95%);
//  - the server's resident memory per connection (its RSS with N actors
//    connected and subscribed, less its RSS before, over N);
//  - parameter fan-out: from Publish of a new version (a state policy's
//    size, kParameterFloats) to the last of the N actors holding it, while
//    the inserts go on (median of kVersions versions);
//  - items lost (inserted by actors, not counted by replay) and streams that
//    failed or hung (a flush or close not done within a deadline);
//  - the server's threads and open fds after all N disconnected, against
//    before they connected (the burst of N connects and disconnects leaves
//    nothing behind).
// The file-descriptor soft limit is raised to the hard one first.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agents/transition.h"
#include "bench/bench.h"
#include "common/grpc_security.h"
#include "common/status_macros.h"
#include "learner/service/parameter_service.h"
#include "proto/parameters.grpc.pb.h"
#include "replay/grpc_client.h"
#include "replay/replay.h"
#include "replay/service.h"

namespace troupe::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
using replay::FieldValue;

constexpr double kActorRate = 100;       // transitions/s per actor (a state actor's pace)
constexpr int kItemsPerRequest = 16;     // WriterOptions' default
constexpr int kFleetObsSize = 5, kFleetActionSize = 1;  // cartpole from state
constexpr int kParameterFloats = 67841;  // the D4PG state policy of cartpole (MLP 256x256)
constexpr int kVersions = 3;             // parameter versions published per N
constexpr int kMaxVersions = 64;

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count(); }

config::ReplayConfig FleetReplayConfig() {
  config::ReplayConfig c;
  c.set_listen("127.0.0.1:0");
  c.set_worker_threads(2);
  auto* t = c.add_tables();
  t->set_name(agents::kTransitionTable);
  t->set_max_size(1000000);
  agents::AddTransitionFields({.state_size = kFleetObsSize}, kFleetActionSize, t);
  return c;
}

// --- The server process -----------------------------------------------------

void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) _exit(3);
    p += w;
    n -= size_t(w);
  }
}
bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

// Serves replay + Parameters and answers commands on `in` (one byte each):
// 'P' publishes the next version and answers its Publish time (ns of the
// steady clock, which is the machine's monotonic clock in both processes);
// 'I' answers replay's insert count; 'Q' shuts down. Answers go to `out`;
// the first is the port.
[[noreturn]] void Serve(int in, int out) {
  auto replay = replay::Replay::Create(FleetReplayConfig());
  if (!replay.ok()) _exit(4);
  replay::ReplayService replay_service(replay->get(), /*worker_threads=*/2);
  learner::ParameterStore store;
  learner::ParameterService parameter_service(&store);
  std::vector<float> parameters(kParameterFloats, 0.5f);
  int64_t version = 1;
  store.Publish(version, "policy", parameters);
  grpc::ServerBuilder builder;
  int port = 0;
  if (!AddSecureListeningPort(builder, GrpcCredentials(), "127.0.0.1:0", "fleet", &port).ok()) _exit(5);
  builder.RegisterService(&replay_service);
  builder.RegisterService(&parameter_service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) _exit(6);
  const int64_t port64 = port;
  WriteAll(out, &port64, sizeof(port64));
  char command = 0;
  while (ReadAll(in, &command, 1)) {
    if (command == 'P') {
      parameters[0] = float(++version);
      const int64_t t0 = NowNs();
      store.Publish(version, "policy", parameters);
      WriteAll(out, &t0, sizeof(t0));
    } else if (command == 'I') {
      const proto::InfoResponse info = (*replay)->Info();
      const int64_t inserts = info.tables_size() ? info.tables(0).rate_limiter().inserts() : -1;
      WriteAll(out, &inserts, sizeof(inserts));
    } else {
      break;
    }
  }
  store.Close();
  (*replay)->Close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  _exit(0);
}

struct ServerProcess {
  pid_t pid = -1;
  int to = -1, from = -1;
  int port = 0;

  absl::StatusOr<int64_t> Ask(char command) {
    WriteAll(to, &command, 1);
    int64_t answer = 0;
    if (!ReadAll(from, &answer, sizeof(answer))) return absl::InternalError("the fleet server process died");
    return answer;
  }
  int64_t Count(const char* what) const {  // threads ("task") or fds ("fd")
    int64_t n = 0;
    std::error_code error;
    for (auto it = std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/", what), error);
         !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
      ++n;
    }
    return n;
  }
  int64_t ResidentBytes() const {
    std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
    int64_t pages = 0, resident = 0;
    statm >> pages >> resident;
    return resident * sysconf(_SC_PAGESIZE);
  }
  void Stop() {
    if (pid <= 0) return;
    const char quit = 'Q';
    WriteAll(to, &quit, 1);
    int status = 0;
    for (int i = 0; i < 50 && waitpid(pid, &status, WNOHANG) != pid; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(pid, SIGKILL);
    waitpid(pid, &status, WNOHANG);
    close(to);
    close(from);
    pid = -1;
  }
};

// --- One simulated actor ----------------------------------------------------

// A Parameters subscription on the callback API (no thread of its own):
// records when it first held each version.
class Follower final : public grpc::ClientReadReactor<proto::ParametersUpdate> {
 public:
  explicit Follower(proto::Parameters::Stub* stub) {
    for (auto& a : arrival_) a.store(0);
    stub->async()->Get(&context_, &request_, this);
    StartRead(&update_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const int64_t now = NowNs();
    const int64_t version = std::min<int64_t>(update_.version(), kMaxVersions - 1);
    for (int64_t v = held_ + 1; v <= version; ++v) arrival_[v].store(now);
    held_ = std::max(held_, version);
    latest_.store(held_);
    StartRead(&update_);
  }
  void OnDone(const grpc::Status& status) override {
    ok_.store(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED);
    done_.store(true);
  }
  void Cancel() { context_.TryCancel(); }
  int64_t latest() const { return latest_.load(); }
  int64_t arrival(int version) const { return arrival_[version].load(); }
  bool done() const { return done_.load(); }
  bool ok() const { return ok_.load(); }

 private:
  grpc::ClientContext context_;
  proto::GetParametersRequest request_;
  proto::ParametersUpdate update_;
  int64_t held_ = 0;  // reactor thread only
  std::atomic<int64_t> latest_{0};
  std::array<std::atomic<int64_t>, kMaxVersions> arrival_;
  std::atomic<bool> done_{false}, ok_{false};
};

struct Actor {
  std::shared_ptr<grpc::Channel> channel;  // its own connection
  std::unique_ptr<replay::ReplayClient> client;
  std::unique_ptr<replay::Writer> writer;
  std::unique_ptr<proto::Parameters::Stub> stub;
  std::unique_ptr<Follower> follower;
  int64_t inserted = 0;
  SteadyClock::time_point due;
};

absl::Status InsertRequest(Actor& actor) {
  static const std::vector<float> obs(kFleetObsSize, 0.5f), action(kFleetActionSize, 0.1f);
  const float reward = 1, discount = 0.99f;
  for (int i = 0; i < kItemsPerRequest; ++i) {
    RETURN_IF_ERROR(actor.writer->Insert(agents::kTransitionTable, 1.0,
                                         {FieldValue::Dense(proto::DTYPE_FLOAT32, {kFleetObsSize}, obs.data()),
                                          FieldValue::Dense(proto::DTYPE_FLOAT32, {kFleetActionSize}, action.data()),
                                          FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                                          FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount),
                                          FieldValue::Dense(proto::DTYPE_FLOAT32, {kFleetObsSize}, obs.data())}));
  }
  actor.inserted += kItemsPerRequest;
  return absl::OkStatus();
}

// Runs `work(actor)` over all actors on `threads` threads. A stream that
// hangs (not all done within `deadline`) ends the benchmark process with a
// message: its threads cannot be joined.
void ForAll(std::vector<Actor>& actors, int threads, std::chrono::seconds deadline, const char* what,
            const std::function<void(Actor&)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<int> finished{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < actors.size(); i = next++) work(actors[i]);
      ++finished;
    });
  }
  const auto end = SteadyClock::now() + deadline;
  while (finished.load() < threads && SteadyClock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (finished.load() < threads) {
    std::fprintf(stderr, "troupe bench fleet: %s of %zu actors hung (not done in %ld s)\n", what, actors.size(),
                 long(deadline.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  for (auto& w : workers) w.join();
}

}  // namespace

absl::StatusOr<Report> RunFleetBenchmark(const Options& options) {
  // Many connections: the soft fd limit up to the hard one.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  std::vector<int> sizes = options.quick ? std::vector<int>{8, 32} : std::vector<int>{64, 256, 1024};
  if (!options.filter.empty()) {
    sizes.clear();
    for (const std::string& n : options.filter) sizes.push_back(std::stoi(n));
  }
  const int max_actors = *std::max_element(sizes.begin(), sizes.end());
  if (uint64_t(max_actors) * 2 + 64 > limit.rlim_cur) {
    return absl::FailedPreconditionError(absl::StrCat("fleet of ", max_actors, " actors: the fd limit is ",
                                                      limit.rlim_cur, "; raise it (ulimit -Hn)"));
  }
  const double seconds = options.quick ? 2.0 : std::max(5.0, 5 * options.seconds_per_figure);

  // The server, forked before this process starts gRPC.
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return absl::InternalError("pipe failed");
  ServerProcess server;
  server.pid = fork();
  if (server.pid < 0) return absl::InternalError("fork failed");
  if (server.pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    Serve(to_child[0], from_child[1]);
  }
  close(to_child[0]);
  close(from_child[1]);
  server.to = to_child[1];
  server.from = from_child[0];
  int64_t port = 0;
  if (!ReadAll(server.from, &port, sizeof(port))) return absl::InternalError("the fleet server did not start");
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::printf("fleet server (pid %d) on %s; %.0f transitions/s per actor in requests of %d; parameters %d floats\n",
              int(server.pid), address.c_str(), kActorRate, kItemsPerRequest, kParameterFloats);
  std::fflush(stdout);

  Report report;
  int64_t inserted_total = 0;
  int64_t version = 1;  // the server's newest parameter version (it publishes 1, then one per 'P')
  int kept_up = 0;
  absl::Status failure;
  for (const int n : sizes) {
    // Before: the server's threads, fds and memory with nobody connected.
    const int64_t threads_before = server.Count("task"), fds_before = server.Count("fd");
    const int64_t rss_before = server.ResidentBytes();
    ASSIGN_OR_RETURN(const int64_t inserts_before, server.Ask('I'));
    // Connect: a channel (own connection), an insert stream and a subscription each.
    std::vector<Actor> actors(n);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    for (Actor& a : actors) {
      ASSIGN_OR_RETURN(a.channel, NewSecureChannel(GrpcCredentials(), address, args));
      a.client = replay::NewGrpcClient(a.channel);
      ASSIGN_OR_RETURN(a.writer, a.client->NewWriter({.max_items_per_request = kItemsPerRequest}));
      a.stub = proto::Parameters::NewStub(a.channel);
      a.follower = std::make_unique<Follower>(a.stub.get());
    }
    // Everyone holds version 1 and has sent a first request (its stream is open on the server).
    std::atomic<int> errors{0};
    ForAll(actors, 4, std::chrono::seconds(120), "the first insert", [&](Actor& a) {
      if (!InsertRequest(a).ok() || !a.writer->Flush().ok()) ++errors;
    });
    const auto subscribed_by = SteadyClock::now() + std::chrono::seconds(60);
    auto all_hold = [&](int64_t version) {
      return std::all_of(actors.begin(), actors.end(), [&](const Actor& a) { return a.follower->latest() >= version; });
    };
    const int64_t first_version = version;
    while (!all_hold(first_version) && SteadyClock::now() < subscribed_by) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int64_t rss_connected = server.ResidentBytes();
    const int64_t threads_connected = server.Count("task"), fds_connected = server.Count("fd");

    // Inserts at the actors' pace for `seconds`, on 2 driver threads;
    // kVersions new parameter versions published meanwhile.
    const auto interval = std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(kItemsPerRequest / kActorRate));
    const auto start = SteadyClock::now();
    for (int i = 0; i < n; ++i) actors[i].due = start + interval * i / n;
    const auto end = start + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
    int64_t inserted_before_phase = 0;
    for (const Actor& a : actors) inserted_before_phase += a.inserted;
    std::vector<std::thread> drivers;
    const int driver_threads = 2;
    for (int t = 0; t < driver_threads; ++t) {
      drivers.emplace_back([&, t] {
        while (SteadyClock::now() < end) {
          SteadyClock::time_point next = end;
          for (int i = t; i < n; i += driver_threads) {
            Actor& a = actors[i];
            if (a.due <= SteadyClock::now()) {
              if (!InsertRequest(a).ok()) ++errors;
              a.due += interval;
            }
            next = std::min(next, a.due);
          }
          std::this_thread::sleep_until(next);
        }
      });
    }
    std::vector<int64_t> published;
    for (int v = 0; v < kVersions; ++v) {
      std::this_thread::sleep_until(start + (end - start) * (v + 1) / (kVersions + 1));
      ASSIGN_OR_RETURN(const int64_t t0, server.Ask('P'));
      published.push_back(t0);
      ++version;
    }
    for (auto& d : drivers) d.join();
    const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
    int64_t inserted_in_phase = -inserted_before_phase;
    for (const Actor& a : actors) inserted_in_phase += a.inserted;

    // Flush and close every stream (a hang is a stream not done in 120 s).
    ForAll(actors, 4, std::chrono::seconds(120), "closing the insert streams", [&](Actor& a) {
      if (!a.writer->Close().ok()) ++errors;
    });
    // Fan-out: from Publish to the last actor holding the version.
    const auto fanned_by = SteadyClock::now() + std::chrono::seconds(60);
    while (!all_hold(version) && SteadyClock::now() < fanned_by) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::vector<double> fan_out_ms;
    int missing_versions = 0;
    for (int v = 0; v < kVersions; ++v) {
      int64_t last = 0;
      for (const Actor& a : actors) {
        const int64_t at = a.follower->arrival(int(first_version + 1 + v));
        if (at == 0) ++missing_versions;
        last = std::max(last, at);
      }
      fan_out_ms.push_back(1e-6 * double(last - published[v]));
    }
    std::sort(fan_out_ms.begin(), fan_out_ms.end());
    // Nothing lost: replay counted every item the actors sent.
    ASSIGN_OR_RETURN(const int64_t inserts_after, server.Ask('I'));
    int64_t sent = 0;
    for (const Actor& a : actors) sent += a.inserted;
    inserted_total += sent;
    const int64_t lost = sent - (inserts_after - inserts_before);
    // Disconnect everyone, then give the server a moment to let go.
    for (Actor& a : actors) a.follower->Cancel();
    const auto cancelled_by = SteadyClock::now() + std::chrono::seconds(60);
    while (SteadyClock::now() < cancelled_by &&
           !std::all_of(actors.begin(), actors.end(), [](const Actor& a) { return a.follower->done(); })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    int hung = 0;
    for (const Actor& a : actors) {
      if (!a.follower->done()) ++hung;
      else if (!a.follower->ok()) ++errors;
    }
    if (hung > 0) {
      failure = absl::DeadlineExceededError(absl::StrCat("fleet of ", n, ": ", hung,
                                                         " parameter subscriptions did not end when cancelled"));
    }
    if (hung == 0) actors.clear();  // channels closed: connections end
    int64_t threads_after = 0, fds_after = 0;
    for (int i = 0; i < 100; ++i) {
      threads_after = server.Count("task");
      fds_after = server.Count("fd");
      if (threads_after <= threads_before && fds_after <= fds_before) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }

    const double offered = n * kActorRate;
    const double achieved = double(inserted_in_phase) / elapsed;
    if (achieved >= 0.95 * offered && lost == 0 && errors == 0 && hung == 0) kept_up = std::max(kept_up, n);
    const std::string at = absl::StrFormat("N=%d: ", n);
    report.Add(at + "inserts reaching replay (kept up: >= 0.95)", achieved, "items/s",
               absl::StrFormat("offered, %d x %.0f/s", n, kActorRate), offered);
    report.Add(at + "server memory per connection (insert stream + subscription)",
               double(rss_connected - rss_before) / n, "bytes", "-", 0);
    report.Add(at + absl::StrFormat("parameter fan-out to all N (%d KB; median of %d, under inserts)",
                                    kParameterFloats * 4 / 1000, kVersions),
               fan_out_ms[fan_out_ms.size() / 2], "ms", "-", 0);
    report.Add(at + absl::StrFormat("  slowest of the %d versions", kVersions), fan_out_ms.back(), "ms", "-", 0);
    report.Add(at + "items lost (sent by actors, not counted by replay)", double(lost), "items", "-", 0);
    report.Add(at + "streams failed or hung, versions never received", double(errors.load() + hung + missing_versions),
               "streams", "-", 0);
    report.Add(at + absl::StrFormat("server threads after all disconnected (%ld while connected)",
                                    long(threads_connected)),
               double(threads_after), "threads", "before they connected", double(threads_before));
    report.Add(at + absl::StrFormat("server fds after all disconnected (%ld while connected)", long(fds_connected)),
               double(fds_after), "fds", "before they connected", double(fds_before));
    if (!failure.ok()) break;
  }
  server.Stop();
  RETURN_IF_ERROR(failure);
  report.Add("largest N whose inserts kept up, with nothing lost", kept_up, "actors", "bar: 1,024", 1024);
  return report;
}

}  // namespace troupe::bench
