#include "envs/render_worker.h"

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
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

extern char** environ;

namespace troupe::envs {
namespace {

constexpr uint64_t kMagic = 0x54524f5550455231ull;  // "TROUPER1"
constexpr char kRequest = 'R';
constexpr char kDone = 'D';
// A render is about a millisecond; a worker silent for this long is stuck.
constexpr int kAnswerTimeoutMs = 60'000;
// Making the contexts takes ~150 ms; loading a big model a little more.
constexpr int kStartTimeoutMs = 60'000;

// The shared memory: this header, then qpos (nq doubles), mocap_pos
// (3 x nmocap), mocap_quat (4 x nmocap), then the pixels (the model's whole
// offscreen buffer at most), each 64-byte aligned.
struct SharedHeader {
  uint64_t magic;
  int32_t nq, nmocap;
  int64_t pixel_capacity;
  // The request.
  int32_t camera_id, width, height;
  uint8_t shadows, reflections;
  // The answer: an absl::StatusCode and its message.
  int32_t code;
  char message[2048];
};

constexpr size_t Align(size_t n) { return (n + 63) & ~size_t(63); }

struct Layout {
  size_t qpos, mocap_pos, mocap_quat, pixels, total;
  Layout(int nq, int nmocap, int64_t pixel_capacity) {
    qpos = Align(sizeof(SharedHeader));
    mocap_pos = qpos + Align(sizeof(double) * nq);
    mocap_quat = mocap_pos + Align(sizeof(double) * 3 * nmocap);
    pixels = mocap_quat + Align(sizeof(double) * 4 * nmocap);
    total = pixels + Align(size_t(pixel_capacity));
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

// Waits up to `timeout_ms` for one byte on `socket`. Returns the byte, 0 on
// EOF or a socket error, -1 on timeout.
int ReadByte(int socket, int timeout_ms) {
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
  if (const char* path = std::getenv("TROUPE_RENDER_WORKER"); path != nullptr && *path != '\0') return path;
  return TROUPE_RENDER_WORKER_PATH;
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

RenderWorker::RenderWorker(std::shared_ptr<const Model> model, pid_t pid, int socket, void* shared,
                           size_t shared_bytes)
    : model_(std::move(model)), pid_(pid), socket_(socket), shared_(shared), shared_bytes_(shared_bytes) {}

absl::StatusOr<std::unique_ptr<RenderWorker>> RenderWorker::Start(std::shared_ptr<const Model> model,
                                                                  bool multisample) {
  const mjModel* m = model->get();
  const int64_t pixel_capacity = int64_t(m->vis.global.offwidth) * m->vis.global.offheight * 3;
  const Layout layout(m->nq, m->nmocap, pixel_capacity);
  auto fail = [&](const std::string& what) {
    return absl::UnavailableError(absl::StrCat("render worker for ", model->path(), ": ", what));
  };

  // Shared memory, set up before the worker maps it.
  const int memfd = memfd_create("troupe-render", MFD_CLOEXEC);
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
  auto* header = At<SharedHeader>(shared, 0);
  header->magic = kMagic;
  header->nq = m->nq;
  header->nmocap = m->nmocap;
  header->pixel_capacity = pixel_capacity;

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
  const std::string multisample_arg = multisample ? "1" : "0";
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>(model->path().c_str()),
                  const_cast<char*>(multisample_arg.c_str()), const_cast<char*>("3"), const_cast<char*>("4"),
                  nullptr};
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
                             " (build the troupe_render_worker target, or set TROUPE_RENDER_WORKER)"));
  }
  std::unique_ptr<RenderWorker> worker(new RenderWorker(std::move(model), pid, sockets[0], shared, layout.total));

