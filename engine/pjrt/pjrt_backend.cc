#include "engine/pjrt/pjrt_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/fnv1a.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

using nn::ConvGeometry;
using nn::FusedActivation;

namespace {

// A device error in a kernel (the Backend interface returns none): abort
// with the plugin's message, as a CUDA error does in the CUDA backend.
[[noreturn]] void Fatal(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "PJRT backend: %s: %s\n", what, status.ToString().c_str());
  std::abort();
}
void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Fatal(status, what);
}

size_t PageRound(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

}  // namespace

// A program being recorded: one kernel's (kernel at a time), or a whole
// step's (compiled steps: every kernel between BeginStep and EndStep). Device
// memory is tracked per allocation as the byte ranges the program has
// written so far, each an SSA value (word aligned: float32 words or bytes),
// so a kernel reading what an earlier kernel of the same program wrote gets
// that value itself — XLA sees the dataflow, not updates of whole buffers —
// and only what must outlive the program is written back: each written
// allocation once, as a result aliased to its parameter (donated, updated
// in place). Scratch (the tape's arena) in a step is never a parameter or a
// result: what the step left there is dead.
class PjrtBackend::Recorder {
 public:
  Recorder(PjrtBackend& backend, bool step) : b_(backend), step_(step) {
    if (step && backend.group_) f.set_replicas(backend.group_->size());
  }
  ~Recorder() {
    for (capi::Buffer* buffer : owned_) b_.client_->Destroy(buffer);
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  Function f;

  // Device data at `p` as a tensor of `dims` and `type` (f32, i32, ui8).
  Value Read(const void* p, const Dims& dims, std::string_view type) {
    int64_t offset = 0;
    Tracked& t = Touch(p, &offset);
    const bool bytes = type == "ui8";
    const int64_t n = Product(dims);
    Require(bytes || offset % 4 == 0, "a 4-byte operand at an unaligned address");
    Value flat = Range(t, offset, offset + (bytes ? n : 4 * n), /*words=*/!bytes);
    if (type == "i32") flat = f.BitcastConvert(flat, flat.dims, "i32");
    return f.Reshape(flat, dims);
  }

  // A float the program takes at run time (no recompile when it changes).
  Value Scalar(float value) {
    const int64_t capacity = step_ ? kStepScalars : kKernelScalars;
    if (!scalars_param_) {
      scalars_param_ = f.Parameter({capacity}, "f32");
      args_.push_back(nullptr);  // filled in by Run
      scalars_arg_ = static_cast<int>(args_.size()) - 1;
    }
    Require(static_cast<int64_t>(scalars_.size()) < capacity, "too many run-time scalars in one program");
    const int64_t i = static_cast<int64_t>(scalars_.size());
    scalars_.push_back(value);
    return f.Reshape(f.Slice(*scalars_param_, {i}, {i + 1}), {});
  }

  // Overwrites the data at `p` with v (f32, or ui8 bytes at any address).
  void Write(void* p, const Value& v) {
    int64_t offset = 0;
    Tracked& t = Touch(p, &offset);
    const int64_t n = v.size();
    Value flat = f.Reshape(v, {n});
    int64_t begin = offset, end = offset + (v.type == "ui8" ? n : 4 * n);
    if (v.type == "ui8") {
      // Widened to whole words with the bytes around it.
      const int64_t w0 = begin / 4 * 4, w1 = (end + 3) / 4 * 4;
      if (w0 != begin || w1 != end) flat = f.UpdateSlice(Range(t, w0, w1, /*words=*/false), flat, {begin - w0});
      begin = w0;
      end = w1;
    } else {
      Require(v.type == "f32" && offset % 4 == 0, "a float32 write at an unaligned address");
    }
    Insert(t, begin, end, flat);
    t.written = true;
  }

  // A value the host gets back after Run.
  int Result(const Value& v) {
    results_.push_back(v);
    return static_cast<int>(results_.size()) - 1;
  }
  // A host buffer the program reads (Upload's data); this recorder owns it.
  Value Input(capi::Buffer* buffer, const Dims& dims, std::string_view type) {
    args_.push_back(buffer);
    owned_.push_back(buffer);
    return f.Parameter(dims, type);
  }
  // Whether `base` (an allocation) is an argument or result of this program.
  bool Touches(uintptr_t base) const {
    return std::any_of(tracked_.begin(), tracked_.end(), [&](const Tracked& t) { return t.base == base; });
  }
  void CountKernel() { ++kernels_; }

  // Compiles (once per program text), executes, and installs the written
  // allocations; fetches the results for the host. `keep_scratch`: scratch
  // written so far is a result too (a step split at a host staging point,
  // whose next program reads it).
  // False, with nothing run, when the plugin refused a step's program and
  // the backend falls back to kernels (FallBackToKernels replays the step);
  // any other failure aborts, saying why.
  [[nodiscard]] bool Run(bool keep_scratch = false) {
    std::vector<Value> outputs;
    std::vector<Tracked*> written;
    for (Tracked& t : tracked_) {
      if (!t.written || (t.scratch && !keep_scratch)) continue;
      if (t.parameter >= 0) f.AliasParameter(t.parameter, static_cast<int>(outputs.size()));
      outputs.push_back(Materialize(t));
      written.push_back(&t);
    }
    for (const Value& r : results_) outputs.push_back(r);
    if (outputs.empty()) return true;  // nothing written or read back: nothing to run
    f.Return(outputs);
    const auto program_began = std::chrono::steady_clock::now();
    Program& program = b_.ProgramOf(f);
    b_.last_program_ = &program;
    const double compiled_before = b_.stats_.compile_seconds;
    const bool replicated = step_ && b_.group_ != nullptr;
    capi::LoadedExecutable* executable = nullptr;
    if (!replicated) {
      absl::StatusOr<capi::LoadedExecutable*> compiled = b_.Executable(program, step_ ? kernels_ : 0);
      if (!compiled.ok()) {
        if (step_ && b_.fall_back_to_kernels_) {
          b_.fallback_reason_ = std::string(compiled.status().message());
          return false;
        }
        std::fprintf(stderr, "%s\n", program.text.c_str());
        Fatal(compiled.status(), step_ ? "a step" : "a kernel");
      }
      executable = *compiled;
    }
    const double compile_seconds = b_.stats_.compile_seconds - compiled_before;
    if (step_) {
      b_.stats_.step_program_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - program_began).count() - compile_seconds;
    }
    Client& client = *b_.client_;
    if (scalars_param_) {
      scalars_.resize(static_cast<size_t>(scalars_param_->dims[0]), 0.0f);
      const int64_t dims[] = {scalars_param_->dims[0]};
      auto buffer = client.BufferFromHost(scalars_.data(), capi::kF32, dims, b_.device_);
      if (!buffer.ok()) Fatal(buffer.status(), "program scalars");
      args_[scalars_arg_] = *buffer;
      owned_.push_back(*buffer);
    }
    std::vector<capi::Buffer*> out(outputs.size(), nullptr);
    if (step_) {
      // The host's part of a step: recording its kernels, writing and finding
      // its program, its inputs (a first step's compile counted apart).
      b_.stats_.step_host_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count() - compile_seconds;
    }
    if (replicated) {
      // One program on every replica: the group runs it once all have arrived.
      PjrtReplicaGroup::Arrival arrival{&program.text, program.fingerprint, &args_, std::move(out)};
      b_.group_->Execute(b_.device_, &arrival, b_.client_, b_.cache_dir_);
      out = std::move(arrival.outputs);
      if (arrival.compile_seconds > 0) {
        b_.NoteStepCompile(arrival.compile_seconds, kernels_, program.text.size(), arrival.from_cache);
      }
    } else {
      Check(client.Execute(executable, args_, out, b_.device_), step_ ? "executing a step" : "launching a kernel");
    }
    ++b_.stats_.launches;
    if (step_) ++b_.stats_.step_launches;
    for (size_t i = 0; i < written.size(); ++i) {
      Allocation& a = *written[i]->allocation;
      client.Destroy(a.buffer);  // donated to the execution (or, scratch, replaced)
      a.buffer = out[i];
      if (written[i]->scratch) a.live_in_step = true;
    }
    for (size_t i = 0; i < results_.size(); ++i) {
      capi::Buffer* r = out[written.size() + i];
      const Value& v = results_[i];
      host_.emplace_back(static_cast<size_t>(v.size()) * (v.type == "ui8" ? 1 : 4));
      Check(client.ToHost(r, host_.back().data(), host_.back().size()), "reading a program's result");
      client.Destroy(r);
    }
    for (capi::Buffer* buffer : owned_) client.Destroy(buffer);
    owned_.clear();
    return true;
  }
  const std::vector<char>& host(int i) const { return host_.at(i); }

