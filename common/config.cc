#include "common/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
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

// Fields that were strings before they became enums whose value names are
// those strings: configs written earlier quote their values.
constexpr const char* kFormerStringEnums[] = {"dtype", "selector"};

std::string MovedHint(const MovedField& moved) {
  return absl::StrCat(moved.old_path, " is now ", moved.new_path, " (--set ", moved.new_path, "=...)");
}

// "; write mode: RL (one of SCRIPTED, RL, GAN)" for `value` given as a string
// to enum field `field`.
std::string EnumHint(const pb::FieldDescriptor* field, const std::string& value) {
  const pb::EnumValueDescriptor* match = field->enum_type()->FindValueByName(value);
  if (match == nullptr) match = field->enum_type()->FindValueByName(absl::AsciiStrToUpper(value));
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
    // The parser reports a bad name or enum value where it stopped, after
    // it: point at the name itself.
    for (const char* prefix : {"no field named \"", "Unknown enumeration value of \""}) {
      const std::string name = QuotedAfter(message, prefix);
      if (!name.empty()) Rewind(name, &line, &column);
    }
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

  // Moves (line, column) back to the start of the last `token` at or before
  // it, when there is one.
  void Rewind(const std::string& token, int* line, int* column) const {
    size_t offset = 0;
    for (int i = 0; i < *line; ++i) {
      const size_t newline = text_.find('\n', offset);
      if (newline == std::string_view::npos) return;
      offset = newline + 1;
    }
    offset = std::min(text_.size(), offset + static_cast<size_t>(std::max(*column, 0)));
    const size_t at = text_.substr(0, offset).rfind(token);
    if (at == std::string_view::npos) return;
    int l = 0;
    size_t line_start = 0;
    for (size_t i = 0; i < at; ++i) {
      if (text_[i] == '\n') {
        ++l;
        line_start = i + 1;
      }
    }
    *line = l;
    *column = static_cast<int>(at - line_start);
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

// Records in *lines the 1-based line of every field `tree` saw written in
// `message`, by field path under `prefix`; a list's path gets its first
// element's line.
void RecordLines(const pb::Message& message, const pb::TextFormat::ParseInfoTree* tree, const std::string& prefix,
                 absl::flat_hash_map<std::string, int>* lines) {
  if (tree == nullptr) return;
  const pb::Reflection* reflection = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    const bool is_message = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (!field->is_repeated()) {
      const pb::TextFormat::ParseLocation at = tree->GetLocation(field, -1);
      if (at.line >= 0) lines->try_emplace(path, at.line + 1);
      if (is_message) {
        RecordLines(reflection->GetMessage(message, field), tree->GetTreeForNested(field, -1), path, lines);
      }
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      const pb::TextFormat::ParseLocation at = tree->GetLocation(field, i);
      if (at.line < 0) continue;
      const std::string element = absl::StrCat(path, "[", i, "]");
      lines->try_emplace(element, at.line + 1);
      lines->try_emplace(path, at.line + 1);
      if (is_message) {
        RecordLines(reflection->GetRepeatedMessage(message, field, i), tree->GetTreeForNested(field, i), element,
                    lines);
      }
    }
  }
}

// True when `path` ("learner.engine.replicas", "replay.tables[0].name",
// "learner.engine.seed") names a field of `root`'s schema.
bool IsSchemaPath(const pb::Descriptor* root, absl::string_view path) {
  const pb::Descriptor* current = root;
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::string_view part = parts[i];
    bool indexed = false;
    if (const size_t bracket = part.find('['); bracket != absl::string_view::npos) {
      int index = 0;
      if (part.back() != ']' || !absl::SimpleAtoi(part.substr(bracket + 1, part.size() - bracket - 2), &index)) {
        return false;
      }
      part = part.substr(0, bracket);
      indexed = true;
    }
    if (current == nullptr) return false;
    const pb::FieldDescriptor* field = current->FindFieldByName(std::string(part));
    if (field == nullptr || (indexed && !field->is_repeated())) return false;
    current = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ? field->message_type() : nullptr;
  }
  return true;
}

// The words of `message` that could be field paths, in order.
std::vector<std::string> PathCandidates(absl::string_view message) {
  std::vector<std::string> out;
  size_t i = 0;
  auto path_char = [](char c) { return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '[' || c == ']'; };
  while (i < message.size()) {
    if (!path_char(message[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < message.size() && path_char(message[end])) ++end;
    absl::string_view word = message.substr(i, end - i);
    while (!word.empty() && word.back() == '.') word.remove_suffix(1);
    if (!word.empty() && absl::ascii_islower(word.front())) out.emplace_back(word);
    i = end;
  }
  return out;
}

}  // namespace

std::string ConfigSource::Locate(absl::string_view message) const {
  const pb::Descriptor* root = config::ExperimentConfig::descriptor();
  std::vector<std::string> paths;
  for (std::string& candidate : PathCandidates(message)) {
    if (IsSchemaPath(root, candidate)) paths.push_back(std::move(candidate));
  }
  // The line of the file that sets `path`, or "".
  auto file_line = [&](const std::string& path) -> std::string {
    if (auto it = lines.find(path); it != lines.end()) return absl::StrCat(file, ":", it->second);
    // An element of a list written as one [a, b, c]: the list's line.
    if (path.back() == ']') {
      const std::string list = path.substr(0, path.rfind('['));
      if (auto it = lines.find(list); it != lines.end()) return absl::StrCat(file, ":", it->second);
    }
    return "";
  };
  // An override of any field named wins: applied last, it is what made the
  // config refused (a batch size the file set, divided by replicas a --set
  // changed, is the --set's doing). The file's line of the first other field
  // named follows.
  for (const std::string& path : paths) {
    for (const auto& [overridden, assignment] : overrides) {
      if (overridden != path && !absl::StartsWith(overridden, absl::StrCat(path, "."))) continue;
      for (const std::string& other : paths) {
        if (other == path) continue;
        if (const std::string where = file_line(other); !where.empty()) {
          return absl::StrCat(assignment, ": ", message, " (", other, " is set at ", where, ")");
        }
      }
      return absl::StrCat(assignment, ": ", message);
    }
  }
  // Else the first field named that the file sets.
  for (const std::string& path : paths) {
    if (const std::string where = file_line(path); !where.empty()) return absl::StrCat(where, ": ", message);
  }
  // None is set: at its default. The closest enclosing message written.
  if (!paths.empty()) {
    absl::string_view enclosing = paths.front();
    while (true) {
      const size_t dot = enclosing.rfind('.');
      if (dot == absl::string_view::npos) break;
      enclosing = enclosing.substr(0, dot);
      if (auto it = lines.find(enclosing); it != lines.end()) {
        return absl::StrCat(file, ":", it->second, ": ", message, " (", paths.front(),
                            " is not set in the file: that is its default)");
      }
    }
    return absl::StrCat(file, ": ", message, " (", paths.front(), " is not set in the file: that is its default)");
  }
  return absl::StrCat(file, ": ", message);
}

absl::Status ConfigSource::Annotate(const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), Locate(status.message()));
}

