// One kernel call of a PjrtBackend (for pjrt_backend.cc and pjrt_kernels.cc
// only): it records into the step's program inside a compiled step, else
// into a program of its own that Run() executes at once.
//
// Holds: which program the call records into, and the few ways a kernel
// reads and writes device memory (typed reads, stores, accumulations). Not:
// the recording itself (program_recorder.h), nor running a step's program
// (the backend's EndStep).
#ifndef TROUPE_ENGINE_PJRT_LAUNCH_H_
#define TROUPE_ENGINE_PJRT_LAUNCH_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/pjrt/pjrt_backend.h"
#include "engine/pjrt/program_recorder.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

class PjrtBackend::Launch {
 public:
  explicit Launch(PjrtBackend& backend)
      : backend_(backend),
        own_(backend.step_ ? nullptr : backend.NewRecorder(/*step=*/false)),
        r_(backend.step_ ? *backend.step_ : *own_),
        f(r_.f) {
    r_.CountKernel();
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

 private:
  PjrtBackend& backend_;
  std::unique_ptr<ProgramRecorder> own_;
  ProgramRecorder& r_;

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
  Dims WrittenDims(const void* p, int64_t floats) const { return r_.WrittenDims(p, floats); }
  void NoteImageRows(const void* p, const Dims& chw) { r_.NoteImageRows(p, chw); }
  Dims ImageRows(const void* p) const { return r_.ImageRows(p); }
  Value Input(capi::Buffer* buffer, const Dims& dims, std::string_view type) { return r_.Input(buffer, dims, type); }
  // Runs the kernel's own program (nothing inside a compiled step: the step's
  // program runs at its end).
  void Run() {
    if (own_) (void)backend_.RunProgram(*own_);  // a kernel's program: never refused without aborting
  }
  const std::vector<char>& host(int i) const { return r_.host(i); }
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_LAUNCH_H_