  // The step's calls as they were made, kept while the backend may fall back
  // to kernels (PjrtBackendOptions::fall_back_to_kernels): each runs again,
  // kernel at a time, if the plugin refuses the step's program. `call` is
  // the backend's own method with its arguments (device addresses, sizes,
  // scalars by value).
  bool capturing() const { return step_ && b_.fall_back_to_kernels_; }
  void Capture(std::function<void()> call) { calls_.push_back(std::move(call)); }
  // For the replay: the calls, and the upload buffers (each an Upload's
  // data, now its replayed call's to own and destroy).
  std::vector<std::function<void()>> TakeCalls() {
    owned_.clear();
    return std::move(calls_);
  }

 private:
  // Floats a program takes at run time: one float32 vector parameter of this
  // many entries (a kernel's few, a step's learning rates, bias corrections,
  // slopes).
  static constexpr int64_t kKernelScalars = 16;
  static constexpr int64_t kStepScalars = 4096;

  // A written byte range [begin, end) of an allocation: f32[(end - begin) / 4]
  // or ui8[end - begin]; begin and end are multiples of 4.
  struct Piece {
    int64_t end;
    Value v;
  };
  struct Tracked {
    uintptr_t base;
    Allocation* allocation;
    bool scratch;        // no parameter: what it held before the program is dead
    int parameter = -1;  // index among the function's parameters
    Value whole;         // the parameter (f32[words]) when there is one
    std::map<int64_t, Piece> pieces;
    bool written = false;
  };

  static int64_t Product(const Dims& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  static void Require(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "PJRT backend: %s\n", what);
    std::abort();
  }

  Tracked& Touch(const void* p, int64_t* offset) {
    auto [base, allocation] = b_.Find(p, offset);
    for (Tracked& t : tracked_) {
      if (t.base == base) return t;
    }
    Tracked t{base, allocation, step_ && allocation->scratch && !allocation->live_in_step};
    if (!t.scratch) {
      t.whole = f.Parameter({allocation->words}, "f32");
      t.parameter = f.num_parameters() - 1;
      args_.push_back(allocation->buffer);
    }
    tracked_.push_back(std::move(t));
    return tracked_.back();
  }

  // A word value as bytes (ui8[4n]) and back.
  Value AsBytes(const Value& v) {
    if (v.type == "ui8") return v;
    return f.Reshape(f.BitcastConvert(v, {v.dims[0], 4}, "ui8"), {4 * v.dims[0]});
  }
  Value AsWords(const Value& v) {
    if (v.type == "f32") return v;
    return f.BitcastConvert(f.Reshape(v, {v.dims[0] / 4, 4}), {v.dims[0] / 4}, "f32");
  }
  // Bytes [from, to) of a piece or parameter value starting at byte `at`
  // (all multiples of 4), in the value's own element type.
  Value Cut(const Value& v, int64_t at, int64_t from, int64_t to) {
    const int64_t k = v.type == "ui8" ? 1 : 4;
    if (from == at && (to - from) / k == v.dims[0]) return v;
    return f.Slice(v, {(from - at) / k}, {(to - at) / k});
  }

  // The allocation's bytes [begin, end) as of this point of the program, as
  // f32 words (`words`: begin and end multiples of 4) or ui8 bytes.
  Value Range(Tracked& t, int64_t begin, int64_t end, bool words) {
    const int64_t a0 = begin / 4 * 4, a1 = (end + 3) / 4 * 4;
    // The segments covering [a0, a1): written pieces, and what was there
    // before (the parameter; zeros for scratch) in the gaps.
    std::vector<Value> segments;
    auto it = t.pieces.upper_bound(a0);
    if (it != t.pieces.begin() && std::prev(it)->second.end > a0) --it;
    int64_t at = a0;
    auto gap = [&](int64_t to) {
      if (to <= at) return;
      segments.push_back(t.scratch ? f.Constant(0.0, "f32", {(to - at) / 4}) : Cut(t.whole, 0, at, to));
      at = to;
    };
    for (; it != t.pieces.end() && it->first < a1; ++it) {
      gap(it->first);
      const int64_t to = std::min(it->second.end, a1);
      // One piece exactly the range, in the type asked for: the value itself.
      if (it->first == begin && it->second.end == end && (it->second.v.type == "ui8") != words) return it->second.v;
      segments.push_back(Cut(it->second.v, it->first, at, to));
      at = to;
    }
    gap(a1);
    const bool all_words = std::all_of(segments.begin(), segments.end(), [](const Value& v) { return v.type == "f32"; });
    if (words && all_words) return segments.size() == 1 ? segments[0] : f.Concatenate(segments, 0);
    for (Value& s : segments) s = AsBytes(s);
    Value bytes = segments.size() == 1 ? segments[0] : f.Concatenate(segments, 0);
    if (a0 != begin || a1 != end) bytes = f.Slice(bytes, {begin - a0}, {end - a0});
    return words ? AsWords(bytes) : bytes;
  }

  // Records that bytes [begin, end) now hold v (word aligned).
  void Insert(Tracked& t, int64_t begin, int64_t end, const Value& v) {
    // Pieces overlapping [begin, end) keep what lies outside it.
    auto it = t.pieces.upper_bound(begin);
    if (it != t.pieces.begin() && std::prev(it)->second.end > begin) --it;
    std::vector<std::pair<int64_t, Piece>> kept;
    while (it != t.pieces.end() && it->first < end) {
      const int64_t pb = it->first, pe = it->second.end;
      if (pb < begin) kept.push_back({pb, {begin, Cut(it->second.v, pb, pb, begin)}});
      if (pe > end) kept.push_back({end, {pe, Cut(it->second.v, pb, end, pe)}});
      it = t.pieces.erase(it);
    }
    for (auto& [b, piece] : kept) t.pieces.emplace(b, std::move(piece));
    t.pieces.emplace(begin, Piece{end, v});
  }

