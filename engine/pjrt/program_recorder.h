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
//
// Holds: the program's function, its arguments (the allocations' buffers it
// reads, the uploads it owns, its run-time scalars), the values the host
// reads back, and, for a step that may fall back to kernels, the calls made
// (the replay). Not: the allocations (device_memory.h), finding or compiling
// the program (program_cache.h), executing it (PjrtBackend::RunProgram, or
// PjrtReplicaGroup for K replicas in one program).
//
// Its life: kernels Read, Write, take Scalars and Inputs and ask for
// Results; then Close ends the program, Arguments hands its inputs to an
// execution, and Install takes the execution's outputs: the written
// allocations' new buffers, the results' bytes for the host (host(i)).
#ifndef TROUPE_ENGINE_PJRT_PROGRAM_RECORDER_H_
#define TROUPE_ENGINE_PJRT_PROGRAM_RECORDER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/pjrt/device_memory.h"
#include "engine/pjrt/plugin.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

// What executing a closed step's program again needs (PjrtBackend::RunStep's
// replay, step_replay.cc), and what two recordings of one step are compared
// by: the same program over the same memory with the same run-time scalars
// gives the same execution.
struct StepRecording {
  // Per parameter of the program: the allocation it is (its range's start),
  // or 0 for the run-time scalars; with the allocation's id (an address
  // range freed and reserved again is another allocation).
  std::vector<uintptr_t> args;
  std::vector<uint64_t> arg_ids;
  std::vector<float> scalars;
  // The allocations the program's first outputs replace, in order (each an argument).
  std::vector<uintptr_t> written;
  bool operator==(const StepRecording&) const = default;
};

class ProgramRecorder {
 public:
  // A program over `memory` on `device` of `client`; `step`: a whole step's
  // (else one kernel's); `replicas` > 1: a step run as that many replicas,
  // one program (a PjrtReplicaGroup's).
  ProgramRecorder(DeviceMemory& memory, Client& client, int device, bool step, int replicas);
  // Destroys the buffers it still owns (uploads and scalars of a program
  // that did not run).
  ~ProgramRecorder();
  ProgramRecorder(const ProgramRecorder&) = delete;
  ProgramRecorder& operator=(const ProgramRecorder&) = delete;

  Function f;

  // --- Recording ---
  // Device data at `p` as a tensor of `dims` and `type` (f32, i32, ui8).
  Value Read(const void* p, const Dims& dims, std::string_view type);
  // A float the program takes at run time (no recompile when it changes).
  Value Scalar(float value);
  // Overwrites the data at `p` with v (f32, or ui8 bytes at any address).
  void Write(void* p, const Value& v);
  // A value the host gets back after the program runs (host(i)).
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
  bool Touches(uintptr_t base) const;
  // The dims of the value this program last wrote at exactly the floats
  // [p, p + floats) (one write, as a kernel made it); empty where the
  // program has written no such value (an argument, part of a write, bytes).
  Dims WrittenDims(const void* p, int64_t floats) const;
  // A note for later kernels of this program: the rows of the matrix at `p`
  // (a linear layer's weight) were multiplied by an image flattened in
  // (c, h, w) order, `chw` = {c, h, w}; empty when none was noted.
  void NoteImageRows(const void* p, const Dims& chw) { image_rows_[p] = chw; }
  Dims ImageRows(const void* p) const {
    auto it = image_rows_.find(p);
    return it == image_rows_.end() ? Dims{} : it->second;
  }
  void CountKernel() { ++kernels_; }

  bool step() const { return step_; }
  // Kernels recorded (a step's; a kernel's program: 1).
  int64_t kernels() const { return kernels_; }
  // When recording began (a step's host time is counted from it).
  std::chrono::steady_clock::time_point began() const { return began_; }

  // --- Running ---
  // Ends the program: its results are the written allocations (`keep_scratch`:
  // scratch written so far too, for a step split at a host staging point,
  // whose next program reads it), each aliased to its parameter, then the
  // values asked for by Result. False when there is none: nothing to run.
  bool Close(bool keep_scratch);
  // The program's arguments, in its parameters' order, its run-time scalars
  // uploaded now.
  const std::vector<capi::Buffer*>& Arguments();
  // The closed program's arguments and outputs by the memory they are (an
  // Input's argument shows as 0, as the scalars do: the backend does not
  // replay a step with Inputs).
  StepRecording Recording() const;
  // How many outputs an execution of the closed program returns.
  size_t num_outputs() const { return num_outputs_; }
  // Takes an execution's outputs: each written allocation's buffer (the old
  // one, donated or replaced, destroyed), the results copied to the host;
  // then destroys the buffers it owned.
  void Install(const std::vector<capi::Buffer*>& outputs);
  const std::vector<char>& host(int i) const { return host_.at(i); }

  // --- The replay ---
  // The step's calls as they were made, kept while the backend may fall back
  // to kernels (PjrtBackendOptions::fall_back_to_kernels): each runs again,
  // kernel at a time, if the plugin refuses the step's program. `call` is
  // the backend's own method with its arguments (device addresses, sizes,
  // scalars by value).
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
    Dims written;  // the dims of the value a kernel wrote (empty: a part of one, or bytes widened)
  };
  struct Tracked {
    uintptr_t base;
    DeviceMemory::Allocation* allocation;
    bool scratch;        // no parameter: what it held before the program is dead
    int parameter = -1;  // index among the function's parameters
    Value whole;         // the parameter (f32[words]) when there is one
    std::map<int64_t, Piece> pieces;
    bool written = false;
  };

  static int64_t Product(const Dims& dims);
  static void Require(bool ok, const char* what);
  Tracked& Touch(const void* p, int64_t* offset);
  // A word value as bytes (ui8[4n]) and back.
  Value AsBytes(const Value& v);
  Value AsWords(const Value& v);
  // Bytes [from, to) of a piece or parameter value starting at byte `at`
  // (all multiples of 4), in the value's own element type.
  Value Cut(const Value& v, int64_t at, int64_t from, int64_t to);
  // The allocation's bytes [begin, end) as of this point of the program, as
  // f32 words (`words`: begin and end multiples of 4) or ui8 bytes.
  Value Range(Tracked& t, int64_t begin, int64_t end, bool words);
  // Records that bytes [begin, end) now hold v (word aligned), written as
  // a value of dims `written`.
  void Insert(Tracked& t, int64_t begin, int64_t end, const Value& v, const Dims& written = {});
  // Bytes of the allocation the pieces cover.
  static int64_t Covered(const Tracked& t);
  // The whole allocation (f32[words]) with everything written: where the
  // pieces cover it all (scratch; a gradient buffer filled then accumulated
  // into tensor by tensor), their concatenation, the same value a kernel
  // reading all of it got; else the parameter updated in place piece by piece.
  Value Materialize(Tracked& t);

  DeviceMemory& memory_;
  Client& client_;
  int device_;
  bool step_;
  std::vector<Tracked> tracked_;  // std::vector: references stay valid only until the next Touch
  std::vector<Tracked*> written_;  // Close: the allocations its first outputs are
  size_t num_outputs_ = 0;
  std::vector<capi::Buffer*> args_;
  std::vector<capi::Buffer*> owned_;
  std::optional<Value> scalars_param_;
  int scalars_arg_ = -1;
  std::vector<float> scalars_;
  std::vector<Value> results_;
  std::map<const void*, Dims> image_rows_;  // NoteImageRows
  std::vector<std::vector<char>> host_;
  std::vector<std::function<void()>> calls_;
  int64_t kernels_ = 0;
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_PROGRAM_RECORDER_H_
