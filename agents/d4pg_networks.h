// D4PG's networks, shared by the learner (d4pg_agent.h D4pgAgent) and
// inference (d4pg_policy.h D4pgPolicy): a DrQ-style pixel encoder, a deterministic tanh actor and a
// categorical critic. A network here is only parameter indices into a
// ParameterSet (immutable, shareable); the values live in the caller's sets.
// `Weights` says whether a pass differentiates the weights (trainable) or
// reads them as constants (targets, inference, the critic inside the actor
// loss), so one definition serves every use.
//
// Internal to agents/; callers outside use d4pg_policy.h and d4pg_agent.h.
#ifndef TROUPE_AGENTS_D4PG_NETWORKS_H_
#define TROUPE_AGENTS_D4PG_NETWORKS_H_

#include <cstdint>
#include <vector>

#include "agents/networks.h"
#include "engine/nn/layers.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"
#include "proto/config.pb.h"

namespace troupe::agents {

struct ObservationSpec;

namespace internal {

// DrQ's encoder (Kostrikov et al. 2020): conv 3x3 stride 2, three conv 3x3
// stride 1 (all `channels` wide, ReLU), linear to `features`, layer norm, tanh.
struct Encoder {
  std::vector<nn::Conv2dLayer> convs;
  nn::LinearLayer linear;
  nn::LayerNormLayer norm;
  int64_t features = 0;
  // Declares "encoder.*" parameters for pixels of `spec` (3 channels per frame).
  static Encoder Declare(nn::ParameterSet& params, const ObservationSpec& spec, int channels, int features);
  // pixels: float [B, 3k, H, W] in [0, 1] -> features [B, features] in [-1, 1].
  nn::Var operator()(nn::Tape& tape, Weights weights, nn::Var pixels) const;
};

// The hidden layer sizes of the actor and critic MLPs (d4pg.hidden; [256, 256] when empty).
std::vector<int64_t> HiddenSizes(const config::D4pgConfig& config);

// The actor: features -> hidden... -> action_size, tanh ("actor.*").
Mlp DeclareActor(nn::ParameterSet& params, int64_t feature_size, const std::vector<int64_t>& hidden,
                 int action_size);
// The critic head: [features, action] -> hidden... -> atoms logits
// ("critic.*"); part `part` of it split over `parts` replicas (its first two
// layers, Mlp's tensor-parallel pair: needs two hidden layers or more, the
// first divisible by `parts`).
Mlp DeclareCritic(nn::ParameterSet& params, int64_t feature_size, const std::vector<int64_t>& hidden,
                  int action_size, int atoms, int parts = 1, int part = 0);
// Logits of the critic on (features, action): concatenates and applies
// (`group`: the sum over a split critic's parts).
nn::Var ApplyCritic(const Mlp& critic, nn::Tape& tape, Weights weights, nn::Var features, nn::Var action,
                    nn::CrossReplicaSum* group = nullptr);

// The agent's checkpoint (D4pgAgent::Save: one nn checkpoint, whose entry
// names add nn::kParameterEntryPrefix) names each tensor "<set>/<name>"
// for its sets "critic" (the encoder, when pixels, and the critic head),
// "actor", their targets and optimizer moments, plus kCheckpointCounters
// (updates, critic and actor optimizer steps: int64s as float pairs). A
// policy parameter (encoder.* or actor.*) is trained in the critic set
// (the encoder) or in the actor set; this is its name there.
std::string AgentCheckpointName(const std::string& policy_parameter);
inline constexpr char kCheckpointCounters[] = "counters.updates_critic_actor_steps";
// True for the policy parameters trained in the critic set (the encoder's).
bool TrainedWithCritic(const std::string& policy_parameter);

// Replay's pixel layout uint8 [B, k, H, W, 3] (frames oldest first, on the
// host) as the encoder's input: uploaded and converted on the device to float
// NCHW [B, 3k, H, W] / 255 (channel f*3 + c is frame f's colour c).
nn::Var PixelInput(nn::Tape& t, const uint8_t* pixels, int64_t batch, const ObservationSpec& spec);

}  // namespace internal
}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_D4PG_NETWORKS_H_