std::string EnumValues(const google::protobuf::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return absl::StrJoin(names, ", ");
}

std::string UnquoteFormerStringEnums(std::string_view written) {
  std::string text(written);
  const auto identifier = [](char c) { return absl::ascii_isalnum(c) || c == '_'; };
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const char c = text[i];
    if (c == '#') {  // a comment, to the line's end
      while (i < n && text[i] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {  // a string, with its escapes
      for (++i; i < n && text[i] != c && text[i] != '\n'; ++i) {
        if (text[i] == '\\') ++i;
      }
      ++i;
      continue;
    }
    if (!identifier(c)) {
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < n && identifier(text[i])) ++i;
    const std::string_view name(text.data() + start, i - start);
    if (std::find(std::begin(kFormerStringEnums), std::end(kFormerStringEnums), name) ==
        std::end(kFormerStringEnums)) {
      continue;
    }
    // NAME: "value" with an identifier for value: the quotes become spaces.
    size_t j = i;
    while (j < n && absl::ascii_isspace(text[j])) ++j;
    if (j >= n || text[j] != ':') continue;
    ++j;
    while (j < n && absl::ascii_isspace(text[j])) ++j;
    if (j >= n || (text[j] != '"' && text[j] != '\'')) continue;
    size_t k = j + 1;
    while (k < n && identifier(text[k])) ++k;
    if (k == j + 1 || k >= n || text[k] != text[j] || absl::ascii_isdigit(text[j + 1])) continue;
    text[j] = text[k] = ' ';
    i = k + 1;
  }
  return text;
}

namespace {

// ParseTextConfig, recording where each field was written into *tree when
// given; protobuf logs nothing meanwhile.
absl::Status ParseText(std::string_view written, const std::string& name, pb::Message* message,
                       pb::TextFormat::ParseInfoTree* tree, bool allow_unknown_fields = false) {
  const std::string text = UnquoteFormerStringEnums(written);
  const pb::LogSilencer quiet;
  FirstErrorCollector errors(text, message->GetDescriptor());
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(allow_unknown_fields);
  if (tree != nullptr) parser.WriteLocationsTo(tree);
  if (!parser.ParseFromString(text, message)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ":", errors.error().empty() ? "1:1: does not parse" : errors.error()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTextConfig(std::string_view text, const std::string& name, pb::Message* message,
                             bool allow_unknown_fields) {
  return ParseText(text, name, message, nullptr, allow_unknown_fields);
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
    const pb::LogSilencer quiet;
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

absl::StatusOr<LoadedConfig> ParseExperimentConfig(std::string_view text, const std::string& name,
                                                   const std::vector<std::string>& overrides) {
  LoadedConfig loaded;
  loaded.source.file = name;
  pb::TextFormat::ParseInfoTree tree;
  RETURN_IF_ERROR(ParseText(text, name, &loaded.config, &tree));
  RecordLines(loaded.config, &tree, "", &loaded.source.lines);
  for (const std::string& assignment : overrides) {
    RETURN_IF_ERROR(ApplyOverride(assignment, &loaded.config));
    const std::string path = assignment.substr(0, assignment.find('='));
    loaded.source.overrides[path] = absl::StrCat("--set ", assignment);
  }
  return loaded;
}

absl::StatusOr<LoadedConfig> LoadExperimentConfigWithSource(const std::string& path,
                                                            const std::vector<std::string>& overrides) {
  // Only a regular file of a sane size: a directory would read as an empty
  // (default) config, a device or fifo might never end.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("config file not found: ", path));
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", path, ": not a regular file (",
        S_ISDIR(st.st_mode) ? "a directory" : "a device, fifo or socket",
        "); give an experiment config, e.g. configs/cartpole_swingup_state.textproto"));
  }
  if (st.st_size > kMaxConfigFileBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", st.st_size,
                                                   " bytes, more than a config can be (", kMaxConfigFileBytes, ")"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return ParseExperimentConfig(text, path, overrides);
}

absl::StatusOr<config::ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                              const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(LoadedConfig loaded, LoadExperimentConfigWithSource(path, overrides));
  return std::move(loaded.config);
}

}  // namespace troupe
