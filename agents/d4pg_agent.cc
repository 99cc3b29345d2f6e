#include "agents/d4pg_agent.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agents/augment.h"
#include "agents/categorical.h"
#include "agents/step_signature.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/cpu_backend.h"
#include "engine/replicator/sharded_adam.h"
#include "engine/replicator/straggler.h"
#include "replay/item.h"

namespace troupe::agents {
using internal::ClippedOptimizer;
using internal::MixSeed;
using internal::Weights;

// A replica's input ahead of its updates (learner.prefetch_input): a thread
// produces input i (sampling it into buffer i % B, preparing its frames)
// once buffer i % B is free (Free: the execution that read input i - B was
// launched, its batches copied to the device and their keys kept) and Allow
// let it make i + 1 inputs. With B = 2 learner.updates_per_execution
// buffers (BatchesInFlight), the next execution's inputs are made while an
// execution steps: the input runs a whole execution ahead of the device,
// never into a buffer an execution not yet launched reads (a launched one's
// frames stay right: the device runs a later upload after it). Train allows
// its own updates' inputs, and with StartInput's input the next call's
// first execution's, made between the calls. The thread runs SCHED_BATCH:
// woken by each execution's Free, it waits for a core instead of
// preempting the learner's thread (on a machine with fewer cores than
// busy threads each such preemption cost the learner two context switches
// an execution). The hand-off is a std::mutex and two condition variables,
// each signalled after the lock is let go and only when its side waits:
// with an absl::Mutex's conditions, the learner's unlock that woke the
// thread evaluated its condition and walked the mutex's waiters, a tenth
// of the learner's own time an execution (docs/benchmarks/learner.md).
class D4pgAgent::InputPrefetcher {
 public:
  InputPrefetcher(int64_t buffers, std::function<absl::Status(int64_t)> produce)
      : buffers_(buffers), produce_(std::move(produce)), thread_([this](std::stop_token) { Run(); }) {}
  // Waits for an input in production (a sample blocked on the rate limiter
  // returns when replay closes or fills, or when the input's cancel ends it).
  ~InputPrefetcher() {
    Change([this] { stop_ = true; });
    thread_.join();
  }
  InputPrefetcher(const InputPrefetcher&) = delete;
  InputPrefetcher& operator=(const InputPrefetcher&) = delete;

  // Inputs 0 .. count - 1 may be made.
  void Allow(int64_t count) {
    Change([this, count] { allowed_ = std::max(allowed_, count); });
  }
  // Blocks until input `index` is made; adds the seconds waited to *waited.
  // Its status (the sampler's, or the frames').
  absl::Status Take(int64_t index, double* waited) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    if (made_ <= index && status_.ok()) {
      ++takers_waiting_;
      made_or_failed_.wait(lock, [this, index] { return made_ > index || !status_.ok(); });
      --takers_waiting_;
    }
    *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return made_ > index ? absl::OkStatus() : status_;
  }
  // Inputs 0 .. count - 1 are done with (their executions launched, or
  // their call over): their buffers may be refilled.
  void Free(int64_t count) {
    Change([this, count] { freed_ = std::max(freed_, count); });
  }

 private:
  // Changes what the thread may make, and wakes it if it waits.
  template <typename F>
  void Change(F change) {
    bool wake;
    {
      std::lock_guard lock(mu_);
      change();
      wake = maker_waits_;
    }
    if (wake) may_make_.notify_one();
  }

  void Run() {
    const sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);  // (a hint: refused, it runs as it was)
    for (int64_t i = 0;; ++i) {
      {
        std::unique_lock lock(mu_);
        maker_waits_ = true;
        may_make_.wait(lock, [this, i] { return stop_ || (i - buffers_ < freed_ && allowed_ > i); });
        maker_waits_ = false;
        if (stop_) return;
      }
      absl::Status status = produce_(i);
      const bool failed = !status.ok();
      bool wake;
      {
        std::lock_guard lock(mu_);
        if (failed) {
          status_ = std::move(status);
        } else {
          made_ = i + 1;
        }
        wake = takers_waiting_ > 0;
      }
      if (wake) made_or_failed_.notify_all();
      if (failed) return;
    }
  }

  const int64_t buffers_;
  const std::function<absl::Status(int64_t)> produce_;
  std::mutex mu_;  // guards what follows, to the thread
  std::condition_variable may_make_;        // the thread waits for room (freed_, allowed_) or stop_
  std::condition_variable made_or_failed_;  // Take waits for made_ or status_
  int64_t made_ = 0;      // inputs made
  int64_t freed_ = 0;     // inputs done with
  int64_t allowed_ = 0;   // inputs it may make
  bool stop_ = false;
  bool maker_waits_ = false;
  int takers_waiting_ = 0;
  absl::Status status_;
  std::jthread thread_;  // last: started once the rest is built
};

// --- Table -----------------------------------------------------------------------

// --- The step's memory -----------------------------------------------------------

// Roughly: every replica's parameters with their gradients, Adam moments
// and targets, and the activations of a batch (DrQ encoder: a stride-2 conv
// then three stride-1 convs; the MLPs).
absl::Status CheckD4pgStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size) {
  const config::D4pgConfig& d4pg = config.d4pg();
  const double batch = config.learner().batch_size();
  double parameters = 0, activations = 0, input = spec.state_size;
  if (spec.pixels()) {
    const double channels = d4pg.conv_channels(), in = 3.0 * spec.frames;
    const double side = (std::max(spec.height, spec.width) - 3) / 2 + 1;
    parameters += 9 * (in * channels + 3 * channels * channels) + channels * side * side * d4pg.encoder_features();
    activations += 2.0 * in * spec.height * spec.width + 4 * channels * side * side * 4;
    input = d4pg.encoder_features();
  }
  std::vector<double> widths(d4pg.hidden().begin(), d4pg.hidden().end());
  if (widths.empty()) widths = {256, 256};
  for (const bool critic : {false, true}) {
    double previous = input + (critic ? action_size : 0);
    for (double width : widths) {
      parameters += previous * width;
      activations += 6 * width;
      previous = width;
    }
    parameters += previous * (critic ? d4pg.atoms() : action_size);
  }
  const double replicas = config.learner().engine().replicas();
  // Each replica's device frame table (agents/device_frames.h) as it starts
  // (it grows on demand, up to the budget, with what replay holds).
  const DeviceFrameSizing frames = DeviceFrameSlots(config, spec, static_cast<int>(replicas));
  const double frame_table = static_cast<double>(frames.slots) * static_cast<double>(frames.frame_bytes) * replicas;
  const double bytes = 4.0 * (6 * parameters * replicas + 3 * activations * batch) + frame_table;
  return CheckFitsInMemory(absl::StrCat("learner.batch_size ", config.learner().batch_size(), " with d4pg sizes (",
                                        spec.pixels() ? "conv_channels, encoder_features, " : "",
                                        "hidden) and learner.engine.replicas ", replicas,
                                        spec.pixels() && config.learner().device_frames()
                                            ? absl::StrCat(", with learner.device_frame_mib ",
                                                           config.learner().device_frame_mib())
                                            : std::string()),
                           bytes);
}

namespace {

// The networks D4PG trains, as declared.
struct D4pgLayers {
  internal::Encoder encoder;  // in the critic's set (pixels)
  internal::Mlp critic, actor;
};

// The critic (after the encoder, for pixels) declared into `critic`, the
// actor into `actor`; the critic's part `part` of `parts` when split over a
// model-parallel group (learner.engine.model_parallel).
D4pgLayers DeclareNetworks(const config::D4pgConfig& d4pg, const ObservationSpec& spec, int action_size,
                           nn::ParameterSet& critic, nn::ParameterSet& actor, int parts = 1, int part = 0) {
  const int64_t feature_size = spec.pixels() ? d4pg.encoder_features() : spec.state_size;
  const std::vector<int64_t> hidden = internal::HiddenSizes(d4pg);
  D4pgLayers layers;
  if (spec.pixels()) layers.encoder = internal::Encoder::Declare(critic, spec, d4pg.conv_channels(), d4pg.encoder_features());
  layers.critic = internal::DeclareCritic(critic, feature_size, hidden, action_size, d4pg.atoms(), parts, part);
  layers.actor = internal::DeclareActor(actor, feature_size, hidden, action_size);
  return layers;
}

}  // namespace

D4pgReplicaState D4pgReplicaStateBytes(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                       int action_size, int replicas) {
  const auto shard_state = config.learner().engine().shard_state();
  const bool sharded = shard_state != config::EngineConfig::NONE;
  nn::ParameterSet critic, actor;  // declared, not allocated: their layouts' sizes (a critic's part's)
  DeclareNetworks(config.d4pg(), spec, action_size, critic, actor,
                  std::max(1, config.learner().engine().model_parallel()));
  const int64_t floats = critic.total_floats() + actor.total_floats();
  const int64_t pad = sharded ? replicator::ShardedAdam::PadMultiple(replicas) : 1;
  auto padded = [pad](int64_t n) { return (n + pad - 1) / pad * pad; };
  const int64_t buffers = padded(critic.total_floats()) + padded(actor.total_floats());
  D4pgReplicaState s;
  if (shard_state == config::EngineConfig::PARAMETERS) {
    // Parts of everything; whole networks only while a step uses them.
    s.networks = s.gradients = s.targets = 4 * buffers / replicas;
    s.moments = 2 * 4 * buffers / replicas;
    const int64_t c = 4 * padded(critic.total_floats()), a = 4 * padded(actor.total_floats());
    s.gathered = std::max({c + a, 2 * c, c + 2 * a});
    return s;
  }
  s.networks = s.gradients = 4 * buffers;
  s.targets = 4 * floats;
  s.moments = sharded ? 2 * 4 * buffers / replicas : 2 * 4 * floats;
  // Where the replicas run a step as one program (PJRT, and GPU when it
  // resolves to it), a replica's part of the values and gradients has
  // buffers of its own too (replicator::ShardedAdam).
  const auto device = config.learner().engine().device();
  if (sharded && replicas > 1 && (device == config::EngineConfig::PJRT || device == config::EngineConfig::GPU)) {
    s.moments += 2 * 4 * buffers / replicas;
  }
  return s;
}

absl::Status CheckD4pgCriticSplits(const config::ExperimentConfig& config, const ObservationSpec& spec) {
  const int m = config.learner().engine().model_parallel();
  if (m <= 1) return absl::OkStatus();
  const auto bad = [m](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("learner.engine.model_parallel ", m, ": ", what...));
  };
  const std::vector<int64_t> hidden = internal::HiddenSizes(config.d4pg());
  if (hidden.size() < 2) {
    return bad("the critic's first two layers split as a pair, so it needs two hidden layers or more (d4pg.hidden has ",
               hidden.size(), ")");
  }
  if (hidden[0] % m != 0) return bad("d4pg.hidden[0] ", hidden[0], " does not split into ", m, " parts");
  if (const auto c = config.learner().engine().collectives();
      c != config::EngineConfig::IN_PROCESS && c != config::EngineConfig::MPI) {
    return bad("collectives ", config::EngineConfig::Collectives_Name(c),
               ": D4PG's split critic runs with its replicas in this process (IN_PROCESS) or one per MPI rank (MPI)");
  }
  return absl::OkStatus();
}