  // Bytes of the allocation the pieces cover.
  static int64_t Covered(const Tracked& t) {
    int64_t covered = 0;
    for (const auto& [begin, piece] : t.pieces) covered += piece.end - begin;
    return covered;
  }

  // The whole allocation (f32[words]) with everything written: where the
  // pieces cover it all (scratch; a gradient buffer filled then accumulated
  // into tensor by tensor), their concatenation, the same value a kernel
  // reading all of it got; else the parameter updated in place piece by piece.
  Value Materialize(Tracked& t) {
    const int64_t words = t.allocation->words;
    if (t.scratch || Covered(t) == 4 * words) return Range(t, 0, 4 * words, /*words=*/true);
    Value v = t.whole;
    for (auto& [begin, piece] : t.pieces) v = f.UpdateSlice(v, AsWords(piece.v), {begin / 4});
    return v;
  }

  PjrtBackend& b_;
  bool step_;
  std::vector<Tracked> tracked_;  // std::vector: references stay valid only until the next Touch
  std::vector<capi::Buffer*> args_;
  std::vector<capi::Buffer*> owned_;
  std::optional<Value> scalars_param_;
  int scalars_arg_ = -1;
  std::vector<float> scalars_;
  std::vector<Value> results_;
  std::vector<std::vector<char>> host_;
  std::vector<std::function<void()>> calls_;
  int64_t kernels_ = 0;
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
};

// One kernel call: records into the step's program inside a compiled step,
// else into a program of its own that Run() executes at once.
class PjrtBackend::Launch {
 public:
  explicit Launch(PjrtBackend& backend)
      : own_(backend.step_ ? nullptr : std::make_unique<Recorder>(backend, /*step=*/false)),
        r_(backend.step_ ? *backend.step_ : *own_),
        f(r_.f) {
    r_.CountKernel();
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

 private:
  std::unique_ptr<Recorder> own_;
  Recorder& r_;

 public:
  Function& f;

  Value Read(const void* p, const Dims& dims, std::string_view type) { return r_.Read(p, dims, type); }
  Value F32(const float* p, const Dims& dims) { return r_.Read(p, dims, "f32"); }
  Value I32(const int32_t* p, const Dims& dims) { return r_.Read(p, dims, "i32"); }
  Value Scalar(float value) { return r_.Scalar(value); }
  Value Const(double value) { return f.Constant(value); }
  void Write(void* p, const Value& v) { r_.Write(p, v); }
  // *p += v; nothing when p is null (a gradient nobody needs).
  void Accumulate(float* p, const Value& v) {
    if (p != nullptr) r_.Write(p, f.Add(F32(p, v.dims), v));
  }
  // *p = v, or with `accumulate` *p += v.
  void Store(float* p, const Value& v, bool accumulate) {
    if (accumulate) {
      Accumulate(p, v);
    } else {
      Write(p, v);
    }
  }
  int Result(const Value& v) { return r_.Result(v); }
  Value Input(capi::Buffer* buffer, const Dims& dims, std::string_view type) { return r_.Input(buffer, dims, type); }
  // Runs the kernel's own program (nothing inside a compiled step: the step's
  // program runs at its end).
  void Run() {
    if (own_) (void)own_->Run();  // a kernel's program: never refused without aborting
  }
  const std::vector<char>& host(int i) const { return r_.host(i); }
};

// --- Compiled steps on disk ------------------------------------------------------

namespace {

// A program compiled for `replicas` replicas, from the on-disk cache
// in `cache_dir` when it holds one for this plugin, device kind and text
// (one file per program, named by a 128-bit hash of them; a file that does
// not load is compiled again and replaced; written to a temporary name and
// renamed, so a killed process leaves no half file), else compiled and, where
// the plugin can serialize it, stored there. `cache_dir` empty: no cache.
absl::StatusOr<capi::LoadedExecutable*> CompileProgram(Client& client, const std::string& cache_dir,
                                                       const std::string& text, int replicas, double* seconds,
                                                       bool* from_cache) {
  const auto start = std::chrono::steady_clock::now();
  *from_cache = false;
  std::string path;
  if (!cache_dir.empty()) {
    const std::string key = absl::StrCat(client.plugin().path(), "\n", client.platform(), "\n",
                                         client.device_kind(0), "\n", replicas, "\n", text);
    path = absl::StrCat(cache_dir, "/", absl::Hex(Fnv1a64(key.data(), key.size()), absl::kZeroPad16),
                        absl::Hex(Fnv1a64(key.data(), key.size(), kCheckpointFnv1aBasis), absl::kZeroPad16),
                        ".xla");
    std::ifstream in(path, std::ios::binary);
    if (in) {
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (auto loaded = client.Deserialize(bytes); loaded.ok()) {
        *from_cache = true;
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return *loaded;
      }
    }
  }
  auto executable = client.Compile(text, replicas);
  if (!executable.ok()) {
    return absl::Status(executable.status().code(), absl::StrCat("compiling a program for ", replicas, " replica(s) (",
                                                                 text.size() / 1024, " KB of StableHLO): ",
                                                                 executable.status().message()));
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!path.empty()) {
    // Best effort: a cache that cannot be written costs a compile next time.
    if (auto bytes = client.Serialize(*executable); bytes.ok()) {
      std::error_code ignored;
      std::filesystem::create_directories(cache_dir, ignored);
      const std::string temporary = absl::StrCat(path, ".", getpid(), ".tmp");
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      out.close();
      if (out) {
        std::filesystem::rename(temporary, path, ignored);
      } else {
        std::filesystem::remove(temporary, ignored);
      }
    }
  }
  return *executable;
}

}  // namespace

std::string DefaultPjrtCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/troupe/pjrt");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/troupe/pjrt");
  }
  return "/tmp/troupe-pjrt-cache";
}

// --- Set-up and memory --------------------------------------------------------

absl::StatusOr<std::unique_ptr<PjrtBackend>> PjrtBackend::Create(const PjrtBackendOptions& options) {
  auto client = Client::Shared(options.plugin, options.client);
  if (!client.ok()) return client.status();
  if (options.device < 0 || options.device >= (*client)->num_devices()) {
    return absl::OutOfRangeError(absl::StrCat("PJRT plugin ", options.plugin, ": device ", options.device,
                                              " asked for, the plugin has ", (*client)->num_devices(), " (",
                                              (*client)->platform(), ")"));
  }
  if (options.group && options.group->size() > (*client)->num_devices()) {
    return absl::OutOfRangeError(absl::StrCat("PJRT plugin ", options.plugin, ": ", options.group->size(),
                                              " replicas in one program need as many devices, the plugin has ",
                                              (*client)->num_devices(), " (", (*client)->platform(), ")"));
  }
  return std::unique_ptr<PjrtBackend>(new PjrtBackend(*std::move(client), options));
}

