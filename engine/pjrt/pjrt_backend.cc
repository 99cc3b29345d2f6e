#include "engine/pjrt/pjrt_backend.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/pjrt/fatal.h"
#include "engine/pjrt/launch.h"
#include "engine/pjrt/program_recorder.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

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
  PjrtBackendOptions resolved = options;
  if (const char* split = std::getenv("TROUPE_PJRT_WEIGHT_GRADIENTS"); split != nullptr && *split != '\0') {
    const std::string value(split);
    if (value != "split" && value != "one") {
      return absl::InvalidArgumentError(
          absl::StrCat("TROUPE_PJRT_WEIGHT_GRADIENTS=", value, ": expected split or one"));
    }
    resolved.split_weight_gradients = value == "split" ? PjrtBackendOptions::SplitWeightGradients::kAlways
                                                       : PjrtBackendOptions::SplitWeightGradients::kNever;
  }
  return std::unique_ptr<PjrtBackend>(new PjrtBackend(*std::move(client), resolved));
}

PjrtBackend::PjrtBackend(std::shared_ptr<Client> client, const PjrtBackendOptions& options)
    : client_(std::move(client)),
      device_(options.device),
      bfloat16_(options.bfloat16),
      split_weight_gradients_(
          options.split_weight_gradients == PjrtBackendOptions::SplitWeightGradients::kAlways ||
          (options.split_weight_gradients == PjrtBackendOptions::SplitWeightGradients::kAuto &&
           client_->platform() == "cpu")),
      compile_steps_(options.compile_steps),
      fall_back_to_kernels_(options.compile_steps && options.fall_back_to_kernels &&
                            !(options.group && options.group->size() > 1)),
      refuse_step_programs_(options.refuse_step_programs),
      cache_dir_(options.cache_dir),
      group_(options.group && options.group->size() > 1 ? options.group : nullptr),
      programs_(client_),
      memory_(client_, options.device),
      check_replay_every_(options.check_replay_every) {}

PjrtBackend::~PjrtBackend() {
  DropUnlandedReads();
  for (auto& [signature, step] : replayed_) Forget(*step);
  step_.reset();
  ReleaseScratchPool();
  // memory_ (its buffers), then programs_ (their executables), as declared.
}

const std::string& PjrtBackend::last_program() const {
  static const std::string none;
  return last_program_ != nullptr ? last_program_->text : none;
}

std::string PjrtBackend::name() const { return absl::StrCat("pjrt:", client_->platform(), ":", device_); }

void* PjrtBackend::DeviceAllocate(size_t bytes) { return memory_.Allocate(bytes, /*scratch=*/false); }

void PjrtBackend::DeviceFree(void* p) {
  if (p == nullptr) return;
  if (step_ && step_->Touches(reinterpret_cast<uintptr_t>(p))) {
    std::fprintf(stderr, "PJRT backend: Free(%p) of memory the step being recorded uses\n", p);
    std::abort();
  }
  memory_.Free(p);  // aborts, naming p, when it is not an allocation
}

void* PjrtBackend::DeviceAllocateScratch(size_t bytes) { return memory_.Allocate(bytes, /*scratch=*/true); }

// --- Programs -------------------------------------------------------------------

std::unique_ptr<ProgramRecorder> PjrtBackend::NewRecorder(bool step) {
  return std::make_unique<ProgramRecorder>(memory_, *client_, device_, step, step && group_ ? group_->size() : 1);
}