  // Start-up: the worker answers once its contexts exist (or why not).
  const int byte = ReadByte(worker->socket_, kStartTimeoutMs);
  if (byte == -1) return fail(absl::StrCat(binary, " (pid ", pid, ") did not start within ", kStartTimeoutMs, " ms"));
  if (byte != kDone) return worker->WorkerGone("during start-up");
  RETURN_IF_ERROR(Answer(header));
  return worker;
}

RenderWorker::~RenderWorker() {
  close(socket_);
  if (pid_ > 0) Reap(pid_, std::chrono::seconds(1));
  munmap(shared_, shared_bytes_);
}

absl::Status RenderWorker::WorkerGone(const char* when) {
  const auto* header = At<SharedHeader>(shared_, 0);
  std::string how = pid_ > 0 ? Reap(pid_, std::chrono::seconds(1)) : "had already ended";
  std::string last = header->code != 0 ? absl::StrCat("; its last message: ", header->message) : "";
  dead_ = absl::UnavailableError(absl::StrCat("render worker (pid ", pid_, ") for ", model_->path(), " ", how, " ",
                                              when, last));
  pid_ = -1;
  return dead_;
}

absl::Status RenderWorker::Render(const mjData* data, int camera_id, const RenderOptions& options, uint8_t* out) {
  if (!dead_.ok()) return dead_;
  auto* header = At<SharedHeader>(shared_, 0);
  const Layout layout(header->nq, header->nmocap, header->pixel_capacity);
  const mjModel* m = model_->get();
  std::memcpy(At<double>(shared_, layout.qpos), data->qpos, sizeof(double) * m->nq);
  std::memcpy(At<double>(shared_, layout.mocap_pos), data->mocap_pos, sizeof(double) * 3 * m->nmocap);
  std::memcpy(At<double>(shared_, layout.mocap_quat), data->mocap_quat, sizeof(double) * 4 * m->nmocap);
  header->camera_id = camera_id;
  header->width = options.width;
  header->height = options.height;
  header->shadows = options.shadows;
  header->reflections = options.reflections;
  if (!WriteByte(socket_, kRequest)) return WorkerGone("before a render");
  const int byte = ReadByte(socket_, kAnswerTimeoutMs);
  if (byte == -1) {
    return absl::DeadlineExceededError(absl::StrCat("render worker (pid ", pid_, ") for ", model_->path(),
                                                    " did not answer within ", kAnswerTimeoutMs, " ms"));
  }
  if (byte != kDone) return WorkerGone("during a render");
  RETURN_IF_ERROR(Answer(header));
  // RenderPixels checked the size against the offscreen buffer, which bounds the pixel area.
  std::memcpy(out, At<uint8_t>(shared_, layout.pixels), size_t(options.width) * options.height * 3);
  return absl::OkStatus();
}

int RunRenderWorker(const std::string& model_path, bool multisample, int shared_fd, int socket_fd) {
  struct stat st;
  if (fstat(shared_fd, &st) != 0 || size_t(st.st_size) < sizeof(SharedHeader)) return 2;
  void* shared = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
  if (shared == MAP_FAILED) return 2;
  auto* header = At<SharedHeader>(shared, 0);
  if (header->magic != kMagic) return 2;
  const Layout layout(header->nq, header->nmocap, header->pixel_capacity);
  if (layout.total > size_t(st.st_size)) return 2;
  auto refuse = [&](const absl::Status& status) {
    SetAnswer(header, status);
    WriteByte(socket_fd, kDone);
    return 1;
  };

  auto model = Model::Load(model_path, multisample);
  if (!model.ok()) return refuse(model.status());
  const mjModel* m = (*model)->get();
  if (m->nq != header->nq || m->nmocap != header->nmocap) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(model_path, " loaded with nq ", m->nq, ", nmocap ",
                                                             m->nmocap, " but the pool's model has nq ", header->nq,
                                                             ", nmocap ", header->nmocap, " (file changed?)")));
  }
  if (auto status = PrepareRenderer(*model); !status.ok()) return refuse(status);
  mjData* d = mj_makeData(m);
  SetAnswer(header, absl::OkStatus());
  if (!WriteByte(socket_fd, kDone)) return 0;

  // Serve until the pool closes the socket (or its process ends).
  while (ReadByte(socket_fd, -1) == kRequest) {
    std::memcpy(d->qpos, At<double>(shared, layout.qpos), sizeof(double) * m->nq);
    std::memcpy(d->mocap_pos, At<double>(shared, layout.mocap_pos), sizeof(double) * 3 * m->nmocap);
    std::memcpy(d->mocap_quat, At<double>(shared, layout.mocap_quat), sizeof(double) * 4 * m->nmocap);
    absl::Status status;
    try {
      mj_fwdPosition(m, d);  // the poses the scene is built from
    } catch (const MujocoError& e) {
      status = absl::InternalError(absl::StrCat("MuJoCo position stage for ", model_path, ": ", e.what()));
    }
    if (status.ok()) {
      RenderOptions options{header->width, header->height, header->shadows != 0, header->reflections != 0};
      status = RenderPixels(*model, d, header->camera_id, options, At<uint8_t>(shared, layout.pixels));
    }
    SetAnswer(header, status);
    if (!WriteByte(socket_fd, kDone)) break;
  }
  mj_deleteData(d);
  return 0;
}

}  // namespace troupe::envs