PjrtBackend::PjrtBackend(std::shared_ptr<Client> client, const PjrtBackendOptions& options)
    : client_(std::move(client)),
      device_(options.device),
      bfloat16_(options.bfloat16),
      compile_steps_(options.compile_steps),
      fall_back_to_kernels_(options.compile_steps && options.fall_back_to_kernels &&
                            !(options.group && options.group->size() > 1)),
      refuse_step_programs_(options.refuse_step_programs),
      cache_dir_(options.cache_dir),
      group_(options.group && options.group->size() > 1 ? options.group : nullptr) {}

PjrtBackend::~PjrtBackend() {
  step_.reset();
  ReleaseScratchPool();
  for (auto& [base, a] : allocations_) {
    client_->Destroy(a.buffer);
    munmap(reinterpret_cast<void*>(base), a.reserved);
  }
  for (auto& [fingerprint, program] : programs_) {
    if (program.executable != nullptr) client_->Destroy(program.executable);
  }
}

const std::string& PjrtBackend::last_program() const {
  static const std::string none;
  return last_program_ != nullptr ? last_program_->text : none;
}

std::string PjrtBackend::name() const { return absl::StrCat("pjrt:", client_->platform(), ":", device_); }

void* PjrtBackend::Allocate(size_t bytes) {
  Allocation a;
  a.bytes = bytes;
  a.reserved = PageRound(bytes);
  a.words = static_cast<int64_t>(std::max<size_t>(1, (bytes + 3) / 4));
  // Addresses only: PROT_NONE and never backed, so the host cannot use them.
  void* base = mmap(nullptr, a.reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    std::fprintf(stderr, "PJRT backend: no address range for an allocation of %zu bytes\n", bytes);
    std::abort();
  }
  // Contents are undefined by the contract; zeros are what the device gets.
  const std::vector<float> zeros(static_cast<size_t>(a.words), 0.0f);
  const int64_t dims[] = {a.words};
  auto buffer = client_->BufferFromHost(zeros.data(), capi::kF32, dims, device_);
  if (!buffer.ok()) Fatal(buffer.status(), absl::StrCat("allocating ", bytes, " bytes").c_str());
  a.buffer = *buffer;
  allocations_.emplace(reinterpret_cast<uintptr_t>(base), a);
  return base;
}

void PjrtBackend::Free(void* p) {
  if (p == nullptr) return;
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations_.end()) {
    std::fprintf(stderr, "PJRT backend: Free(%p): not an allocation of this backend\n", p);
    std::abort();
  }
  if (step_ && step_->Touches(it->first)) {
    std::fprintf(stderr, "PJRT backend: Free(%p) of memory the step being recorded uses\n", p);
    std::abort();
  }
  client_->Destroy(it->second.buffer);
  munmap(p, it->second.reserved);
  allocations_.erase(it);
}

void* PjrtBackend::AllocateScratch(size_t bytes) {
  void* p = Allocate(bytes);
  allocations_.at(reinterpret_cast<uintptr_t>(p)).scratch = true;
  return p;
}

std::pair<uintptr_t, PjrtBackend::Allocation*> PjrtBackend::Find(const void* p, int64_t* byte_offset) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = allocations_.upper_bound(address);
  if (p == nullptr || it == allocations_.begin() || address >= std::prev(it)->first + std::prev(it)->second.bytes) {
    std::fprintf(stderr, "PJRT backend: %p is not this device's memory (host memory given to a kernel?)\n", p);
    std::abort();
  }
  --it;
  *byte_offset = static_cast<int64_t>(address - it->first);
  return {it->first, &it->second};
}

PjrtBackend::Program& PjrtBackend::ProgramOf(const Function& f) {
  const Fingerprint fingerprint = f.fingerprint();
  auto [it, met_first] = programs_.try_emplace(fingerprint);
  if (met_first) {
    it->second.fingerprint = fingerprint;
    it->second.text = f.Module();
    ++stats_.programs_printed;
  }
  return it->second;
}

absl::StatusOr<capi::LoadedExecutable*> PjrtBackend::Executable(Program& program, int64_t step_kernels) {
  if (program.executable != nullptr) return program.executable;
  if (step_kernels > 0 && refuse_step_programs_) {
    return absl::InvalidArgumentError("compiling a step: refused, as a plugin would refuse one (a test's "
                                      "PjrtBackendOptions::refuse_step_programs)");
  }
  // A step's program is kept on disk too; a kernel's is cheap to compile again.
  double seconds = 0;
  bool from_cache = false;
  ASSIGN_OR_RETURN(program.executable, CompileProgram(*client_, step_kernels > 0 ? cache_dir_ : std::string(),
                                                      program.text, 1, &seconds, &from_cache));
  if (step_kernels > 0) {
    NoteStepCompile(seconds, step_kernels, program.text.size(), from_cache);
  } else {
    stats_.compile_seconds += seconds;
    ++stats_.compiles;
  }
  return program.executable;
}

void PjrtBackend::NoteStepCompile(double seconds, int64_t kernels, size_t text_bytes, bool from_cache) {
  stats_.compile_seconds += seconds;
  ++(from_cache ? stats_.step_cache_loads : stats_.step_compiles);
  if (!from_cache) ++stats_.compiles;
  // Once per program: a step's shape changes rarely (a new batch size).
  const std::string replicas = group_ ? absl::StrCat(" for ", group_->size(), " replicas") : std::string();
  std::fprintf(stderr, "troupe: %s %s a step%s (%lld kernels, %zu KB of StableHLO) in %.2f s\n", name().c_str(),
               from_cache ? "loaded (from the on-disk cache)" : "compiled", replicas.c_str(), static_cast<long long>(kernels),
               text_bytes / 1024, seconds);
}

// --- Steps ----------------------------------------------------------------------

void PjrtBackend::BeginStep() {
  nn::Backend::BeginStep();
  if (!compile_steps_) return;
  for (auto& [base, a] : allocations_) a.live_in_step = false;
  step_ = std::make_unique<Recorder>(*this, /*step=*/true);
}

void PjrtBackend::AllReduceInStep(float* data, int64_t count, bool mean) {
  if (!reduces_in_step()) nn::Backend::AllReduceInStep(data, count, mean);  // aborts, saying why
  if (count == 0) return;
  Launch l(*this);
  Value sum = l.f.AllReduce(l.F32(data, {count}), group_->size());
  l.Write(data, mean ? l.f.Mul(sum, l.Const(1.0 / group_->size())) : sum);
  l.Run();
}

PjrtReplicaGroup::~PjrtReplicaGroup() {
  for (auto& [text, executable] : executables_) client_->Destroy(executable);
}