bool PjrtBackend::RunProgram(ProgramRecorder& r, bool keep_scratch) {
  const bool step = r.step();
  if (!r.Close(keep_scratch)) return true;  // nothing written or read back: nothing to run
  const auto program_began = std::chrono::steady_clock::now();
  bool met_first = false;
  ProgramCache::Program& program = programs_.Of(r.f, &met_first);
  if (met_first) ++stats_.programs_printed;
  if (step && capture_ != nullptr) {
    capture_->recording = r.Recording();
    capture_->program = &program;
  }
  last_program_ = &program;
  const double compiled_before = stats_.compile_seconds;
  const bool replicated = step && group_ != nullptr;
  capi::LoadedExecutable* executable = nullptr;
  if (!replicated) {
    absl::StatusOr<capi::LoadedExecutable*> compiled = Executable(program, step ? r.kernels() : 0);
    if (!compiled.ok()) {
      if (step && fall_back_to_kernels_) {
        fallback_reason_ = std::string(compiled.status().message());
        return false;
      }
      std::fprintf(stderr, "%s\n", program.text.c_str());
      Fatal(compiled.status(), step ? "a step" : "a kernel");
    }
    executable = *compiled;
  }
  const double compile_seconds = stats_.compile_seconds - compiled_before;
  if (step) {
    stats_.step_program_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - program_began).count() - compile_seconds;
  }
  const std::vector<capi::Buffer*>& args = r.Arguments();
  std::vector<capi::Buffer*> out(r.num_outputs(), nullptr);
  if (step) {
    // The host's part of a step: recording its kernels, writing and finding
    // its program, its inputs (a first step's compile counted apart).
    stats_.step_host_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.began()).count() - compile_seconds;
  }
  const auto execute_began = std::chrono::steady_clock::now();
  Execute(program, executable, args, out, step, r.kernels());
  r.Install(out);
  if (step) {
    stats_.step_execute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - execute_began).count();
  }
  return true;
}

void PjrtBackend::Execute(const ProgramCache::Program& program, capi::LoadedExecutable* executable,
                          const std::vector<capi::Buffer*>& args, std::vector<capi::Buffer*>& out, bool step,
                          int64_t kernels) {
  if (step && group_ != nullptr) {
    // One program on every replica: the group runs it once all have arrived.
    PjrtReplicaGroup::Arrival arrival{&program.text, program.fingerprint, &args, std::move(out)};
    group_->Execute(device_, &arrival, client_, cache_dir_);
    out = std::move(arrival.outputs);
    if (arrival.compile_seconds > 0) {
      NoteStepCompile(arrival.compile_seconds, kernels, program.text.size(), arrival.from_cache);
    }
  } else {
    Check(client_->Execute(executable, args, out, device_), step ? "executing a step" : "launching a kernel");
  }
  ++stats_.launches;
  if (step) ++stats_.step_launches;
}

