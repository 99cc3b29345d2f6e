// Turns each env's stream of timesteps into n-step transitions
// (obs_t, a_t, sum_j<n gamma^j r_t+j, gamma^n, obs_t+n), as Acme's
// NStepTransitionAdder does, and inserts them into replay's "transitions"
// table (the D4PG signature: observation, action, reward, discount,
// next_observation). At an episode's end the pending steps are flushed with
// shorter returns and their own gamma^m (control tasks end by time limit, so
// the last observation is bootstrapped from, not treated as terminal).
//
// Pixels: each env's newest frame is appended to the writer once; a stacked
// observation is the list of its last k frame keys (the first frame repeats
// at the start of an episode), so replay stores every frame once.
//
// Not thread-safe: one owner thread.
#ifndef TROUPE_ACTORS_TRANSITION_WRITER_H_
#define TROUPE_ACTORS_TRANSITION_WRITER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "replay/client.h"

namespace troupe::actors {

struct TransitionLayout {
  int state_size = 0;  // > 0: state observations of this many floats
  int frames = 0;      // > 0: pixel observations, a stack of this many frames
  int height = 0, width = 0;
  int action_size = 0;
  int n_step = 1;
  float discount = 0.99f;
  std::string table = "transitions";
};

class TransitionWriter {
 public:
  TransitionWriter(replay::Writer* writer, int num_envs, const TransitionLayout& layout);

  // The first observation of env `env`'s episode (state [S] or the newest
  // frame [H, W, 3]). Forgets anything pending for it.
  absl::Status Start(int env, const float* state, const uint8_t* frame);

  // One step of env `env`: the action taken from its previous observation,
  // the reward and env discount, whether the episode ended, and the new
  // observation. Inserts the transitions that became complete. A send
  // that fails (replay unreachable) is returned only after the step is
  // wholly recorded: its transitions stay queued in the writer (a
  // resumable writer re-sends them on Resume), so an episode is never cut.
  absl::Status Step(int env, const float* action, float reward, float discount, bool last, const float* state,
                    const uint8_t* frame);

  // Drops every env's pending steps (after replay was lost and reconnected:
  // nothing half-written is kept). Envs must Start again.
  void Clear();

  // Transitions handed to the writer (queued or sent).
  int64_t transitions_inserted() const { return inserted_; }

 private:
  // One observation: the state vector or the frame-key stack.
  struct Observation {
    std::vector<float> state;
    std::vector<uint64_t> frames;
  };
  struct Pending {
    Observation observation;
    std::vector<float> action;
    float reward = 0;
    float discount = 1;
  };
  struct EnvState {
    bool started = false;
    Observation current;
    std::deque<Pending> pending;
  };

  absl::StatusOr<Observation> Observe(const EnvState& env, const float* state, const uint8_t* frame, bool first);
  // Inserts pending[0] with the n-step return of the first `steps`
  // pendings. An item the writer queued but could not send is recorded as
  // inserted, and the send's error goes to *sent.
  absl::Status InsertFront(EnvState& env, size_t steps, const Observation& next, absl::Status* sent);

  replay::Writer* writer_;
  TransitionLayout layout_;
  std::vector<EnvState> envs_;
  int64_t inserted_ = 0;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_TRANSITION_WRITER_H_
