#include "common/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace troupe {
namespace {

namespace pb = google::protobuf;

// Fields that moved to another place in the schema: their names stay
// unreserved so that the parser still refuses them, and the error says where
// they went.
struct MovedField {
  const char* message;  // full name of the message that had it
  const char* field;
  const char* old_path;
  const char* new_path;
};
constexpr MovedField kMovedFields[] = {
    {"troupe.config.LearnerConfig", "replicas", "learner.replicas", "learner.engine.replicas"},
    {"troupe.config.LearnerConfig", "backend", "learner.backend", "learner.engine.collectives"},
    {"troupe.config.LearnerConfig", "threads", "learner.threads", "learner.engine.threads"},
    {"troupe.config.LearnerConfig", "seed", "learner.seed", "learner.engine.seed"},
    {"troupe.config.GanConfig", "replicas", "gan.replicas", "gan.engine.replicas"},
    {"troupe.config.GanConfig", "backend", "gan.backend", "gan.engine.collectives"},
    {"troupe.config.GanConfig", "threads", "gan.threads", "gan.engine.threads"},
    {"troupe.config.GanConfig", "seed", "gan.seed", "gan.engine.seed"},
};

const MovedField* FindMovedField(const std::string& message, const std::string& field) {
  for (const MovedField& moved : kMovedFields) {
    if (message == moved.message && field == moved.field) return &moved;
  }
  return nullptr;
}

std::string MovedHint(const MovedField& moved) {
  return absl::StrCat(moved.old_path, " is now ", moved.new_path, " (--set ", moved.new_path, "=...)");
}

std::string EnumValues(const pb::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return absl::StrJoin(names, ", ");
}

// "; write mode: RL (one of SCRIPTED, RL, GAN)" for `value` given as a string
// to enum field `field`.
std::string EnumHint(const pb::FieldDescriptor* field, const std::string& value) {
  const pb::EnumValueDescriptor* match = field->enum_type()->FindValueByName(absl::AsciiStrToUpper(value));
  return absl::StrCat(field->name(), " is a choice, written without quotes",
                      match ? absl::StrCat(": ", field->name(), ": ", match->name()) : "", " (one of ",
                      EnumValues(field->enum_type()), ")");
}

// The first enum field called `name` in `root` or any message below it.
const pb::FieldDescriptor* FindEnumField(const pb::Descriptor* root, const std::string& name) {
  std::vector<const pb::Descriptor*> todo = {root}, seen;
  while (!todo.empty()) {
    const pb::Descriptor* d = todo.back();
    todo.pop_back();
    if (std::find(seen.begin(), seen.end(), d) != seen.end()) continue;
    seen.push_back(d);
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM && f->name() == name) return f;
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) todo.push_back(f->message_type());
    }
  }
  return nullptr;
}

// Keeps the first parse error with its position, and says what would be
// right where the schema changed: a moved field's new place, an enum's
// values.
class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  FirstErrorCollector(std::string_view text, const pb::Descriptor* root) : text_(text), root_(root) {}

  void AddError(int line, int column, const std::string& message) override {
    if (!error_.empty()) return;
    error_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
    const std::string hint = Hint(line, column, message);
    if (hint.empty()) return;
    if (absl::EndsWith(error_, ".")) error_.pop_back();
    absl::StrAppend(&error_, "; ", hint);
  }
  const std::string& error() const { return error_; }

 private:
  std::string Hint(int line, int column, const std::string& message) const {
    // A field that is not in the message: moved, or a typo.
    const std::string type = QuotedAfter(message, "Message type \""), name = QuotedAfter(message, "no field named \"");
    if (!type.empty() && !name.empty()) {
      const MovedField* moved = FindMovedField(type, name);
      return moved ? MovedHint(*moved) : "";
    }
    // A quoted string for an enum: the field is the name before the colon.
    if (absl::StartsWith(message, "Expected integer or identifier")) {
      std::string_view before = Line(line).substr(0, column);
      auto strip = [&before] {
        while (!before.empty() && absl::ascii_isspace(before.back())) before.remove_suffix(1);
      };
      strip();
      if (before.empty() || before.back() != ':') return "";
      before.remove_suffix(1);
      strip();
      size_t start = before.size();
      while (start > 0 && (absl::ascii_isalnum(before[start - 1]) || before[start - 1] == '_')) --start;
      const pb::FieldDescriptor* field = FindEnumField(root_, std::string(before.substr(start)));
      return field ? EnumHint(field, QuotedAfter(message, "got: \"")) : "";
    }
    // A value the enum does not have.
    if (absl::StartsWith(message, "Unknown enumeration value")) {
      const pb::FieldDescriptor* field = FindEnumField(root_, QuotedAfter(message, "for field \""));
      return field ? absl::StrCat("(one of ", EnumValues(field->enum_type()), ")") : "";
    }
    return "";
  }

  // The text between `prefix` and the next '"' in `message`, "" without `prefix`.
  static std::string QuotedAfter(std::string_view message, std::string_view prefix) {
    const size_t at = message.find(prefix);
    if (at == std::string_view::npos) return "";
    message.remove_prefix(at + prefix.size());
    return std::string(message.substr(0, message.find('"')));
  }

  std::string_view Line(int line) const {
    std::string_view rest = text_;
    for (int i = 0; i < line; ++i) {
      const size_t newline = rest.find('\n');
      if (newline == std::string_view::npos) return {};
      rest.remove_prefix(newline + 1);
    }
    return rest.substr(0, rest.find('\n'));
  }

  std::string_view text_;
  const pb::Descriptor* root_;
  std::string error_;
};

std::string FieldNames(const pb::Descriptor* descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor->field_count(); ++i) names.push_back(descriptor->field(i)->name());
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status ParseTextConfig(std::string_view text, const std::string& name, pb::Message* message) {
  FirstErrorCollector errors(text, message->GetDescriptor());
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", errors.error()));
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(std::string_view assignment_view, pb::Message* message) {
  const std::string assignment(assignment_view);
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": expected path.to.field=value"));
  }
  const std::string path = assignment.substr(0, equals);
  const std::string value(assignment.substr(equals + 1));
  // Walk the path down to the field's message.
  pb::Message* current = message;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto* descriptor = current->GetDescriptor();
    const auto* field = descriptor->FindFieldByName(parts[i]);
    if (!field) {
      if (const MovedField* moved = FindMovedField(descriptor->full_name(), parts[i])) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", MovedHint(*moved)));
      }
      return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", descriptor->name(), " has no field '",
                                                     parts[i], "' (it has: ", FieldNames(descriptor), ")"));
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", assignment, ": '", parts[i], "' is a list; edit it in the config file"));
    }
    const bool last = i + 1 == parts.size();
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
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
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING &&
        (literal.empty() || literal.front() != '"')) {
      literal = absl::StrCat("\"", absl::CEscape(literal), "\"");
    }
    // Parsed quietly: the error is ours to report.
    FirstErrorCollector errors(literal, current->GetDescriptor());
    pb::TextFormat::Parser parser;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFieldValueFromString(literal, field, current)) {
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": '", value, "' is not a value of ",
                                                       path, " (one of ", EnumValues(field->enum_type()), ")"));
      }
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
