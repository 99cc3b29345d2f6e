#include "actors/actor.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "actors/item_writer.h"
#include "actors/observation_stack.h"
#include "actors/parameter_client.h"
#include "actors/transition_writer.h"
#include "agents/policies.h"
#include "common/grpc_security.h"
#include "common/status_macros.h"
#include "envs/env_pool.h"
#include "replay/grpc_client.h"

namespace troupe::actors {

absl::Status ValidateActorsConfig(const config::ActorsConfig& actors) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (actors.count() < 0 || actors.count() > kMaxActors) {
    return bad("actors.count ", actors.count(), ": must be in [0, ", kMaxActors, "] (processes on this machine)");
  }
  if (actors.max_restarts() < 0) return bad("actors.max_restarts ", actors.max_restarts(), ": must be >= 0");
  const struct {
    const char* name;
    double value;
  } non_negative[] = {{"noise_min", actors.noise_min()},
                      {"noise_max", actors.noise_max()},
                      {"noise_initial", actors.noise_initial()},
                      {"noise_decay_frames", double(actors.noise_decay_frames())},
                      {"random_frames", double(actors.random_frames())}};
  for (const auto& [name, value] : non_negative) {
    // !(>= 0) also refuses NaN.
    if (!(value >= 0) || std::isinf(value)) return bad("actors.", name, " ", value, ": must be finite and >= 0");
  }
  if (actors.authentication_timeout_s() < 0) {
    return bad("actors.authentication_timeout_s ", actors.authentication_timeout_s(), ": must be >= 0 (0 = retry forever)");
  }
  if (actors.noise_max() < actors.noise_min()) {
    return bad("actors.noise_max ", actors.noise_max(), ": must be >= actors.noise_min ", actors.noise_min());
  }
  return absl::OkStatus();
}

absl::StatusOr<TransitionLayout> ActorTransitionLayout(const config::ExperimentConfig& config,
                                                       const agents::ObservationSpec& spec, int action_size) {
  TransitionLayout layout;
  ASSIGN_OR_RETURN(layout.signature, agents::TransitionSignature(spec, action_size));
  const agents::ReplayItem item = agents::ActorReplayItem(config);
  layout.n_step = item.n_step;
  layout.discount = item.discount;
  return layout;
}

namespace {

// The actor's connection to replay: a writer and the agent's item writer
// on it, remade after the learner goes away.
struct Connection {
  std::unique_ptr<replay::ReplayClient> client;
  std::unique_ptr<replay::Writer> writer;
  std::unique_ptr<ItemWriter> items;
};

absl::Status Connect(const std::string& address, const GrpcCredentials& credentials,
                     const config::ExperimentConfig& config, const agents::ObservationSpec& spec, int action_size,
                     int num_envs, Connection* c) {
  c->items.reset();
  c->writer.reset();
  c->client = replay::NewGrpcClient(address, {.credentials = credentials});
  // Resumable: a broken stream is resumed with nothing lost or inserted
  // twice; its frame window holds every env's items.
  ASSIGN_OR_RETURN(c->writer, c->client->NewWriter({.frame_window = ItemFrameWindow(config, spec, num_envs),
                                                    .resumable = true}));
  ASSIGN_OR_RETURN(c->items, MakeItemWriter(config, spec, action_size, c->writer.get(), num_envs));
  return absl::OkStatus();
}

bool Retryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsCancelled(status) ||
         absl::IsAborted(status);
}

}  // namespace