absl::Status CheckD4pgStateFitsDevice(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                      int action_size, int replicas) {
  const int64_t budget_mib = config.learner().engine().device_memory_mib();
  if (budget_mib == 0) return absl::OkStatus();
  const D4pgReplicaState s = D4pgReplicaStateBytes(config, spec, action_size, replicas);
  if (s.total() <= budget_mib * (int64_t{1} << 20)) return absl::OkStatus();
  const auto mib = [](int64_t bytes) { return absl::StrFormat("%.2f", bytes / double(1 << 20)); };
  const auto shard_state = config.learner().engine().shard_state();
  if (shard_state == config::EngineConfig::PARAMETERS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.engine.device_memory_mib ", budget_mib, ": a replica's training state needs ", mib(s.total()),
        " MiB (its part of ", replicas, " of the networks, gradients, targets and Adam's moments ", mib(s.kept()),
        ", the whole networks a step gathers at once ", mib(s.gathered),
        "); fewer or smaller networks (d4pg.hidden), or more replicas"));
  }
  const bool sharded = shard_state == config::EngineConfig::OPTIMIZER;
  return absl::InvalidArgumentError(absl::StrCat(
      "learner.engine.device_memory_mib ", budget_mib, ": a replica's training state needs ", mib(s.total()),
      " MiB (networks ", mib(s.networks), ", gradients ", mib(s.gradients), ", targets ", mib(s.targets),
      ", Adam's moments ", mib(s.moments), sharded ? absl::StrCat(", its part of ", replicas) : std::string(),
      sharded ? "); splitting the networks too (learner.engine.shard_state PARAMETERS) keeps 1/K of them on each "
                "between updates"
              : "); splitting Adam's moments over the replicas (learner.engine.shard_state OPTIMIZER) keeps 1/K of "
                "them on each, and PARAMETERS of the networks too"));
}

// --- D4pgAgent --------------------------------------------------------------------

// Update j of an execution: where its inputs and its readout lie in device
// memory. Its inputs (gather slots, shift offsets: observations', then next
// observations'; rewards, discounts, actions, observations and next
// observations: floats, or pixel bytes; importance weights over atoms) are
// slices of the execution's one input buffer, which goes up whole before
// the step (which the backend may replay: nn::Backend::RunStep), but for
// decoded pixels (megabytes an update), which go up from the batch into
// memory of the update's own without a copy through the staging; its
// readout (per-item loss and Q [B, 2], then the actor loss) a slice of the
// execution's readout, read in one read at the step's end.
struct D4pgAgent::StepInputs {
  // `words` 4-byte words at `offset` in the execution's buffer, `address`
  // there once the buffer is known; or at `address` in memory of its own
  // (offset -1). Null: an input this kind of batch does not have.
  struct Slice {
    float* address = nullptr;
    int64_t offset = -1, words = 0;
    float* data() const { return address; }
    int64_t size() const { return words; }
  };
  Slice slots, shifts, reward, discount, action, observation, next_observation, weights, readout;
  nn::DeviceBuffer pixels[2];       // decoded pixels: observations, next observations
  nn::DeviceBuffer shared_pixels;  // a split critic's: every part's pixels gathered (ShareInputs), kept between updates
  std::vector<int32_t> host_shifts;

  std::array<Slice*, 8> inputs() {
    return {&slots, &shifts, &reward, &discount, &action, &observation, &next_observation, &weights};
  }
};

// A batch's own inputs as its update's staging takes them, made where the
// batch is made (ProduceInput: with prefetching on the input thread), so
// that the update's host part appends one block of whole words: the frame
// slots in gather order, rewards, discounts, actions, state observations
// and importance weights, each a slice at its offset in `words` (offset -1:
// this batch has none).
struct D4pgAgent::StagedBatch {
  std::vector<float> words;
  StepInputs::Slice slots, shifts, reward, discount, action, observation, next_observation, weights;
  int64_t update = -1;  // the update `shifts` are drawn for (the one it is made for, as the input opened)
};

// An execution of updates the device was given.
struct D4pgAgent::Launched {
  uint64_t step = 0;           // nn::Backend::steps_begun() after it
  int64_t n = 0;               // its updates
  std::vector<uint64_t> keys;  // its batches' keys, in update order
};

// One replica's mutable state: its networks, targets, optimizers, tapes and
// scratch. Used only by that replica's thread during Train.
struct D4pgAgent::Replica {
  explicit Replica(std::shared_ptr<nn::Backend> device)
      : backend(std::move(device)), critic_tape(backend.get()), actor_tape(backend.get()) {}

  std::shared_ptr<nn::Backend> backend;  // this replica's device (from the Replicator)
  nn::ParameterSet critic, actor, target_critic, target_actor;  // critic = encoder (pixels) + critic head
  // Adam over the whole buffers, each clipped after the gradients' all-reduce;
  // or with engine.shard_state OPTIMIZER, this replica's part of Adam's
  // moments (ShardedAdam reduces, clips and gathers itself).
  std::unique_ptr<nn::Adam> critic_adam, actor_adam;
  std::unique_ptr<nn::Optimizer> critic_clipped;  // a ClippedOptimizer, or a split critic's SplitClippedOptimizer
  std::unique_ptr<ClippedOptimizer> actor_clipped;
  internal::SplitClippedOptimizer* critic_split_clip = nullptr;  // critic_clipped's, for a split critic
  // learner.engine.model_parallel M: this replica's part of the critic (its
  // index along the model axis) and the critic as declared for it.
  int part = 0;
  internal::Mlp critic_net;
  nn::DeviceBuffer critic_bias_mask;  // critic_net's bias_mask (split): ones on part 0, zeros on the others
  std::unique_ptr<replicator::ShardedAdam> critic_sharded, actor_sharded;
  // engine.shard_state PARAMETERS: this replica's parts of the four
  // networks (their sets above hold whole buffers only during a step).
  std::unique_ptr<replicator::ShardedParameters> critic_part, actor_part, target_critic_part, target_actor_part;
  // Its part of network n (Network's order).
  replicator::ShardedParameters& part_of(int n) const {
    const std::unique_ptr<replicator::ShardedParameters>* parts[kNetworks] = {&critic_part, &actor_part,
                                                                              &target_critic_part, &target_actor_part};
    return **parts[n];
  }
  nn::Tape critic_tape, actor_tape;
  // The optimizers whose state a checkpoint holds.
  nn::Optimizer& critic_state() {
    return critic_sharded ? static_cast<nn::Optimizer&>(*critic_sharded) : *critic_adam;
  }
  nn::Optimizer& actor_state() { return actor_sharded ? static_cast<nn::Optimizer&>(*actor_sharded) : *actor_adam; }

  // Rebuilt at each Train call: they hold that call's ReplicaContext. The
  // gradients' reduction: bucketed during backward, or with engine.straggler
  // DEADLINE once after it (kept across calls: they measure the steps);
  // none with sharded state.
  int64_t generation = -1;
  int num_replicas = 1;  // the call's ctx.num_replicas() (read once: a virtual call on cold memory an execution)
  std::unique_ptr<replicator::GradientReducer> critic_bucketed, actor_bucketed;
  std::unique_ptr<replicator::DeadlineReducer> critic_deadline, actor_deadline;
  int64_t late_counted = 0;  // their late passes already in the metrics
  std::vector<float> metrics;  // an execution's, all-reduced (kept: no allocation per execution)
  replicator::GradientReduction* critic_reducer = nullptr;
  replicator::GradientReduction* actor_reducer = nullptr;
  std::unique_ptr<replicator::ReplicatedOptimizer> critic_replicated, actor_replicated;
  nn::Optimizer* critic_optimizer = nullptr;  // what steps: critic_replicated or critic_sharded
  nn::Optimizer* actor_optimizer = nullptr;

  // Input i (counted from the input's opening) in batches[i % batches.size()]:
  // BatchesInFlight buffers (an execution's, and the next's made ahead), so
  // the input made ahead never refills one an execution still needs.
  std::vector<replay::SampledBatch> batches;
  // The execution's inputs, every update's in one buffer that goes up
  // whole (one upload an execution, not eight an update): one buffer per
  // kind of batch (frame references or not, importance weights or not; the
  // kind fixes the layout, and a replayed program's buffers never move),
  // each of learner.updates_per_execution updates. PrepareUpdate writes
  // them into `staging`, with the optimizers' per-update values. The
  // execution's readouts, one read.
  nn::DeviceBuffer packed[2][2];  // [frame references][importance weights]
  nn::StepStaging staging;
  double input_wait = 0;  // seconds input_fn waited for inputs, not yet in the metrics (the epilogue's lock)
  nn::DeviceBuffer readout_device;
  std::vector<float> readout;
  nn::DeviceBuffer support;        // the atoms' values z_j, [atoms, 1]; uploaded once
  nn::DeviceBuffer bound;          // actor_pre_tanh_bound everywhere, [B, A]; uploaded once
  std::vector<uint64_t> keys;                        // the last execution's batches' keys ...
  std::vector<uint64_t> spare_keys;                  // (an execution's keys before, reused by the next)
  std::vector<double> item_loss;                     // ... and their critic losses
  // Pixels on the device (learner.device_frames): the frame table, the
  // decoder for frames it lacks, and a batch's slots (as resolved, then in
  // gather order: every observation's frames, then every next observation's).
  std::unique_ptr<DeviceFrameTable> frames;
  replay::FrameDecoder decoder;
  std::vector<std::vector<int32_t>> slots;  // slots[i % batches.size()]: that batch's
  std::vector<StagedBatch> staged;          // staged[i % batches.size()]: that batch's inputs
  std::vector<StepInputs> in;  // update j of an execution's; learner.updates_per_execution of them
  int64_t call_updates = 0;    // updates of this Train call so far (input_fn's)
  int64_t call_stepped = 0;    // ... of them stepped (step_fn's), and the call's count
  int64_t call_target = 0;
  // An execution launched whose readouts the host has not read yet: its
  // epilogue runs after the next execution is launched (the backend's late
  // reads), or at the Train call's end.
  std::optional<Launched> unread;
  int64_t next_input = 0;                       // the input's next, counted from its opening
  int64_t first_update = 0;                     // `updates` as the input opened: input i is for update first_update + i
  std::unique_ptr<InputPrefetcher> prefetcher;  // learner.prefetch_input: the input made ahead
  int64_t updates = 0;
};

D4pgAgent::~D4pgAgent() { StopInput(); }

