#include "learner/rl_learner.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include <grpcpp/server_builder.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/actor.h"
#include "actors/evaluator.h"
#include "common/event_writer.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/grpc_security.h"
#include "common/host.h"
#include "common/image.h"
#include "common/limits.h"
#include "common/plot.h"
#include "common/status_macros.h"
#include "common/video.h"
#include "engine/engine_config.h"
#include "engine/nn/checkpoint.h"
#include "envs/env.h"
#include "replay/client.h"
#include "replay/grpc_client.h"

namespace troupe::learner {
namespace {

using Clock = std::chrono::steady_clock;

std::string CheckpointDir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

// The files of a checkpoint: one generation of CheckpointDir (the
// single-file layout before generations had them directly there).
constexpr char kAgentFile[] = "agent.ckpt";
constexpr char kCountersFile[] = "counters.txt";
constexpr char kReplayFile[] = "replay.ckpt";

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
  std::ifstream in(path);
  if (!in) return absl::DataLossError(absl::StrCat("no learner counters at ", path));
  Counters counters;
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "frames") counters.frames = value;
    if (key == "samples") counters.samples = value;
    if (key == "updates") counters.updates = value;
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

absl::Status ValidateLearnerConfig(const config::LearnerConfig& learner) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat("learner.", parts...)); };
  RETURN_IF_ERROR(engine::ValidateEngineConfig(learner.engine(), "learner", learner.batch_size()));
  if (learner.publish_every() < 1) return bad("publish_every ", learner.publish_every(), ": must be >= 1");
  if (learner.checkpoint_every_s() < 1) {
    return bad("checkpoint_every_s ", learner.checkpoint_every_s(), ": must be >= 1");
  }
  if (learner.max_updates() < 0) return bad("max_updates ", learner.max_updates(), ": must be >= 0 (0 = no limit)");
  if (learner.batch_size() > kMaxLearnerBatchSize) {
    return bad("batch_size ", learner.batch_size(), ": must be in [1, ", kMaxLearnerBatchSize, "]");
  }
  if (learner.replay_size() < 1 || learner.replay_size() > replay::kMaxTableSize) {
    return bad("replay_size ", learner.replay_size(), ": must be in [1, ", replay::kMaxTableSize, "]");
  }
  RETURN_IF_ERROR(CheckFitsInMemory(absl::StrCat("learner.replay_size ", learner.replay_size()),
                                    static_cast<double>(learner.replay_size()) * replay::kTableBytesPerSlot));
  if (learner.min_replay_size() < 1 || learner.min_replay_size() > learner.replay_size()) {
    return bad("min_replay_size ", learner.min_replay_size(), ": must be in [1, learner.replay_size ",
               learner.replay_size(), "]");
  }
  // !(>= 0) also refuses NaN.
  if (!(learner.samples_per_insert() >= 0) || std::isinf(learner.samples_per_insert())) {
    return bad("samples_per_insert ", learner.samples_per_insert(), ": must be finite and >= 0 (0 = no ratio)");
  }
  if (learner.keep_checkpoints() < 1 || learner.keep_checkpoints() > kMaxKeptGenerations) {
    return bad("keep_checkpoints ", learner.keep_checkpoints(), ": must be in [1, ", kMaxKeptGenerations,
               "] (checkpoints kept, the newest first)");
  }
  RETURN_IF_ERROR(ValidateHostPort(learner.listen(), "learner.listen"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RlLearner>> RlLearner::Create(const config::ExperimentConfig& config,
                                                             const std::string& run_dir, bool resume,
                                                             const RlLearnerOptions& options) {
  std::unique_ptr<RlLearner> l(new RlLearner());
  l->config_ = config;
  l->run_dir_ = run_dir;
  RETURN_IF_ERROR(ValidateLearnerConfig(config.learner()));
  ASSIGN_OR_RETURN(const envs::EnvSpec env_spec, envs::DescribeEnv(config.env()));
  l->spec_ = agents::ObservationSpecOf(env_spec);
  l->action_size_ = env_spec.action_size;
  RETURN_IF_ERROR(agents::ValidateD4pg(config.d4pg(), l->spec_, l->action_size_));
  RETURN_IF_ERROR(agents::ValidateDeviceFrames(config, l->spec_));
  // TLS and the token of the port and of other ranks' connections to rank 0.
  ASSIGN_OR_RETURN(l->credentials_, LoadGrpcCredentials(config.security()));

  // The Replicator first: under MPI it says which rank this process is.
  const config::EngineConfig& engine = config.learner().engine();
  l->mpi_ = !engine::InProcessReplicas(engine);
  ASSIGN_OR_RETURN(l->replicator_, engine::MakeReplicator(engine, options.collective_timeout));
  if (l->mpi_) {
    l->rank_ = l->replicator_->local_replicas().front();
    l->num_ranks_ = l->replicator_->num_replicas();
    if (engine.replicas() > 1 && engine.replicas() != l->num_ranks_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "learner.engine.replicas ", engine.replicas(), " with learner.engine.collectives ",
          config::EngineConfig::Collectives_Name(engine.collectives()), ": mpirun started ",
          l->num_ranks_, " ranks (one replica each); leave learner.engine.replicas at 1 or make it match `mpirun -np`"));
    }
  }

  // Replay, embedded: the D4PG transitions table unless the config lists tables.
  config::ReplayConfig replay_config = config.replay();
  if (replay_config.tables_size() == 0) {
    *replay_config.add_tables() = agents::D4pgTransitionTable(l->spec_, l->action_size_, config);
  }
  absl::Status chief_status;
  if (l->is_chief()) chief_status = l->StartChief(replay_config);
  if (l->mpi_) {
    RETURN_IF_ERROR(l->ShareChiefAddress(chief_status, replay_config.max_message_bytes()));
  } else {
    RETURN_IF_ERROR(chief_status);
  }

  // The agent on the Replicator, one sampler per local replica. Rank 0
  // samples its embedded replay; other ranks sample it over gRPC. (Rather
  // than rank 0 sampling the whole global batch and scattering shards: the
  // Replicator's collectives carry floats of equal size, not pixel batches,
  // rank 0 would decode every rank's frames on its own cores, and every
  // replica's input would wait on one thread. Over gRPC each rank's sample
  // stream decodes its own frames, and rank 0's rate limiter still counts
  // every sample, as it does for in-process replicas.)
  ASSIGN_OR_RETURN(l->agent_, agents::D4pgAgent::Create(config, l->spec_, l->action_size_, l->replicator_.get()));
  const int shard = config.learner().batch_size() / l->replicator_->num_replicas();
  for (size_t i = 0; i < l->replicator_->local_replicas().size(); ++i) {
    replay::SamplerOptions sampler_options{.table = "transitions", .batch_size = shard};
    // A remote sampler gives up when rank 0 stops answering (as collectives do).
    if (!l->is_chief()) sampler_options.timeout = absl::FromChrono(options.collective_timeout);
    // Frame references for the device frame table: from the embedded replay,
    // or over gRPC (other ranks), each frame once per stream.
    sampler_options.frame_references = l->agent_->frame_references();
    ASSIGN_OR_RETURN(auto sampler, l->replay_client_->NewSampler(sampler_options));
    l->samplers_.push_back(std::move(sampler));
  }

  l->metrics_csv_ = AppendLog(run_dir + "/metrics.csv",
                              "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,"
                              "critic_loss,actor_loss,q_mean,eval_return,parameter_version,input_wait_ms,"
                              "frames_uploaded_per_update\n");
  l->metrics_jsonl_ = AppendLog(run_dir + "/metrics.jsonl");
  l->eval_csv_ = AppendLog(run_dir + "/eval.csv", "frames,updates,eval_return,actions_at_bound\n");
  l->resumed_ = resume;
  if (resume) {
    if (l->is_chief()) {
      RETURN_IF_ERROR(l->Restore());
    } else {
      // The agent of the newest usable generation, as rank 0 finds it.
      const std::string dir = CheckpointDir(run_dir);
      absl::StatusOr<Generation> generation = LoadNewestGeneration(
          dir, [&](const Generation& g) { return l->agent_->Load(g.File(kAgentFile)); }, nullptr);
      if (absl::IsNotFound(generation.status()) && std::filesystem::exists(dir + "/" + kAgentFile)) {
        RETURN_IF_ERROR(l->agent_->Load(dir + "/" + kAgentFile));
      } else {
        RETURN_IF_ERROR(generation.status());
      }
    }
  }
  if (!l->is_chief()) return l;
  ASSIGN_OR_RETURN(l->eval_policy_, agents::D4pgPolicy::Create(config.d4pg(), l->spec_, l->action_size_));
  // Videos: a missing encoder or a bad size fails here, before training.
  // Each written video becomes a frame strip in the event file.
  std::function<void(const std::string&)> on_video_written;
  if (config.tensorboard()) {
    on_video_written = [learner = l.get()](const std::string& path) { learner->AddFrameStrip(path); };
  }
  ASSIGN_OR_RETURN(l->eval_recorder_, actors::MakeEvaluationRecorder(config, std::move(on_video_written)));
  // TensorBoard, last: a start that failed leaves no event file (troupe run
  // then removes the run directory). A resumed run's file starts past its
  // checkpoint (Restore dropped the events after it from the files before).
  l->OpenEventFile(resume ? l->frames_before_ + 1 : 0);
  if (!resume) l->next_eval_frames_ = l->NextEvaluation(0);  // else from eval.csv (Restore)
  // Version 1 (or the restored one) before any actor asks.
  l->agent_->PolicyParameters(&l->policy_parameters_);
  l->parameter_store_.Publish(l->agent_->updates() + 1, "policy", l->policy_parameters_);
  return l;
}

