#include "agents/trajectory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::agents {

void AddTrajectoryFields(const ObservationSpec& spec, int action_size, int steps, config::ReplayTableConfig* table) {
  auto add = [&](const char* name, config::ReplayFieldConfig::DType dtype, std::initializer_list<int64_t> shape) {
    config::ReplayFieldConfig* field = table->add_fields();
    field->set_name(name);
    field->set_dtype(dtype);
    for (int64_t d : shape) field->add_shape(d);
  };
  const auto f32 = config::ReplayFieldConfig::float32;
  if (spec.pixels()) {
    add("observation", config::ReplayFieldConfig::uint8, {spec.height, spec.width, 3});
    table->mutable_fields(table->fields_size() - 1)->set_frames((steps + 1) * spec.frames);
  } else {
    add("observation", f32, {steps + 1, spec.state_size});
  }
  add("action", f32, {steps, action_size});
  add("reward", f32, {steps});
  add("discount", f32, {steps});
  add("log_prob", f32, {steps});
  add("policy_version", config::ReplayFieldConfig::int64, {});
}

absl::StatusOr<replay::Signature> TrajectorySignature(const ObservationSpec& spec, int action_size, int steps) {
  if (steps < 1) return absl::InvalidArgumentError(absl::StrCat("trajectory length ", steps, ": must be >= 1"));
  config::ReplayTableConfig table;
  table.set_name(kTrajectoryTable);
  AddTrajectoryFields(spec, action_size, steps, &table);
  return replay::Signature::FromConfig(table);
}

config::ReplayTableConfig TrajectoryTable(const ObservationSpec& spec, int action_size,
                                          const config::ExperimentConfig& config) {
  const int64_t batch = config.learner().batch_size();
  config::ReplayTableConfig table;
  table.set_name(kTrajectoryTable);
  table.set_selector(config::ReplayTableConfig::fifo);
  table.set_seed(config.learner().engine().seed());
  config::RateLimiterConfig* limiter = table.mutable_rate_limiter();
  limiter->set_min_size_to_sample(1);
  limiter->set_samples_per_insert(1.0);
  limiter->set_error_buffer(std::max<double>(2.0 * batch, 2.0));
  table.set_max_size(4 * batch + 16);
  AddTrajectoryFields(spec, action_size, config.appo().unroll_length(), &table);
  return table;
}

}  // namespace troupe::agents
