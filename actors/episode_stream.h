// The evaluator's episode stream (proto/episodes.proto): the evaluator
// publishes the physics state of its current episode step by step, and
// `troupe view --live HOST:PORT` follows it and replays the states in its
// own MuJoCo. Served on the learner's port (learner/rl_learner.cc).
//
// An EpisodePublisher fans each state out to the streams following it; with
// no follower, Publish costs one lock and returns. Each Follow call is a
// FollowReactor:
//   1. On start it registers with the publisher and writes the greeting
//      (task and action repeat, episode 0), so the follower can build its
//      model before the next evaluation.
//   2. Publish() appends the state to every reactor's queue (under the
//      reactor's lock) and starts a write if none is in flight. A queue of
//      kMaxQueuedStates that is full drops the new state and the rest of its
//      episode: the follower loses whole episodes, never single states.
//   3. When a write completes it writes the next queued state, else waits
//      for step 2. A failed write (client gone) finishes UNAVAILABLE.
//   4. On cancel (client gone or server shutdown) or Close() it finishes;
//      OnDone unregisters it and deletes it.
// No reaction blocks: locks guard only the queue and the reactor list.
// Lock order: the publisher's mutex, then a reactor's.
#ifndef TROUPE_ACTORS_EPISODE_STREAM_H_
#define TROUPE_ACTORS_EPISODE_STREAM_H_

#include <mujoco/mujoco.h>

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/episodes.grpc.pb.h"

namespace troupe::actors {

class EpisodePublisher {
 public:
  static constexpr size_t kMaxQueuedStates = 20000;

  EpisodePublisher(std::string task, int action_repeat) : task_(std::move(task)), action_repeat_(action_repeat) {}

  // A new episode starts: the states published next belong to it (its
  // step 0 is the state after reset). Returns the episode number (1, 2, ...).
  int64_t BeginEpisode();
  // Publishes the state `data` of `model` after `step` agent steps of the
  // current episode (`action` and `reward`: what led to it; empty and 0 at
  // step 0). Thread-safe; never blocks on a follower.
  void Publish(const mjModel* model, const mjData* data, int64_t step, bool last, std::span<const float> action,
               double reward, int64_t parameter_version);
  // Streams following now.
  int followers() const;
  // Ends every stream (server shutdown): followers finish UNAVAILABLE.
  void Close();

  // Reactor registration (see the header comment). Internal to the service.
  // OnState runs under the publisher's lock and must not call back into it.
  class Listener {
   public:
    virtual ~Listener() = default;
    // A state to send, or (null, closed = true) when the publisher closes.
    virtual void OnState(std::shared_ptr<const proto::EpisodeState> state, bool closed) = 0;
  };
  // Registers `listener` and gives it the greeting (or closed).
  void AddListener(Listener* listener);
  void RemoveListener(Listener* listener);

 private:
  const std::string task_;
  const int action_repeat_;
  mutable absl::Mutex mutex_;
  std::set<Listener*> listeners_ ABSL_GUARDED_BY(mutex_);
  int64_t episode_ ABSL_GUARDED_BY(mutex_) = 0;
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
};

class EpisodeStreamService final : public proto::EpisodeStream::CallbackService {
 public:
  // `publisher` must outlive the service and every call on it.
  explicit EpisodeStreamService(EpisodePublisher* publisher) : publisher_(publisher) {}
  grpc::ServerWriteReactor<proto::EpisodeState>* Follow(grpc::CallbackServerContext* context,
                                                        const proto::FollowRequest* request) override;

 private:
  EpisodePublisher* publisher_;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_EPISODE_STREAM_H_
