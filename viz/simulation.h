// The viewer's physics thread (MuJoCo simulate's pattern): an EpisodeSource
// advanced in simulated real time, times a speed factor, on a thread this
// object owns; the drawing thread reads the state under a mutex.
//
// Locking: `mutex_` guards the source's mjData, `status_` and the request
// fields. The physics thread holds it while a step or reset mutates the
// state (not while the policy runs); Read() holds it for the caller's
// callback, which must be short (mjv_updateScene and a few copies).
#ifndef TROUPE_VIZ_SIMULATION_H_
#define TROUPE_VIZ_SIMULATION_H_

#include <condition_variable>
#include <future>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "viz/sources/interface.h"

namespace troupe::viz {

// What the drawing thread shows of the simulation.
struct SimulationStatus {
  int64_t episode = 0;  // episodes started, 1 = the first
  int64_t step = 0;     // agent steps in this episode
  int64_t total_steps = 0;
  double episode_return = 0;
  double last_episode_return = 0;  // of the last finished episode
  bool has_last_episode = false;
  std::vector<float> action;  // the last applied action (zeros before the first step)
  std::vector<float> action_minimum, action_maximum;
  std::vector<uint8_t> pixels;  // the agent's newest pixel frame, RGB top-down
  int pixel_width = 0, pixel_height = 0;
  bool paused = false;
  double speed = 1;             // simulated seconds per wall second
  double steps_per_second = 0;  // measured over the last second
  std::string policy;           // EpisodeSource::Describe
  std::string version;          // EpisodeSource::Version
  absl::Status error;           // the source's error that stopped the physics, if any
};

struct SimulationOptions {
  bool start_paused = false;
  double speed = 1;
};

class Simulation {
 public:
  // Makes the source with `make_source` on the physics thread (an env
  // renders its pixels on an EGL context of the thread that steps it, and a
  // thread may have only one current GL context: the main thread's is the
  // window's), resets it, then starts stepping. Blocks until that is done.
  // Errors: make_source's and the first ApplyReset's.
  using SourceFactory = std::function<absl::StatusOr<std::unique_ptr<EpisodeSource>>()>;
  static absl::StatusOr<std::unique_ptr<Simulation>> Create(SourceFactory make_source,
                                                            const SimulationOptions& options);
  // Stops and joins the physics thread.
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  const mjModel* model() const { return source_->model(); }
  const envs::EnvSpec& spec() const { return source_->spec(); }

  // Calls `fn` with the current state and status under the lock.
  void Read(const std::function<void(const mjModel*, const mjData*, const SimulationStatus&)>& fn) const;

  // Requests, each taking effect on the physics thread. Non-blocking.
  void SetPaused(bool paused);
  void TogglePaused();
  void RequestStep();   // one agent step; only while paused
  void RequestReset();  // a new episode now
  void ScaleSpeed(double factor);  // clamped to [1/64, 64]

  // Blocks until every request made so far has been carried out (tests use
  // it to make a key press deterministic). False on timeout.
  bool WaitUntilIdle(absl::Duration timeout) const;

 private:
  explicit Simulation(const SimulationOptions& options);
  // Makes the source and resets it; then steps until `stop`.
  absl::Status Start(const SourceFactory& make_source);
  void Loop(std::stop_token stop);
  // Apply a reset or a step under the lock and fold it into status_.
  absl::Status ResetLocked();
  // A new episode in status_ (counters zeroed), starting with `step`.
  void BeginEpisodeLocked(const SourceStep& step);
  void Record(const SourceStep& step);

  std::unique_ptr<EpisodeSource> source_;  // made, used and destroyed on the physics thread
  SimulationOptions options_;
  mutable std::mutex mutex_;
  mutable std::condition_variable_any changed_;
  SimulationStatus status_;
  int pending_steps_ = 0;
  bool pending_reset_ = false;
  bool busy_ = false;           // the physics thread is carrying out a request
  bool resync_clock_ = true;    // pacing restarts (after pause, speed change, reset)
  std::jthread thread_;         // last: joined before the members above go
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_SIMULATION_H_
