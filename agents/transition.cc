#include "agents/transition.h"

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

}  // namespace troupe::agents
