// The evaluator's current episode, followed over gRPC (`troupe view --live
// HOST:PORT`, proto/episodes.proto): each message is a physics state that
// is applied by setting time/qpos/qvel/act and calling mj_forward, so no
// pixels cross the wire. The viewer replays states at the task's pace
// (speed keys apply); the evaluator produces them faster, in bursts, so
// they queue here.
//
// Threading: a reader thread this object owns receives states into a
// queue (guarded by mutex_); the EpisodeSource methods run on the physics
// thread and take from it. PrepareStep waits at most 100 ms for a state and
// otherwise reports an idle step, so the physics thread stays responsive
// to pause, reset and shutdown. The destructor cancels the call and joins.
#ifndef TROUPE_VIZ_SOURCES_LIVE_H_
#define TROUPE_VIZ_SOURCES_LIVE_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "proto/episodes.grpc.pb.h"
#include "viz/sources/interface.h"

namespace troupe::viz {

class LiveEpisodes : public EpisodeSource {
 public:
  // States queued beyond this drop the oldest whole episodes.
  static constexpr size_t kMaxQueuedStates = 20000;

  // Connects to the evaluator's stream at `address` and waits up to
  // `connect_timeout` for its greeting, which names the task; then builds
  // that task's model. `credentials`: TLS and the token
  // (common/grpc_security.h; none: loopback only). Errors: FailedPrecondition
  // for credentials that cannot reach the address (beyond loopback without
  // TLS); Unavailable naming the address (and what to check, with the last
  // call's error: a refused token or handshake shows there) if nothing
  // answers in time; the greeting's unknown task as MakeEnv says it. A
  // stream that breaks later is re-followed every second; the HUD shows
  // "reconnecting".
  static absl::StatusOr<std::unique_ptr<LiveEpisodes>> Create(const std::string& address,
                                                              absl::Duration connect_timeout = absl::Seconds(10),
                                                              const GrpcCredentials& credentials = {});
  ~LiveEpisodes() override;

  const mjModel* model() const override { return env_->model(); }
  const mjData* data() const override { return data_; }
  const envs::EnvSpec& spec() const override { return env_->spec(); }
  double step_seconds() const override { return step_seconds_; }
  std::string Describe() const override;
  std::string Version() const override;
  const std::string& task() const { return task_; }

  // The episode's next state: the queue's next step 0 if one is there (a new
  // episode now), else the state shown stays until the stream's next episode.
  absl::StatusOr<SourceStep> ApplyReset() override;
  absl::Status PrepareStep() override;
  absl::StatusOr<SourceStep> ApplyStep() override;

  // States received so far (tests).
  int64_t received() const;

 private:
  LiveEpisodes(std::string address) : address_(std::move(address)) {}
  // The reader thread: follows, reconnecting until stopped.
  void ReadLoop(std::stop_token stop);
  // Sets data_ to `state` and runs mj_forward.
  void Apply(const proto::EpisodeState& state);

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::EpisodeStream::Stub> stub_;
  std::string task_;
  int action_repeat_ = 1;
  std::unique_ptr<envs::Environment> env_;  // the task's model and spec (its own data unused)
  mjData* data_ = nullptr;                  // the replayed state; physics thread only
  double step_seconds_ = 0;

  // Shared with the reader thread.
  mutable absl::Mutex mutex_;
  std::deque<proto::EpisodeState> queue_ ABSL_GUARDED_BY(mutex_);
  std::optional<proto::EpisodeState> greeting_ ABSL_GUARDED_BY(mutex_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mutex_) = nullptr;  // the call in flight
  bool connected_ ABSL_GUARDED_BY(mutex_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mutex_);  // how the last call ended, if it failed
  int64_t received_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;  // the destructor runs: stop waiting to reconnect
  int64_t parameter_version_ = -1;            // of the last applied state; physics thread only

  // The physics thread's current step.
  std::optional<proto::EpisodeState> next_;
  bool mid_episode_ = false;  // a state after step 0 has been applied since the last reset
  std::vector<float> action_;
  std::jthread reader_;  // last: stopped and joined first
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_SOURCES_LIVE_H_
