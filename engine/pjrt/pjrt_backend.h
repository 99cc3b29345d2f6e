// The nn engine's backend over a PJRT plugin: the route to a TPU (libtpu.so),
// and to GPUs and CPUs through XLA's plugins, behind the same Backend
// interface the CPU and CUDA backends implement.
//
// Memory: each Allocate is one PJRT buffer on the device (float32 words),
// named by an address from a range reserved PROT_NONE, so a host read of
// device memory faults as on the strict CPU device. Kernels take addresses
// anywhere inside an allocation (the tape's arena, a parameter inside a
// ParameterSet), so each launch resolves its pointers to (allocation, offset).
//
// Kernels: the backend implements the core of nn::Backend (its generic
// kernels); every other kernel is the composed default, a chain of core
// kernels that XLA fuses inside a compiled step as it fused the per-kernel
// emitters this backend once had, except the uint8 frames' conversion to
// float planes, kept fused (a transpose, where the default gathers). Each core kernel call is
// one small StableHLO program (stablehlo.h)
// whose parameters are the whole allocations it touches plus a vector of
// the call's float scalars (learning rates, slopes: values that change from
// step to step without a recompile); it slices its operands at constant
// offsets, computes, writes its outputs back with dynamic_update_slice and
// returns the updated allocations, aliased to their parameters
// (tf.aliasing_output) so the plugin updates them in place. Programs are
// compiled once and cached by their text, which holds the kernel, its
// shapes, offsets and precision. The tape issues backward kernels
// explicitly, so no differentiation happens on the StableHLO side.
//
// Compiled steps (the default): between BeginStep and EndStep (nn::Backend's
// step contract) kernels record instead of launching, into ONE program for
// the whole training step — the batch and the run-time scalars (learning
// rates, Adam's bias corrections) as inputs, parameters and optimizer state
// as donated buffers aliased to the results that update them, what the host
// reads at the step's end as results, the tape's scratch neither — compiled
// once per program text and executed once per step. Inside the program a
// kernel's operands are the values earlier kernels produced (not slices of
// buffers), so XLA fuses across kernel boundaries as it does for a jitted
// JAX step. A host collective's staging inside a step (K replicas whose
// gradients reduce through the host) splits the step there into two
// programs. Kernel at a time (PjrtBackendOptions::compile_steps false)
// stays as a debugging switch: every kernel its own launch.
//
// Its parts, each a file of engine/pjrt/: device_memory.h (the allocations
// and their reserved address ranges), program_recorder.h (recording kernel
// calls into a program, and a step's calls kept for a replay),
// program_cache.h (programs by fingerprint with their executables, and
// compiled steps on disk), replica_group.h (the rendezvous of K replicas
// that run a step as one program), launch.h (one kernel call: into the
// step's program, or a program of its own). This file's PjrtBackend composes
// them: set-up, steps, transfers, and running a recorded program
// (pjrt_backend.cc); steps traced once and replayed (RunStep:
// step_replay.cc); its kernels are in pjrt_kernels.cc.
#ifndef TROUPE_ENGINE_PJRT_PJRT_BACKEND_H_
#define TROUPE_ENGINE_PJRT_PJRT_BACKEND_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/nn/backend.h"
#include "engine/pjrt/device_memory.h"
#include "engine/pjrt/plugin.h"
#include "engine/pjrt/program_cache.h"
#include "engine/pjrt/program_recorder.h"
#include "engine/pjrt/replica_group.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