absl::StatusOr<std::unique_ptr<D4pgAgent>> D4pgAgent::Create(const config::ExperimentConfig& config,
                                                             const ObservationSpec& spec, int action_size,
                                                             replicator::Replicator* replicator) {
  const config::D4pgConfig& d4pg = config.d4pg();
  RETURN_IF_ERROR(ValidateD4pg(d4pg, spec, action_size));
  const int per_execution = config.learner().updates_per_execution();
  if (per_execution < 1 || per_execution > kMaxUpdatesPerExecution) {
    return absl::InvalidArgumentError(absl::StrCat("learner.updates_per_execution ", per_execution,
                                                   ": must be in [1, ", kMaxUpdatesPerExecution, "]"));
  }
  RETURN_IF_ERROR(ValidateDeviceFrames(config, spec));
  if (replicator == nullptr) return absl::InvalidArgumentError("D4pgAgent needs a replicator");
  const int64_t batch = config.learner().batch_size();
  const int k = replicator->num_replicas();
  // With the critic split over a model-parallel group (learner.engine.
  // model_parallel M) the replicas are a (K/M) x M mesh: the batch is split
  // over the K/M model copies, a copy's M parts sharing its rows.
  const int m = replicator->model_parallel();
  const int copies = k / m;
  // (ValidateEngineConfig cannot know the MPI ranks mpirun started.)
  if (batch < 1 || batch % copies != 0) {
    return absl::InvalidArgumentError(absl::StrCat("learner.batch_size ", batch, ": must be >= 1 and divisible by the ",
                                                   copies, m > 1 ? " model copies" : " replicas"));
  }
  RETURN_IF_ERROR(CheckD4pgCriticSplits(config, spec));
  std::unique_ptr<D4pgAgent> agent(new D4pgAgent());
  agent->config_ = config;
  agent->spec_ = spec;
  agent->action_size_ = action_size;
  ASSIGN_OR_RETURN(agent->signature_, TransitionSignature(spec, action_size));
  agent->replicator_ = replicator;
  agent->batch_size_ = batch;
  agent->rows_ = batch / copies;
  agent->model_parallel_ = m;
  agent->hidden_ = internal::HiddenSizes(d4pg);
  // The fixed support z_j = v_min + j * dz (each replica keeps it on its device).
  const int atoms = d4pg.atoms();
  const float dz = (d4pg.v_max() - d4pg.v_min()) / static_cast<float>(atoms - 1);
  std::vector<float> support;
  for (int j = 0; j < atoms; ++j) support.push_back(d4pg.v_min() + j * dz);

  const int local = static_cast<int>(replicator->local_replicas().size());
  RETURN_IF_ERROR(CheckD4pgStateFitsDevice(config, spec, action_size, k));
  // Sharded state splits the networks' buffers into K equal parts.
  const bool sharded = config.learner().engine().shard_state() != config::EngineConfig::NONE;
  const bool split_parameters = config.learner().engine().shard_state() == config::EngineConfig::PARAMETERS;
  const uint64_t seed = config.learner().engine().seed();
  const int64_t feature_size = spec.pixels() ? d4pg.encoder_features() : spec.state_size;
  const int64_t shard = agent->rows_;
  // A split critic's parts start as their slices of the whole critic that
  // one replica starts from (the same seed, initialised on the host).
  std::vector<float> whole_critic;
  if (m > 1) {
    nn::ParameterSet actor;
    const D4pgLayers whole = DeclareNetworks(d4pg, spec, action_size, agent->whole_critic_set_, actor);
    agent->whole_critic_ = whole.critic;
    nn::CpuBackend host(1);
    nn::ParameterSet initial, initial_actor;
    DeclareNetworks(d4pg, spec, action_size, initial, initial_actor);
    initial.Allocate(host, seed);
    whole_critic = initial.DownloadValues();
  }
  for (int i = 0; i < local; ++i) {
    auto r = std::make_unique<Replica>(replicator->backend(i));
    nn::Backend& device = *r->backend;
    r->part = replicator->local_replicas()[i] % m;
    // Online and target sets share one declaration (same layout).
    for (const auto& [critic, actor] : {std::pair{&r->critic, &r->actor}, std::pair{&r->target_critic, &r->target_actor}}) {
      const D4pgLayers layers = DeclareNetworks(d4pg, spec, action_size, *critic, *actor, m, r->part);
      agent->encoder_ = layers.encoder;
      r->critic_net = layers.critic;
      agent->actor_ = layers.actor;
    }
    if (m > 1) {
      r->critic_bias_mask = r->critic_net.MakeBiasMask(device, r->critic);
      r->critic_net.bias_mask = r->critic_bias_mask.data();
    }
    // Same seed on every replica (and every MPI rank): identical starts.
    const int64_t pad = sharded ? replicator::ShardedAdam::PadMultiple(k) : 1;
    // A network and its target (a constant of the update, never
    // differentiated: no gradient buffer) start equal; with the parameters
    // split each set keeps its part and releases its whole buffers before
    // the next network is made (no device holds the whole model at once).
    const int id = replicator->local_replicas()[i];
    for (const auto& [online, target, online_seed, part, target_part] :
         {std::tuple{&r->critic, &r->target_critic, seed, &r->critic_part, &r->target_critic_part},
          std::tuple{&r->actor, &r->target_actor, MixSeed(seed, 1, 0), &r->actor_part, &r->target_actor_part}}) {
      online->Allocate(device, online_seed, pad);
      if (m > 1 && online == &r->critic) {
        // This part's slices of the whole critic; the encoder (pixels) whole.
        const nn::ParameterSet& set = *online;
        std::vector<float> values(set.total_floats());
        for (const nn::ParameterInfo& info : set.infos()) {
          const nn::ParameterInfo& from = agent->whole_critic_set_.info(agent->whole_critic_set_.Find(info.name));
          if (from.shape == info.shape) {
            std::copy_n(whole_critic.begin() + from.offset, from.shape.size(), values.begin() + info.offset);
          }
        }
        agent->ForEachCriticSlice(r->critic_net, set, [&](int p, int w, internal::PartSlice slice) {
          const nn::ParameterInfo& from = agent->whole_critic_set_.info(w);
          internal::CopyPartFromWhole({whole_critic.data() + from.offset, size_t(from.shape.size())}, from.shape,
                                      slice, {values.data() + set.info(p).offset, size_t(set.info(p).shape.size())});
        });
        RETURN_IF_ERROR(online->UploadValues(values));
      }
      target->Allocate(device, 0, split_parameters ? pad : 1, /*gradients=*/false);
      RETURN_IF_ERROR(target->CopyValuesFrom(*online));
      if (split_parameters && local != k && i == 0) {
        // The other parts are on other ranks: the host's copies of the whole
        // networks start from the whole ones here, before the split.
        const int n = online == &r->critic ? kCritic : kActor;
        agent->values_on_host_[n] = online->DownloadValues();
        agent->values_on_host_[n + kTargetCritic] = agent->values_on_host_[n];
      }
      if (split_parameters) {
        ASSIGN_OR_RETURN(*part, replicator::ShardedParameters::Create(online, id, k));
        ASSIGN_OR_RETURN(*target_part, replicator::ShardedParameters::Create(target, id, k));
      }
    }
    const replicator::ShardedAdamOptions options{.max_grad_norm = d4pg.max_gradient_norm()};
    if (split_parameters) {
      ASSIGN_OR_RETURN(r->critic_sharded,
                       replicator::ShardedAdam::CreateForParameters(r->critic_part.get(), id, k, options));
      ASSIGN_OR_RETURN(r->actor_sharded,
                       replicator::ShardedAdam::CreateForParameters(r->actor_part.get(), id, k, options));
      r->actor_sharded->set_gather_values(false);  // released, unread, right after its step
    } else if (sharded) {
      ASSIGN_OR_RETURN(r->critic_sharded, replicator::ShardedAdam::Create(&r->critic, id, k, options));
      ASSIGN_OR_RETURN(r->actor_sharded, replicator::ShardedAdam::Create(&r->actor, id, k, options));
    } else {
      r->critic_adam = std::make_unique<nn::Adam>(&r->critic, &device);
      r->actor_adam = std::make_unique<nn::Adam>(&r->actor, &device);
      if (m > 1) {
        // The norm over the whole critic: the pair's parts summed over the
        // model axis (from layer 0 to layer 2 in the set), the rest (the
        // encoder before it, the layers after) once.
        auto clip = std::make_unique<internal::SplitClippedOptimizer>(
            r->critic_adam.get(), &device, d4pg.max_gradient_norm(), r->critic.info(r->critic_net.layers[0].w).offset,
            r->critic.info(r->critic_net.layers[2].w).offset, m);
        r->critic_split_clip = clip.get();
        r->critic_clipped = std::move(clip);
      } else {
        r->critic_clipped = std::make_unique<ClippedOptimizer>(r->critic_adam.get(), &device, d4pg.max_gradient_norm());
      }
      r->actor_clipped = std::make_unique<ClippedOptimizer>(r->actor_adam.get(), &device, d4pg.max_gradient_norm());
    }
    // Scratch sized once; constants on the device.
    r->support = nn::DeviceBuffer(device, atoms);
    r->support.Upload(support);
    r->bound = nn::DeviceBuffer(device, shard * action_size);
    r->bound.Upload(std::vector<float>(shard * action_size, d4pg.actor_pre_tanh_bound()));
    const int in_flight = BatchesInFlight(config.learner());
    r->batches.resize(in_flight);
    r->slots.resize(in_flight);
    r->staged.resize(in_flight);
    r->in.resize(per_execution);
    r->readout_device = nn::DeviceBuffer(device, per_execution * (2 * shard + 1));
    r->readout.resize(per_execution * (2 * shard + 1));
    // (A split critic's parts share part 0's pixels, not a frame table of
    // their own: its learner samples decoded pixels.)
    if (const DeviceFrameSizing sizing = DeviceFrameSlots(config, spec, k); sizing.slots > 0 && m == 1) {
      for (const int64_t slots : {sizing.slots, sizing.max_slots}) {
        RETURN_IF_ERROR(
            DeviceFrameTable::Check(slots, sizing.frame_bytes, in_flight * ShardFrames(batch, k, spec)));
      }
      r->frames = std::make_unique<DeviceFrameTable>(&device, sizing.slots, sizing.frame_bytes, sizing.max_slots);
      r->frames->set_batches_in_flight(in_flight);
    }
    agent->replicas_.push_back(std::move(r));
  }

  // Where each policy parameter comes from (encoder: critic set; actor: actor set).
  nn::ParameterSet policy_layout;
  if (spec.pixels()) internal::Encoder::Declare(policy_layout, spec, d4pg.conv_channels(), d4pg.encoder_features());
  internal::DeclareActor(policy_layout, feature_size, agent->hidden_, action_size);
  const Replica& r0 = *agent->replicas_[0];
  for (const nn::ParameterInfo& p : policy_layout.infos()) {
    const int source = internal::TrainedWithCritic(p.name) ? 0 : 1;
    const nn::ParameterSet& set = source == 0 ? r0.critic : r0.actor;
    const int index = set.Find(p.name);
    TROUPE_CHECK(index >= 0 && set.info(index).shape == p.shape);
    agent->policy_copies_.push_back({source, set.info(index).offset, p.offset, p.shape.size()});
  }
  agent->policy_floats_ = policy_layout.total_floats();
  return agent;
}

void D4pgAgent::StartInput(SampleFn sample, std::function<void()> cancel) {
  OpenInput(std::move(sample), std::move(cancel), /*across_calls=*/true, config_.learner().prefetch_input());
}

void D4pgAgent::OpenInput(SampleFn sample, std::function<void()> cancel, bool across_calls, bool prefetch) {
  StopInput();
  sample_ = std::move(sample);
  cancel_input_ = std::move(cancel);
  input_across_calls_ = across_calls;
  const int64_t shard = rows_;
  const std::vector<int>& ids = replicator_->local_replicas();
  for (size_t k = 0; k < replicas_.size(); ++k) {
    Replica& r = *replicas_[k];
    r.next_input = 0;
    r.first_update = r.updates;
    if (!prefetch) continue;
    r.prefetcher = std::make_unique<InputPrefetcher>(
        static_cast<int64_t>(r.batches.size()),
        [this, &r, id = ids[k], shard](int64_t i) { return ProduceInput(r, id, shard, i, sample_); });
  }
}

void D4pgAgent::StopInput() {
  const bool prefetching = !replicas_.empty() && replicas_[0]->prefetcher != nullptr;
  if (prefetching && cancel_input_) cancel_input_();  // a sample blocked on the rate limiter returns
  for (auto& r : replicas_) {
    r->prefetcher.reset();                           // (joined)
    if (r->frames != nullptr) r->frames->DropPending();  // frames of an input made ahead, never uploaded
  }
  sample_ = nullptr;
  cancel_input_ = nullptr;
}

