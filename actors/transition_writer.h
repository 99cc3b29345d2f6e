// Turns each env's stream of timesteps into n-step transitions
// (obs_t, a_t, sum_j<n gamma^j r_t+j, gamma^n, obs_t+n), as Acme's
// NStepTransitionAdder does, and inserts them into replay's transition table
// with the transition's signature (agents/transition.h: the layout's
// signature gives each field's dtype and shape, and its fields are filled in
// agents::TransitionField order). At an episode's end the pending steps are
// flushed with shorter returns and their own gamma^m (control tasks end by
// time limit, so the last observation is bootstrapped from, not treated as
// terminal).
//
// Pixels: each env's newest frame is appended to the writer once; a stacked
// observation is the list of its last k frame keys (the first frame repeats
// at the start of an episode), so replay stores every frame once.
//
// Allocation-free once running: each env's pending steps live in a ring of
// n_step slots whose buffers are sized when the writer is made, and one set
// of field values is refilled for every insert (the replay::Writer reuses
// its request's buffers too).
//
// Not thread-safe: one owner thread.
#ifndef TROUPE_ACTORS_TRANSITION_WRITER_H_
#define TROUPE_ACTORS_TRANSITION_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "actors/item_writer.h"
#include "agents/transition.h"
#include "replay/client.h"

namespace troupe::actors {

struct TransitionLayout {
  // agents::TransitionSignature: its fields in agents::TransitionField order.
  replay::Signature signature;
  int n_step = 1;
  float discount = 0.99f;
  std::string table = agents::kTransitionTable;
};

class TransitionWriter final : public ItemWriter {
 public:
  TransitionWriter(replay::Writer* writer, int num_envs, const TransitionLayout& layout);
  // (observation_ points into layout_.)
  TransitionWriter(const TransitionWriter&) = delete;
  TransitionWriter& operator=(const TransitionWriter&) = delete;

  // The first observation of env `env`'s episode (state [S] or the newest
  // frame [H, W, 3]). Forgets anything pending for it.
  absl::Status Start(int env, const float* state, const uint8_t* frame) override;

  // One step of env `env`: the action taken from its previous observation,
  // the reward and env discount, whether the episode ended, and the new
  // observation. Inserts the transitions that became complete. A send
  // that fails (replay unreachable) is returned only after the step is
  // wholly recorded: its transitions stay queued in the writer (a
  // resumable writer re-sends them on Resume), so an episode is never cut.
  absl::Status Step(int env, const float* action, float reward, float discount, bool last, const float* state,
                    const uint8_t* frame);
  absl::Status Step(int env, const ActorStep& step) override {
    return Step(env, step.action, step.reward, step.discount, step.last, step.state, step.frame);
  }

  // Drops every env's pending steps (after replay was lost and reconnected:
  // nothing half-written is kept). Envs must Start again.
  void Clear() override;

  // Transitions handed to the writer (queued or sent).
  int64_t transitions_inserted() const { return inserted_; }
  int64_t items_inserted() const override { return inserted_; }

 private:
  // One observation: the state's bytes or the frame-key stack.
  struct Observation {
    std::vector<uint8_t> state;
    std::vector<uint64_t> frames;
  };
  struct Pending {
    Observation observation;
    std::vector<uint8_t> action;
    float reward = 0;
    float discount = 1;
  };
  struct EnvState {
    bool started = false;
    Observation current;
    Observation next;  // where a step's new observation is made
    // The pending steps, oldest first: ring[(head + j) % n_step] for j < size.
    std::vector<Pending> ring;
    size_t head = 0, size = 0;
    Pending& pending(size_t j) { return ring[(head + j) % ring.size()]; }
  };

  // Makes env's new observation in *out (its first of an episode when `first`).
  absl::Status Observe(const EnvState& env, const float* state, const uint8_t* frame, bool first, Observation* out);
  // Sets values_[field] to observation `o`.
  void SetObservation(agents::TransitionField field, const Observation& o);
  // Inserts the oldest pending step with the n-step return of the first
  // `steps` pendings. An item the writer queued but could not send is
  // recorded as inserted, and the send's error goes to *sent.
  absl::Status InsertFront(EnvState& env, size_t steps, const Observation& next, absl::Status* sent);

  replay::Writer* writer_;
  TransitionLayout layout_;
  // The signature's observation field (layout_'s).
  const replay::FieldSpec* observation_ = nullptr;
  std::vector<EnvState> envs_;
  // One value per signature field; dtypes and shapes set once, data and
  // frame keys per insert.
  std::vector<replay::FieldValue> values_;
  int64_t inserted_ = 0;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_TRANSITION_WRITER_H_