void PjrtReplicaGroup::Execute(int replica, Arrival* arrival, const std::shared_ptr<Client>& client,
                               const std::string& cache_dir) {
  std::unique_lock<std::mutex> lock(mu_);
  if (arrivals_[replica] != nullptr) {
    std::fprintf(stderr, "PJRT replicas: replica %d arrived twice at one step\n", replica);
    std::abort();
  }
  arrivals_[replica] = arrival;
  const uint64_t generation = generation_;
  if (++arrived_ < replicas_) {
    if (!done_.wait_for(lock, timeout_, [&] { return generation_ != generation; })) {
      std::fprintf(stderr, "PJRT replicas: replica %d waited %llds for the others' step (%d of %d arrived)\n", replica,
                   static_cast<long long>(timeout_.count()), arrived_, replicas_);
      std::abort();
    }
    return;
  }
  // The last to arrive: one program for all.
  if (!client_) client_ = client;
  const Arrival& first = *arrivals_[0];
  for (int r = 1; r < replicas_; ++r) {
    if (arrivals_[r]->fingerprint != first.fingerprint) {
      std::fprintf(stderr, "PJRT replicas: replica %d recorded another step than replica 0 (%zu and %zu bytes)\n", r,
                   arrivals_[r]->text->size(), first.text->size());
      std::abort();
    }
  }
  auto it = executables_.find(first.fingerprint);
  if (it == executables_.end()) {
    absl::StatusOr<capi::LoadedExecutable*> executable =
        CompileProgram(*client_, cache_dir, *first.text, replicas_, &arrival->compile_seconds, &arrival->from_cache);
    if (!executable.ok()) {
      std::fprintf(stderr, "%s\n", first.text->c_str());
      Fatal(executable.status(), "a replicated step");
    }
    it = executables_.emplace(first.fingerprint, *executable).first;
  }
  std::vector<std::vector<capi::Buffer*>> args, outputs;
  for (int r = 0; r < replicas_; ++r) {
    args.push_back(*arrivals_[r]->args);
    outputs.push_back(std::move(arrivals_[r]->outputs));
  }
  Check(client_->ExecuteReplicated(it->second, args, outputs), "executing a replicated step");
  for (int r = 0; r < replicas_; ++r) {
    arrivals_[r]->outputs = std::move(outputs[r]);
    arrivals_[r] = nullptr;
  }
  arrived_ = 0;
  ++generation_;
  done_.notify_all();
}

void PjrtBackend::EndStep() {
  if (!step_) {
    nn::Backend::EndStep();  // kernel at a time: the reads are downloads
    return;
  }
  // The reads the host asked for are results of the step's one program.
  std::vector<DeferredRead> reads = TakeDeferredReads();
  std::vector<int> results;
  for (const DeferredRead& r : reads) {
    const bool words = reinterpret_cast<uintptr_t>(r.device) % 4 == 0 && r.bytes % 4 == 0;
    const int64_t count = static_cast<int64_t>(words ? r.bytes / 4 : r.bytes);
    results.push_back(step_->Result(step_->Read(r.device, {count}, words ? "f32" : "ui8")));
  }
  set_in_step(false);
  std::unique_ptr<Recorder> step = std::move(step_);
  if (!step->Run()) {
    // The plugin refused the step's program: the step again, kernel at a
    // time, and its reads as downloads.
    FallBackToKernels(*step);
    for (const DeferredRead& r : reads) Download(r.device, r.host, r.bytes);
    return;
  }
  ++stats_.steps;
  for (size_t i = 0; i < reads.size(); ++i) std::memcpy(reads[i].host, step->host(results[i]).data(), reads[i].bytes);
}

void PjrtBackend::KeepForFallback(std::function<void()> call) {
  if (step_ && step_->capturing()) step_->Capture(std::move(call));
}

void PjrtBackend::FallBackToKernels(Recorder& step) {
  std::fprintf(stderr,
               "troupe: %s: the plugin refused a compiled step (%s); this backend runs kernel at a time from here "
               "on (engine.pjrt_steps COMPILED_ELSE_KERNELS)\n",
               name().c_str(), fallback_reason_.c_str());
  compile_steps_ = false;
  ++stats_.step_fallbacks;
  for (const std::function<void()>& call : step.TakeCalls()) call();
}

namespace {

// A host transfer of `bytes` at `offset` into an allocation: float words
// where it is aligned to them, else bytes; `whole`: all of the allocation.
struct Transfer {
  bool words;
  bool whole;
  int64_t count;  // words or bytes
};
Transfer TransferOf(const char* what, int64_t offset, size_t bytes, size_t allocation_bytes, int64_t allocation_words) {
  if (offset + static_cast<int64_t>(bytes) > static_cast<int64_t>(allocation_bytes)) {
    std::fprintf(stderr, "PJRT backend: %s of %zu bytes at offset %ld overruns an allocation of %zu\n", what, bytes,
                 static_cast<long>(offset), allocation_bytes);
    std::abort();
  }
  const bool words = offset % 4 == 0 && bytes % 4 == 0;
  return {words, words && offset == 0 && static_cast<int64_t>(bytes / 4) == allocation_words,
          static_cast<int64_t>(words ? bytes / 4 : bytes)};
}

}  // namespace

void PjrtBackend::Upload(const void* host, void* device, size_t bytes) {
  if (bytes == 0) return;
  int64_t offset = 0;
  Allocation* a = Find(device, &offset).second;
  const Transfer t = TransferOf("Upload", offset, bytes, a->bytes, a->words);
  const int64_t dims[] = {t.count};
  const auto began = std::chrono::steady_clock::now();
  auto buffer = client_->BufferFromHost(host, t.words ? capi::kF32 : capi::kU8, dims, device_);
  if (!buffer.ok()) Fatal(buffer.status(), "uploading");
  if (step_) stats_.step_upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  if (t.whole && !step_) {
    // The whole allocation: the new buffer replaces the old one.
    client_->Destroy(a->buffer);
    a->buffer = *buffer;
    return;
  }
  const auto write = [this, device, buffer = *buffer, t] {
    Launch l(*this);
    l.Write(device, l.Input(buffer, {t.count}, t.words ? "f32" : "ui8"));
    l.Run();
  };
  write();
  // The replay's own copy of the data is the buffer (its upload).
  KeepForFallback(write);
}

void PjrtBackend::Download(const void* device, void* host, size_t bytes) {
  if (bytes == 0) return;
  if (step_) {
    if (host_reads_forbidden()) {
      std::fprintf(stderr,
                   "PJRT backend: Download of %zu bytes inside a compiled step (a host round trip): read it with "
                   "ReadAtStepEnd\n",
                   bytes);
      std::abort();
    }
    // A collective's staging: the step so far runs as a program of its own,
    // the bytes come back, and the rest of the step records anew.
    std::unique_ptr<Recorder> first = std::move(step_);  // out of the way: a replay runs kernel at a time
    if (!first->Run(/*keep_scratch=*/true)) FallBackToKernels(*first);
  }
  struct Resume {
    PjrtBackend* b;
    bool resume;
    ~Resume() {
      if (resume) b->step_ = std::make_unique<Recorder>(*b, /*step=*/true);
    }
  } resume{this, in_step() && compile_steps_};
  int64_t offset = 0;
  Allocation* a = Find(device, &offset).second;
  const Transfer t = TransferOf("Download", offset, bytes, a->bytes, a->words);
  if (t.whole) {
    Check(client_->ToHost(a->buffer, host, bytes), "downloading");
    return;
  }
  Launch l(*this);
  l.Result(l.Read(device, {t.count}, t.words ? "f32" : "ui8"));
  l.Run();
  std::memcpy(host, l.host(0).data(), bytes);
}

void PjrtBackend::Synchronize() {
  if (step_) return;  // nothing of the step has run yet: its program runs at EndStep
  for (auto& [base, a] : allocations_) Check(client_->Await(a.buffer), "synchronising");
}

// --- Memory kernels -------------------------------------------------------------