absl::Status D4pgAgent::Train(int64_t num_updates) {
  if (!sample_) {
    return absl::FailedPreconditionError(
        "D4pgAgent::Train(num_updates) without an input: call StartInput first (or Train(num_updates, sample))");
  }
  return RunUpdates(num_updates);
}

absl::Status D4pgAgent::Train(int64_t num_updates, const SampleFn& sample) {
  if (sample_) {
    return absl::FailedPreconditionError(
        "D4pgAgent::Train(num_updates, sample) while StartInput's input runs: call Train(num_updates), or StopInput "
        "first");
  }
  // Prefetching one update is only a thread's start.
  OpenInput(sample, nullptr, /*across_calls=*/false, config_.learner().prefetch_input() && num_updates > 1);
  const absl::Status status = RunUpdates(num_updates);
  StopInput();
  return status;
}

bool D4pgAgent::state_split_across_processes() const {
  return (replicas_[0]->critic_sharded != nullptr || model_parallel_ > 1) &&
         static_cast<int>(replicas_.size()) != replicator_->num_replicas();
}

absl::Status D4pgAgent::PrepareCheckpoint() {
  if (!state_split_across_processes()) return absl::OkStatus();
  const bool split_parameters = replicas_[0]->critic_part != nullptr;
  RETURN_IF_ERROR(replicator_->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
    Replica& r = *replicas_[ctx.local_index()];
    // Local replica 0's copies are the ones a checkpoint reads.
    const bool keep = ctx.local_index() == 0;
    if (model_parallel_ > 1) return GatherCriticParts(ctx, r, keep);
    if (split_parameters) {
      // Each network, then each's moments, whole on the host (on the
      // device one at a time, and only during its gather).
      for (int n = 0; n < kNetworks; ++n) {
        std::vector<float> whole;
        RETURN_IF_ERROR(r.part_of(n).GatherToHost(ctx, &whole));
        if (keep) values_on_host_[n] = std::move(whole);
      }
    }
    int n = kCritic;
    for (replicator::ShardedAdam* sharded : {r.critic_sharded.get(), r.actor_sharded.get()}) {
      RETURN_IF_ERROR(sharded->set_context(&ctx));
      if (split_parameters) {
        std::vector<std::vector<float>> whole;
        RETURN_IF_ERROR(sharded->GatherStateToHost(&whole));
        if (keep) moments_on_host_[n] = std::move(whole);
      } else {
        RETURN_IF_ERROR(sharded->GatherState());
      }
      ++n;
    }
    return absl::OkStatus();
  }));
  state_gathered_ = true;
  return absl::OkStatus();
}

void D4pgAgent::ReleaseGatheredState() {
  if (!state_gathered_) return;
  for (auto& r : replicas_) {
    if (r->critic_sharded == nullptr) continue;
    r->critic_sharded->ReleaseWholeState();
    r->actor_sharded->ReleaseWholeState();
  }
  for (auto& moments : moments_on_host_) moments.clear();
  critic_parts_on_host_.clear();
  state_gathered_ = false;
}

absl::Status D4pgAgent::GatherPolicyNetworks() {
  return replicator_->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
    Replica& r = *replicas_[ctx.local_index()];
    for (int n : {kCritic, kActor}) {
      const auto reads = [n](const PolicyCopy& c) { return c.source == n; };
      if (std::none_of(policy_copies_.begin(), policy_copies_.end(), reads)) {
        continue;  // (the critic's set, from state: the policy reads none of it)
      }
      std::vector<float> whole;
      RETURN_IF_ERROR(r.part_of(n).GatherToHost(ctx, &whole));
      if (ctx.local_index() == 0) values_on_host_[n] = std::move(whole);
    }
    return absl::OkStatus();
  });
}

absl::Status D4pgAgent::RunUpdates(int64_t num_updates) {
  if (num_updates < 0) return absl::InvalidArgumentError(absl::StrCat("Train: num_updates ", num_updates, " < 0"));
  ReleaseGatheredState();
  ++train_generation_;
  const int64_t per_execution = config_.learner().updates_per_execution();
  // The inputs this call takes, and with StartInput's input the next call's
  // first execution's.
  for (auto& r : replicas_) {
    if (r->prefetcher != nullptr) {
      r->prefetcher->Allow(r->next_input + num_updates + (input_across_calls_ ? per_execution : 0));
    }
    r->call_updates = r->call_stepped = 0;
    r->call_target = num_updates;
    if (r->unread) {
      // A call that failed left an execution unread: its readouts are dropped.
      r->backend->LandReads(r->unread->step);
      r->unread.reset();
    }
  }
  const int64_t shard = rows_;
  absl::Status status = replicator_->Run<Block>(
      (num_updates + per_execution - 1) / per_execution,
      // input_fn: this replica's shards of the global batch for the next
      // execution's updates, their new frames uploaded.
      [&](replicator::ReplicaContext& ctx) -> absl::StatusOr<Block> {
        const int k = ctx.local_index();
        Replica& r = *replicas_[k];
        Block block;
        const int64_t n = std::min(per_execution, num_updates - r.call_updates);
        r.call_updates += n;
        double waited = 0;
        // The execution's inputs made (one wait for all n: they are made in order).
        if (r.prefetcher != nullptr && n > 0) RETURN_IF_ERROR(r.prefetcher->Take(r.next_input + n - 1, &waited));
        for (int64_t j = 0; j < n; ++j) {
          const int64_t i = r.next_input++;
          if (r.prefetcher == nullptr) {
            const auto start = std::chrono::steady_clock::now();
            RETURN_IF_ERROR(ProduceInput(r, ctx.replica_id(), shard, i, sample_));
            waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          }
          if (r.frames != nullptr) r.frames->Upload();
          const size_t b = static_cast<size_t>(i) % r.batches.size();
          block.push_back(Input{&r.batches[b], &r.staged[b], i});
        }
        r.input_wait += waited;  // (published with the metrics, by the epilogue)
        return block;
      },
      // step_fn: the D4PG updates on them, one execution.
      [&](replicator::ReplicaContext& ctx, Block& block) -> absl::Status {
        return Update(ctx, *replicas_[ctx.local_index()], block);
      });
  // Every input this call took is done with (read, or its call failed).
  for (auto& r : replicas_) {
    if (r->prefetcher != nullptr) r->prefetcher->Free(r->next_input);
  }
  updates_ = replicas_[0]->updates;
  PublishMetrics();  // (the replicas' threads are done)
  // The parameters split over ranks: the networks the actors' policy reads,
  // whole on the host for PolicyParameters (a collective at every call).
  if (status.ok() && replicas_[0]->critic_part != nullptr && state_split_across_processes()) {
    status = GatherPolicyNetworks();
  }
  return status;
}

absl::Status D4pgAgent::ProduceInput(Replica& r, int replica_id, int64_t shard, int64_t index,
                                     const SampleFn& sample) {
  const size_t b = static_cast<size_t>(index) % r.batches.size();
  replay::SampledBatch& batch = r.batches[b];
  // The model copy and the update this input is for (StageBatch's shifts).
  const int copy = replica_id / model_parallel_;
  const int64_t update = r.first_update + index;
  if (model_parallel_ > 1 && r.part != 0) {
    // A split critic's part takes its copy's rows from part 0 (ShareInputs):
    // it samples nothing, its batch only shaped.
    replay::ShapeBatch(signature_, shard, &batch);
    if (config_.learner().prioritized()) batch.weights.assign(shard, 0.0);
    StageBatch(batch, /*gathered=*/false, r.slots[b], copy, update, r.staged[b]);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(sample(replica_id, shard, &batch));
  // Checked where it is made (with prefetching on the input's thread): the
  // update takes it as it is.
  const bool gathered = spec_.pixels() && !batch.frames.empty();
  if (gathered && r.frames == nullptr) {
    return absl::InvalidArgumentError(
        "transition batch carries frame references, and this agent keeps no device frame table "
        "(learner.device_frames false): sample decoded pixels");
  }
  if (absl::Status checked = replay::CheckBatch(signature_, batch, shard, gathered); !checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("transition ", checked.message()));
  }
  // Frame references: slots found, new frames decoded (uploaded by input_fn).
  if (gathered) RETURN_IF_ERROR(r.frames->Prepare(batch.frames, r.decoder, &r.slots[b]));
  StageBatch(batch, gathered, r.slots[b], copy, update, r.staged[b]);
  return absl::OkStatus();
}

void D4pgAgent::StageBatch(const replay::SampledBatch& batch, bool gathered, const std::vector<int32_t>& slots,
                           int copy, int64_t update, StagedBatch& staged) const {
  const int64_t rows = rows_;
  staged = StagedBatch{.words = std::move(staged.words)};
  staged.words.clear();
  // `slice` as the next `words` words; where they start.
  const auto add = [&staged](StepInputs::Slice& slice, int64_t words) {
    slice = {.offset = static_cast<int64_t>(staged.words.size()), .words = words};
    staged.words.resize(staged.words.size() + static_cast<size_t>(words));
    return staged.words.data() + slice.offset;
  };
  const auto put = [&add](StepInputs::Slice& slice, const void* data, int64_t bytes) {
    std::memcpy(add(slice, (bytes + 3) / 4), data, static_cast<size_t>(bytes));
  };
  if (gathered) {
    // The step gathers observations, then next observations: every row's
    // stack of the first, then of the second (the batch has them by row).
    const int64_t stack = spec_.frames;
    TROUPE_CHECK(static_cast<int64_t>(slots.size()) == 2 * rows * stack);
    auto* gather = reinterpret_cast<int32_t*>(add(staged.slots, 2 * rows * stack));
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t j = 0; j < stack; ++j) {
        gather[b * stack + j] = slots[b * 2 * stack + j];
        gather[(rows + b) * stack + j] = slots[b * 2 * stack + stack + j];
      }
    }
  }
  put(staged.reward, batch.fields[kReward].as<float>(), sizeof(float) * rows);
  put(staged.discount, batch.fields[kDiscount].as<float>(), sizeof(float) * rows);
  put(staged.action, batch.fields[kAction].as<float>(), sizeof(float) * rows * action_size_);
  if (!spec_.pixels()) {
    put(staged.observation, batch.fields[kObservation].as<float>(), sizeof(float) * rows * spec_.state_size);
    put(staged.next_observation, batch.fields[kNextObservation].as<float>(), sizeof(float) * rows * spec_.state_size);
  }
  if (config_.learner().prioritized() && static_cast<int64_t>(batch.weights.size()) == rows) {
    put(staged.weights, batch.weights.data(), sizeof(float) * rows);
  }
  if (spec_.pixels() && config_.d4pg().augment_pad() > 0) {
    // Drawn here, off the learner's thread where the input is made ahead:
    // the update takes them when it is the update they are for (a Load
    // since the input opened moves the updates: it draws its own).
    ShiftsOf(copy, update, reinterpret_cast<int32_t*>(add(staged.shifts, 4 * rows)));
    staged.update = update;
  }
}

void D4pgAgent::ShiftsOf(int copy, int64_t update, int32_t* out) const {
  // Augmentation randomness from (seed, model copy, update): Load continues
  // exactly, and a split critic's parts shift their copy's pixels alike (a
  // copy is a replica without model_parallel): the observations' offsets,
  // then the next observations'.
  RandomShiftOffsets(MixSeed(config_.learner().engine().seed(), copy, update), 2 * rows_, config_.d4pg().augment_pad(),
                     out);
}