struct PjrtBackendOptions {
  // The plugin's .so (libtpu.so, the XLA CUDA plugin, an XLA CPU plugin).
  std::string plugin;
  // Which of the plugin's devices (replica r of a process on device r).
  int device = 0;
  // bfloat16 inputs to matrix multiplies and convolutions (float32
  // accumulation and everything else float32).
  bool bfloat16 = false;
  // One program per step (see above); false: every kernel its own launch.
  bool compile_steps = true;
  // A convolution's weight gradient as sums over a few samples at a time
  // (ConvWeightGradSamples in pjrt_kernels.cc), not one convolution over the
  // whole batch: 2-4x faster on XLA's CPU runtime, whose one convolution
  // streams a contraction n*oh*ow long into a small [oc, c, kh, kw] result;
  // a GPU's libraries take the one convolution well, and more launches
  // would not. kAuto: split on the "cpu" platform only; kAlways: on any
  // platform (where ConvWeightGradSamples splits: never a layer too small
  // for it); kNever: one convolution each. Create() takes
  // TROUPE_PJRT_WEIGHT_GRADIENTS=split or =one from the environment over
  // this (benchmarks compare the two).
  enum class SplitWeightGradients { kAuto, kNever, kAlways };
  SplitWeightGradients split_weight_gradients = SplitWeightGradients::kAuto;
  // The K replicas this backend's steps run with as one program (replica
  // `device` of them); null: a step of its own.
  std::shared_ptr<PjrtReplicaGroup> group;
  // Where compiled step programs are kept on disk, so a resumed run or the
  // next process does not compile them again (where the plugin can
  // serialize them); empty: no cache. engine_config's default:
  // DefaultPjrtCacheDir().
  std::string cache_dir;
  // How the plugin's client takes device memory, when this backend is the
  // first of the process to open it (engine.gpu_memory_fraction).
  ClientOptions client;
  // Compiled steps: when the plugin refuses a step's program (a compile
  // error), run that step again kernel at a time, and every later one, saying
  // so on stderr with the plugin's message (engine.pjrt_steps
  // COMPILED_ELSE_KERNELS; device GPU's default). Each step's calls are kept
  // until its program runs. Not with a replica group (K > 1 in one program):
  // there a refusal stops the process, saying why. Otherwise it does too.
  bool fall_back_to_kernels = false;
  // Tests: every step's program refused as a plugin would refuse one.
  bool refuse_step_programs = false;
  // RunStep's guard (engine.pjrt_check_replay, TROUPE_PJRT_CHECK_REPLAY):
  // every this many replays of a step, it is recorded again instead, and the
  // process aborts, naming what differs, when the recording is not the one
  // being replayed. 0: never.
  int check_replay_every = 0;
};

// DefaultPjrtCacheDir(): program_cache.h.

// The samples of each chunk a split weight gradient sums over
// (PjrtBackendOptions::split_weight_gradients), for geometry `g`.
int64_t ConvWeightGradSamples(const nn::ConvGeometry& g);

// Counters of a backend's launches, for benchmarks and tests.
struct PjrtStats {
  int64_t launches = 0;       // programs executed (a compiled step: one)
  int64_t compiles = 0;       // programs compiled, kernels' and steps'
  int64_t step_compiles = 0;  // of them, whole steps
  int64_t step_cache_loads = 0;  // whole steps loaded from the on-disk cache instead
  int64_t steps = 0;          // compiled steps executed
  int64_t step_launches = 0;  // programs they executed (one each, unless a host staging split one)
  int64_t programs_printed = 0;  // program texts written: once each, a program met again is found by its fingerprint
  int64_t step_fallbacks = 0;    // steps the plugin refused, run again kernel at a time (0 or 1)
  int64_t step_replays = 0;      // RunStep calls that executed a recorded program without recording
  int64_t uploads = 0;           // Upload calls (host to device copies)
  int64_t replay_checks = 0;     // recordings made to check a replay (check_replay_every)
  double compile_seconds = 0.0;
  // Host time of compiled steps before their execution: recording the
  // kernels, writing and finding the program, uploading its inputs. Of it:
  double step_host_seconds = 0.0;
  double step_program_seconds = 0.0;  // writing the program's text and finding its executable
  double step_upload_seconds = 0.0;   // copying host data into device buffers (Upload)
  // Host time of replayed steps before their execution (binding arguments).
  double replay_host_seconds = 0.0;
  // Wall time of steps' executions, recorded or replayed, until their
  // results are on the host: what the host waits for (with late reads, a
  // replay's wait is in late_read_wait_seconds instead).
  double step_execute_seconds = 0.0;
  // With late reads (nn::Backend::set_late_reads): what landing a replay's
  // reads waited for its execution.
  double late_read_wait_seconds = 0.0;
  // Replays launched after the replay before had ended: the device waited
  // for the host that long in all (device_idle_seconds()).
  int64_t idle_launches = 0;
  double device_idle_seconds = 0.0;
};

class PjrtBackend final : public nn::Backend {
 public:
  // Errors: the plugin's (Plugin::Load, Client::Shared), OutOfRange for a
  // device the plugin does not have.
  static absl::StatusOr<std::unique_ptr<PjrtBackend>> Create(const PjrtBackendOptions& options);
  ~PjrtBackend() override;
  PjrtBackend(const PjrtBackend&) = delete;
  PjrtBackend& operator=(const PjrtBackend&) = delete;

  // "pjrt:cpu:0", "pjrt:cuda:1", "pjrt:tpu:0".
  std::string name() const override;
  int num_threads() const override { return 1; }
  const Client& client() const { return *client_; }
  const PjrtStats& stats() const { return stats_; }
  // The StableHLO text of the last kernel launched (tests read it).
  const std::string& last_program() const;

