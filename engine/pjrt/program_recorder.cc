#include "engine/pjrt/program_recorder.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>

#include "engine/pjrt/fatal.h"

namespace troupe::pjrt {

ProgramRecorder::ProgramRecorder(DeviceMemory& memory, Client& client, int device, bool step, int replicas)
    : memory_(memory), client_(client), device_(device), step_(step) {
  if (replicas > 1) f.set_replicas(replicas);
}

ProgramRecorder::~ProgramRecorder() {
  for (capi::Buffer* buffer : owned_) client_.Destroy(buffer);
}

// --- Recording --------------------------------------------------------------------

Value ProgramRecorder::Read(const void* p, const Dims& dims, std::string_view type) {
  int64_t offset = 0;
  Tracked& t = Touch(p, &offset);
  const bool bytes = type == "ui8";
  const int64_t n = Product(dims);
  Require(bytes || offset % 4 == 0, "a 4-byte operand at an unaligned address");
  Value flat = Range(t, offset, offset + (bytes ? n : 4 * n), /*words=*/!bytes);
  if (type == "i32") flat = f.BitcastConvert(flat, flat.dims, "i32");
  return f.Reshape(flat, dims);
}

Value ProgramRecorder::Scalar(float value) {
  const int64_t capacity = step_ ? kStepScalars : kKernelScalars;
  if (!scalars_param_) {
    scalars_param_ = f.Parameter({capacity}, "f32");
    args_.push_back(nullptr);  // filled in by Arguments
    scalars_arg_ = static_cast<int>(args_.size()) - 1;
  }
  Require(static_cast<int64_t>(scalars_.size()) < capacity, "too many run-time scalars in one program");
  const int64_t i = static_cast<int64_t>(scalars_.size());
  scalars_.push_back(value);
  return f.Reshape(f.Slice(*scalars_param_, {i}, {i + 1}), {});
}

void ProgramRecorder::Write(void* p, const Value& v) {
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
  Insert(t, begin, end, flat, v.type == "f32" ? v.dims : Dims{});
  t.written = true;
}

Dims ProgramRecorder::WrittenDims(const void* p, int64_t floats) const {
  int64_t offset = 0;
  const uintptr_t base = memory_.Find(p, &offset).first;
  for (const Tracked& t : tracked_) {
    if (t.base != base) continue;
    auto it = t.pieces.find(offset);
    if (it == t.pieces.end() || it->second.end != offset + 4 * floats) return {};
    return it->second.written;
  }
  return {};
}

bool ProgramRecorder::Touches(uintptr_t base) const {
  return std::any_of(tracked_.begin(), tracked_.end(), [&](const Tracked& t) { return t.base == base; });
}

// --- Running ----------------------------------------------------------------------

bool ProgramRecorder::Close(bool keep_scratch) {
  std::vector<Value> outputs;
  written_.clear();
  for (Tracked& t : tracked_) {
    if (!t.written || (t.scratch && !keep_scratch)) continue;
    if (t.parameter >= 0) f.AliasParameter(t.parameter, static_cast<int>(outputs.size()));
    outputs.push_back(Materialize(t));
    written_.push_back(&t);
  }
  for (const Value& r : results_) outputs.push_back(r);
  if (outputs.empty()) return false;  // nothing written or read back: nothing to run
  f.Return(outputs);
  num_outputs_ = outputs.size();
  return true;
}

const std::vector<capi::Buffer*>& ProgramRecorder::Arguments() {
  if (scalars_param_) {
    scalars_.resize(static_cast<size_t>(scalars_param_->dims[0]), 0.0f);
    const int64_t dims[] = {scalars_param_->dims[0]};
    auto buffer = client_.BufferFromHost(scalars_.data(), capi::kF32, dims, device_);
    if (!buffer.ok()) Fatal(buffer.status(), "program scalars");
    args_[scalars_arg_] = *buffer;
    owned_.push_back(*buffer);
  }
  return args_;
}

StepRecording ProgramRecorder::Recording() const {
  StepRecording r;
  r.args.assign(args_.size(), 0);
  r.arg_ids.assign(args_.size(), 0);
  for (const Tracked& t : tracked_) {
    if (t.parameter < 0) continue;
    // Parameters are numbered as args_ is filled: a tracked allocation's index is its argument's.
    r.args[static_cast<size_t>(t.parameter)] = t.base;
    r.arg_ids[static_cast<size_t>(t.parameter)] = t.allocation->id;
  }
  // As the program takes them: the parameter's whole vector.
  r.scalars = scalars_;
  if (scalars_param_) r.scalars.resize(static_cast<size_t>(scalars_param_->dims[0]), 0.0f);
  for (const Tracked* t : written_) r.written.push_back(t->base);
  return r;
}

void ProgramRecorder::Install(const std::vector<capi::Buffer*>& out) {
  for (size_t i = 0; i < written_.size(); ++i) {
    DeviceMemory::Allocation& a = *written_[i]->allocation;
    capi::Buffer*& buffer = memory_.buffer(a);
    client_.Destroy(buffer);  // donated to the execution (or, scratch, replaced)
    buffer = out[i];
    if (written_[i]->scratch) a.live_in_step = true;
  }
  for (size_t i = 0; i < results_.size(); ++i) {
    capi::Buffer* r = out[written_.size() + i];
    const Value& v = results_[i];
    host_.emplace_back(static_cast<size_t>(v.size()) * (v.type == "ui8" ? 1 : 4));
    Check(client_.ToHost(r, host_.back().data(), host_.back().size()), "reading a program's result");
    client_.Destroy(r);
  }
  for (capi::Buffer* buffer : owned_) client_.Destroy(buffer);
  owned_.clear();
}

// --- Tracking device memory ---------------------------------------------------------

int64_t ProgramRecorder::Product(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

void ProgramRecorder::Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "PJRT backend: %s\n", what);
  std::abort();
}