absl::Status D4pgAgent::PrepareUpdate(replicator::ReplicaContext& ctx, Replica& r, const Input& input,
                                      int64_t update, StepInputs& in, nn::StepStaging& staging, bool* gathered,
                                      bool* weighted) {
  const replay::SampledBatch& batch = *input.batch;
  const config::D4pgConfig& d4pg = config_.d4pg();
  const int64_t rows = rows_;
  for (StepInputs::Slice* slice : in.inputs()) *slice = {};  // (an input this kind of batch lacks stays null)
  // Each input appended to the execution's staging in whole words (Update
  // sends it up and gives the slices their addresses). First the batch's
  // own, staged where it was made (StageBatch; the frames went up with the
  // input: one upload, one scatter), as one block: pixels as frame
  // references gathered from the device frame table where it has their
  // slots, importance weights where it has them.
  const StagedBatch& made = *input.staged;
  *gathered = made.slots.offset >= 0;
  *weighted = made.weights.offset >= 0;
  const int64_t block = staging.Append(made.words.data(), sizeof(float) * static_cast<int64_t>(made.words.size()));
  const std::pair<StepInputs::Slice*, const StepInputs::Slice*> staged[] = {
      {&in.slots, &made.slots},   {&in.shifts, &made.shifts},           {&in.reward, &made.reward},
      {&in.discount, &made.discount}, {&in.action, &made.action},       {&in.observation, &made.observation},
      {&in.next_observation, &made.next_observation}, {&in.weights, &made.weights}};
  for (const auto& [slice, from] : staged) {
    if (from->offset >= 0) *slice = {.offset = block + from->offset, .words = from->words};
  }
  if (made.shifts.offset >= 0 && made.update != update) {
    // Drawn for another update (a Load since the input opened): this one's.
    in.host_shifts.resize(4 * rows);
    ShiftsOf(ctx.replica_id() / model_parallel_, update, in.host_shifts.data());
    in.shifts = {.offset = staging.Append(in.host_shifts.data(), sizeof(int32_t) * 4 * rows), .words = 4 * rows};
  }
  if (spec_.pixels() && !*gathered) {
    const int64_t bytes = rows * spec_.frames * spec_.height * spec_.width * 3;
    nn::Backend& device = *r.backend;
    for (int half = 0; half < 2; ++half) {
      nn::DeviceBuffer& own = in.pixels[half];
      const int64_t words = (bytes + 3) / 4;
      if (own.size() != words) own = nn::DeviceBuffer(device, words);
      device.Upload(batch.fields[half == 0 ? kObservation : kNextObservation].as<uint8_t>(), own.data(),
                    static_cast<size_t>(bytes));
      (half == 0 ? in.observation : in.next_observation) = {.address = own.data(), .words = words};
    }
  }
  // The optimizers' per-update values (where the backend replays steps) with them.
  r.critic_optimizer->Prepare(d4pg.critic_learning_rate(), &staging);
  r.actor_optimizer->Prepare(d4pg.actor_learning_rate(), &staging);
  return absl::OkStatus();
}

void D4pgAgent::ForEachCriticSlice(const internal::Mlp& critic, const nn::ParameterSet& set,
                                   absl::FunctionRef<void(int, int, internal::PartSlice)> each) const {
  for (size_t layer = 0; layer < critic.layers.size(); ++layer) {
    for (const bool weight : {true, false}) {
      const nn::LinearLayer& part = critic.layers[layer];
      const nn::LinearLayer& whole = whole_critic_.layers[layer];
      each(weight ? part.w : part.b, weight ? whole.w : whole.b, critic.SliceOf(layer, weight, set));
    }
  }
}

absl::Status D4pgAgent::ShareInputs(replicator::ReplicaContext& ctx, Replica& r, StepInputs& in, bool weighted) {
  replicator::ReplicaContext& model = ctx.model_axis();
  nn::Backend& device = *r.backend;
  const int64_t state = spec_.state_size;
  const std::pair<StepInputs::Slice*, int64_t> inputs[] = {
      {&in.reward, rows_},           {&in.discount, rows_},
      {&in.action, rows_ * action_size_}, {&in.observation, rows_ * state},
      {&in.next_observation, rows_ * state}, {&in.weights, weighted ? rows_ : 0}};
  for (const auto& [buffer, floats] : inputs) {
    if (floats == 0) continue;
    // Part 0's rows, the other parts' zeros: their sum is part 0's (before
    // the step: the step's program is every part's).
    if (model.replica_id() != 0) device.Fill(buffer->data(), floats, 0.0f);
    RETURN_IF_ERROR(model.AllReduceDevice(device, buffer->data(), floats, replicator::ReduceOp::kSum));
  }
  if (spec_.pixels()) {
    // Pixels are bytes, not floats to sum: every part gathers every part's
    // buffer along the model axis (a copy, bit for bit) and keeps part 0's.
    for (StepInputs::Slice* buffer : {&in.observation, &in.next_observation}) {
      const int64_t words = buffer->size();
      if (in.shared_pixels.size() != model.num_replicas() * words) {
        in.shared_pixels = nn::DeviceBuffer(device, model.num_replicas() * words);
      }
      RETURN_IF_ERROR(model.AllGatherDevice(device, buffer->data(), in.shared_pixels.data(), words));
      device.Copy(in.shared_pixels.data(), buffer->data(), words);
    }
  }
  return absl::OkStatus();
}

absl::Status D4pgAgent::Update(replicator::ReplicaContext& ctx, Replica& r, const Block& block) {
  const int64_t rows = rows_;
  const int64_t n = static_cast<int64_t>(block.size());
  // This Train call's gradient averaging (the context changes per call).
  if (r.generation != train_generation_) {
    r.generation = train_generation_;
    r.num_replicas = ctx.num_replicas();
    if (r.critic_sharded) {
      RETURN_IF_ERROR(r.critic_sharded->set_context(&ctx));
      RETURN_IF_ERROR(r.actor_sharded->set_context(&ctx));
      r.critic_optimizer = r.critic_sharded.get();
      r.actor_optimizer = r.actor_sharded.get();
    } else {
      const config::EngineConfig& engine = config_.learner().engine();
      if (engine.straggler() == config::EngineConfig::DEADLINE) {
        if (r.critic_deadline == nullptr) {
          const replicator::DeadlineOptions options{.factor = engine.straggler_deadline()};
          r.critic_deadline = std::make_unique<replicator::DeadlineReducer>(&ctx, &r.critic, options);
          r.actor_deadline = std::make_unique<replicator::DeadlineReducer>(&ctx, &r.actor, options);
        }
        r.critic_deadline->set_context(&ctx);
        r.actor_deadline->set_context(&ctx);
        r.critic_reducer = r.critic_deadline.get();
        r.actor_reducer = r.actor_deadline.get();
      } else {
        // Averaged over the model copies (a split critic's parts are the
        // same for the actor and their own for the critic's pair).
        replicator::ReplicaContext& copies = ctx.data_axis();
        r.critic_bucketed = std::make_unique<replicator::GradientReducer>(&copies, &r.critic);
        r.actor_bucketed = std::make_unique<replicator::GradientReducer>(&copies, &r.actor);
        r.critic_reducer = r.critic_bucketed.get();
        r.actor_reducer = r.actor_bucketed.get();
      }
      if (r.critic_split_clip != nullptr) r.critic_split_clip->set_group(&ctx.model_axis());
      r.critic_replicated = std::make_unique<replicator::ReplicatedOptimizer>(r.critic_clipped.get(),
                                                                              &ctx.data_axis(), r.critic_reducer);
      r.actor_replicated =
          std::make_unique<replicator::ReplicatedOptimizer>(r.actor_clipped.get(), &ctx.data_axis(), r.actor_reducer);
      r.critic_optimizer = r.critic_replicated.get();
      r.actor_optimizer = r.actor_replicated.get();
    }
  }

  // The host's part: every input of the execution's updates in device
  // memory (one upload), and the optimizers' per-update values (nothing of
  // a batch is read inside the step).
  bool gathered = false, weighted = false;
  r.staging.Clear();
  for (int64_t j = 0; j < n; ++j) {
    bool g = false, w = false;
    RETURN_IF_ERROR(PrepareUpdate(ctx, r, block[j], r.updates + j, r.in[j], r.staging, &g, &w));
    if (j > 0 && (g != gathered || w != weighted)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transition batches of one execution differ in ", g != gathered ? "frame references" : "importance weights",
          " (update ", j, " of ", n, ")"));
    }
    gathered = g;
    weighted = w;
  }
  // Up in one upload, into the buffer of this kind of batch, sized for a
  // whole execution (every update of a kind has the same inputs). A call's
  // last execution may have fewer updates: its staging is padded to the
  // whole buffer all the same (an upload of a whole buffer replaces it; a
  // part of one is a copy on the device).
  nn::DeviceBuffer& packed = r.packed[gathered][weighted];
  std::vector<float>& host = r.staging.host;
  const int64_t words = static_cast<int64_t>(host.size()) / n * config_.learner().updates_per_execution();
  if (packed.size() != words) packed = nn::DeviceBuffer(*r.backend, words);
  host.resize(static_cast<size_t>(words));
  r.backend->Upload(host.data(), packed.data(), sizeof(float) * host.size());
  r.staging.device = packed.data();
  const int64_t readout = 2 * rows + 1;
  for (int64_t j = 0; j < n; ++j) {
    StepInputs& in = r.in[j];
    for (StepInputs::Slice* slice : in.inputs()) {
      if (slice->offset >= 0) slice->address = packed.data() + slice->offset;
    }
    in.readout = {.address = r.readout_device.data() + j * readout, .offset = j * readout, .words = readout};
    if (model_parallel_ > 1) RETURN_IF_ERROR(ShareInputs(ctx, r, in, weighted));
  }

  // The device's part: one step (nn::Backend's step contract) of n updates
  // in order, recorded once and replayed where the backend can (what its
  // program depends on besides device memory is in the signature); each
  // execution's one read lands in its readout when it ends.
  const uint64_t signature = StepSignature(StepKind::kD4pgUpdate, {rows, r.num_replicas, gathered, weighted, n});
  absl::Status stepped;
  // Its readouts land later (nn::Backend's late reads): the host reads them
  // while the next execution runs.
  r.backend->set_late_reads(overlap_epilogue_);
  r.backend->RunStep(signature, [&] {
    for (int64_t j = 0; j < n && stepped.ok(); ++j) stepped = DeviceUpdate(ctx, r, r.in[j], rows, gathered, weighted);
    if (stepped.ok()) r.backend->ReadAtStepEnd(r.readout_device.data(), r.readout.data(), sizeof(float) * n * readout);
  });
  r.backend->set_late_reads(false);
  RETURN_IF_ERROR(stepped);
  r.updates += n;
  r.call_stepped += n;
  Launched launched{.step = r.backend->steps_begun(), .n = n, .keys = std::move(r.spare_keys)};
  launched.keys.clear();
  for (const Input& input : block) {
    launched.keys.insert(launched.keys.end(), input.batch->keys.begin(), input.batch->keys.end());
  }
  // The batches are read (into the device's inputs, and their keys): their
  // buffers may take the inputs after the next execution's.
  if (r.prefetcher != nullptr) r.prefetcher->Free(block.back().index + 1);

  // The host's epilogue of the execution before this one (which the device
  // has finished or is about to: this one queues behind it), then, at the
  // call's end, this one's.
  if (r.unread) {
    Launched before = std::move(*r.unread);
    r.unread.reset();
    RETURN_IF_ERROR(Epilogue(ctx, r, before, rows));
  }
  if (overlap_epilogue_ && r.call_stepped < r.call_target) {
    r.unread = std::move(launched);
    return absl::OkStatus();
  }
  return Epilogue(ctx, r, launched, rows);
}