absl::Status RlLearner::StartChief(const config::ReplayConfig& replay_config) {
  // (The checkpoint folder is made by the first checkpoint: a start that
  // fails leaves nothing in run_dir.)
  ASSIGN_OR_RETURN(replay_, replay::Replay::Create(replay_config));
  replay_client_ = replay::NewLocalClient(replay_.get());

  // One port for replay inserts and parameter streams.
  replay_service_ = std::make_unique<replay::ReplayService>(replay_.get(), replay_config.worker_threads());
  parameter_service_ = std::make_unique<ParameterService>(&parameter_store_);
  episode_publisher_ = std::make_unique<actors::EpisodePublisher>(config_.env().task(), config_.env().action_repeat());
  episode_service_ = std::make_unique<actors::EpisodeStreamService>(episode_publisher_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string& listen = config_.learner().listen();
  RETURN_IF_ERROR(AddSecureListeningPort(builder, credentials_, listen, "learner.listen", &port));
  builder.SetMaxReceiveMessageSize(int(replay_config.max_message_bytes()));
  builder.SetMaxSendMessageSize(int(replay_config.max_message_bytes()));
  builder.RegisterService(replay_service_.get());
  builder.RegisterService(parameter_service_.get());
  builder.RegisterService(episode_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("learner.listen: cannot listen on ", listen, " (port in use?)"));
  }
  address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return absl::OkStatus();
}

