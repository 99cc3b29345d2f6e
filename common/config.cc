#include "common/config.h"

#include <fstream>
#include <sstream>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace troupe {
namespace {

// Keeps the first parse error with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

std::string FieldNames(const google::protobuf::Descriptor* descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor->field_count(); ++i) names.push_back(descriptor->field(i)->name());
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status ParseTextConfig(std::string_view text, const std::string& name, google::protobuf::Message* message) {
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", errors.error()));
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(std::string_view assignment_view, google::protobuf::Message* message) {
  const std::string assignment(assignment_view);
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": expected path.to.field=value"));
  }
  const std::string path = assignment.substr(0, equals);
  const std::string value(assignment.substr(equals + 1));
  // Walk the path down to the field's message.
  google::protobuf::Message* current = message;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto* descriptor = current->GetDescriptor();
    const auto* field = descriptor->FindFieldByName(parts[i]);
    if (!field) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", descriptor->name(), " has no field '",
                                                     parts[i], "' (it has: ", FieldNames(descriptor), ")"));
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", assignment, ": '", parts[i], "' is a list; edit it in the config file"));
    }
    const bool last = i + 1 == parts.size();
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set ", assignment, ": '", parts[i], "' is a message; set one of its fields (",
                         FieldNames(field->message_type()), ")"));
      }
      current = current->GetReflection()->MutableMessage(current, field);
      continue;
    }
    if (!last) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": '", parts[i], "' is not a message"));
    }
    // Strings may be given bare; text format wants them quoted.
    std::string literal = value;
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING &&
        (literal.empty() || literal.front() != '"')) {
      literal = absl::StrCat("\"", absl::CEscape(literal), "\"");
    }
    if (!google::protobuf::TextFormat::ParseFieldValueFromString(literal, field, current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", assignment, ": '", value, "' is not a valid ", field->type_name(), " for ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<config::ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                              const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file not found: ", path));
  std::stringstream text;
  text << in.rdbuf();
  config::ExperimentConfig config;
  RETURN_IF_ERROR(ParseTextConfig(text.str(), path, &config));
  for (const auto& assignment : overrides) RETURN_IF_ERROR(ApplyOverride(assignment, &config));
  return config;
}

}  // namespace troupe