absl::Status D4pgAgent::Epilogue(replicator::ReplicaContext& ctx, Replica& r, Launched& execution, int64_t rows) {
  r.backend->LandReads(execution.step);
  const int64_t n = execution.n;
  // Priorities of each update, and the execution's metrics (each update's
  // means over the global batch) in one all-reduce. The keys move, and the
  // last execution's buffer is kept for the next one's.
  std::swap(r.keys, execution.keys);
  r.spare_keys = std::move(execution.keys);
  r.item_loss.clear();
  // Each update's three means, then with engine.straggler DEADLINE each
  // replica's backward passes left at the deadline in this execution (its
  // own slot, times K so that the mean is the count): one all-reduce, none
  // with one replica.
  const int k = r.num_replicas;
  std::vector<float>& metrics = r.metrics;
  metrics.assign(3 * n + (r.critic_deadline != nullptr ? k : 0), 0.0f);
  if (r.critic_deadline != nullptr) {
    const int64_t passes = r.critic_deadline->stats().late + r.actor_deadline->stats().late;
    metrics[3 * n + ctx.replica_id()] = static_cast<float>((passes - r.late_counted) * k);
    r.late_counted = passes;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* host = r.readout.data() + r.in[j].readout.offset;  // (update j's slice, as Update placed it)
    double loss_sum = 0, q_sum = 0;
    for (int64_t b = 0; b < rows; ++b) {
      r.item_loss.push_back(host[2 * b]);
      loss_sum += host[2 * b];
      q_sum += host[2 * b + 1];
    }
    metrics[3 * j] = static_cast<float>(loss_sum / rows);
    metrics[3 * j + 1] = host[2 * rows];
    metrics[3 * j + 2] = static_cast<float>(q_sum / rows);
  }
  if (k > 1) RETURN_IF_ERROR(ctx.AllReduce(metrics, replicator::ReduceOp::kMean));
  const double input_wait = std::exchange(r.input_wait, 0.0);  // (replica 0's is the metric)
  if (&r == replicas_[0].get()) {
    MetricSums& sums = unpublished_;
    if (r.critic_deadline != nullptr) {
      sums.late_passes.resize(k);
      for (int i = 0; i < k; ++i) sums.late_passes[i] += std::llround(metrics[3 * n + i]);
    }
    for (int64_t j = 0; j < n; ++j) {
      sums.critic_loss += metrics[3 * j];
      sums.actor_loss += metrics[3 * j + 1];
      sums.q += metrics[3 * j + 2];
    }
    sums.count += n;
    sums.updates = r.updates;
    sums.input_wait += input_wait;
    if (sums.count >= kMetricsPublishEvery) PublishMetrics();
  }
  return absl::OkStatus();
}

void D4pgAgent::PublishMetrics() {
  MetricSums& sums = unpublished_;
  if (sums.count == 0) return;
  absl::MutexLock lock(&metrics_mu_);
  late_passes_.resize(std::max(late_passes_.size(), sums.late_passes.size()));
  for (size_t i = 0; i < sums.late_passes.size(); ++i) late_passes_[i] += std::exchange(sums.late_passes[i], 0);
  sum_critic_loss_ += std::exchange(sums.critic_loss, 0.0);
  sum_actor_loss_ += std::exchange(sums.actor_loss, 0.0);
  sum_q_ += std::exchange(sums.q, 0.0);
  sum_input_wait_ += std::exchange(sums.input_wait, 0.0);
  metric_count_ += std::exchange(sums.count, 0);
  metric_updates_ = sums.updates;
}

absl::Status D4pgAgent::DeviceUpdate(replicator::ReplicaContext& ctx, Replica& r, StepInputs& in,
                                     int64_t rows, bool gathered, bool weighted) {
  const config::D4pgConfig& d4pg = config_.d4pg();
  const int atoms = d4pg.atoms();
  nn::Backend& device = *r.backend;

  // Inputs: state as is; pixels to float, randomly shifted (DrQ).
  nn::Tape& t = r.critic_tape;
  t.Reset();
  nn::Var observation, next_observation;
  if (gathered) {
    // The stacked frames gathered from the device frame table straight into
    // the encoder's float input (uint8 until then), as PixelInput lays it out.
    const int64_t count = in.slots.size();
    const int32_t* slots = reinterpret_cast<const int32_t*>(in.slots.data());
    for (int half = 0; half < 2; ++half) {
      const nn::Var frames = t.NewValue({count / 2, 3, spec_.height, spec_.width}, /*requires_grad=*/false);
      r.frames->GatherToFloatPlanar(count / 2, slots + half * (count / 2), /*channels=*/3, 1.0f / 255.0f,
                                    t.value(frames).data);
      (half == 0 ? observation : next_observation) =
          nn::Reshape(frames, {rows, 3 * spec_.frames, spec_.height, spec_.width});
    }
  } else if (spec_.pixels()) {
    for (int half = 0; half < 2; ++half) {
      const StepInputs::Slice& bytes = half == 0 ? in.observation : in.next_observation;
      const nn::Var frames =
          nn::DeviceImagesToFloat(t, reinterpret_cast<const uint8_t*>(bytes.data()), rows * spec_.frames,
                                  spec_.height, spec_.width, /*channels=*/3, 1.0f / 255.0f);
      (half == 0 ? observation : next_observation) =
          nn::Reshape(frames, {rows, 3 * spec_.frames, spec_.height, spec_.width});
    }
  }
  if (spec_.pixels()) {
    if (d4pg.augment_pad() > 0) {
      const int32_t* shifts = reinterpret_cast<const int32_t*>(in.shifts.data());
      observation = RandomShiftBy(observation, d4pg.augment_pad(), shifts);
      next_observation = RandomShiftBy(next_observation, d4pg.augment_pad(), shifts + 2 * rows);
    }
  } else {
    observation = t.Constant(in.observation.data(), {rows, spec_.state_size});
    next_observation = t.Constant(in.next_observation.data(), {rows, spec_.state_size});
  }

  // Target distribution: target critic at (s', target actor(s')), projected
  // through r + discount * z (D4PG's n-step distributional Bellman target).
  // With the parameters split (engine.shard_state PARAMETERS) each network's
  // whole values are gathered from the replicas' parts for the phase that
  // reads them and released after it.
  const bool split = r.critic_part != nullptr;
  if (split) {
    RETURN_IF_ERROR(r.target_critic_part->Gather(ctx));
    RETURN_IF_ERROR(r.target_actor_part->Gather(ctx));
  }
  const Weights target_critic{&r.target_critic, false}, target_actor{&r.target_actor, false};
  const nn::Var next_features = spec_.pixels() ? encoder_(t, target_critic, next_observation) : next_observation;
  const nn::Var next_action = actor_(t, target_actor, next_features);
  nn::CrossReplicaSum* parts = model_parallel_ > 1 ? &ctx.model_axis() : nullptr;  // a split critic's
  const nn::Var next_probs =
      nn::Softmax(internal::ApplyCritic(r.critic_net, t, target_critic, next_features, next_action, parts));
  float* projected = t.AllocateFloats(rows * atoms);
  CategoricalProjection(device, rows, atoms, d4pg.v_min(), d4pg.v_max(), t.data(next_probs).data, in.reward.data(),
                        in.discount.data(), projected);
  const nn::Var target = t.Constant(projected, {rows, atoms});
  if (split) {
    r.target_critic_part->Release();
    r.target_actor_part->Release();
    RETURN_IF_ERROR(r.critic_part->Gather(ctx));
  }

  // Critic: cross-entropy of the online distribution at (s, a) to the target;
  // the encoder (pixels) is trained by this loss only.
  const Weights critic{&r.critic, true};
  r.critic.ZeroGrad();
  const nn::Var features = spec_.pixels() ? encoder_(t, critic, observation) : observation;
  const nn::Var log_probs = nn::LogSoftmax(
      internal::ApplyCritic(r.critic_net, t, critic, features, t.Constant(in.action.data(), {rows, action_size_}), parts));
  // Per-item losses (priorities) and Q = sum_j p_j z_j, before weighting, on
  // the device from constants (no gradient): [rows, 2], downloaded once.
  const nn::Var log_probs_now = t.Constant(t.data(log_probs).data, {rows, atoms});
  const nn::Var item_loss = nn::Scale(nn::SumAxis(nn::Mul(target, log_probs_now), /*axis=*/1), -1.0f);
  const nn::Var item_q = nn::MatMul(nn::Softmax(log_probs_now), t.Constant(r.support.data(), {atoms, 1}));
  const std::array<nn::Var, 2> per_item = {nn::Reshape(item_loss, {rows, 1}), item_q};
  const nn::Var items = nn::Concat(per_item, /*axis=*/1);  // read with the step's other metrics, at its end
  // The target-weighted log-probabilities, whose negated sum over a row is
  // its cross-entropy; importance weights scale each row's.
  const nn::Var log_likelihood =
      weighted ? nn::Mul(nn::SumAxis(nn::Mul(log_probs, target), /*axis=*/1), t.Constant(in.weights.data(), {rows}))
               : nn::Mul(log_probs, target);
  const nn::Var critic_loss = nn::Scale(nn::Sum(log_likelihood), -1.0f / static_cast<float>(rows));
  if (r.critic_reducer) r.critic_reducer->Reset();
  t.Backward(critic_loss, r.critic_reducer);
  r.critic_optimizer->Apply();  // (split: the updated values gathered for the actor's loss)
  if (!ctx.status().ok()) return ctx.status();
  if (split) {
    r.critic_part->ReleaseGradients();
    RETURN_IF_ERROR(r.actor_part->Gather(ctx));
  }

  // Actor: maximise E[sum_j p_j z_j] of the critic at (s, actor(s)); the
  // critic's weights and the encoder's features are constants here, so only
  // the actor moves (DrQ's detached encoder). Uses the just-updated critic.
  nn::Tape& a = r.actor_tape;
  a.Reset();
  r.actor.ZeroGrad();
  const nn::Var actor_features = a.Constant(t.data(features).data, t.data(features).shape);
  const nn::Var pre_tanh = actor_.PreTanh(a, Weights{&r.actor, true}, actor_features);
  const nn::Var policy_action = nn::Tanh(pre_tanh);
  const nn::Var q_probs =
      nn::Softmax(internal::ApplyCritic(r.critic_net, a, Weights{&r.critic, false}, actor_features, policy_action, parts));
  const nn::Var q = nn::MatMul(q_probs, a.Constant(r.support.data(), {atoms, 1}));
  nn::Var actor_loss = nn::Scale(nn::Mean(q), -1.0f);
  if (d4pg.actor_pre_tanh_penalty() > 0) {
    // (|u| - bound)^2 beyond the bound, each side through a ReLU hinge.
    const nn::Var bound = a.Constant(r.bound.data(), {rows, action_size_});
    const nn::Var above = nn::Relu(nn::Sub(pre_tanh, bound));
    const nn::Var below = nn::Relu(nn::Sub(nn::Scale(pre_tanh, -1.0f), bound));
    const nn::Var excess = nn::Add(nn::Mean(nn::Mul(above, above)), nn::Mean(nn::Mul(below, below)));
    actor_loss = nn::Add(actor_loss, nn::Scale(excess, d4pg.actor_pre_tanh_penalty()));
  }
  if (r.actor_reducer) r.actor_reducer->Reset();
  a.Backward(actor_loss, r.actor_reducer);
  r.actor_optimizer->Apply();
  if (!ctx.status().ok()) return ctx.status();

  // Targets follow by Polyak averaging (layouts equal by construction), on
  // the parts where the parameters are split.
  const float tau = d4pg.target_tau();
  if (split) {
    r.actor_part->Release();
    r.critic_part->Release();
    r.target_critic_part->Polyak(*r.critic_part, tau);
    r.target_actor_part->Polyak(*r.actor_part, tau);
  } else {
    RETURN_IF_ERROR(nn::PolyakUpdate(r.critic, r.target_critic, device, tau));
    RETURN_IF_ERROR(nn::PolyakUpdate(r.actor, r.target_actor, device, tau));
  }

  // The update's one read: per-item losses and Q [rows, 2] and the actor
  // loss, gathered on the device (in memory of its own: a later update of
  // the step reuses the tapes) and downloaded together at the step's end.
  float* readout = in.readout.data();  // (read with the execution's others at its end)
  device.Copy(t.data(items).data, readout, 2 * rows);
  device.Copy(a.data(actor_loss).data, readout + 2 * rows, 1);
  return absl::OkStatus();
}