absl::StatusOr<ActorStats> RunActor(const ActorOptions& options, const std::atomic<bool>* stop) {
  const config::ExperimentConfig& config = options.config;
  RETURN_IF_ERROR(ValidateActorsConfig(config.actors()));
  // TLS and the token from config.security and $TROUPE_TOKEN (common/grpc_security.h).
  ASSIGN_OR_RETURN(const GrpcCredentials credentials, LoadGrpcCredentials(config.security()));
  // The env as the agent observes it (frames stacked; the pool renders single frames).
  ASSIGN_OR_RETURN(const envs::EnvSpec observed, envs::DescribeEnv(config.env()));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(observed);
  const int action_size = observed.action_size;
  ASSIGN_OR_RETURN(auto policy, agents::CreatePolicy(config, spec, action_size));

  // The pool renders single frames; stacks are kept here and in replay.
  config::EnvConfig env_config = config.env();
  env_config.set_frame_stack(1);
  env_config.set_seed(config.env().seed() + 1000003ull * (options.index + 1));
  ASSIGN_OR_RETURN(auto pool_options, envs::EnvPoolOptions::FromConfig(env_config, config.pool()));
  pool_options.batch_size = 0;
  ASSIGN_OR_RETURN(auto pool, envs::EnvPool::Create(pool_options));
  const envs::EnvSpec& env_spec = pool->spec();
  const int n = pool->num_envs();
  const bool pixels = spec.pixels();
  ObservationStack stack(n, std::max(spec.frames, 1), spec.height, spec.width);

  // Trajectories carry the behaviour's log-probabilities (every action the
  // policy's) and, at a time limit, its value bootstrap.
  const agents::ReplayItem item = agents::ActorReplayItem(config);
  const bool trajectories = item.kind == agents::ReplayItem::Kind::kTrajectories;

  ParameterClient parameters(options.learner_address, credentials);
  Connection connection;
  RETURN_IF_ERROR(Connect(options.learner_address, credentials, config, spec, action_size, n, &connection));
  (void)parameters.WaitForFirst(options.connect_timeout_ms);

  std::mt19937_64 rng(config.env().seed() * 7919 + options.index);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> actions(size_t(n) * action_size), parameter_buffer, log_probs(trajectories ? n : 0);
  std::vector<double> episode_return(n, 0.0);
  ActorStats stats;
  auto frame_of = [&](const envs::EnvBatch& batch, int i) {
    return pixels ? batch.pixels.data() + size_t(i) * env_spec.pixel_bytes() : nullptr;
  };
  auto state_of = [&](const envs::EnvBatch& batch, int i) { return batch.state.data() + size_t(i) * env_spec.state_size; };

  ASSIGN_OR_RETURN(envs::EnvBatch batch, pool->Reset());
  auto start_all = [&]() -> absl::Status {
    for (int i = 0; i < n; ++i) {
      if (pixels) stack.Reset(i, frame_of(batch, i));
      RETURN_IF_ERROR(connection.items->Start(i, state_of(batch, i), frame_of(batch, i)));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(start_all());
  // TLS handshakes failing in a row: said once, given up after the bound.
  struct AuthenticationFailures {
    const ActorOptions& options;
    const GrpcCredentials& credentials;
    std::optional<std::chrono::steady_clock::time_point> since;
    absl::Status Failed(const absl::Status& status) {
      const std::string why = ExplainTlsFailure(status, credentials, options.learner_address);
      if (why.empty()) return absl::OkStatus();
      const int limit = options.config.actors().authentication_timeout_s();
      const auto now = std::chrono::steady_clock::now();
      if (!since) {
        since = now;
        std::fprintf(stderr, "actor %d: %s; retrying, %s\n", options.index, why.c_str(),
                     limit > 0 ? absl::StrCat("giving up after ", limit, " s (actors.authentication_timeout_s)").c_str()
                               : "for as long as it takes (actors.authentication_timeout_s 0)");
      }
      if (limit > 0 && now - *since >= std::chrono::seconds(limit)) {
        return absl::UnauthenticatedError(absl::StrCat(
            "actor ", options.index, ": gave up after ", limit, " s (actors.authentication_timeout_s): ", why));
      }
      return absl::OkStatus();
    }
    void Succeeded() { since.reset(); }
  } authentication{options, credentials, std::nullopt};
  std::chrono::milliseconds backoff(100);
  constexpr std::chrono::milliseconds kMaxBackoff(5000);
  // Ends the writer's account: what replay acknowledged counts as written,
  // the rest as lost; returns the lost.
  const auto settle_writer = [&] {
    const int64_t lost = connection.writer->items_unacknowledged();
    stats.transitions += connection.items->items_inserted() - lost;
    stats.transitions_lost += lost;
    return lost;
  };
  constexpr int kFlushEvery = 16;  // pool steps between waits for replay's acknowledgement
  int steps_since_flush = 0;
  while (!(stop && stop->load()) && (options.max_frames == 0 || stats.frames < options.max_frames)) {
    // A newer policy, if one arrived, between env steps.
    if (parameters.TakeNewer(&stats.parameter_version, &parameter_buffer)) {
      RETURN_IF_ERROR(policy->SetParameters(parameter_buffer));
    }
    // Act: random at first (transitions), then the policy with this actor's exploration.
    if (!trajectories && (stats.parameter_version == 0 || stats.frames < config.actors().random_frames())) {
      for (float& a : actions) a = uniform(rng);
    } else {
      RETURN_IF_ERROR(policy->Explore(pixels ? nullptr : batch.state.data(), pixels ? stack.Stacked() : nullptr, n,
                                      {.actor = options.index, .frames = stats.frames}, rng, actions.data(),
                                      trajectories ? log_probs.data() : nullptr));
    }
    ASSIGN_OR_RETURN(batch, pool->Step(actions));

    // Record each env's step (or its new episode) in replay. A send that
    // fails leaves its transitions queued in the writer: every env's step
    // is still recorded, and the stream is resumed below.
    absl::Status write_status;
    for (int i = 0; i < n; ++i) {
      const auto type = static_cast<envs::StepType>(batch.step_type[i]);
      absl::Status recorded;
      if (type == envs::StepType::kFirst) {
        if (pixels) stack.Reset(i, frame_of(batch, i));
        recorded = connection.items->Start(i, state_of(batch, i), frame_of(batch, i));
      } else {
        if (pixels) stack.Push(i, frame_of(batch, i));
        stats.frames += env_spec.action_repeat;
        episode_return[i] += batch.reward[i];
        const bool last = type == envs::StepType::kLast;
        ActorStep step{.action = &actions[size_t(i) * action_size],
                       .reward = batch.reward[i],
                       .discount = batch.discount[i],
                       .last = last,
                       .state = state_of(batch, i),
                       .frame = frame_of(batch, i)};
        if (trajectories) {
          step.log_prob = log_probs[i];
          step.policy_version = stats.parameter_version;
          if (last && batch.discount[i] > 0) {
            // V of env i's last observation: its state, or its stack (just pushed).
            const uint8_t* stacked =
                pixels ? stack.Stacked() + size_t(i) * spec.frames * env_spec.pixel_bytes() : nullptr;
            RETURN_IF_ERROR(policy->Values(pixels ? nullptr : state_of(batch, i), stacked, 1, &step.bootstrap_value));
          }
        }
        recorded = connection.items->Step(i, step);
        if (last) {
          ++stats.episodes;
          stats.last_return = episode_return[i];
          std::printf("actor %d: episode %ld return %.1f frames %ld params v%ld %s\n", options.index,
                      long(stats.episodes), episode_return[i], long(stats.frames), long(stats.parameter_version),
                      policy->DescribeExploration({.actor = options.index, .frames = stats.frames}).c_str());
          std::fflush(stdout);
          episode_return[i] = 0;
        }
      }
      if (!recorded.ok() && !Retryable(recorded)) return recorded;
      write_status.Update(recorded);
    }
    // Every few steps, wait until what was sent is in replay: this is where
    // the learner's rate limiter holds actors back (without it, transport
    // buffers would let an actor run thousands of steps ahead).
    if (write_status.ok() && ++steps_since_flush >= kFlushEvery) {
      write_status = connection.writer->Flush();
      steps_since_flush = 0;
      // Replay acknowledged: the connection works (and is authenticated);
      // the backoff starts afresh. (Steps between flushes only buffer.)
      if (write_status.ok()) {
        authentication.Succeeded();
        backoff = std::chrono::milliseconds(100);
      }
    }
    if (write_status.ok()) continue;
    if (!Retryable(write_status)) return write_status;
    // Stopping while the learner stops too: nothing to resume.
    if (stop && stop->load() && replay::IsReplayShuttingDown(write_status)) break;
    // A TLS handshake that fails is said in troupe's words, and given up
    // after actors.authentication_timeout_s (a wrong CA does not heal).
    RETURN_IF_ERROR(authentication.Failed(write_status));
    // Replay went away: resume the insert stream with backoff. Its
    // unacknowledged transitions are re-sent, and replay skips those it
    // had: nothing is lost or inserted twice, and episodes go on.
    std::fprintf(stderr, "actor %d: replay unavailable (%s); resuming the insert stream with backoff from %ld ms\n",
                 options.index, std::string(write_status.message()).c_str(), long(backoff.count()));
    const auto broke = std::chrono::steady_clock::now();
    const int64_t waiting = connection.writer->items_unacknowledged();
    int tries = 0;
    absl::Status resumed = write_status;
    while (!resumed.ok() && !(stop && stop->load())) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
      ++tries;
      resumed = connection.writer->Resume();
      if (absl::IsFailedPrecondition(resumed)) {
        // Replay no longer has this writer's session (the learner
        // restarted): what it had not acknowledged is lost; a new stream
        // starts every env's transitions afresh from its current observation.
        const int64_t lost = settle_writer();
        std::fprintf(stderr, "actor %d: %s; %ld transitions lost, starting a new insert stream\n", options.index,
                     std::string(resumed.message()).c_str(), long(lost));
        resumed = Connect(options.learner_address, credentials, config, spec, action_size, n, &connection);
        if (resumed.ok()) resumed = start_all();
      }
      if (resumed.ok()) break;
      if (!Retryable(resumed)) return resumed;
      RETURN_IF_ERROR(authentication.Failed(resumed));
    }
    if (!resumed.ok()) break;  // stopped while replay was away
    ++stats.reconnects;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - broke).count();
    std::fprintf(stderr, "actor %d: replay insert stream resumed after %.1f s (%d tries), %ld transitions re-sent\n",
                 options.index, seconds, tries, long(waiting));
  }
  // Deliver what is queued (best effort: the learner may be gone); what
  // replay never acknowledged is counted as lost. A stream that broke is
  // resumed once, unless replay said it is shutting down (the learner is
  // stopping: a new stream would only meet a closed replay).
  if (connection.writer) {
    absl::Status closed = connection.writer->Close();
    if (!closed.ok() && Retryable(closed) && !replay::IsReplayShuttingDown(closed) &&
        connection.writer->Resume().ok()) {
      closed = connection.writer->Close();
    }
    const int64_t lost = settle_writer();
    if (!closed.ok()) {
      std::fprintf(stderr, "actor %d: the last transitions did not reach replay (%s): %ld lost\n", options.index,
                   std::string(closed.message()).c_str(), long(lost));
    }
  }
  stats.parameter_reconnects = parameters.reconnects();
  return stats;
}

}  // namespace troupe::actors