absl::Status RlLearner::ShareChiefAddress(const absl::Status& chief_status, int64_t max_message_bytes) {
  // Rank 0 sends [ok, length, characters...] of its address (an address on
  // every interface becomes its host name) or of its error, as floats.
  constexpr int kMaxChars = 1000;
  std::vector<float> message(2 + kMaxChars, 0.0f);
  if (is_chief()) {
    std::string text = chief_status.ok() ? ReachableAddress(address_) : std::string(chief_status.message());
    text.resize(std::min<size_t>(text.size(), kMaxChars));
    message[0] = chief_status.ok() ? 1.0f : 0.0f;
    message[1] = float(text.size());
    for (size_t i = 0; i < text.size(); ++i) message[2 + i] = float(static_cast<unsigned char>(text[i]));
  }
  RETURN_IF_ERROR(replicator_->RunReplicas(
      [&](replicator::ReplicaContext& ctx) { return ctx.Broadcast(message, /*root=*/0); }));
  if (is_chief()) return chief_status;
  std::string text(size_t(message[1]), ' ');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(int(message[2 + i]));
  if (message[0] != 1.0f) {
    return absl::FailedPreconditionError(absl::StrCat("learner rank 0 failed to start: ", text));
  }
  address_ = text;
  replay_client_ =
      replay::NewGrpcClient(address_, {.max_message_bytes = max_message_bytes, .credentials = credentials_});
  return absl::OkStatus();
}

absl::StatusOr<int> RlLearner::AgreeOnStep(int step) {
  if (!mpi_ || num_ranks_ == 1) return step;
  float value = float(step);
  RETURN_IF_ERROR(replicator_->RunReplicas(
      [&](replicator::ReplicaContext& ctx) { return ctx.Broadcast({&value, 1}, /*root=*/0); }));
  return int(value);
}

absl::Status RlLearner::CheckReplicasAgree() {
  if (!mpi_ || num_ranks_ == 1) return absl::OkStatus();
  // The 64-bit checksum as three exact floats of 22 bits each.
  const uint64_t mine = agent_->StateChecksum();
  const float parts[3] = {float(mine & 0x3fffff), float((mine >> 22) & 0x3fffff), float(mine >> 44)};
  std::vector<float> all(3 * size_t(num_ranks_));
  RETURN_IF_ERROR(replicator_->RunReplicas(
      [&](replicator::ReplicaContext& ctx) { return ctx.AllGather(parts, all); }));
  auto checksum_of = [&](int r) {
    return uint64_t(all[3 * r]) | uint64_t(all[3 * r + 1]) << 22 | uint64_t(all[3 * r + 2]) << 44;
  };
  for (int r = 1; r < num_ranks_; ++r) {
    if (checksum_of(r) != checksum_of(0)) {
      return absl::InternalError(absl::StrFormat(
          "learner replicas diverged: rank %d's state checksum %016x differs from rank 0's %016x after %d updates", r,
          checksum_of(r), checksum_of(0), agent_->updates()));
    }
  }
  return absl::OkStatus();
}

