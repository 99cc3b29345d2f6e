// PjrtBackend::RunStep: a step traced once and replayed (nn::Backend::RunStep
// says the contract). Per signature, the step is recorded (device_part runs,
// its kernels become one program, executed as any compiled step) until two
// recordings in a row are the same (StepRecording: program, arguments by
// allocation, run-time scalars, outputs, and the host memory its reads go
// to); from then on each call binds the allocations' current buffers to that
// program's executable and executes it, without running device_part, the
// tape, the ops or the recorder. Two recordings, not one, because a first
// update may differ from the rest (an optimizer's state made on first use).
// check_replay_every > 0 records every so many replays again and aborts,
// naming the difference, when the recording is not the one replayed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/pjrt/fatal.h"
#include "engine/pjrt/pjrt_backend.h"

namespace troupe::pjrt {

void PjrtBackend::Forget(ReplayedStep& step) {
  if (step.scalars != nullptr) client_->Destroy(step.scalars);
  step = ReplayedStep();
}

bool PjrtBackend::RecordStep(const std::function<void()>& device_part, Recorded* out, std::string* why_not) {
  *out = Recorded();
  capture_ = out;
  BeginStep();
  device_part();
  EndStep();
  capture_ = nullptr;
  *why_not = not_replayable_;
  if (why_not->empty() && out->program == nullptr) *why_not = "no program ran";
  return why_not->empty();
}

namespace {

// What differs between two recordings of one signature, for the guard's abort.
std::string Difference(const StepRecording& was, const std::string& was_text, const StepRecording& now,
                       const std::string& now_text) {
  if (was_text != now_text) return "the program's text";
  if (was.args != now.args || was.arg_ids != now.arg_ids) return "the memory its arguments are";
  if (was.written != now.written) return "the memory it writes";
  if (was.scalars != now.scalars) {
    for (size_t i = 0; i < std::min(was.scalars.size(), now.scalars.size()); ++i) {
      if (was.scalars[i] != now.scalars[i]) {
        return "run-time scalar " + std::to_string(i) + " (" + std::to_string(was.scalars[i]) + " replayed, " +
               std::to_string(now.scalars[i]) + " recorded): a value from the host that is not an input";
      }
    }
    return "the number of run-time scalars";
  }
  return "the host memory its reads go to";
}

}  // namespace

void PjrtBackend::RunStep(uint64_t signature, const std::function<void()>& device_part) {
  if (!compile_steps_) {
    nn::Backend::RunStep(signature, device_part);
    return;
  }
  auto found = std::find_if(replayed_.begin(), replayed_.end(), [signature](const auto& s) { return s.first == signature; });
  if (found == replayed_.end()) found = replayed_.insert(found, {signature, std::make_unique<ReplayedStep>()});
  ReplayedStep& step = *found->second;
  const bool check = step.ready && check_replay_every_ > 0 && ++step.replays_since_check >= check_replay_every_;
  if (step.ready && !check && Replay(step)) return;
  Recorded now;
  std::string why_not;
  const bool replayable = RecordStep(device_part, &now, &why_not);
  if (check) {
    ++stats_.replay_checks;
    step.replays_since_check = 0;
    if (!(replayable && now == step.recorded)) {
      std::fprintf(stderr,
                   "PJRT backend: a replayed step (signature %016llx) recorded again differs from its replay in %s; "
                   "its device part takes something that is not in device memory or its signature\n",
                   static_cast<unsigned long long>(signature),
                   !replayable ? why_not.c_str()
                               : Difference(step.recorded.recording, step.recorded.program->text, now.recording,
                                            now.program->text)
                                     .c_str());
      std::abort();
    }
    return;
  }
  if (!replayable) {
    Forget(step);
    return;
  }
  if (now == step.recorded) {
    step.ready = true;
    return;
  }
  Forget(step);
  step.recorded = std::move(now);
}

bool PjrtBackend::Bind(ReplayedStep& step) {
  const StepRecording& r = step.recorded.recording;
  step.bound_layout = 0;
  step.arg_slots.assign(r.args.size(), ReplayedStep::kScalars);
  for (size_t i = 0; i < r.args.size(); ++i) {
    if (r.args[i] == 0) continue;  // the run-time scalars
    DeviceMemory::Allocation* a = memory_.At(r.args[i]);
    if (a == nullptr || a->id != r.arg_ids[i]) return false;  // freed or made anew since the recording
    step.arg_slots[i] = a->slot;
  }
  step.written_slots.assign(r.written.size(), 0);
  for (size_t i = 0; i < r.written.size(); ++i) {
    step.written_slots[i] = memory_.At(r.written[i])->slot;  // (each an argument: bound above)
  }
  step.bound_layout = memory_.layout();
  return true;
}

bool PjrtBackend::Replay(ReplayedStep& step) {
  const auto began = std::chrono::steady_clock::now();
  const StepRecording& r = step.recorded.recording;
  const ProgramCache::Program& program = *step.recorded.program;
  // The allocations found again only when some were made or freed since.
  if (step.bound_layout != memory_.layout() && !Bind(step)) {
    // Memory freed or made anew since the recording: record again.
    Forget(step);
    return false;
  }
  std::vector<capi::Buffer*>& args = step.args;
  args.resize(r.args.size());
  for (size_t i = 0; i < r.args.size(); ++i) {
    if (const uint32_t slot = step.arg_slots[i]; slot != ReplayedStep::kScalars) {
      args[i] = memory_.buffer(slot);
      continue;
    }
    if (step.scalars == nullptr) {
      const int64_t dims[] = {static_cast<int64_t>(r.scalars.size())};
      auto buffer = client_->BufferFromHost(r.scalars.data(), capi::kF32, dims, device_);
      if (!buffer.ok()) Fatal(buffer.status(), "a replayed step's scalars");
      step.scalars = *buffer;
    }
    args[i] = step.scalars;
  }
  CountStep();
  std::vector<capi::Buffer*>& out = step.out;
  out.assign(r.written.size() + step.recorded.reads.size(), nullptr);
  const auto execute_began = std::chrono::steady_clock::now();
  stats_.replay_host_seconds += std::chrono::duration<double>(execute_began - began).count();
  NoteDeviceIdle(execute_began);
  Execute(program, program.executable, args, out, /*step=*/true, /*kernels=*/0);
  for (size_t i = 0; i < r.written.size(); ++i) {
    capi::Buffer*& buffer = memory_.buffer(step.written_slots[i]);
    client_->Destroy(buffer);  // donated to the execution
    buffer = out[i];
  }
  const size_t reads = step.recorded.reads.size();
  // When the execution ends (its first result computed), for the idle time
  // before the next one.
  capi::Event* ended = reads > 0 ? WatchEnd(out[r.written.size()]) : nullptr;
  // Each result copied to the host now, or when the caller lands this
  // step's reads (late reads: the wait is then landing's).
  const bool late = late_reads();
  for (size_t i = 0; i < reads; ++i) {
    auto result = std::make_shared<LateResult>(client_.get(), out[r.written.size() + i], i == 0 ? ended : nullptr);
    auto land = [this, result, to = step.recorded.reads[i], late] {
      const auto waited = std::chrono::steady_clock::now();
      Check(client_->ToHost(result->buffer, to.first, to.second), "reading a replayed step's result");
      if (late) {
        stats_.late_read_wait_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - waited).count();
      }
    };
    if (late) {
      KeepLateRead(std::move(land));
    } else {
      land();
    }
  }
  if (!late) {
    stats_.step_execute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - execute_began).count();
  }
  ++stats_.steps;
  ++stats_.step_replays;
  return true;
}

PjrtBackend::LateResult::~LateResult() {
  client->Destroy(buffer);
  client->Destroy(ended);
}

capi::Event* PjrtBackend::WatchEnd(capi::Buffer* result) {
  auto ended = std::make_shared<std::atomic<int64_t>>(0);
  absl::StatusOr<capi::Event*> event = client_->WhenReady(result, [ended] {
    ended->store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
  });
  if (!event.ok()) return nullptr;  // the idle time goes unmeasured; the read says any error
  last_end_ = std::move(ended);
  return *event;
}

void PjrtBackend::NoteDeviceIdle(std::chrono::steady_clock::time_point now) {
  if (last_end_ == nullptr) return;
  const int64_t ended = last_end_->load(std::memory_order_acquire);
  last_end_ = nullptr;
  if (ended == 0) return;  // the last execution still runs: this one queues behind it
  const auto idle = now.time_since_epoch().count() - ended;
  if (idle <= 0) return;
  ++stats_.idle_launches;
  stats_.device_idle_seconds += std::chrono::duration<double>(std::chrono::steady_clock::duration(idle)).count();
}

}  // namespace troupe::pjrt