void PjrtBackend::Fill(float* x, int64_t n, float value, float step) {
  KeepForFallback([=, this] { Fill(x, n, value, step); });
  if (n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value v = f.Splat(l.Scalar(value), {n});
  if (step != 0.0f) v = f.Add(v, f.Mul(f.Iota({n}, 0, "f32"), l.Scalar(step)));
  l.Write(x, v);
  l.Run();
}

void PjrtBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                             float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  KeepForFallback([=, this] { CopyBlocks(outer, len, src, src_stride, src_offset, dst, dst_stride, dst_offset, accumulate); });
  if (outer == 0 || len == 0) return;
  Launch l(*this);
  Function& f = l.f;
  // The span from the first block's start to the last one's end, padded to
  // whole strides and viewed as [outer, stride].
  auto span = [&](const float* base, int64_t stride) {
    const int64_t count = (outer - 1) * stride + len;
    return f.Reshape(f.Pad(l.F32(base, {count}), l.Const(0.0), {0}, {outer * stride - count}), {outer, stride});
  };
  Value blocks = f.Slice(span(src + src_offset, src_stride), {0, 0}, {outer, len});
  float* out = dst + dst_offset;
  Value region = span(out, dst_stride);
  if (accumulate) blocks = f.Add(blocks, f.Slice(region, {0, 0}, {outer, len}));
  Value updated = f.UpdateSlice(region, blocks, {0, 0});
  const int64_t count = (outer - 1) * dst_stride + len;
  l.Write(out, f.Slice(f.Reshape(updated, {outer * dst_stride}), {0}, {count}));
  l.Run();
}

// --- Dense ------------------------------------------------------------------------

namespace {

// Matrix-multiply and convolution inputs in the backend's precision.
Value MatmulInput(Function& f, const Value& x, bool bfloat16) { return bfloat16 ? f.Convert(x, "bf16") : x; }

}  // namespace

void PjrtBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       const float* b, float beta, float* c) {
  KeepForFallback([=, this] { Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c); });
  if (m == 0 || n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value product;
  if (k == 0) {
    product = f.Constant(0.0, "f32", {m, n});
  } else {
    Value av = MatmulInput(f, l.F32(a, trans_a ? Dims{k, m} : Dims{m, k}), bfloat16_);
    Value bv = MatmulInput(f, l.F32(b, trans_b ? Dims{n, k} : Dims{k, n}), bfloat16_);
    product = f.Dot(av, bv, {trans_a ? 0 : 1}, {trans_b ? 1 : 0}, {}, {}, !bfloat16_);
  }
  if (alpha != 1.0f) product = f.Mul(l.Scalar(alpha), product);
  // beta == 0 never reads c (it may hold anything, NaN included).
  if (beta != 0.0f) product = f.Add(product, f.Mul(l.Scalar(beta), l.F32(c, {m, n})));
  l.Write(c, product);
  l.Run();
}

// --- Convolution --------------------------------------------------------------------
// XLA's convolution with explicit dimension numbers; the backward kernels are
// convolutions too (as JAX derives them): the input gradient a convolution of
// the stride-dilated output gradient with the flipped kernel, the weight
// gradient one of the input with the output gradient as a dilated kernel.

namespace {

constexpr std::string_view kNchw = "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]";

// conv(x, w) for x [n, c, h, w], w [oc, c, kh, kw] -> [n, oc, oh, ow].
Value ConvForward(Function& f, const ConvGeometry& g, const Value& x, const Value& w, bool bf16) {
  return f.Convolution(MatmulInput(f, x, bf16), MatmulInput(f, w, bf16), kNchw, {g.n, g.oc, g.oh(), g.ow()},
                       {g.stride, g.stride}, {{g.pad, g.pad}, {g.pad, g.pad}}, {1, 1}, {1, 1}, !bf16);
}

// The adjoint of ConvForward in x: dy [n, oc, oh, ow] -> [n, c, h, w].
Value ConvInputGrad(Function& f, const ConvGeometry& g, const Value& dy, const Value& w, bool bf16) {
  const int64_t lo_h = g.kh - 1 - g.pad, lo_w = g.kw - 1 - g.pad;
  const int64_t hi_h = g.h + g.kh - 1 - lo_h - ((g.oh() - 1) * g.stride + 1);
  const int64_t hi_w = g.w + g.kw - 1 - lo_w - ((g.ow() - 1) * g.stride + 1);
  return f.Convolution(MatmulInput(f, dy, bf16), MatmulInput(f, f.Reverse(w, {2, 3}), bf16),
                       "[b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1]", {g.n, g.c, g.h, g.w}, {1, 1},
                       {{lo_h, hi_h}, {lo_w, hi_w}}, {g.stride, g.stride}, {1, 1}, !bf16);
}

// The adjoint of ConvForward in w: x [n, c, h, w], dy [n, oc, oh, ow] -> [oc, c, kh, kw].
Value ConvWeightGrad(Function& f, const ConvGeometry& g, const Value& x, const Value& dy, bool bf16) {
  const int64_t hi_h = g.kh + (g.oh() - 1) * g.stride - g.h - g.pad;
  const int64_t hi_w = g.kw + (g.ow() - 1) * g.stride - g.w - g.pad;
  return f.Convolution(MatmulInput(f, x, bf16), MatmulInput(f, dy, bf16), "[f, b, 0, 1]x[i, o, 0, 1]->[f, b, 0, 1]",
                       {g.oc, g.c, g.kh, g.kw}, {1, 1}, {{g.pad, hi_h}, {g.pad, hi_w}}, {1, 1},
                       {g.stride, g.stride}, !bf16);
}

Value AddChannelBias(Function& f, const Value& y, const Value& bias) {
  return f.Add(y, f.Broadcast(bias, y.dims, {1}));
}

}  // namespace

void PjrtBackend::Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                                const float* b, float* y) {
  KeepForFallback([=, this] { Conv2dForward(g, act, x, w, b, y); });
  Launch l(*this);
  Function& f = l.f;
  Value out = ConvForward(f, g, l.F32(x, {g.n, g.c, g.h, g.w}), l.F32(w, {g.oc, g.c, g.kh, g.kw}), bfloat16_);
  if (b != nullptr) out = AddChannelBias(f, out, l.F32(b, {g.oc}));
  if (act == FusedActivation::kRelu) out = f.Max(out, l.Const(0.0));
  l.Write(y, out);
  l.Run();
}

void PjrtBackend::Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                                 const float* y, const float* dy, float* dx, float* dw, float* db) {
  KeepForFallback([=, this] { Conv2dBackward(g, act, x, w, y, dy, dx, dw, db); });
  Launch l(*this);
  Function& f = l.f;
  const Dims out_dims = {g.n, g.oc, g.oh(), g.ow()};
  Value d = l.F32(dy, out_dims);
  if (act == FusedActivation::kRelu) d = f.Select(f.Compare(l.F32(y, out_dims), l.Const(0.0), "GT"), d, l.Const(0.0));
  if (db != nullptr) l.Accumulate(db, f.Reduce(d, {0, 2, 3}));
  if (dx != nullptr) l.Accumulate(dx, ConvInputGrad(f, g, d, l.F32(w, {g.oc, g.c, g.kh, g.kw}), bfloat16_));
  if (dw != nullptr) l.Accumulate(dw, ConvWeightGrad(f, g, l.F32(x, {g.n, g.c, g.h, g.w}), d, bfloat16_));
  l.Run();
}

