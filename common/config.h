// Experiment configs: protobuf text format files (configs/*.textproto) in
// the schema of proto/config.proto, with command-line overrides.
#ifndef TROUPE_COMMON_CONFIG_H_
#define TROUPE_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/config.pb.h"

namespace troupe {

// The largest config file troupe reads (a config is a few KiB).
inline constexpr int64_t kMaxConfigFileBytes = 1 << 20;

// Where each field of a loaded config was set: a line of its file, or the
// `--set` override that set it last. Field paths are written as validators
// name them: "learner.engine.replicas", "replay.tables[1].max_size".
struct ConfigSource {
  std::string file;
  // Field path -> 1-based line in `file` of the field (or the message) as
  // written there.
  absl::flat_hash_map<std::string, int> lines;
  // Field path -> the override that set it, "--set learner.batch_size=10".
  absl::flat_hash_map<std::string, std::string> overrides;

  // Says where the field a validator's message is about was set, in front of
  // the message: "FILE:LINE: MESSAGE" or "--set PATH=VALUE: MESSAGE". The
  // field is the first field path of the schema the message names that the
  // file or an override sets; when it names none that is set, the line of
  // the closest enclosing message written in the file, with the field said
  // to be at its default; "FILE: MESSAGE" when even that is not there.
  std::string Locate(absl::string_view message) const;
  // `status` with its message Locate()d (OK stays OK).
  absl::Status Annotate(const absl::Status& status) const;
};

// A config and where each of its fields came from.
struct LoadedConfig {
  config::ExperimentConfig config;
  ConfigSource source;
};

// Parses `text` as `message` in text format. Errors: InvalidArgument
// "NAME:LINE:COLUMN: what", with NAME the file name given. Configs written
// by earlier versions read as they did: see UnquoteFormerStringEnums.
// `allow_unknown_fields`: fields this version does not know are skipped
// (a reader of configs other versions wrote, as the report is).
absl::Status ParseTextConfig(std::string_view text, const std::string& name, google::protobuf::Message* message,
                             bool allow_unknown_fields = false);

// `text` with the quotes around the value of a field that was a string
// before it became an enum (replay tables' `selector` and their fields'
// `dtype`, whose enum value names are the strings earlier versions wrote)
// turned into spaces: `selector: "fifo"` reads as `selector: fifo`, every
// line and column kept. Quoted values that are no identifier, comments and
// strings elsewhere are left as they are. ParseTextConfig and
// ParseExperimentConfig apply it before parsing.
std::string UnquoteFormerStringEnums(std::string_view text);

// An enum's value names, "uniform, prioritized, fifo", for messages.
std::string EnumValues(const google::protobuf::EnumDescriptor* type);

// Applies one "path.to.field=value" override (as `--set` takes it) to
// `message`. Errors: InvalidArgument naming the override and what is wrong
// (no '=', unknown field with the fields there are, bad value).
absl::Status ApplyOverride(std::string_view assignment, google::protobuf::Message* message);

// Parses `text` as LoadExperimentConfigWithSource does with a file's
// contents (no file is read): what fuzzing and tests drive.
absl::StatusOr<LoadedConfig> ParseExperimentConfig(std::string_view text, const std::string& name,
                                                   const std::vector<std::string>& overrides);

// Reads `path`, parses it, applies `overrides` in order, recording where
// each field was set. Errors: NotFound for a missing file;
// InvalidArgument for a path that is not a regular file (a directory, a
// device, a fifo) or one over kMaxConfigFileBytes; the errors above.
// Nothing is logged: protobuf's own messages are kept from stderr.
absl::StatusOr<LoadedConfig> LoadExperimentConfigWithSource(const std::string& path,
                                                            const std::vector<std::string>& overrides);

// LoadExperimentConfigWithSource without the source.
absl::StatusOr<config::ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                              const std::vector<std::string>& overrides);

}  // namespace troupe

#endif  // TROUPE_COMMON_CONFIG_H_
