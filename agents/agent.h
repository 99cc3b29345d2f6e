// What every agent gives the learner: its updates on the Replicator over
// replay's batches, the parameters its policy (agents/policy.h) acts with,
// its metrics, its replay feedback and its checkpoint state. The learner
// holds an Agent made by agents::CreateAgent (agents/agents.h) for the
// config's agent and never names an algorithm.
//
//   ASSIGN_OR_RETURN(auto agent, agents::CreateAgent(config, spec, action_size, replicator.get()));
//   agent->StartInput([&](int replica, int64_t n, replay::SampledBatch* out) {
//     return samplers[replica]->Next(out);   // n: the replica's shard of learner.batch_size
//   }, [&] { for (auto& s : samplers) s->Cancel(); });
//   agent->Train(/*num_updates=*/10);   // ... publish, checkpoint, Train again
//   agent->StopInput();                 // before the samplers go
//   std::vector<float> params; agent->PolicyParameters(&params);  // a Policy's SetParameters layout
//
// Threads: Train runs the Replicator's replica threads (and the agent's
// input threads, agents may sample ahead); everything else but metrics()
// and frame_stats() (any thread) is called from the thread that calls
// Train, between Train calls.
#ifndef TROUPE_AGENTS_AGENT_H_
#define TROUPE_AGENTS_AGENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agents/device_frames.h"
#include "agents/policy.h"
#include "engine/nn/checkpoint.h"
#include "replay/replay.h"

namespace troupe::agents {

// learner.updates_per_execution's largest: a step program of that many
// updates (unrolled) compiles in minutes.
inline constexpr int kMaxUpdatesPerExecution = 64;

// An agent's metrics over the updates since the last call.
struct AgentMetrics {
  int64_t updates = 0;      // total updates so far (restored by Load)
  double input_wait_s = 0;  // what an update waited for its input (sampling, new frames), mean
  // What the device sat idle between executions waiting for the host, per
  // update (nn::Backend::device_idle_seconds over the replicas' devices, mean).
  double device_idle_s = 0;
  // The agent's own scalars (losses, value estimates), each a mean over
  // the interval (or a count, where the name says so: D4PG's
  // late_backward.replicaR), by name: the name is its metrics.csv column
  // and TensorBoard's train/NAME. Always the same names in the same order.
  std::vector<std::pair<std::string, double>> values;
  // The value named `name`, 0 when the agent has none of that name.
  double operator[](std::string_view name) const {
    for (const auto& [n, v] : values) {
      if (n == name) return v;
    }
    return 0;
  }
};

class Agent {
 public:
  // Fills `out` with `shard_batch_size` items of the agent's replay table
  // for replica `replica_id`. Called concurrently from every local
  // replica's thread (give each replica its own Sampler).
  using SampleFn = std::function<absl::Status(int replica_id, int64_t shard_batch_size, replay::SampledBatch* out)>;

  virtual ~Agent() = default;

  // The input of the Train(num_updates) calls that follow: `sample` fills
  // each local replica's shard of every update's batch, and may be called
  // between Train calls too (an agent that samples ahead), until StopInput,
  // which calls `cancel` (if given) to end a sample blocked on the rate
  // limiter.
  virtual void StartInput(SampleFn sample, std::function<void()> cancel = nullptr) = 0;
  // Stops the input (joins its threads) and drops what was sampled ahead.
  virtual void StopInput() = 0;
  // `num_updates` updates on the Replicator, on StartInput's input
  // (FailedPrecondition without one), gradients averaged over replicas.
  // Errors: the sampler's, InvalidArgument for a batch that does not match
  // the table's signature, collective errors; each prefixed with the
  // replica ("replica 1: ...").
  virtual absl::Status Train(int64_t num_updates) = 0;
  // Updates so far (restored by Load).
  virtual int64_t updates() const = 0;

  // The policy's flat parameters, exactly its SetParameters layout;
  // resizes *out.
  virtual void PolicyParameters(std::vector<float>* out) const = 0;
  virtual int64_t num_policy_parameters() const = 0;
  // Floats of gradient one update averages across replicas.
  virtual int64_t gradient_floats() const = 0;
  // The optimizers' state one replica keeps between updates, in bytes (its
  // part of it with sharded state: engine.shard_state).
  virtual int64_t optimizer_state_bytes() const = 0;
  // The networks' values and what else of them it keeps between updates
  // (gradients, targets) on one replica, in bytes (its part with
  // engine.shard_state PARAMETERS).
  virtual int64_t parameter_state_bytes() const = 0;

  // Means over the updates since the last call.
  virtual AgentMetrics metrics() const = 0;
  // The names of AgentMetrics::values, fixed for the agent's life: its
  // columns in metrics.csv (after the platform's samples_per_insert) and
  // TensorBoard's train/NAME.
  virtual std::vector<std::string> metric_names() const = 0;

  // True when the batches must carry frame references
  // (replay::SamplerOptions::frame_references) instead of decoded pixels.
  virtual bool frame_references() const = 0;
  // The device frame tables' counters (zeros without tables); from any thread.
  virtual DeviceFrameStats frame_stats() const = 0;

  // Replay feedback: the keys of the last Train call's last batches on this
  // process's replicas and each one's new priority. Empty for an agent
  // that sets none (uniform or queue tables).
  virtual void LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const = 0;

  // Everything the agent's training state holds (networks, targets,
  // optimizer state, counters) in one checkpoint file (engine/nn/
  // checkpoint.h). Load checks every entry's name and shape first
  // (InvalidArgument naming the entry) and sets every local replica; a
  // corrupt file is DataLoss. Under MPI: Save on the rank holding replica
  // 0, Load on all.
  virtual absl::Status Save(const std::string& path) const = 0;
  virtual absl::Status Load(const std::string& path) = 0;
  // What Save writes, downloaded from replica 0, in file order
  // (nn::WriteCheckpoint writes it on any thread).
  virtual std::vector<nn::CheckpointTensor> CheckpointState() const = 0;
  // True when part of the state lives on replicas of other processes (the
  // optimizer state, the networks or a critic's parts split over MPI
  // ranks): then every rank calls PrepareCheckpoint, a collective, at the
  // same update before the chief's Save, CheckpointState or any rank's
  // StateChecksum; it gathers the whole state, which stays until the next
  // Train.
  virtual bool state_split_across_processes() const { return false; }
  virtual absl::Status PrepareCheckpoint() { return absl::OkStatus(); }
  // False where the state is split across processes and not gathered since
  // the last Train: a checkpoint cannot be written now (after a stop the
  // ranks did not agree on, the others may be gone).
  virtual bool state_gathered() const { return true; }
  // FNV-1a (64-bit) over the bytes of everything Save writes: equal on
  // every replica and MPI rank exactly when their states are bit-identical.
  virtual uint64_t StateChecksum() const = 0;

  virtual const ObservationSpec& spec() const = 0;
  virtual int action_size() const = 0;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_AGENT_H_