// --- Elementwise, reductions, gathers and conversions (the core) -------------------
// The composed kernels (nn::Backend's defaults) are chains of these; inside a
// compiled step XLA fuses the chain as it fused the single emitters they
// replaced.

namespace {

// The axes of the view [outer, mid, inner] an operand holds (nn::Axes), as
// its dimensions and where they go in the view.
void HeldAxes(const nn::View3& v, int axes, Dims* dims, std::vector<int64_t>* map) {
  const int64_t sizes[] = {v.outer, v.mid, v.inner};
  const int bits[] = {nn::kOuterAxis, nn::kMidAxis, nn::kInnerAxis};
  for (int a = 0; a < 3; ++a) {
    if ((axes & bits[a]) != 0) {
      dims->push_back(sizes[a]);
      map->push_back(a);
    }
  }
}

}  // namespace

Value PjrtBackend::ViewOperand(Launch& l, const float* p, const nn::View3& v, int axes) {
  Dims dims;
  std::vector<int64_t> map;
  HeldAxes(v, axes, &dims, &map);
  Value x = dims.empty() ? l.f.Reshape(l.F32(p, {1}), {}) : l.F32(p, dims);
  return l.f.Broadcast(x, {v.outer, v.mid, v.inner}, map);
}

void PjrtBackend::Unary(nn::UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
                        bool accumulate) {
  KeepForFallback([=, this] { Unary(op, alpha, beta, x, y, n, accumulate); });
  if (n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value v = l.F32(x, {n});
  // Constants only where an op uses them (a kernel's text is its program).
  auto zero = [&] { return l.Const(0.0); };
  auto positive = [&] { return f.Compare(v, zero(), "GT"); };
  Value out;
  switch (op) {
    case nn::UnaryOp::kRelu:
      out = f.Select(positive(), v, zero());
      break;
    case nn::UnaryOp::kLeakyRelu:
      out = f.Select(positive(), v, f.Mul(l.Scalar(alpha), v));
      break;
    case nn::UnaryOp::kElu:
      out = f.Select(positive(), v, f.Mul(l.Scalar(alpha), f.Unary("exponential_minus_one", v)));
      break;
    case nn::UnaryOp::kTanh:
      out = f.Unary("tanh", v);
      break;
    case nn::UnaryOp::kSigmoid:
      out = f.Unary("logistic", v);
      break;
    case nn::UnaryOp::kSoftplus: {
      // log(1 + e^x), x itself above 20 (as the CPU backend).
      Value big = f.Compare(v, l.Const(20.0), "GT");
      out = f.Select(big, v, f.Unary("log_plus_one", f.Unary("exponential", f.Min(v, l.Const(20.0)))));
      break;
    }
    case nn::UnaryOp::kAffine:
      out = f.Mul(l.Scalar(alpha), v);
      if (beta != 0.0f) out = f.Add(out, l.Scalar(beta));
      break;
    case nn::UnaryOp::kClamp:
      out = f.Clamp(f.Splat(l.Scalar(alpha), {n}), v, f.Splat(l.Scalar(beta), {n}));
      break;
    case nn::UnaryOp::kExp:
      out = f.Unary("exponential", v);
      break;
    case nn::UnaryOp::kLog:
      out = f.Unary("log", v);
      break;
    case nn::UnaryOp::kSqrt:
      out = f.Unary("sqrt", v);
      break;
    case nn::UnaryOp::kRsqrt:
      out = f.Unary("rsqrt", v);
      break;
    case nn::UnaryOp::kReciprocal:
      out = f.Div(l.Const(1.0), v);
      break;
    case nn::UnaryOp::kSquare:
      out = f.Mul(v, v);
      break;
    case nn::UnaryOp::kAbs:
      out = f.Unary("abs", v);
      break;
    case nn::UnaryOp::kFloor:
      out = f.Unary("floor", v);
      break;
    case nn::UnaryOp::kStep:
      out = f.Select(positive(), l.Const(1.0), zero());
      break;
  }
  l.Store(y, out, accumulate);
  l.Run();
}

void PjrtBackend::UnaryBackward(nn::UnaryOp op, float alpha, float beta, const float* x, const float* y,
                                const float* dy, float* dx, int64_t n) {
  KeepForFallback([=, this] { UnaryBackward(op, alpha, beta, x, y, dy, dx, n); });
  // Floor and step: zero almost everywhere.
  if (n == 0 || dx == nullptr || op == nn::UnaryOp::kFloor || op == nn::UnaryOp::kStep) return;
  Launch l(*this);
  Function& f = l.f;
  Value d = l.F32(dy, {n}), zero = l.Const(0.0), one = l.Const(1.0);
  auto in = [&] { return l.F32(x, {n}); };
  auto out = [&] { return l.F32(y, {n}); };
  auto positive = [&] { return f.Compare(in(), zero, "GT"); };
  Value grad;
  switch (op) {
    case nn::UnaryOp::kRelu:
      grad = f.Select(positive(), d, zero);
      break;
    case nn::UnaryOp::kLeakyRelu:
      grad = f.Select(positive(), d, f.Mul(l.Scalar(alpha), d));
      break;
    case nn::UnaryOp::kElu:
      // d/dx alpha * (e^x - 1) = y + alpha.
      grad = f.Select(positive(), d, f.Mul(f.Add(out(), l.Scalar(alpha)), d));
      break;
    case nn::UnaryOp::kTanh: {
      Value o = out();
      grad = f.Mul(f.Sub(one, f.Mul(o, o)), d);
      break;
    }
    case nn::UnaryOp::kSigmoid: {
      Value o = out();
      grad = f.Mul(f.Mul(o, f.Sub(one, o)), d);
      break;
    }
    case nn::UnaryOp::kSoftplus:
      grad = f.Mul(f.Unary("logistic", in()), d);
      break;
    case nn::UnaryOp::kAffine:
      grad = f.Mul(l.Scalar(alpha), d);
      break;
    case nn::UnaryOp::kClamp: {
      Value v = in();
      Value inside = f.Binary("and", f.Compare(v, f.Splat(l.Scalar(alpha), {n}), "GE"),
                              f.Compare(v, f.Splat(l.Scalar(beta), {n}), "LE"));
      grad = f.Select(inside, d, zero);
      break;
    }
    case nn::UnaryOp::kExp:
      grad = f.Mul(out(), d);
      break;
    case nn::UnaryOp::kLog:
      grad = f.Div(d, in());
      break;
    case nn::UnaryOp::kSqrt:
      grad = f.Div(f.Mul(l.Const(0.5), d), out());
      break;
    case nn::UnaryOp::kRsqrt: {
      Value o = out();
      grad = f.Mul(f.Mul(l.Const(-0.5), f.Mul(o, f.Mul(o, o))), d);
      break;
    }
    case nn::UnaryOp::kReciprocal: {
      Value o = out();
      grad = f.Mul(f.Unary("negate", f.Mul(o, o)), d);
      break;
    }
    case nn::UnaryOp::kSquare:
      grad = f.Mul(f.Mul(l.Const(2.0), in()), d);
      break;
    case nn::UnaryOp::kAbs:
      grad = f.Mul(f.Unary("sign", in()), d);
      break;
    case nn::UnaryOp::kFloor:
    case nn::UnaryOp::kStep:
      return;  // (returned above)
  }
  l.Accumulate(dx, grad);
  l.Run();
}

void PjrtBackend::BinaryBroadcast(nn::Binary op, const nn::View3& v, const float* a, int a_axes, const float* b,
                                  int b_axes, float* y, bool accumulate) {
  KeepForFallback([=, this] { BinaryBroadcast(op, v, a, a_axes, b, b_axes, y, accumulate); });
  if (v.size() == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value p = ViewOperand(l, a, v, a_axes), q = ViewOperand(l, b, v, b_axes);
  static constexpr std::string_view kOps[] = {"add", "subtract", "multiply", "divide", "maximum", "minimum"};
  Value out = f.Binary(kOps[static_cast<int>(op)], p, q);
  l.Store(y, out, accumulate);
  l.Run();
}

void PjrtBackend::Reduce(nn::Reduction op, const nn::View3& v, float scale, const float* x, float* y,
                         bool accumulate) {
  KeepForFallback([=, this] { Reduce(op, v, scale, x, y, accumulate); });
  if (v.outer * v.inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const bool max = op == nn::Reduction::kMax;
  Value out = v.mid == 0 ? f.Constant(max ? -3.4028234663852886e38 : 0.0, "f32", {v.outer, v.inner})
                         : f.Reduce(l.F32(x, {v.outer, v.mid, v.inner}), {1}, max ? "maximum" : "add");
  if (scale != 1.0f) out = f.Mul(l.Scalar(scale), out);
  l.Store(y, out, accumulate);
  l.Run();
}

namespace {

// The index vectors (o, indices[o, j]) [outer, out, 2] of a gather or
// scatter along the middle axis of [outer, in, inner].
Value MiddleAxisPlaces(Function& f, const Value& indices, int64_t outer, int64_t out) {
  return f.Concatenate({f.Iota({outer, out, 1}, 0, "i32"), f.Reshape(indices, {outer, out, 1})}, 2);
}

}  // namespace

// Gathers and replacing scatters move i32 bits (no float op may touch a
// frame's bytes); the indices are run-time data, so a step's program does
// not change with the rows it picks.
void PjrtBackend::Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x,
                         const int32_t* indices, float* y) {
  KeepForFallback([=, this] { Gather(outer, in, inner, out, x, indices, y); });
  if (outer * out * inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const Dims dims = {outer, in, inner};
  Value bits = f.BitcastConvert(l.F32(x, dims), dims, "i32");
  Value places = MiddleAxisPlaces(f, l.I32(indices, {outer, out}), outer, out);
  Value picked = f.Gather(bits, places, /*offset_dims=*/{2}, /*collapsed=*/{0, 1}, /*start_index_map=*/{0, 1},
                          /*slice_sizes=*/{1, 1, inner});
  l.Write(y, f.BitcastConvert(picked, {outer, out, inner}, "f32"));
  l.Run();
}

void PjrtBackend::Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                          const float* values, float* x, bool add) {
  KeepForFallback([=, this] { Scatter(outer, in, inner, out, indices, values, x, add); });
  if (outer * out * inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const Dims dims = {outer, in, inner}, update_dims = {outer, out, inner};
  Value places = MiddleAxisPlaces(f, l.I32(indices, {outer, out}), outer, out);
  if (add) {
    l.Write(x, f.ScatterAdd(l.F32(x, dims), places, l.F32(values, update_dims), /*window_dims=*/{2},
                            /*inserted=*/{0, 1}, /*index_map=*/{0, 1}));
  } else {
    Value bits = f.BitcastConvert(l.F32(x, dims), dims, "i32");
    Value update = f.BitcastConvert(l.F32(values, update_dims), update_dims, "i32");
    Value scattered = f.ScatterReplace(bits, places, update, {2}, {0, 1}, {0, 1});
    l.Write(x, f.BitcastConvert(scattered, dims, "f32"));
  }
  l.Run();
}

void PjrtBackend::Convert(nn::DType from, const void* x, nn::DType to, void* y, int64_t n, float scale) {
  KeepForFallback([=, this] { Convert(from, x, to, y, n, scale); });
  if (n == 0) return;
  if (to == nn::DType::kU8) {
    std::fprintf(stderr, "PJRT backend: Convert to uint8 is not offered\n");
    std::abort();
  }
  Launch l(*this);
  Function& f = l.f;
  Value v = from == nn::DType::kU8    ? f.Convert(l.Read(x, {n}, "ui8"), "f32")
            : from == nn::DType::kI32 ? f.Convert(l.Read(x, {n}, "i32"), "f32")
                                      : l.Read(x, {n}, "f32");
  if (scale != 1.0f) v = f.Mul(l.Scalar(scale), v);
  if (to == nn::DType::kI32) v = f.BitcastConvert(f.Convert(v, "i32"), {n}, "f32");
  l.Write(y, v);
  l.Run();
}

// --- Fused kernels kept (measured or plainly better than the composed default) ---

// uint8 frames to float planes: a convert and a transpose. The composed
// default transposes with a gather whose index table is as large as the
// batch (one index per element); XLA lowers a transpose to a copy loop.
void PjrtBackend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale,
                                     const uint8_t* in, float* out) {
  KeepForFallback([=, this] { BytesToFloatPlanar(images, pixels, channels, scale, in, out); });
  if (images * pixels * channels == 0) return;
  Launch l(*this);
  l.Write(out, Planes(l, l.Read(in, {images, pixels * channels}, "ui8"), pixels, channels, scale));
  l.Run();
}

// The same inside the gather of the frame table's rows (a learner step's
// first layer): the rows as i32 words, their bytes, then as above.
void PjrtBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                           const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                           float* out) {
  KeepForFallback([=, this] { GatherBytesToFloatPlanar(rows, row_words, table, images, indices, pixels, channels, scale, out); });
  if (images * pixels * channels == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value bits = f.BitcastConvert(l.F32(table, {rows, row_words}), {rows, row_words}, "i32");
  Value at = f.Reshape(l.I32(indices, {images}), {images, 1});
  Value picked = f.Gather(bits, at, /*offset_dims=*/{1}, /*collapsed=*/{0}, /*start_index_map=*/{0}, {1, row_words});
  // Words to their bytes (little-endian, as the host wrote them), the image's first pixels * channels.
  Value bytes = f.Reshape(f.BitcastConvert(picked, {images, row_words, 4}, "ui8"), {images, 4 * row_words});
  if (4 * row_words != pixels * channels) bytes = f.Slice(bytes, {0, 0}, {images, pixels * channels});
  l.Write(out, Planes(l, bytes, pixels, channels, scale));
  l.Run();
}

Value PjrtBackend::Planes(Launch& l, const Value& bytes, int64_t pixels, int64_t channels, float scale) {
  Function& f = l.f;
  const int64_t images = bytes.dims[0];
  Value values = f.Convert(f.Reshape(bytes, {images, pixels, channels}), "f32");
  return f.Mul(l.Scalar(scale), f.Transpose(values, {0, 2, 1}));
}

}  // namespace troupe::pjrt
