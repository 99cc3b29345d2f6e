#include "envs/env_worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "envs/env_pool.h"

extern char** environ;

namespace troupe::envs {
namespace {

constexpr uint64_t kMagic = 0x54524f5550454e31ull;  // "TROUPEN1"
constexpr char kRequest = 'R';
constexpr char kDone = 'D';
// A batch is milliseconds (a pixel step is about one); a worker silent for
// this long is stuck.
constexpr int kAnswerTimeoutMs = 60'000;
// The pool waits for a batch after stepping its own share of it, so the
// answer is often moments away.
constexpr std::chrono::microseconds kAnswerSpin{200};
// Making the contexts and loading a model take a noticeable fraction of a
// second (docs/design.md, "Measured costs"); this is far above both.
constexpr int kStartTimeoutMs = 60'000;

// The shared memory: this header, then the arrays Layout places, each
// 64-byte aligned and indexed by the worker's env (0 = env `first`).
struct SharedHeader {
  uint64_t magic;
  // The envs to make, written by the pool before the worker starts.
  char task[64];
  char camera[64];
  uint64_t seed;
  int32_t first, count;
  int32_t width, height;
  uint8_t pixels, shadows, reflections, multisample;
  int32_t action_repeat, frame_stack;
  // Their sizes as the pool's own envs have them; the worker checks its envs against them.
  int32_t action_size, state_size;
  int64_t pixel_bytes;
  int32_t nq, nv, na, nmocap;
  // A request: the first num_jobs job slots.
  int32_t num_jobs;
  // The answer: physics blow-ups so far, an absl::StatusCode and its message.
  int64_t physics_errors;
  int32_t code;
  char message[2048];
};

struct JobSlot {
  int32_t env;  // the worker's index
  int32_t reset;
};

struct ResultSlot {
  uint8_t step_type;
  float reward, discount;
  int32_t episode_step;
};

constexpr size_t Align(size_t n) { return (n + 63) & ~size_t(63); }

// Doubles of an env's physics state: qpos, qvel, act, mocap_pos, mocap_quat, time.
size_t PhysicsDoubles(const SharedHeader& h) { return size_t(h.nq) + h.nv + h.na + 7 * size_t(h.nmocap) + 1; }

// Calls copy(field pointer, doubles) for each part of the physics state, in order.
template <typename Data, typename Copy>
void ForEachPhysicsField(const SharedHeader& h, Data* d, Copy copy) {
  copy(d->qpos, h.nq);
  copy(d->qvel, h.nv);
  copy(d->act, h.na);
  copy(d->mocap_pos, 3 * h.nmocap);
  copy(d->mocap_quat, 4 * h.nmocap);
  copy(&d->time, 1);
}

struct Layout {
  size_t jobs, actions, results, state, pixels, physics, total;
  explicit Layout(const SharedHeader& h) {
    const size_t n = size_t(h.count);
    jobs = Align(sizeof(SharedHeader));
    actions = jobs + Align(sizeof(JobSlot) * n);
    results = actions + Align(sizeof(float) * n * h.action_size);
    state = results + Align(sizeof(ResultSlot) * n);
    pixels = state + Align(sizeof(float) * n * h.state_size);
    physics = pixels + Align(size_t(h.pixel_bytes) * n);
    total = physics + Align(sizeof(double) * n * PhysicsDoubles(h));
  }
};

template <typename T>
T* At(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

void SetAnswer(SharedHeader* header, const absl::Status& status) {
  header->code = static_cast<int32_t>(status.code());
  const absl::string_view message = status.message();
  const size_t n = std::min(message.size(), sizeof(header->message) - 1);
  if (n > 0) std::memcpy(header->message, message.data(), n);
  header->message[n] = '\0';
}

absl::Status Answer(const SharedHeader* header) {
  if (header->code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(header->code),
                      std::string(header->message, strnlen(header->message, sizeof(header->message))));
}

// Copies `text` into a fixed field; false if it does not fit.
template <size_t N>
bool CopyName(const std::string& text, char (&field)[N]) {
  if (text.size() >= N) return false;
  std::memcpy(field, text.c_str(), text.size() + 1);
  return true;
}

// Waits up to `timeout_ms` for one byte on `socket`, looking without
// sleeping for the first `spin` (a wake-up from the kernel costs more than a
// short spin: docs/design.md, "Measured costs"). Returns the byte, 0 on EOF or a
// socket error, -1 on timeout.
int ReadByte(int socket, int timeout_ms, std::chrono::microseconds spin = {}) {
  if (spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + spin;
    char byte = 0;
    do {
      const ssize_t n = recv(socket, &byte, 1, MSG_DONTWAIT);
      if (n == 1) return static_cast<unsigned char>(byte);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 0;
    } while (std::chrono::steady_clock::now() < until);
  }
  pollfd p{socket, POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) return -1;
  char byte = 0;
  ssize_t n;
  do {
    n = recv(socket, &byte, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n == 1 ? static_cast<unsigned char>(byte) : 0;
}

bool WriteByte(int socket, char byte) {
  ssize_t n;
  do {
    n = send(socket, &byte, 1, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == 1;
}

std::string WorkerBinary() {
  if (const char* path = std::getenv("TROUPE_ENV_WORKER"); path != nullptr && *path != '\0') return path;
  // Beside this binary (a relocated bundle's bin/), else where the build put it.
  std::error_code ec;
  const std::filesystem::path beside =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "troupe_env_worker";
  if (!ec && std::filesystem::exists(beside, ec)) return beside.string();
  return TROUPE_ENV_WORKER_PATH;
}

// Reaps `pid`, killing it if it is still running after `grace`. Returns how it ended.
std::string Reap(pid_t pid, std::chrono::milliseconds grace) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + grace;
  pid_t r;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (r == 0) {
    kill(pid, SIGKILL);
    r = waitpid(pid, &status, 0);
  }
  if (r != pid) return "could not be reaped";
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "ended";
}

}  // namespace

EnvWorker::EnvWorker(pid_t pid, int socket, void* shared, size_t shared_bytes, std::string task, int first,
                     int count)
    : pid_(pid), socket_(socket), shared_(shared), shared_bytes_(shared_bytes), task_(std::move(task)), first_(first),
      count_(count) {}

std::string EnvWorker::Name() const {
  return absl::StrCat("env worker (pid ", pid_, ") for ", task_, " envs [", first_, ", ", first_ + count_, ")");
}

absl::StatusOr<std::unique_ptr<EnvWorker>> EnvWorker::Start(const EnvOptions& options, const EnvSpec& spec,
                                                            const mjModel* model, int first, int count) {
  const std::string what = absl::StrCat("env worker for ", options.task, " envs [", first, ", ", first + count, ")");
  auto fail = [&](const std::string& why) { return absl::UnavailableError(absl::StrCat(what, ": ", why)); };
  constexpr int kMaxEnvs = EnvPoolOptions::kMaxEnvs;
  if (count < 1 || count > kMaxEnvs || first < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count must be in [1, ", kMaxEnvs, "], first >= 0"));
  }
  SharedHeader h{};
  h.magic = kMagic;
  if (!CopyName(options.task, h.task)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": task name longer than ", sizeof(h.task) - 1, " characters"));
  }
  if (!CopyName(options.camera, h.camera)) {
    return absl::InvalidArgumentError(absl::StrCat("env.render.camera: '", options.camera, "' is longer than ",
                                                   sizeof(h.camera) - 1, " characters"));
  }
  h.seed = options.seed;
  h.first = first;
  h.count = count;
  h.width = options.render.width;
  h.height = options.render.height;
  h.pixels = options.pixels;
  h.shadows = options.render.shadows;
  h.reflections = options.render.reflections;
  h.multisample = options.multisample;
  h.action_repeat = options.action_repeat;
  h.frame_stack = options.frame_stack;
  h.action_size = spec.action_size;
  h.state_size = spec.state_size;
  h.pixel_bytes = int64_t(spec.pixel_bytes());
  h.nq = model->nq;
  h.nv = model->nv;
  h.na = model->na;
  h.nmocap = model->nmocap;
  const Layout layout(h);

  // Shared memory, set up before the worker maps it.
  const int memfd = memfd_create("troupe-env-worker", MFD_CLOEXEC);
  if (memfd < 0) return fail(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (ftruncate(memfd, off_t(layout.total)) != 0) {
    const int e = errno;
    close(memfd);
    return fail(absl::StrCat("ftruncate to ", layout.total, " bytes: ", std::strerror(e)));
  }
  void* shared = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (shared == MAP_FAILED) {
    const int e = errno;
    close(memfd);
    return fail(absl::StrCat("mmap: ", std::strerror(e)));
  }
  std::memcpy(shared, &h, sizeof(h));

  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
    const int e = errno;
    munmap(shared, layout.total);
    close(memfd);
    return fail(absl::StrCat("socketpair: ", std::strerror(e)));
  }
  // The worker finds the memory at fd 3 and its socket at fd 4. Move both
  // out of that range first: a dup2 onto the same number would keep CLOEXEC.
  const int child_memfd = fcntl(memfd, F_DUPFD_CLOEXEC, 10);
  const int child_socket = fcntl(sockets[1], F_DUPFD_CLOEXEC, 10);
  const int dup_errno = errno;
  close(memfd);
  close(sockets[1]);
  if (child_memfd < 0 || child_socket < 0) {
    if (child_memfd >= 0) close(child_memfd);
    if (child_socket >= 0) close(child_socket);
    close(sockets[0]);
    munmap(shared, layout.total);
    return fail(absl::StrCat("fcntl(F_DUPFD_CLOEXEC): ", std::strerror(dup_errno)));
  }

  const std::string binary = WorkerBinary();
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>("3"), const_cast<char*>("4"), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_memfd, 3);
  posix_spawn_file_actions_adddup2(&actions, child_socket, 4);
  // The spawning thread's signal mask (gRPC and pool threads block some) is not the worker's.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, binary.c_str(), &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(child_memfd);
  close(child_socket);
  if (spawned != 0) {
    close(sockets[0]);
    munmap(shared, layout.total);
    return fail(absl::StrCat("cannot start ", binary, ": ", std::strerror(spawned),
                             " (build the troupe_env_worker target, or set TROUPE_ENV_WORKER)"));
  }
  std::unique_ptr<EnvWorker> worker(new EnvWorker(pid, sockets[0], shared, layout.total, options.task, first, count));

  // Start-up: the worker answers once its envs and contexts exist (or why not).
  auto* header = At<SharedHeader>(shared, 0);
  const int byte = ReadByte(worker->socket_, kStartTimeoutMs);
  if (byte == -1) return fail(absl::StrCat(binary, " (pid ", pid, ") did not start within ", kStartTimeoutMs, " ms"));
  if (byte != kDone) return worker->WorkerGone("during start-up");
  if (auto status = Answer(header); !status.ok()) return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
  return worker;
}

EnvWorker::~EnvWorker() {
  close(socket_);
  if (pid_ > 0) Reap(pid_, std::chrono::seconds(1));
  munmap(shared_, shared_bytes_);
}

absl::Status EnvWorker::WorkerGone(const char* when) {
  const auto* header = At<SharedHeader>(shared_, 0);
  std::string how = pid_ > 0 ? Reap(pid_, std::chrono::seconds(1)) : "had already ended";
  std::string last = header->code != 0 ? absl::StrCat("; its last message: ", header->message) : "";
  dead_ = absl::UnavailableError(absl::StrCat(Name(), " ", how, " ", when, last));
  pid_ = -1;
  return dead_;
}

absl::Status EnvWorker::Run(std::span<const Job> jobs, const float* actions) {
  RETURN_IF_ERROR(Send(jobs, actions));
  return Wait();
}

absl::Status EnvWorker::Send(std::span<const Job> jobs, const float* actions) {
  if (!dead_.ok()) return dead_;
  auto* header = At<SharedHeader>(shared_, 0);
  const Layout layout(*header);
  if (sent_) return absl::FailedPreconditionError(absl::StrCat(Name(), ": Send before the last request's Wait"));
  if (jobs.size() > size_t(count_)) {
    return absl::InvalidArgumentError(absl::StrCat(Name(), ": ", jobs.size(), " jobs for its ", count_, " envs"));
  }
  auto* slots = At<JobSlot>(shared_, layout.jobs);
  float* shared_actions = At<float>(shared_, layout.actions);
  const size_t action_size = size_t(header->action_size);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int32_t id = jobs[j].env_id;
    if (id < first_ || id >= first_ + count_) {
      return absl::InvalidArgumentError(absl::StrCat(Name(), ": env ", id, " is not one of the worker's envs [", first_,
                                                     ", ", first_ + count_, ")"));
    }
    const int32_t local = id - first_;
    slots[j] = JobSlot{local, jobs[j].reset};
    if (!jobs[j].reset) {
      std::memcpy(shared_actions + local * action_size, actions + size_t(id) * action_size,
                  sizeof(float) * action_size);
    }
  }
  header->num_jobs = int32_t(jobs.size());
  if (!WriteByte(socket_, kRequest)) return WorkerGone("before a batch");
  sent_ = true;
  return absl::OkStatus();
}

absl::Status EnvWorker::Wait() {
  if (!dead_.ok()) return dead_;
  if (!sent_) return absl::FailedPreconditionError(absl::StrCat(Name(), ": Wait without a request sent"));
  sent_ = false;
  const auto* header = At<SharedHeader>(shared_, 0);
  const int byte = ReadByte(socket_, kAnswerTimeoutMs, kAnswerSpin);
  if (byte == -1) {
    return absl::DeadlineExceededError(absl::StrCat(Name(), " did not answer within ", kAnswerTimeoutMs, " ms"));
  }
  if (byte != kDone) return WorkerGone("during a batch");
  physics_errors_.store(header->physics_errors, std::memory_order_relaxed);
  return Answer(header);
}

EnvWorker::Result EnvWorker::result(int32_t env_id) const {
  const auto* header = At<SharedHeader>(shared_, 0);
  const Layout layout(*header);
  const size_t local = size_t(env_id - first_);
  const ResultSlot& r = At<ResultSlot>(shared_, layout.results)[local];
  return Result{TimeStep{static_cast<StepType>(r.step_type), r.reward, r.discount}, r.episode_step,
                At<float>(shared_, layout.state) + local * header->state_size,
                header->pixel_bytes > 0 ? At<uint8_t>(shared_, layout.pixels) + local * header->pixel_bytes : nullptr};
}

void EnvWorker::CopyPhysicsState(int32_t env_id, mjData* data) const {
  const auto* header = At<SharedHeader>(shared_, 0);
  const Layout layout(*header);
  const double* in = At<double>(shared_, layout.physics) + size_t(env_id - first_) * PhysicsDoubles(*header);
  ForEachPhysicsField(*header, data, [&](double* field, int n) {
    std::memcpy(field, in, sizeof(double) * n);
    in += n;
  });
}

int RunEnvWorker(int shared_fd, int socket_fd) {
  // Memory the worker cannot read its request from: said on stderr (which
  // is the pool's), as the pool reports only the exit code.
  auto unusable = [&](const std::string& why) {
    std::fprintf(stderr, "troupe_env_worker: shared memory at fd %d: %s\n", shared_fd, why.c_str());
    return 2;
  };
  struct stat st;
  if (fstat(shared_fd, &st) != 0) return unusable(absl::StrCat("fstat: ", std::strerror(errno)));
  if (size_t(st.st_size) < sizeof(SharedHeader)) {
    return unusable(absl::StrCat(st.st_size, " bytes, smaller than its header (", sizeof(SharedHeader), ")"));
  }
  void* shared = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
  if (shared == MAP_FAILED) return unusable(absl::StrCat("mmap: ", std::strerror(errno)));
  auto* header = At<SharedHeader>(shared, 0);
  if (header->magic != kMagic) return unusable("not a troupe env worker header (magic)");
  if (header->count < 1 || header->count > EnvPoolOptions::kMaxEnvs) {
    return unusable(absl::StrCat("env count ", header->count, " is outside [1, ", EnvPoolOptions::kMaxEnvs, "]"));
  }
  const Layout layout(*header);
  if (layout.total > size_t(st.st_size)) {
    return unusable(absl::StrCat(st.st_size, " bytes, smaller than the ", layout.total, " its header lays out"));
  }
  auto refuse = [&](const absl::Status& status) {
    SetAnswer(header, status);
    WriteByte(socket_fd, kDone);
    return 1;
  };

  // The envs, made as the pool makes its own.
  EnvOptions options;
  options.task = std::string(header->task, strnlen(header->task, sizeof(header->task)));
  options.camera = std::string(header->camera, strnlen(header->camera, sizeof(header->camera)));
  options.pixels = header->pixels != 0;
  options.render = RenderOptions{header->width, header->height, header->shadows != 0, header->reflections != 0};
  options.multisample = header->multisample != 0;
  options.action_repeat = header->action_repeat;
  options.frame_stack = header->frame_stack;
  auto model = LoadTaskModel(options.task, options.multisample);
  if (!model.ok()) return refuse(model.status());
  const int count = header->count;
  std::vector<std::unique_ptr<Environment>> envs;
  for (int i = 0; i < count; ++i) {
    options.seed = EnvPool::SeedFor(header->seed, header->first + i);
    auto env = MakeEnv(options, *model);
    if (!env.ok()) return refuse(env.status());
    envs.push_back(*std::move(env));
  }
  const EnvSpec& spec = envs[0]->spec();
  const mjModel* m = (*model)->get();
  if (spec.action_size != header->action_size || spec.state_size != header->state_size ||
      int64_t(spec.pixel_bytes()) != header->pixel_bytes || m->nq != header->nq || m->nv != header->nv ||
      m->na != header->na || m->nmocap != header->nmocap) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        (*model)->path(), " made envs of other sizes than the pool's (action ", spec.action_size, " vs ",
        header->action_size, ", state ", spec.state_size, " vs ", header->state_size, ", pixels ",
        spec.pixel_bytes(), " vs ", header->pixel_bytes, ", nq ", m->nq, " vs ", header->nq,
        "); did the file change?")));
  }
  std::vector<EpisodeProgress> progress(count);
  SetAnswer(header, absl::OkStatus());
  if (!WriteByte(socket_fd, kDone)) return 0;

  // Serve until the pool closes the socket (or its process ends).
  const auto* slots = At<JobSlot>(shared, layout.jobs);
  const float* actions = At<float>(shared, layout.actions);
  auto* results = At<ResultSlot>(shared, layout.results);
  float* state = At<float>(shared, layout.state);
  uint8_t* pixels = header->pixel_bytes > 0 ? At<uint8_t>(shared, layout.pixels) : nullptr;
  double* physics = At<double>(shared, layout.physics);
  while (ReadByte(socket_fd, -1) == kRequest) {
    absl::Status first_error;
    const int num_jobs = header->num_jobs;
    for (int j = 0; j < num_jobs && j < count; ++j) {
      const int32_t local = slots[j].env;
      if (local < 0 || local >= count) {
        first_error = absl::InternalError(absl::StrCat("env worker: job for env ", local, " of ", count));
        break;
      }
      absl::Status error;
      const TimeStep t = AdvanceEnv(
          *envs[local], progress[local], slots[j].reset != 0, actions + size_t(local) * spec.action_size,
          ObservationBuffers{state + size_t(local) * spec.state_size,
                             pixels ? pixels + size_t(local) * spec.pixel_bytes() : nullptr},
          &error);
      if (first_error.ok()) first_error = error;
      results[local] = ResultSlot{static_cast<uint8_t>(t.step_type), t.reward, t.discount, progress[local].episode_step};
      double* out = physics + size_t(local) * PhysicsDoubles(*header);
      ForEachPhysicsField(*header, envs[local]->data(), [&](const double* field, int n) {
        std::memcpy(out, field, sizeof(double) * n);
        out += n;
      });
    }
    int64_t physics_errors = 0;
    for (const auto& env : envs) physics_errors += env->physics_errors();
    header->physics_errors = physics_errors;
    SetAnswer(header, first_error);
    if (!WriteByte(socket_fd, kDone)) break;
  }
  return 0;
}

}  // namespace troupe::envs