RlLearner::~RlLearner() {
  Interrupt();
  evaluator_ = std::jthread();  // joins
  parameter_store_.Close();
  if (episode_publisher_) episode_publisher_->Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

void RlLearner::Interrupt() {
  if (replay_) replay_->Close();
}

int64_t RlLearner::TransitionsInserted() const {
  const proto::InfoResponse info = replay_->Info();
  return (info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0) - inserts_before_;
}

int64_t RlLearner::FramesNow() const {
  const proto::InfoResponse info = replay_->Info();
  const int64_t inserts = info.tables_size() ? info.tables(0).rate_limiter().inserts() : 0;
  return frames_before_ + (inserts - inserts_before_) * std::max(config_.env().action_repeat(), 1);
}

absl::Status RlLearner::LoadCheckpointFiles(const std::string& folder, bool has_replay, std::string* replay_note) {
  // The networks and optimizer state, then the counters of the same step.
  RETURN_IF_ERROR(agent_->Load(folder + "/" + kAgentFile));
  ASSIGN_OR_RETURN(const Counters counters, ReadCounters(folder + "/" + kCountersFile));
  if (counters.updates >= 0 && counters.updates != agent_->updates()) {
    return absl::DataLossError(absl::StrCat(folder, "/", kCountersFile, " counts ", counters.updates, " updates, ",
                                            kAgentFile, " holds ", agent_->updates(),
                                            ": not one step's checkpoint"));
  }
  // Replay: checked whole before any table changes, so a failure here leaves
  // replay as it was for an older generation.
  int64_t inserts = 0;
  *replay_note = "replay starts empty (learner.checkpoint_replay is off)";
  if (config_.learner().checkpoint_replay() && !has_replay) {
    *replay_note = absl::StrCat("replay starts empty (the checkpoint has no ", kReplayFile, ")");
  } else if (config_.learner().checkpoint_replay()) {
    RETURN_IF_ERROR(replay_->Restore(folder + "/" + kReplayFile).status());
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
  const std::string dir = CheckpointDir(run_dir_);
  // The newest generation that is whole; a damaged or unfinished newer one
  // is said, and passed over.
  std::string replay_note, from;
  std::vector<std::string> passed_over;
  absl::StatusOr<Generation> generation = LoadNewestGeneration(
      dir,
      [&](const Generation& g) { return LoadCheckpointFiles(g.path, g.Has(kReplayFile), &replay_note); },
      &passed_over);
  if (generation.ok()) {
    from = generation->path;
    last_generation_ = generation->number;
  } else if (absl::IsNotFound(generation.status()) && std::filesystem::exists(dir + "/" + kAgentFile)) {
    // A run from before generations: its one checkpoint, directly in `dir`.
    RETURN_IF_ERROR(LoadCheckpointFiles(dir, std::filesystem::exists(dir + "/" + kReplayFile), &replay_note));
    from = dir;
    last_generation_ = 0;
  } else {
    return generation.status();
  }
  last_generation_frames_ = frames_before_;
  for (const std::string& why : passed_over) {
    std::printf("checkpoint passed over: %s\n", why.c_str());
  }
  if (!passed_over.empty()) {
    absl::MutexLock lock(&mutex_);
    stats_.checkpoint_note = absl::StrCat("resumed from ", std::filesystem::path(from).filename().string(), ", ",
                                          passed_over.size(), " newer checkpoint(s) damaged or unfinished (see log)");
  }
  // The run's clock goes on from the last metrics row, lost piece included.
  start_ = RunClockStart(run_dir_, /*resume=*/true);
  // The rows written after the checkpoint (the run went on until it was
  // stopped) are written again from it: they go, with their videos, so the
  // logs go on from the checkpoint without a step back.
  const double limit = static_cast<double>(frames_before_);
  ASSIGN_OR_RETURN(const std::vector<std::string> evals,
                   DropRowsPast(run_dir_ + "/eval.csv", limit, /*header=*/true,
                                [](std::string_view row) { return CsvNumber(row, 0); }));
  for (const std::string& row : evals) {
    if (const std::optional<double> frames = CsvNumber(row, 0)) {
      std::filesystem::remove(absl::StrCat(run_dir_, "/videos/eval-", static_cast<int64_t>(*frames), ".mp4"));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   DropRowsPast(run_dir_ + "/metrics.csv", limit, /*header=*/true,
                                [](std::string_view row) { return CsvNumber(row, 1); }));
  RETURN_IF_ERROR(DropRowsPast(run_dir_ + "/metrics.jsonl", limit, /*header=*/false, [](std::string_view row) {
                    return JsonNumber(row, "frames");
                  }).status());
  // The TensorBoard event files too (step = frames). A file that cannot be
  // rewritten costs its points' correctness, not the run.
  if (const absl::StatusOr<int64_t> events = DropEventsPast(run_dir_, frames_before_); !events.ok()) {
    std::fprintf(stderr, "tensorboard: %s (its points past %ld frames stay)\n",
                 std::string(events.status().message()).c_str(), long(frames_before_));
  }
  // Evaluations so far stay on the curve, and the next is due where it was.
  int64_t last_eval_frames = 0;
  std::ifstream eval(run_dir_ + "/eval.csv");
  std::string line;
  std::getline(eval, line);  // header
  absl::MutexLock lock(&mutex_);
  while (std::getline(eval, line)) {
    // frames,updates,eval_return,...
    const std::optional<double> frames = CsvNumber(line, 0), value = CsvNumber(line, 2);
    if (frames.has_value() && value.has_value()) {
      eval_frames_.push_back(*frames);
      eval_returns_.push_back(*value);
      stats_.last_eval_frames = last_eval_frames = static_cast<int64_t>(*frames);
      stats_.last_eval_return = *value;
    }
  }
  next_eval_frames_ = NextEvaluation(last_eval_frames);
  std::printf(
      "resumed from %s: %ld updates, %ld frames; %s; %zu metrics rows and %zu evaluations made after that "
      "checkpoint dropped (made again)\n",
      from.c_str(), static_cast<long>(agent_->updates()), static_cast<long>(frames_before_), replay_note.c_str(),
      rows.size(), evals.size());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WriteLearnerCheckpoint(const std::string& dir, const agents::D4pgAgent& agent,
                                               replay::Replay* replay, absl::FunctionRef<std::string()> counters,
                                               int keep) {
  ASSIGN_OR_RETURN(GenerationWriter generation, GenerationWriter::Begin(dir));
  const std::string agent_path = generation.File(kAgentFile);
  std::vector<nn::CheckpointTensor> state = agent.CheckpointState();
  absl::Status agent_written;
  {
    // The agent written on its own thread (joined at the end of this block,
    // an error included) while replay is written here.
    std::jthread writer([&] { agent_written = nn::WriteCheckpoint(agent_path, state); });
    if (replay != nullptr) {
      // Its crc32 comes from its writer: hundreds of MB are not read back.
      uint32_t crc32 = 0;
      ASSIGN_OR_RETURN(const int64_t bytes, replay->Checkpoint(generation.File(kReplayFile), &crc32));
      RETURN_IF_ERROR(generation.AddWritten(kReplayFile, bytes, crc32));
    }
  }
  RETURN_IF_ERROR(agent_written);
  RETURN_IF_ERROR(generation.Add(kAgentFile));
  RETURN_IF_ERROR(generation.AddText(kCountersFile, counters()));
  ASSIGN_OR_RETURN(const std::string note, generation.Commit(keep, {kAgentFile, kCountersFile, kReplayFile}));
  // An old generation that could not be removed costs disk, not the checkpoint.
  if (!note.empty()) std::fprintf(stderr, "checkpoint: %s\n", note.c_str());
  return generation.number();
}

absl::Status RlLearner::Checkpoint() {
  const auto started = Clock::now();
  // One generation: replay, networks and counters of this step.
  int64_t frames = 0;
  ASSIGN_OR_RETURN(last_generation_,
                   WriteLearnerCheckpoint(CheckpointDir(run_dir_), *agent_,
                                          config_.learner().checkpoint_replay() ? replay_.get() : nullptr,
                                          [&] {
                                            frames = FramesNow();
                                            return CountersText(frames, samples_, agent_->updates());
                                          },
                                          config_.learner().keep_checkpoints()));
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
  if (last_generation_ == 0) return absl::StrCat(CheckpointDir(run_dir_), " at ", Thousands(last_generation_frames_), " frames");
  return absl::StrCat("generation ", last_generation_, " at ", Thousands(last_generation_frames_), " frames");
}

int64_t RlLearner::NextEvaluation(int64_t frames) const {
  const int64_t every = std::max<int64_t>(config_.evaluator().every_frames(), 1);
  return (frames / every + 1) * every;
}

void RlLearner::MaybeEvaluate(bool force) {
  const int64_t frames = FramesNow();
  if (config_.evaluator().every_frames() <= 0 || evaluating_.load() || (frames < next_eval_frames_ && !force)) return;
  next_eval_frames_ = NextEvaluation(frames);
  // Evaluate a snapshot of the policy on the evaluator's thread.
  evaluator_ = std::jthread();  // the previous one has finished (evaluating_ is false)
  evaluating_ = true;
  std::vector<float> snapshot = policy_parameters_;
  const int64_t updates = agent_->updates();
  evaluator_ = std::jthread([this, snapshot = std::move(snapshot), frames, updates] {
    actors::Evaluation evaluation;
    absl::Status status = eval_policy_->SetParameters(snapshot);
    if (status.ok()) {
      auto result = actors::Evaluate(config_, *eval_policy_, config_.evaluator().episodes(),
                                     config_.env().seed() + 7777 + uint64_t(updates), episode_publisher_.get(),
                                     updates, eval_recorder_.get(),
                                     absl::StrCat(run_dir_, "/videos/eval-", frames, ".mp4"));
      if (result.ok()) evaluation = *result;
      status = result.status();
    }
    const double value = evaluation.mean_return;
    if (status.ok() && evaluation.actions_at_bound >= actors::Evaluation::kSaturatedShare) {
      std::fprintf(stderr,
                   "evaluator: %.0f%% of the policy's actions are at +-1 at %ld frames: its tanh has saturated "
                   "(try a lower d4pg.actor_learning_rate or wider early noise, actors.noise_decay_frames)\n",
                   100 * evaluation.actions_at_bound, long(frames));
    }
    if (!status.ok()) std::fprintf(stderr, "evaluator: %s\n", status.ToString().c_str());
    if (status.ok()) {
      absl::MutexLock lock(&mutex_);
      stats_.last_eval_return = value;
      stats_.last_eval_frames = frames;
      eval_frames_.push_back(double(frames));
      eval_returns_.push_back(value);
      // The curve so far, as CSV and PNG (a row that cannot be written is
      // warned about by the log; the run goes on).
      eval_csv_.Append(absl::StrFormat("%d,%d,%.3f,%.3f\n", frames, updates, value, evaluation.actions_at_bound));
      if (events_) {
        const EventWriter::Scalar scalars[] = {{"eval/return", value},
                                               {"eval/actions_at_bound", evaluation.actions_at_bound}};
        WarnOnEventError(events_->AddScalars(frames, scalars));
      }
      PlotSeries curve{"eval return", eval_frames_, eval_returns_, {31, 119, 180}};
      (void)WritePng(run_dir_ + "/learning_curve.png",
                     PlotLines({curve}, PlotOptions{640, 400, config_.env().task() + " D4PG", "env frames",
                                                    "eval return"}));
    }
    evaluating_ = false;
  });
}

void RlLearner::WriteMetrics() {
  LearnerStats s = Stats();
  // A row that cannot be written (a full disk) is warned about by the log,
  // and the run goes on.
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  metrics_csv_.Append(absl::StrFormat("%.1f,%d,%d,%.2f,%.1f,%d,%.3f,%.5f,%.5f,%.4f,%.2f,%d,%.3f,%.2f\n", seconds,
                                      s.frames, s.updates, s.updates_per_second, s.frames_per_second, s.replay_size,
                                      s.samples_per_insert, s.critic_loss, s.actor_loss, s.q_mean, s.last_eval_return,
                                      s.parameter_version, s.input_wait_ms, s.frames_uploaded_per_update));
  metrics_jsonl_.Append(absl::StrFormat(
      "{\"seconds\": %.1f, \"frames\": %d, \"updates\": %d, \"updates_per_s\": %.2f, \"frames_per_s\": %.1f, "
      "\"replay_size\": %d, \"samples_per_insert\": %.3f, \"critic_loss\": %.5f, \"actor_loss\": %.5f, "
      "\"q_mean\": %.4f, \"eval_return\": %.2f, \"parameter_version\": %d, \"checkpoint_s\": %.3f, "
      "\"input_wait_ms\": %.3f, \"frames_uploaded_per_update\": %.2f}\n",
      seconds, s.frames, s.updates, s.updates_per_second, s.frames_per_second, s.replay_size, s.samples_per_insert,
      s.critic_loss, s.actor_loss, s.q_mean, s.last_eval_return, s.parameter_version, s.checkpoint_seconds,
      s.input_wait_ms, s.frames_uploaded_per_update));
  // The same row in the event file, at step = frames (eval_return comes
  // from the evaluations themselves, at theirs).
  if (events_) {
    const EventWriter::Scalar scalars[] = {
        {"train/updates", double(s.updates)},
        {"train/critic_loss", s.critic_loss},
        {"train/actor_loss", s.actor_loss},
        {"train/q_mean", s.q_mean},
        {"train/parameter_version", double(s.parameter_version)},
        {"speed/updates_per_second", s.updates_per_second},
        {"speed/frames_per_second", s.frames_per_second},
        {"replay/size", double(s.replay_size)},
        {"replay/samples_per_insert", s.samples_per_insert},
    };
    WarnOnEventError(events_->AddScalars(s.frames, scalars));
  }
}

void RlLearner::OpenEventFile(int64_t start_step) {
  if (!config_.tensorboard()) return;
  absl::StatusOr<std::unique_ptr<EventWriter>> writer = EventWriter::Open(run_dir_, start_step);
  if (!writer.ok()) {
    WarnOnEventError(writer.status());
    return;
  }
  events_ = std::move(*writer);
}

void RlLearner::WarnOnEventError(const absl::Status& status) {
  if (status.ok() || event_error_warned_.exchange(true)) return;
  std::fprintf(stderr, "tensorboard: %s (the run goes on; later TensorBoard errors are not shown; metrics.csv and "
               "eval.csv have every number)\n", std::string(status.message()).c_str());
}

void RlLearner::AddFrameStrip(const std::string& path) {
  if (!events_) return;  // it could not be made
  // The evaluation's frames, from the name MaybeEvaluate gave the video.
  long frames = 0;
  if (std::sscanf(std::filesystem::path(path).filename().c_str(), "eval-%ld.mp4", &frames) != 1) return;
  // Five frames from first to last, at half the video's size, side by side.
  absl::StatusOr<std::vector<Image>> images = ReadVideoFrames(path, /*count=*/5);
  if (!images.ok()) {
    WarnOnEventError(images.status());
    return;
  }
  for (Image& image : *images) image = Downscale(image, /*factor=*/2);
  WarnOnEventError(events_->AddImage("eval/frames", frames, HorizontalStrip(*images)));
}

LearnerStats RlLearner::Stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

void RlLearner::RecordStats(bool write_row) {
  const auto now = Clock::now();
  const int64_t frames = FramesNow();
  const proto::InfoResponse info = replay_->Info();
  {
    absl::MutexLock lock(&mutex_);
    stats_.frames = frames;
    stats_.updates = agent_->updates();
    stats_.replay_size = info.tables_size() ? info.tables(0).size() : 0;
    stats_.parameter_version = parameter_store_.version();
    const int64_t inserted = (frames - frames_before_) / std::max(config_.env().action_repeat(), 1);
    stats_.samples_per_insert = inserted > 0 ? double(samples_ - samples_before_) / double(inserted) : 0.0;
    if (write_row) {
      // Rates and losses over the interval since the last row.
      const double seconds = std::max(std::chrono::duration<double>(now - last_row_).count(), 1e-9);
      stats_.updates_per_second = (agent_->updates() - row_updates_) / seconds;
      stats_.frames_per_second = (frames - row_frames_) / seconds;
      stats_.checkpoint_seconds = checkpoint_seconds_ - row_checkpoint_seconds_;
      if (agent_->updates() > row_updates_) {
        const agents::D4pgMetrics m = agent_->metrics();
        stats_.critic_loss = m.critic_loss;
        stats_.actor_loss = m.actor_loss;
        stats_.q_mean = m.q_mean;
        stats_.input_wait_ms = 1e3 * m.input_wait_s;
        const int64_t uploaded = agent_->frame_stats().frames_uploaded;
        stats_.frames_uploaded_per_update =
            static_cast<double>(uploaded - row_frames_uploaded_) / static_cast<double>(agent_->updates() - row_updates_);
        row_frames_uploaded_ = uploaded;
      }
    }
  }
  if (!write_row) return;
  WriteMetrics();
  last_row_ = now;
  row_updates_ = agent_->updates();
  row_frames_ = frames;
  row_checkpoint_seconds_ = checkpoint_seconds_;
}

absl::Status RlLearner::Run(const std::atomic<bool>* stop) {
  if (!resumed_) start_ = Clock::now();  // a resumed run's clock goes on (Restore)
  auto last_checkpoint = Clock::now();
  last_row_ = Clock::now();
  row_updates_ = agent_->updates();
  row_frames_ = is_chief() ? FramesNow() : 0;
  const int64_t publish_every = std::max(config_.learner().publish_every(), 1);
  const int64_t min_size = std::max<int64_t>(config_.learner().min_replay_size(), config_.learner().batch_size());
  // What every rank does next; rank 0 decides (it has replay and counters).
  enum Step { kStop = 0, kWait = 1, kTrain = 2 };
  auto decide = [&]() -> int {
    if (!is_chief()) return kStop;  // replaced by rank 0's decision
    if ((stop && stop->load()) ||
        (config_.learner().max_updates() > 0 && agent_->updates() >= config_.learner().max_updates()) ||
        FramesNow() >= config_.total_frames()) {
      return kStop;
    }
    const proto::InfoResponse info = replay_->Info();
    return (info.tables_size() ? info.tables(0).size() : 0) < min_size ? kWait : kTrain;
  };
  auto sample = [&](int replica_id, int64_t shard, replay::SampledBatch* out) -> absl::Status {
    const auto& local = replicator_->local_replicas();
    const size_t index = std::find(local.begin(), local.end(), replica_id) - local.begin();
    return samplers_[index]->Next(out);
  };

  absl::Status status;
  for (;;) {
    absl::StatusOr<int> step = AgreeOnStep(decide());
    if (!step.ok()) {
      status = step.status();
      break;
    }
    if (*step == kStop) break;
    if (*step == kWait) {
      // Actors are filling replay.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      status = agent_->Train(publish_every, sample);
      if (!status.ok()) break;
      samples_ += publish_every * config_.learner().batch_size();
      if (is_chief()) {
        // A new policy version for the actors.
        agent_->PolicyParameters(&policy_parameters_);
        parameter_store_.Publish(agent_->updates() + 1, "policy", policy_parameters_);
      }
      if (config_.learner().prioritized()) {
        // Each rank sends the priorities of its own replicas' samples.
        proto::MutatePrioritiesRequest request;
        request.set_table("transitions");
        std::vector<uint64_t> keys;
        std::vector<double> priorities;
        agent_->LastPriorities(&keys, &priorities);
        for (size_t i = 0; i < keys.size(); ++i) {
          request.add_keys(keys[i]);
          request.add_priorities(priorities[i]);
        }
        // A lost update leaves those items at their old priorities: not worth stopping for.
        (void)replay_client_->MutatePriorities(request);
      }
    }
    if (!is_chief()) {
      absl::MutexLock lock(&mutex_);
      stats_.updates = agent_->updates();
      continue;
    }
    // Stats every pass; rates, losses and a metrics row every 2 s, or every
    // 500 updates when training is fast.
    const auto now = Clock::now();
    RecordStats(now - last_row_ >= std::chrono::seconds(2) || agent_->updates() - row_updates_ >= 500);
    MaybeEvaluate();
    if (now - last_checkpoint >= std::chrono::seconds(config_.learner().checkpoint_every_s())) {
      CheckpointOrWarn();  // a failed checkpoint (a full disk) is said, and training goes on
      last_checkpoint = now;
    }
  }
  // With 2 ranks, a replica stalled inside a collective can only be the other one.
  if (mpi_ && num_ranks_ == 2 && absl::IsDeadlineExceeded(status) &&
      absl::StrContains(status.message(), "another replica stalled")) {
    status = absl::DeadlineExceededError(absl::StrCat(status.message(), " (rank ", 1 - rank_, ", the other of 2)"));
  }
  // A stop request closes replay, which ends a blocked Train with Cancelled.
  if (!status.ok() && !(stop && stop->load())) return status;
  // Every rank ends with the same state (only after a clean, agreed stop:
  // after an error the ranks are no longer in step).
  if (status.ok()) RETURN_IF_ERROR(CheckReplicasAgree());
  if (!is_chief()) return absl::OkStatus();
  // Videos still being encoded are written (the last evaluation's is the
  // one most worth watching).
  auto flush_videos = [this] {
    if (!eval_recorder_) return;
    if (const absl::Status video = eval_recorder_->Flush(); !video.ok()) {
      std::fprintf(stderr, "evaluator: video: %s\n", video.ToString().c_str());
    }
  };
  evaluator_ = std::jthread();  // let a running evaluation finish
  flush_videos();
  // A run that reached its end has its final policy evaluated there, unless
  // the last evaluation already was (a stop request ends without one).
  if (!(stop && stop->load()) && Stats().last_eval_frames < std::min(FramesNow(), config_.total_frames())) {
    MaybeEvaluate(/*force=*/true);
    evaluator_ = std::jthread();
    flush_videos();
  }
  RecordStats(/*write_row=*/true);
  // The final checkpoint: one that fails ends the run with an error saying
  // what is kept.
  if (const absl::Status final_status = Checkpoint(); !final_status.ok()) {
    return absl::Status(final_status.code(),
                        absl::StrCat("final checkpoint failed: ", final_status.message(), "; the last good checkpoint is ",
                                     LastGenerationText(), " (`troupe run --resume ", run_dir_, "` goes on from it)"));
  }
  return absl::OkStatus();
}

}  // namespace troupe::learner