ProgramRecorder::Tracked& ProgramRecorder::Touch(const void* p, int64_t* offset) {
  auto [base, allocation] = memory_.Find(p, offset);
  for (Tracked& t : tracked_) {
    if (t.base == base) return t;
  }
  Tracked t{base, allocation, step_ && allocation->scratch && !allocation->live_in_step};
  if (!t.scratch) {
    t.whole = f.Parameter({allocation->words}, "f32");
    t.parameter = f.num_parameters() - 1;
    args_.push_back(memory_.buffer(*allocation));
  }
  tracked_.push_back(std::move(t));
  return tracked_.back();
}

Value ProgramRecorder::AsBytes(const Value& v) {
  if (v.type == "ui8") return v;
  return f.Reshape(f.BitcastConvert(v, {v.dims[0], 4}, "ui8"), {4 * v.dims[0]});
}

Value ProgramRecorder::AsWords(const Value& v) {
  if (v.type == "f32") return v;
  return f.BitcastConvert(f.Reshape(v, {v.dims[0] / 4, 4}), {v.dims[0] / 4}, "f32");
}

Value ProgramRecorder::Cut(const Value& v, int64_t at, int64_t from, int64_t to) {
  const int64_t k = v.type == "ui8" ? 1 : 4;
  if (from == at && (to - from) / k == v.dims[0]) return v;
  return f.Slice(v, {(from - at) / k}, {(to - at) / k});
}

Value ProgramRecorder::Range(Tracked& t, int64_t begin, int64_t end, bool words) {
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

void ProgramRecorder::Insert(Tracked& t, int64_t begin, int64_t end, const Value& v, const Dims& written) {
  // Pieces overlapping [begin, end) keep what lies outside it.
  auto it = t.pieces.upper_bound(begin);
  if (it != t.pieces.begin() && std::prev(it)->second.end > begin) --it;
  std::vector<std::pair<int64_t, Piece>> kept;
  while (it != t.pieces.end() && it->first < end) {
    const int64_t pb = it->first, pe = it->second.end;
    if (pb < begin) kept.push_back({pb, {begin, Cut(it->second.v, pb, pb, begin), {}}});
    if (pe > end) kept.push_back({end, {pe, Cut(it->second.v, pb, end, pe), {}}});
    it = t.pieces.erase(it);
  }
  for (auto& [b, piece] : kept) t.pieces.emplace(b, std::move(piece));
  t.pieces.emplace(begin, Piece{end, v, written});
}

int64_t ProgramRecorder::Covered(const Tracked& t) {
  int64_t covered = 0;
  for (const auto& [begin, piece] : t.pieces) covered += piece.end - begin;
  return covered;
}

Value ProgramRecorder::Materialize(Tracked& t) {
  const int64_t words = t.allocation->words;
  if (t.scratch || Covered(t) == 4 * words) return Range(t, 0, 4 * words, /*words=*/true);
  Value v = t.whole;
  for (auto& [begin, piece] : t.pieces) v = f.UpdateSlice(v, AsWords(piece.v), {begin / 4});
  return v;
}

}  // namespace troupe::pjrt