  void BeginStep() override;
  void EndStep() override;
  // Traced once, replayed (nn::Backend::RunStep; step_replay.cc).
  void RunStep(uint64_t signature, const std::function<void()>& device_part) override;
  bool replays_steps() const override { return compile_steps_; }
  void NotReplayable(const char* why) override;
  bool runs_replicas_as_one_program() const override { return group_ != nullptr; }
  bool reduces_in_step() const override { return step_ != nullptr && group_ != nullptr; }
  void AllReduceInStep(float* data, int64_t count, bool mean, const ReplicaGroups* groups = nullptr) override;
  void ReduceScatterInStep(const float* in, float* out, int64_t part, bool mean) override;
  void AllGatherInStep(const float* in, float* out, int64_t part) override;
  bool compiles_steps() const { return compile_steps_; }
  // The K replicas this backend's steps run with as one program (0: none).
  int group_size() const { return group_ ? group_->size() : 0; }
  void Upload(const void* host, void* device, size_t bytes) override;
  void Download(const void* device, void* host, size_t bytes) override;
  void Synchronize() override;
  double device_idle_seconds() const override { return stats_.device_idle_seconds; }

  // The core (nn::Backend); every composed kernel runs as nn::Backend's
  // default over these, which XLA fuses inside a compiled step.
  void Fill(float* x, int64_t n, float value, float step = 0.0f) override;
  void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                  int64_t dst_stride, int64_t dst_offset, bool accumulate) override;
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
            float beta, float* c) override;
  void Conv2dForward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                     const float* b, float* y) override;
  void Conv2dBackward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                      const float* y, const float* dy, float* dx, float* dw, float* db) override;
  void Unary(nn::UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
             bool accumulate = false) override;
  void UnaryBackward(nn::UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
  void BinaryBroadcast(nn::Binary op, const nn::View3& v, const float* a, int a_axes, const float* b, int b_axes,
                       float* y, bool accumulate = false) override;
  void Reduce(nn::Reduction op, const nn::View3& v, float scale, const float* x, float* y,
              bool accumulate = false) override;
  void Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
              float* y) override;
  void Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices, const float* values,
               float* x, bool add) override;
  void Convert(nn::DType from, const void* x, nn::DType to, void* y, int64_t n, float scale = 1.0f) override;
  // Fused where the composed default is worse (see pjrt_kernels.cc).
  void BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in,
                          float* out) override;
  void GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                float* out) override;

 protected:
  // Each allocation one PJRT buffer (device_memory.h); scratch is kept out
  // of a compiled step's program.
  void* DeviceAllocate(size_t bytes) override;
  void* DeviceAllocateScratch(size_t bytes) override;
  void DeviceFree(void* p) override;

 private:
  class Launch;  // launch.h
  PjrtBackend(std::shared_ptr<Client> client, const PjrtBackendOptions& options);
  // A recorder of a program over this backend's memory: a step's (`step`,
  // for K replicas when there is a group) or one kernel's.
  std::unique_ptr<ProgramRecorder> NewRecorder(bool step);
  // Closes `r`'s program, finds it (ProgramCache), compiles it on first use
  // (a step's with a group: the group does), executes it and installs its
  // outputs. `keep_scratch`: see ProgramRecorder::Close. False, with nothing
  // run, when the plugin refused a step's program and the backend falls back
  // to kernels (FallBackToKernels replays the step); any other failure
  // aborts, saying why.
  [[nodiscard]] bool RunProgram(ProgramRecorder& r, bool keep_scratch = false);
  // Executes `program` on `args` into `out` (sized by the caller): a step's
  // with a group by the group (`kernels` for its compile's note), else
  // `executable`; counts the launch.
  void Execute(const ProgramCache::Program& program, capi::LoadedExecutable* executable,
               const std::vector<capi::Buffer*>& args, std::vector<capi::Buffer*>& out, bool step, int64_t kernels);
  // Its compiled executable (compiled on first use; a step's, with
  // `step_kernels` > 0, says so once with its compile time).
  absl::StatusOr<capi::LoadedExecutable*> Executable(ProgramCache::Program& program, int64_t step_kernels);
  // Inside a compiled step that may fall back: keeps `call` (a core kernel's
  // call, or an upload) for FallBackToKernels.
  void KeepForFallback(std::function<void()> call);
  // The plugin refused `step`'s program: says so, turns compiled steps off,
  // and runs the step's kept calls kernel at a time.
  void FallBackToKernels(ProgramRecorder& step);
  // An operand of a [outer, mid, inner] view holding `axes` of it (nn::Axes),
  // broadcast to the whole view.
  Value ViewOperand(Launch& l, const float* p, const nn::View3& v, int axes);
  // Interleaved uint8 images [images, pixels * channels] as float planes
  // [images, channels, pixels] times `scale`.
  Value Planes(Launch& l, const Value& bytes, int64_t pixels, int64_t channels, float scale);
  // Counts a step's compile (or load from the on-disk cache) and says so once (stderr).
  void NoteStepCompile(double seconds, int64_t kernels, size_t text_bytes, bool from_cache);
  // A recording of a step to replay: the program, what it runs on, the
  // host memory its results go to.
  struct Recorded {
    StepRecording recording;
    const ProgramCache::Program* program = nullptr;
    std::vector<std::pair<void*, size_t>> reads;
    bool operator==(const Recorded& o) const {
      return recording == o.recording && program == o.program && reads == o.reads;
    }
  };
  // RunStep's step of one signature (step_replay.cc).
  struct ReplayedStep {
    Recorded recorded;                // the last recording
    bool ready = false;               // two recordings in a row were the same: replay
    int replays_since_check = 0;
    capi::Buffer* scalars = nullptr;  // the recorded run-time scalars on the device, made once
    // The buffer slots (DeviceMemory::buffer) of its arguments (kScalars:
    // the scalars) and of the allocations its outputs replace, found at
    // DeviceMemory::layout() bound_layout (0: not yet).
    static constexpr uint32_t kScalars = ~uint32_t{0};
    std::vector<uint32_t> arg_slots, written_slots;
    uint64_t bound_layout = 0;
    std::vector<capi::Buffer*> args, out;  // a replay's, kept: no allocation per update
  };
  // Forgets `step`'s recording (and destroys its scalars' buffer).
  void Forget(ReplayedStep& step);
  // Records `device_part` as one step; false, saying why in *why_not, when
  // a replay could not repeat it.
  bool RecordStep(const std::function<void()>& device_part, Recorded* out, std::string* why_not);
  // Finds the allocations `step`'s recording names (Replay's, when the
  // memory's layout changed since); false when one was freed or made anew
  // since the recording.
  bool Bind(ReplayedStep& step);
  // Executes `step`'s program again; false (nothing run) when its memory
  // changed since it was recorded.
  bool Replay(ReplayedStep& step);
  // A replay's result until its read lands (at once, or later with late
  // reads): destroyed with the read, landed or dropped; `ended` is
  // WatchEnd's event, if any.
  struct LateResult {
    LateResult(Client* c, capi::Buffer* b, capi::Event* e) : client(c), buffer(b), ended(e) {}
    ~LateResult();
    LateResult(const LateResult&) = delete;
    LateResult& operator=(const LateResult&) = delete;
    Client* client;
    capi::Buffer* buffer;
    capi::Event* ended;
  };
  // Notes when the execution computing `result` ends (last_end_); the
  // event to destroy once it has (null when the plugin cannot say).
  capi::Event* WatchEnd(capi::Buffer* result);
  // A replay launched at `now`: the device's idle time since the last
  // watched execution ended, if it has.
  void NoteDeviceIdle(std::chrono::steady_clock::time_point now);

  std::shared_ptr<Client> client_;
  int device_;
  bool bfloat16_;
  bool split_weight_gradients_;  // PjrtBackendOptions::split_weight_gradients, resolved
  bool compile_steps_;
  bool fall_back_to_kernels_;
  bool refuse_step_programs_;
  std::string fallback_reason_;  // the plugin's refusal, for FallBackToKernels
  std::string cache_dir_;
  std::shared_ptr<PjrtReplicaGroup> group_;
  // Destroyed in reverse: the step, then the memory's buffers, then the
  // programs' executables.
  ProgramCache programs_;
  DeviceMemory memory_;
  std::unique_ptr<ProgramRecorder> step_;  // the step being recorded (compiled steps)
  // RunStep's recording of the step being recorded (null otherwise), and
  // why it cannot be replayed (empty: it can).
  Recorded* capture_ = nullptr;
  std::string not_replayable_;
  int check_replay_every_;
  // By signature, searched in order: a handful (a learner's update kinds, a
  // frame table's scatters), held in one array rather than a hash table's
  // nodes, whose lookups came cold every update (docs/benchmarks/learner.md).
  std::vector<std::pair<uint64_t, std::unique_ptr<ReplayedStep>>> replayed_;
  PjrtStats stats_;
  const ProgramCache::Program* last_program_ = nullptr;
  // When the last watched execution ended (steady_clock ticks; 0: not yet).
  std::shared_ptr<std::atomic<int64_t>> last_end_;
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_PJRT_BACKEND_H_