void D4pgAgent::PolicyParameters(std::vector<float>* out) const {
  out->assign(policy_floats_, 0.0f);
  const Replica& r = *replicas_[0];
  if (r.critic_part != nullptr) {
    // Split parameters: each network the policy reads (the critic's set for
    // the encoder only) assembled from the parts, once, then copied.
    std::vector<float> whole[2];
    for (const PolicyCopy& c : policy_copies_) {
      if (whole[c.source].empty()) whole[c.source] = WholeValues(c.source == 0 ? kCritic : kActor);
      std::copy_n(whole[c.source].begin() + c.from, c.count, out->begin() + c.to);
    }
    return;
  }
  // One download per policy parameter, straight into its place.
  for (const PolicyCopy& c : policy_copies_) {
    const float* from = (c.source == 0 ? r.critic : r.actor).device_values() + c.from;
    r.backend->Download(from, out->data() + c.to, sizeof(float) * c.count);
  }
}

int64_t D4pgAgent::num_policy_parameters() const { return policy_floats_; }

int64_t D4pgAgent::gradient_floats() const {
  const Replica& r = *replicas_.front();
  return r.critic.total_floats() + r.actor.total_floats();
}

AgentMetrics D4pgAgent::metrics() const {
  absl::MutexLock lock(&metrics_mu_);
  AgentMetrics m;
  const double count = std::max<int64_t>(metric_count_, 1);
  const double means[] = {sum_critic_loss_ / count, sum_actor_loss_ / count, sum_q_ / count};
  static_assert(std::size(means) == std::size(kD4pgMetrics));
  for (size_t i = 0; i < std::size(means); ++i) m.values.emplace_back(kD4pgMetrics[i], means[i]);
  if (config_.learner().engine().straggler() == config::EngineConfig::DEADLINE) {
    late_passes_.resize(replicator_->num_replicas());
    for (size_t i = 0; i < late_passes_.size(); ++i) {
      m.values.emplace_back(absl::StrCat("late_backward.replica", i), late_passes_[i]);
      late_passes_[i] = 0;
    }
  }
  m.input_wait_s = sum_input_wait_ / count;
  double idle = 0;  // every replica's device's, since the last call
  for (const auto& r : replicas_) idle += r->backend->device_idle_seconds();
  m.device_idle_s = (idle - device_idle_counted_) / static_cast<double>(replicas_.size()) / count;
  device_idle_counted_ = idle;
  m.updates = metric_updates_;
  sum_critic_loss_ = sum_actor_loss_ = sum_q_ = sum_input_wait_ = 0;
  metric_count_ = 0;
  return m;
}

std::vector<std::string> D4pgAgent::metric_names() const {
  std::vector<std::string> names(std::begin(kD4pgMetrics), std::end(kD4pgMetrics));
  if (config_.learner().engine().straggler() == config::EngineConfig::DEADLINE) {
    for (int i = 0; i < replicator_->num_replicas(); ++i) names.push_back(absl::StrCat("late_backward.replica", i));
  }
  return names;
}

bool D4pgAgent::frame_references() const { return !replicas_.empty() && replicas_[0]->frames != nullptr; }

DeviceFrameStats D4pgAgent::frame_stats() const {
  DeviceFrameStats sum;
  for (const auto& r : replicas_) {
    if (r->frames == nullptr) continue;
    const DeviceFrameStats s = r->frames->stats();
    sum.frames_uploaded += s.frames_uploaded;
    sum.bytes_uploaded += s.bytes_uploaded;
    sum.replaced += s.replaced;
    sum.resolved += s.resolved;
    sum.slots = std::max(sum.slots, s.slots);
    sum.grown += s.grown;
    sum.scatters += s.scatters;
  }
  return sum;
}

void D4pgAgent::LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const {
  keys->clear();
  priorities->clear();
  for (const auto& r : replicas_) {
    if (r->part != 0) continue;  // a split critic's copy's rows are its part 0's
    keys->insert(keys->end(), r->keys.begin(), r->keys.end());
    priorities->insert(priorities->end(), r->item_loss.begin(), r->item_loss.end());
  }
}

// --- Checkpoints ------------------------------------------------------------------

// Every tensor of replica `r` in checkpoint order, in its device's memory:
// networks, targets, Adam moments per parameter (none when the optimizers
// are null); the counters (updates and the two optimizers' step counts, on
// the host) follow them. Every name has nn::kParameterEntryPrefix, as files
// written as one ParameterSet had.
static std::string EntryName(const std::string& prefix, const nn::ParameterSet& set, int i) {
  return nn::kParameterEntryPrefix + prefix + "/" + set.info(i).name;
}
static std::vector<nn::DeviceTensor> Entries(nn::ParameterSet& critic, nn::ParameterSet& actor,
                                             nn::ParameterSet& target_critic, nn::ParameterSet& target_actor,
                                             nn::Optimizer* critic_adam, nn::Optimizer* actor_adam) {
  std::vector<nn::DeviceTensor> entries;
  // (A set whose whole buffers are released, split parameters', gives its
  // names and shapes only.)
  auto add_set = [&](const std::string& prefix, nn::ParameterSet& set, float* base) {
    for (int i = 0; i < set.size(); ++i) {
      entries.push_back({EntryName(prefix, set, i), set.info(i).shape,
                         base == nullptr ? nullptr : base + set.info(i).offset});
    }
  };
  add_set("critic", critic, critic.device_values());
  add_set("actor", actor, actor.device_values());
  add_set("target_critic", target_critic, target_critic.device_values());
  add_set("target_actor", target_actor, target_actor.device_values());
  if (critic_adam == nullptr) return entries;
  for (const nn::OptimizerState& s : critic_adam->State()) add_set("critic." + s.name, critic, s.data);
  for (const nn::OptimizerState& s : actor_adam->State()) add_set("actor." + s.name, actor, s.data);
  return entries;
}

// A checkpoint entry of the critic's set, its target's or its moments'
// (whose shapes a split critic's part does not hold whole): the parameter's
// name, or "" for any other entry; *group_out, where given, the entry's
// group ("critic", "target_critic", "critic.adam.m").
static std::string CriticParameterOf(const std::string& entry, std::string* group_out = nullptr) {
  const size_t prefix = std::strlen(nn::kParameterEntryPrefix), slash = entry.rfind('/');
  if (!entry.starts_with(nn::kParameterEntryPrefix) || slash == std::string::npos || slash < prefix) return "";
  const std::string group = entry.substr(prefix, slash - prefix);
  if (group != "critic" && group != "target_critic" && !group.starts_with("critic.")) return "";
  if (group_out != nullptr) *group_out = group;
  return entry.substr(slash + 1);
}

static std::string CountersEntry() { return std::string(nn::kParameterEntryPrefix) + internal::kCheckpointCounters; }

// Split optimizer state (its moments kept on the host for a checkpoint):
// each moment entry of `set` ("critic.", "actor.") in Entries' order, with
// the state it is of (StateNames' order) and its offset in that state's
// whole buffer.
static void ForEachSplitMoment(
    const std::string& prefix, const nn::ParameterSet& set, const replicator::ShardedAdam& sharded,
    absl::FunctionRef<void(const std::string& name, const nn::Shape& shape, size_t state, int64_t offset)> each) {
  const std::vector<std::string> names = sharded.StateNames();
  for (size_t s = 0; s < names.size(); ++s) {
    for (int i = 0; i < set.size(); ++i) {
      each(EntryName(prefix + names[s], set, i), set.info(i).shape, s, set.info(i).offset);
    }
  }
}

std::vector<nn::CheckpointTensor> D4pgAgent::DownloadState() const {
  Replica& r = *replicas_[0];
  // Split over other processes' replicas too (MPI ranks): PrepareCheckpoint
  // first, on every rank.
  const bool across = state_split_across_processes();
  TROUPE_CHECK(!across || state_gathered_);
  // Split moments on the host (no device holding them whole): assembled from
  // every local replica's part, or over ranks with the parameters split
  // PrepareCheckpoint's copies; with the moments alone split over ranks,
  // the whole ones PrepareCheckpoint gathered on replica 0's device.
  const bool moments_on_host = r.critic_sharded && (!across || r.critic_part != nullptr);
  std::vector<nn::CheckpointTensor> tensors;
  if (r.critic_part != nullptr) {
    // Split parameters: each network whole on the host.
    for (int n = 0; n < kNetworks; ++n) {
      static constexpr const char* kPrefixes[kNetworks] = {"critic", "actor", "target_critic", "target_actor"};
      const nn::ParameterSet& set = r.part_of(n).set();
      const std::vector<float> whole = WholeValues(n);
      for (int i = 0; i < set.size(); ++i) {
        const auto begin = whole.begin() + set.info(i).offset;
        tensors.push_back({EntryName(kPrefixes[n], set, i), set.info(i).shape,
                           std::vector<float>(begin, begin + set.info(i).shape.size())});
      }
    }
  } else {
    tensors = nn::DownloadTensors(*r.backend, Entries(r.critic, r.actor, r.target_critic, r.target_actor,
                                                      moments_on_host ? nullptr : &r.critic_state(),
                                                      moments_on_host ? nullptr : &r.actor_state()));
    if (model_parallel_ > 1) JoinCriticParts(&tensors);  // the whole critic from its parts
  }
  if (moments_on_host) {
    // The moments' entries, in Entries' order, from the host.
    const auto append = [&](const std::string& prefix, const nn::ParameterSet& set, int n,
                            std::unique_ptr<replicator::ShardedAdam> Replica::*sharded) {
      std::vector<replicator::ShardedAdam*> parts;
      for (const auto& each : replicas_) parts.push_back(((*each).*sharded).get());
      std::vector<std::vector<float>> whole;
      if (across) {
        whole = moments_on_host_[n];
      } else {
        TROUPE_CHECK(replicator::ShardedAdam::GatherLocalToHost(parts, &whole).ok());
      }
      ForEachSplitMoment(prefix, set, *parts[0], [&](const std::string& name, const nn::Shape& shape, size_t s,
                                                     int64_t offset) {
        const auto begin = whole[s].begin() + offset;
        tensors.push_back({name, shape, std::vector<float>(begin, begin + shape.size())});
      });
    };
    append("critic.", r.critic, kCritic, &Replica::critic_sharded);
    append("actor.", r.actor, kActor, &Replica::actor_sharded);
  }
  const int64_t counters[3] = {r.updates, r.critic_state().steps(), r.actor_state().steps()};
  tensors.push_back(nn::Int64Tensor(CountersEntry(), counters));
  return tensors;
}