absl::StatusOr<capi::LoadedExecutable*> PjrtBackend::Executable(ProgramCache::Program& program, int64_t step_kernels) {
  if (program.executable != nullptr) return program.executable;
  if (step_kernels > 0 && refuse_step_programs_) {
    return absl::InvalidArgumentError("compiling a step: refused, as a plugin would refuse one (a test's "
                                      "PjrtBackendOptions::refuse_step_programs)");
  }
  // A step's program is kept on disk too; a kernel's, or a step's of one
  // kernel (the device frame table's scatter), is cheap to compile again.
  double seconds = 0;
  bool from_cache = false;
  ASSIGN_OR_RETURN(program.executable, CompileProgram(*client_, step_kernels > 1 ? cache_dir_ : std::string(),
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
  // Once per program: a step's shape changes rarely (a new batch size). A
  // step of one kernel is a kernel's compile (milliseconds): not announced.
  if (kernels <= 1) return;
  const std::string replicas = group_ ? absl::StrCat(" for ", group_->size(), " replicas") : std::string();
  std::fprintf(stderr, "troupe: %s %s a step%s (%lld kernels, %zu KB of StableHLO) in %.2f s\n", name().c_str(),
               from_cache ? "loaded (from the on-disk cache)" : "compiled", replicas.c_str(), static_cast<long long>(kernels),
               text_bytes / 1024, seconds);
}

// --- Steps ----------------------------------------------------------------------

void PjrtBackend::BeginStep() {
  nn::Backend::BeginStep();
  if (!compile_steps_) return;
  memory_.BeginStep();
  step_ = NewRecorder(/*step=*/true);
  not_replayable_.clear();
}

void PjrtBackend::NotReplayable(const char* why) {
  if (step_ && not_replayable_.empty()) not_replayable_ = why;
}

void PjrtBackend::AllReduceInStep(float* data, int64_t count, bool mean, const ReplicaGroups* groups) {
  if (!reduces_in_step()) nn::Backend::AllReduceInStep(data, count, mean);  // aborts, saying why
  if (count == 0) return;
  Launch l(*this);
  const Value sum = l.f.AllReduce(l.F32(data, {count}), group_->size(), groups ? *groups : ReplicaGroups{});
  const size_t size = groups ? groups->front().size() : group_->size();
  l.Write(data, mean ? l.f.Mul(sum, l.Const(1.0 / size)) : sum);
  l.Run();
}

void PjrtBackend::ReduceScatterInStep(const float* in, float* out, int64_t part, bool mean) {
  if (!reduces_in_step()) nn::Backend::ReduceScatterInStep(in, out, part, mean);  // aborts, saying why
  if (part == 0) return;
  Launch l(*this);
  Value mine = l.f.ReduceScatter(l.F32(in, {group_->size() * part}), group_->size());
  l.Write(out, mean ? l.f.Mul(mine, l.Const(1.0 / group_->size())) : mine);
  l.Run();
}

void PjrtBackend::AllGatherInStep(const float* in, float* out, int64_t part) {
  if (!reduces_in_step()) nn::Backend::AllGatherInStep(in, out, part);  // aborts, saying why
  if (part == 0) return;
  Launch l(*this);
  l.Write(out, l.f.AllGather(l.F32(in, {part}), group_->size()));
  l.Run();
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
  std::unique_ptr<ProgramRecorder> step = std::move(step_);
  if (!RunProgram(*step)) {
    // The plugin refused the step's program: the step again, kernel at a
    // time, and its reads as downloads.
    FallBackToKernels(*step);
    for (const DeferredRead& r : reads) DownloadRead(r);
    return;
  }
  ++stats_.steps;
  for (size_t i = 0; i < reads.size(); ++i) CopyRead(reads[i], step->host(results[i]).data());
  if (capture_ != nullptr) {
    for (const DeferredRead& r : reads) capture_->reads.emplace_back(r.host, r.bytes);
  }
}

void PjrtBackend::KeepForFallback(std::function<void()> call) {
  if (step_ && fall_back_to_kernels_) step_->Capture(std::move(call));
}

void PjrtBackend::FallBackToKernels(ProgramRecorder& step) {
  std::fprintf(stderr,
               "troupe: %s: the plugin refused a compiled step (%s); this backend runs kernel at a time from here "
               "on (engine.pjrt_steps COMPILED_ELSE_KERNELS)\n",
               name().c_str(), fallback_reason_.c_str());
  compile_steps_ = false;
  ++stats_.step_fallbacks;
  not_replayable_ = "the plugin refused the step's program";
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
  ++stats_.uploads;
  int64_t offset = 0;
  DeviceMemory::Allocation* a = memory_.Find(device, &offset).second;
  const Transfer t = TransferOf("Upload", offset, bytes, a->bytes, a->words);
  const int64_t dims[] = {t.count};
  const auto began = std::chrono::steady_clock::now();
  auto buffer = client_->BufferFromHost(host, t.words ? capi::kF32 : capi::kU8, dims, device_);
  if (!buffer.ok()) Fatal(buffer.status(), "uploading");
  if (step_) stats_.step_upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  if (t.whole && !step_) {
    // The whole allocation: the new buffer replaces the old one.
    capi::Buffer*& replaced = memory_.buffer(*a);
    client_->Destroy(replaced);
    replaced = *buffer;
    return;
  }
  if (step_) NotReplayable("an upload inside the step (a replayed step's inputs are uploaded before it)");
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
    NotReplayable("a host staging inside the step (a collective through the host splits it in two)");
    std::unique_ptr<ProgramRecorder> first = std::move(step_);  // out of the way: a replay runs kernel at a time
    if (!RunProgram(*first, /*keep_scratch=*/true)) FallBackToKernels(*first);
  }
  struct Resume {
    PjrtBackend* b;
    bool resume;
    ~Resume() {
      if (resume) b->step_ = b->NewRecorder(/*step=*/true);
    }
  } resume{this, in_step() && compile_steps_};
  int64_t offset = 0;
  DeviceMemory::Allocation* a = memory_.Find(device, &offset).second;
  const Transfer t = TransferOf("Download", offset, bytes, a->bytes, a->words);
  if (t.whole) {
    Check(client_->ToHost(memory_.buffer(*a), host, bytes), "downloading");
    return;
  }
  Launch l(*this);
  l.Result(l.Read(device, {t.count}, t.words ? "f32" : "ui8"));
  l.Run();
  std::memcpy(host, l.host(0).data(), bytes);
}

void PjrtBackend::Synchronize() {
  if (step_) return;  // nothing of the step has run yet: its program runs at EndStep
  Check(memory_.Await(), "synchronising");
}

}  // namespace troupe::pjrt
