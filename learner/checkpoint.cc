// The RL learner's checkpoints: writing one generation (agent, counters,
// replay), and resuming from the newest usable one.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/generations.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "learner/rl_learner.h"

namespace troupe::learner {
namespace {

using Clock = std::chrono::steady_clock;

// The learner's counters beside the agent checkpoint: "key value" lines.
std::string CountersText(int64_t frames, int64_t samples, int64_t updates) {
  return absl::StrCat("frames ", frames, "\nsamples ", samples, "\nupdates ", updates, "\n");
}

struct Counters {
  int64_t frames = -1, samples = -1;
  int64_t updates = -1;  // -1 in checkpoints from before it was written
};

// Reads counters.txt; DataLoss when it is missing or lacks frames or samples
// (a damaged checkpoint, passed over for an older one).
absl::StatusOr<Counters> ReadCounters(const std::string& path) {
  if (!std::filesystem::exists(path)) return absl::DataLossError(absl::StrCat("no learner counters at ", path));
  std::map<std::string, std::string> values = ReadKeyValues(path);
  Counters counters;
  for (auto [key, count] : {std::pair{"frames", &counters.frames}, std::pair{"samples", &counters.samples},
                            std::pair{"updates", &counters.updates}}) {
    if (!absl::SimpleAtoi(values[key], count)) *count = -1;
  }
  if (counters.frames < 0 || counters.samples < 0) {
    return absl::DataLossError(absl::StrCat(path, ": no frames or samples count"));
  }
  return counters;
}

// "12,345,678".
std::string Thousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

absl::StatusOr<int64_t> WriteLearnerCheckpoint(const std::string& dir, const agents::Agent& agent,
                                               replay::Replay* replay, absl::FunctionRef<std::string()> counters,
                                               int keep) {
  ASSIGN_OR_RETURN(GenerationWriter generation, GenerationWriter::Begin(dir));
  const std::string agent_path = generation.File(kAgentCheckpointFile);
  std::vector<nn::CheckpointTensor> state = agent.CheckpointState();
  absl::Status agent_written;
  {
    // The agent written on its own thread (joined at the end of this block,
    // an error included) while replay is written here.
    std::jthread writer([&] { agent_written = nn::WriteCheckpoint(agent_path, state); });
    if (replay != nullptr) {
      // Its crc32 comes from its writer: hundreds of MB are not read back.
      uint32_t crc32 = 0;
      ASSIGN_OR_RETURN(const int64_t bytes, replay->Checkpoint(generation.File(kReplayCheckpointFile), &crc32));
      RETURN_IF_ERROR(generation.AddWritten(kReplayCheckpointFile, bytes, crc32));
    }
  }
  RETURN_IF_ERROR(agent_written);
  RETURN_IF_ERROR(generation.Add(kAgentCheckpointFile));
  RETURN_IF_ERROR(generation.AddText(kCountersFile, counters()));
  ASSIGN_OR_RETURN(const std::string note,
                   generation.Commit(keep, {kAgentCheckpointFile, kCountersFile, kReplayCheckpointFile}));
  // An old generation that could not be removed costs disk, not the checkpoint.
  if (!note.empty()) std::fprintf(stderr, "checkpoint: %s\n", note.c_str());
  return generation.number();
}

absl::Status RlLearner::Checkpoint() {
  const auto started = Clock::now();
  // One generation: replay, networks and counters of this step.
  int64_t frames = 0;
  auto write = [&](replay::Replay* with_replay) {
    return WriteLearnerCheckpoint(layout_.checkpoints(), *agent_, with_replay,
                                  [&] {
                                    frames = FramesNow();
                                    return CountersText(frames, samples_, agent_->updates());
                                  },
                                  config_.learner().keep_checkpoints());
  };
  replay::Replay* with_replay = config_.learner().checkpoint_replay() ? replay_.get() : nullptr;
  absl::StatusOr<int64_t> generation = write(with_replay);
  without_replay_ = false;
  if (!generation.ok() && absl::IsResourceExhausted(generation.status()) && with_replay != nullptr) {
    // The disk cannot take the whole generation: the networks, optimizer and
    // counters (a few MB) still commit, so a crash loses replay, not training.
    std::fprintf(stderr,
                 "checkpoint at %s frames: %s; writing it without replay (a resume from it starts with an empty "
                 "replay)\n",
                 Thousands(FramesNow()).c_str(), std::string(generation.status().message()).c_str());
    generation = write(nullptr);
    without_replay_ = generation.ok();
  }
  // The generation's buffers (the agent's serialized state, replay's
  // chunks: hundreds of MB for pixels) go back to the system: tcmalloc
  // keeps freed large blocks in its page heap, and a soak's learner stayed
  // ~100 MiB higher after them (docs/development.md "Soak").
  ReleaseFreeMemory();
  RETURN_IF_ERROR(generation.status());
  last_generation_ = *generation;
  last_generation_frames_ = frames;
  checkpoint_seconds_ += std::chrono::duration<double>(Clock::now() - started).count();
  return absl::OkStatus();
}

void RlLearner::CheckpointOrWarn() {
  const auto started = Clock::now();
  const absl::Status status = Checkpoint();
  std::string note;
  if (status.ok()) {
    if (checkpoint_failures_ > 0) {
      std::fprintf(stderr, "checkpoint: generation %ld committed at %s frames after %d failed attempt(s)\n",
                   long(last_generation_), Thousands(last_generation_frames_).c_str(), checkpoint_failures_);
    }
    checkpoint_failures_ = 0;
    if (without_replay_) {
      note = absl::StrCat("checkpoint without replay (disk full): ", LastGenerationText());
      std::fprintf(stderr, "checkpoint: %s committed without replay: the disk is full\n",
                   LastGenerationText().c_str());
    }
  } else {
    // The partial generation is gone (the writer abandoned it); the last
    // good one stays, and the next checkpoint tries again.
    checkpoint_seconds_ += std::chrono::duration<double>(Clock::now() - started).count();
    ++checkpoint_failures_;
    note = absl::StrCat("checkpoint FAILED (", checkpoint_failures_, "x): ", absl::StatusCodeToString(status.code()),
                        "; last good: ", LastGenerationText());
    std::fprintf(stderr,
                 "checkpoint at %s frames failed: %s; its partial generation was removed, the last good checkpoint "
                 "is %s; training goes on and tries again in %d s%s\n",
                 Thousands(FramesNow()).c_str(), std::string(status.message()).c_str(), LastGenerationText().c_str(),
                 config_.learner().checkpoint_every_s(),
                 absl::IsResourceExhausted(status) ? " (the disk is full: free space under the run directory)" : "");
  }
  absl::MutexLock lock(&mutex_);
  stats_.checkpoint_note = note;
}

std::string RlLearner::LastGenerationText() const {
  if (last_generation_ < 0) return "none yet";
  if (last_generation_ == 0) {
    return absl::StrCat(layout_.checkpoints(), " at ", Thousands(last_generation_frames_), " frames");
  }
  return absl::StrCat("generation ", last_generation_, " at ", Thousands(last_generation_frames_), " frames");
}

absl::Status RlLearner::LoadCheckpointFiles(const std::string& folder, bool has_replay, std::string* replay_note) {
  // The networks and optimizer state, then the counters of the same step.
  RETURN_IF_ERROR(agent_->Load(folder + "/" + kAgentCheckpointFile));
  ASSIGN_OR_RETURN(const Counters counters, ReadCounters(folder + "/" + kCountersFile));
  if (counters.updates >= 0 && counters.updates != agent_->updates()) {
    return absl::DataLossError(absl::StrCat(folder, "/", kCountersFile, " counts ", counters.updates, " updates, ",
                                            kAgentCheckpointFile, " holds ", agent_->updates(),
                                            ": not one step's checkpoint"));
  }
  // Replay: checked whole before any table changes, so a failure here leaves
  // replay as it was for an older generation.
  int64_t inserts = 0;
  *replay_note = "replay starts empty (learner.checkpoint_replay is off)";
  if (config_.learner().checkpoint_replay() && !has_replay) {
    *replay_note = absl::StrCat("replay starts empty (the checkpoint has no ", kReplayCheckpointFile, ")");
  } else if (config_.learner().checkpoint_replay()) {
    RETURN_IF_ERROR(replay_->Restore(folder + "/" + kReplayCheckpointFile).status());
    const proto::InfoResponse info = replay_->Info();
    inserts = info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0;
    *replay_note = absl::StrCat("replay restored: ", info.tables_size() ? info.tables(0).size() : 0, " items");
  }
  frames_before_ = counters.frames;
  samples_ = samples_before_ = counters.samples;
  inserts_before_ = inserts;
  return absl::OkStatus();
}

absl::Status RlLearner::Restore() {
  const std::string dir = layout_.checkpoints();
  // The newest generation that is whole; a damaged or unfinished newer one
  // is said, and passed over.
  std::string replay_note, from;
  std::vector<std::string> passed_over;
  absl::StatusOr<Generation> generation = LoadNewestGeneration(
      dir,
      [&](const Generation& g) { return LoadCheckpointFiles(g.path, g.Has(kReplayCheckpointFile), &replay_note); },
      &passed_over);
  if (generation.ok()) {
    from = generation->path;
    last_generation_ = generation->number;
  } else if (absl::IsNotFound(generation.status()) && std::filesystem::exists(dir + "/" + kAgentCheckpointFile)) {
    // A run from before generations: its one checkpoint, directly in `dir`.
    RETURN_IF_ERROR(
        LoadCheckpointFiles(dir, std::filesystem::exists(dir + "/" + kReplayCheckpointFile), &replay_note));
    from = dir;
    last_generation_ = 0;
  } else {
    return generation.status();
  }
  last_generation_frames_ = frames_before_;
  for (const std::string& why : passed_over) {
    std::printf("checkpoint passed over: %s\n", why.c_str());
  }
  // The logs go on from the checkpoint (what they got after it goes), the
  // run's clock from their last row, and the evaluations kept stay on the
  // curve.
  ASSIGN_OR_RETURN(const LearnerRunLog::Resumed resumed, run_log_->Resume(frames_before_));
  start_ = resumed.start;
  {
    absl::MutexLock lock(&mutex_);
    stats_.last_eval_frames = resumed.last_eval_frames;
    stats_.last_eval_return = resumed.last_eval_return;
    if (!passed_over.empty()) {
      stats_.checkpoint_note = absl::StrCat("resumed from ", std::filesystem::path(from).filename().string(), ", ",
                                            passed_over.size(), " newer checkpoint(s) damaged or unfinished (see log)");
    }
  }
  std::printf(
      "resumed from %s: %ld updates, %ld frames; %s; %zu metrics rows and %zu evaluations made after that "
      "checkpoint dropped (made again)\n",
      from.c_str(), static_cast<long>(agent_->updates()), static_cast<long>(frames_before_), replay_note.c_str(),
      resumed.metrics_dropped, resumed.evaluations_dropped);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status RlLearner::RestoreAgent() {
  // The agent of the newest usable generation, as rank 0 finds it.
  const std::string dir = layout_.checkpoints();
  absl::StatusOr<Generation> generation = LoadNewestGeneration(
      dir, [&](const Generation& g) { return agent_->Load(g.File(kAgentCheckpointFile)); }, nullptr);
  if (absl::IsNotFound(generation.status()) && std::filesystem::exists(dir + "/" + kAgentCheckpointFile)) {
    return agent_->Load(dir + "/" + kAgentCheckpointFile);
  }
  return generation.status();
}

}  // namespace troupe::learner