internal::PartSlice D4pgAgent::CriticSliceOf(int part, const std::string& parameter) const {
  // Every part's critic has the same layout: this process's, as part `part`.
  const Replica& r = *replicas_[0];
  internal::Mlp critic = r.critic_net;
  critic.part = part;
  const int index = r.critic.Find(parameter);
  internal::PartSlice slice;
  bool found = false;
  ForEachCriticSlice(critic, r.critic, [&](int p, int, internal::PartSlice s) {
    if (p == index) slice = s, found = true;
  });
  return found ? slice : internal::PartSlice{};  // (not the MLP's: the encoder, whole on every part)
}

absl::Status D4pgAgent::GatherCriticParts(replicator::ReplicaContext& ctx, Replica& r, bool keep) {
  // Every part's set has the same layout: each of the critic's buffers (its
  // values, its target's, its moments) all-gathered along the model axis.
  std::vector<std::pair<std::string, float*>> buffers = {{"critic", r.critic.device_values()},
                                                         {"target_critic", r.target_critic.device_values()}};
  for (const nn::OptimizerState& s : r.critic_state().State()) buffers.push_back({"critic." + s.name, s.data});
  const int64_t n = r.critic.padded_floats();
  nn::DeviceBuffer all(*r.backend, model_parallel_ * n);
  std::map<std::string, std::vector<float>> gathered;  // group -> every part's buffer, part after part
  for (const auto& [group, data] : buffers) {
    RETURN_IF_ERROR(ctx.model_axis().AllGatherDevice(*r.backend, data, all.data(), n));
    std::vector<float>& host = gathered[group];
    host.resize(all.size());
    r.backend->Download(all.data(), host.data(), sizeof(float) * host.size());
  }
  if (!keep) return absl::OkStatus();
  // Part p's checkpoint entries: this part's, with the critic's from part p's buffers.
  const std::vector<nn::CheckpointTensor> local = nn::DownloadTensors(
      *r.backend, Entries(r.critic, r.actor, r.target_critic, r.target_actor, &r.critic_state(), &r.actor_state()));
  critic_parts_on_host_.assign(model_parallel_, local);
  for (int p = 0; p < model_parallel_; ++p) {
    for (nn::CheckpointTensor& t : critic_parts_on_host_[p]) {
      std::string group;
      const std::string parameter = CriticParameterOf(t.name, &group);
      if (parameter.empty()) continue;
      const float* from = gathered.at(group).data() + p * n + r.critic.info(r.critic.Find(parameter)).offset;
      std::copy_n(from, t.values.size(), t.values.begin());
    }
  }
  return absl::OkStatus();
}

void D4pgAgent::JoinCriticParts(std::vector<nn::CheckpointTensor>* tensors) const {
  // Model copy 0's parts: local replicas 0 .. M-1 where every replica is
  // local, or over MPI ranks PrepareCheckpoint's copies of this copy's.
  std::vector<std::vector<nn::CheckpointTensor>> parts = {*tensors};
  if (state_split_across_processes()) {
    parts = critic_parts_on_host_;
  } else {
    for (int p = 1; p < model_parallel_; ++p) {
      Replica& r = *replicas_[p];
      parts.push_back(nn::DownloadTensors(*r.backend, Entries(r.critic, r.actor, r.target_critic, r.target_actor,
                                                              &r.critic_state(), &r.actor_state())));
    }
  }
  for (size_t t = 0; t < tensors->size(); ++t) {
    const std::string parameter = CriticParameterOf((*tensors)[t].name);
    if (parameter.empty()) continue;
    const nn::Shape& shape = whole_critic_set_.info(whole_critic_set_.Find(parameter)).shape;
    std::vector<float> whole(shape.size(), 0.0f);
    for (int p = 0; p < model_parallel_; ++p) {
      const internal::PartSlice slice = CriticSliceOf(p, parameter);
      if (slice.kind == internal::PartSlice::kWhole && p > 0) continue;  // part 0's (the row pair's bias: only its)
      internal::CopyPartToWhole(parts[p][t].values, shape, slice, whole);
    }
    (*tensors)[t] = {(*tensors)[t].name, shape, std::move(whole)};
  }
}

std::vector<nn::CheckpointTensor> D4pgAgent::CriticPartOf(const Replica& r,
                                                          const std::vector<nn::CheckpointTensor>& whole) const {
  std::vector<nn::CheckpointTensor> part = whole;
  for (nn::CheckpointTensor& t : part) {
    const std::string parameter = CriticParameterOf(t.name);
    if (parameter.empty()) continue;
    const nn::Shape& shape = r.critic.info(r.critic.Find(parameter)).shape;
    std::vector<float> values(shape.size());
    internal::CopyPartFromWhole(t.values, t.shape, CriticSliceOf(r.part, parameter), values);
    t = {t.name, shape, std::move(values)};
  }
  return part;
}

std::vector<float> D4pgAgent::WholeValues(int network) const {
  if (state_split_across_processes()) {
    TROUPE_CHECK(!values_on_host_[network].empty());  // gathered (PrepareCheckpoint, or the policy's after Train)
    return values_on_host_[network];
  }
  std::vector<const replicator::ShardedParameters*> parts;
  for (const auto& each : replicas_) parts.push_back(&each->part_of(network));
  std::vector<float> whole;
  TROUPE_CHECK(replicator::ShardedParameters::GatherLocalToHost(parts, &whole).ok());  // all local
  return whole;
}

int64_t D4pgAgent::parameter_state_bytes() const {
  const Replica& r = *replicas_[0];
  if (r.critic_part != nullptr) {
    int64_t bytes = 0;
    for (int n = 0; n < kNetworks; ++n) bytes += r.part_of(n).part_bytes();
    return bytes;
  }
  // Values and gradients of both networks, and their targets' values.
  return int64_t{sizeof(float)} * (2 * (r.critic.padded_floats() + r.actor.padded_floats()) +
                                   r.target_critic.padded_floats() + r.target_actor.padded_floats());
}

int64_t D4pgAgent::optimizer_state_bytes() const {
  const Replica& r = *replicas_[0];
  if (r.critic_sharded) return r.critic_sharded->state_bytes() + r.actor_sharded->state_bytes();
  return int64_t{sizeof(float)} * (r.critic_adam->state_floats() + r.actor_adam->state_floats());
}

absl::Status D4pgAgent::Save(const std::string& path) const { return nn::WriteCheckpoint(path, DownloadState()); }

uint64_t D4pgAgent::StateChecksum() const {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a offset basis
  for (const nn::CheckpointTensor& t : DownloadState()) {
    const auto* p = reinterpret_cast<const unsigned char*>(t.values.data());
    for (size_t i = 0; i < sizeof(float) * t.values.size(); ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  }
  return hash;
}

absl::Status D4pgAgent::Load(const std::string& path) {
  // Names and shapes are checked against replica 0's layout before anything
  // changes. With split optimizer state the moments stay on the host: each
  // replica takes its part (no device holds them whole).
  ReleaseGatheredState();  // (a checkpoint's copies of the state before this one)
  Replica& r0 = *replicas_[0];
  const bool split = r0.critic_sharded != nullptr;
  const auto device_entries = [split](Replica& r) {
    return Entries(r.critic, r.actor, r.target_critic, r.target_actor, split ? nullptr : &r.critic_state(),
                   split ? nullptr : &r.actor_state());
  };
  std::vector<nn::DeviceTensor> layout = device_entries(r0);
  if (model_parallel_ > 1) {
    // A split critic's entries are the whole critic's.
    for (nn::DeviceTensor& t : layout) {
      if (const std::string parameter = CriticParameterOf(t.name); !parameter.empty()) {
        t = {t.name, whole_critic_set_.info(whole_critic_set_.Find(parameter)).shape, nullptr};
      }
    }
  }
  const size_t moments_begin = layout.size();
  if (split) {
    for (const auto& [prefix, set, sharded] : {std::tuple{"critic.", &r0.critic, r0.critic_sharded.get()},
                                               std::tuple{"actor.", &r0.actor, r0.actor_sharded.get()}}) {
      ForEachSplitMoment(prefix, *set, *sharded, [&](const std::string& name, const nn::Shape& shape, size_t, int64_t) {
        layout.push_back({name, shape, nullptr});
      });
    }
  }
  layout.push_back({CountersEntry(), nn::Shape{6}, nullptr});
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> file, nn::ReadCheckpointMatching(path, layout));
  const std::vector<int64_t> counters = nn::Int64sOf(file.back());
  // The whole moments of `set` from the file's entries from `next` on.
  size_t next = moments_begin;
  const auto whole_moments = [&](const nn::ParameterSet& set, const replicator::ShardedAdam& sharded) {
    std::vector<std::vector<float>> whole(sharded.StateNames().size(), std::vector<float>(set.padded_floats()));
    ForEachSplitMoment("", set, sharded, [&](const std::string&, const nn::Shape&, size_t s, int64_t offset) {
      const std::vector<float>& values = file[next++].values;
      std::copy(values.begin(), values.end(), whole[s].begin() + offset);
    });
    return whole;
  };
  std::vector<std::vector<float>> critic_moments, actor_moments;
  if (split) {
    critic_moments = whole_moments(r0.critic, *r0.critic_sharded);
    actor_moments = whole_moments(r0.actor, *r0.actor_sharded);
  }
  // Split parameters: each network's whole values from the file's entries
  // (Entries' order: critic, actor, target critic, target actor), of which
  // each replica takes its part.
  std::vector<std::vector<float>> whole_values;
  if (r0.critic_part != nullptr) {
    size_t entry = 0;
    for (int n = 0; n < kNetworks; ++n) {
      const nn::ParameterSet& set = r0.part_of(n).set();
      std::vector<float>& whole = whole_values.emplace_back(set.padded_floats(), 0.0f);
      for (int i = 0; i < set.size(); ++i) {
        const std::vector<float>& values = file[entry++].values;
        std::copy(values.begin(), values.end(), whole.begin() + set.info(i).offset);
      }
    }
  }
  // Every local replica gets the same state.
  for (auto& r : replicas_) {
    if (r->critic_part != nullptr) {
      for (int n = 0; n < kNetworks; ++n) r->part_of(n).SetPartFromHost(whole_values[n]);
    } else if (model_parallel_ > 1) {
      nn::UploadTensors(*r->backend, CriticPartOf(*r, file), device_entries(*r));
    } else {
      nn::UploadTensors(*r->backend, file, device_entries(*r));
    }
    r->updates = counters[0];
    r->critic_state().set_steps(counters[1]);
    r->actor_state().set_steps(counters[2]);
    if (split) {
      r->critic_sharded->KeepOwnPartFromHost(critic_moments);
      r->actor_sharded->KeepOwnPartFromHost(actor_moments);
    }
  }
  if (r0.critic_part != nullptr && state_split_across_processes()) {
    // The host's whole networks over ranks, as loaded (the policy's until the next Train).
    for (int n = 0; n < kNetworks; ++n) values_on_host_[n] = std::move(whole_values[n]);
  }
  updates_ = counters[0];
  {
    absl::MutexLock lock(&metrics_mu_);
    metric_updates_ = updates_;
  }
  return absl::OkStatus();
}

}  // namespace troupe::agents
