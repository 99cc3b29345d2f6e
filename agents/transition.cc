#include "agents/transition.h"

#include <algorithm>

namespace troupe::agents {

void AddTransitionFields(const ObservationSpec& spec, int action_size, config::ReplayTableConfig* table) {
  for (const TransitionFieldDeclaration& declared : kTransitionFields) {
    config::ReplayFieldConfig* field = table->add_fields();
    field->set_name(declared.name);
    field->set_dtype(config::ReplayFieldConfig::float32);
    switch (declared.value) {
      case TransitionValue::kObservation:
        if (spec.pixels()) {
          field->set_dtype(config::ReplayFieldConfig::uint8);
          for (int d : {spec.height, spec.width, 3}) field->add_shape(d);
          field->set_frames(spec.frames);
        } else {
          field->add_shape(spec.state_size);
        }
        break;
      case TransitionValue::kAction: field->add_shape(action_size); break;
      case TransitionValue::kScalar: break;
    }
  }
}

absl::StatusOr<replay::Signature> TransitionSignature(const ObservationSpec& spec, int action_size) {
  config::ReplayTableConfig table;
  table.set_name(kTransitionTable);
  AddTransitionFields(spec, action_size, &table);
  return replay::Signature::FromConfig(table);
}

config::ReplayTableConfig TransitionTable(const ObservationSpec& spec, int action_size,
                                          const config::ExperimentConfig& config) {
  const config::LearnerConfig& learner = config.learner();
  config::ReplayTableConfig table;
  table.set_name(kTransitionTable);
  table.set_max_size(learner.replay_size());
  table.set_selector(learner.prioritized() ? config::ReplayTableConfig::prioritized : config::ReplayTableConfig::uniform);
  table.set_seed(learner.engine().seed());
  config::RateLimiterConfig* limiter = table.mutable_rate_limiter();
  limiter->set_min_size_to_sample(learner.min_replay_size());
  limiter->set_samples_per_insert(learner.samples_per_insert());
  // Room for two batches either way, so one batch never waits on itself.
  limiter->set_error_buffer(std::max({100.0, 2.0 * learner.batch_size(), 2.0 * learner.samples_per_insert()}));
  AddTransitionFields(spec, action_size, &table);
  return table;
}

}  // namespace troupe::agents
