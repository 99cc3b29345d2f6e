// The D4PG transition, declared once: the n-step transitions actors write
// into replay and the learner samples. Everything that lays a transition out
// derives from this declaration and the signature it gives (as Reverb
// derives its writers and tables from one signature):
//   - the replay table's fields (TransitionTable);
//   - the actor's layout and the order its writer fills the fields
//     (actors/transition_writer.h: one value per TransitionField);
//   - the check of a sampled batch (replay::CheckBatch against the
//     signature, in D4pgAgent::Train).
//
//   field             dtype and shape                  what it holds
//   observation       float32 [S]                      the state vector, or
//                     | uint8 [H, W, 3] x frames       a stack of frames, each stored once in the frame store
//   action            float32 [A]
//   reward            float32 []                       the n-step discounted reward sum
//   discount          float32 []                       gamma^n, 0 at a true terminal
//   next_observation  like observation                 the observation n steps later
#ifndef TROUPE_AGENTS_TRANSITION_H_
#define TROUPE_AGENTS_TRANSITION_H_

#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "proto/config.pb.h"
#include "replay/item.h"

namespace troupe::agents {

// The replay table the actors fill and the learner samples.
inline constexpr char kTransitionTable[] = "transitions";

// A transition's fields in signature order: the index of a field in the
// signature, in a writer's values and in a sampled batch.
enum TransitionField : int { kObservation = 0, kAction, kReward, kDiscount, kNextObservation, kNumTransitionFields };

// What a field holds, which decides its dtype and shape.
enum class TransitionValue {
  kObservation,  // float32 [state_size], or uint8 [height, width, 3] x frames
  kAction,       // float32 [action_size]
  kScalar,       // float32 []
};

struct TransitionFieldDeclaration {
  const char* name;
  TransitionValue value;
};

// The declaration: one entry per TransitionField, in that order.
inline constexpr TransitionFieldDeclaration kTransitionFields[kNumTransitionFields] = {
    {"observation", TransitionValue::kObservation},
    {"action", TransitionValue::kAction},
    {"reward", TransitionValue::kScalar},
    {"discount", TransitionValue::kScalar},
    {"next_observation", TransitionValue::kObservation},
};

// Appends the declared fields for observations `spec` and `action_size`
// actions to `table` (names, dtypes, shapes, frames).
void AddTransitionFields(const ObservationSpec& spec, int action_size, config::ReplayTableConfig* table);

// The signature of those fields (replay::Signature::FromConfig of a table
// named kTransitionTable). InvalidArgument, naming the field, for a spec or
// action size that makes no field (a size below 1).
absl::StatusOr<replay::Signature> TransitionSignature(const ObservationSpec& spec, int action_size);

// The replay table the actors fill and the learner samples:
// kTransitionTable with the transition's fields above.
// Size, min size, samples per insert and selector (prioritized or uniform)
// come from config.learner(); seed from config.learner().engine().seed().
config::ReplayTableConfig TransitionTable(const ObservationSpec& spec, int action_size,
                                          const config::ExperimentConfig& config);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_TRANSITION_H_
