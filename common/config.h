// Experiment configs: protobuf text format files (configs/*.textproto) in
// the schema of proto/config.proto, with command-line overrides.
#ifndef TROUPE_COMMON_CONFIG_H_
#define TROUPE_COMMON_CONFIG_H_

#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe {

// Parses `text` as `message` in text format. Errors: InvalidArgument
// "NAME:LINE:COLUMN: what", with NAME the file name given.
absl::Status ParseTextConfig(std::string_view text, const std::string& name, google::protobuf::Message* message);

// Applies one "path.to.field=value" override (as `--set` takes it) to
// `message`. Errors: InvalidArgument naming the override and what is wrong
// (no '=', unknown field with the fields there are, bad value).
absl::Status ApplyOverride(std::string_view assignment, google::protobuf::Message* message);

// Reads `path`, parses it, applies `overrides` in order. Errors: NotFound
// for a missing file, the errors above.
absl::StatusOr<config::ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                              const std::vector<std::string>& overrides);

}  // namespace troupe

#endif  // TROUPE_COMMON_CONFIG_H_
