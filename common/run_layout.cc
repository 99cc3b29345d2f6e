#include "common/run_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/status_macros.h"

namespace troupe {

std::vector<std::pair<std::string, std::string>> RunFileNames() {
  return {{"config", kConfigFile},
          {"launch", kLaunchFile},
          {"status", kStatusFile},
          {"learner_address", kLearnerAddressFile},
          {"metrics_csv", kMetricsCsvFile},
          {"metrics_jsonl", kMetricsJsonlFile},
          {"eval_csv", kEvalCsvFile},
          {"episodes_csv", kEpisodesCsvFile},
          {"learning_curve", kLearningCurveFile},
          {"fid_curve", kFidCurveFile},
          {"returns", kReturnsFile},
          {"samples", kSamplesFile},
          {"samples_folder", kSamplesFolder},
          {"report", kReportFile},
          {"checkpoints", kCheckpointsFolder},
          {"logs", kLogsFolder},
          {"videos", kVideosFolder},
          {"slurm", kSlurmFolder},
          {"secrets", kSecretsFolder},
          {"slurm_script", kSlurmScriptFile},
          {"slurm_jobs", kSlurmJobsFile},
          {"agent_checkpoint", kAgentCheckpointFile},
          {"replay_checkpoint", kReplayCheckpointFile},
          {"counters", kCountersFile}};
}

std::string RunLayout::actor_log(int index) const { return absl::StrCat(logs(), "/actor-", index, ".log"); }

std::string RunLayout::slurm_output(const std::string& job_id) const {
  return absl::StrCat(slurm(), "/job-", job_id, ".out");
}

std::string RunLayout::eval_video(int64_t frames) const { return absl::StrCat(videos(), "/eval-", frames, ".mp4"); }

std::string RunLayout::samples_at(int64_t images) const {
  return absl::StrFormat("%s/samples-%09d.png", samples_folder(), images);
}

std::string RunLayout::NewestCheckpoint(bool gan) const {
  return NewestCheckpointFile(checkpoints(), gan ? kCountersFile : kAgentCheckpointFile);
}

bool RunLayout::HasConfig() const {
  std::error_code ec;
  return std::filesystem::is_regular_file(config(), ec);
}

std::optional<int64_t> EvalVideoFrames(const std::string& path) {
  absl::string_view name = path;
  if (const size_t slash = name.rfind('/'); slash != absl::string_view::npos) name.remove_prefix(slash + 1);
  int64_t frames = 0;
  if (!absl::ConsumePrefix(&name, "eval-") || !absl::ConsumeSuffix(&name, ".mp4") || !absl::SimpleAtoi(name, &frames)) {
    return std::nullopt;
  }
  return frames;
}

std::vector<std::string> LogSchema::CsvColumns() const {
  std::vector<std::string> names;
  for (const LogColumn& column : columns) {
    if (column.csv) names.emplace_back(column.name);
  }
  return names;
}

std::string LogSchema::Header() const { return absl::StrCat(absl::StrJoin(CsvColumns(), ","), "\n"); }

// The schemas, and each row's values in its schema's column order.
namespace {

// The RL metrics' platform columns: those before the agent's, then those after.
constexpr LogColumn kRlMetricsColumnsBefore[] = {
    {"seconds", 1},       {"frames", 0},      {"updates", 0},        {"updates_per_s", 2},
    {"frames_per_s", 1},  {"replay_size", 0}, {"samples_per_insert", 3}};
constexpr LogColumn kRlMetricsColumnsAfter[] = {
    {"eval_return", 2},   {"parameter_version", 0}, {"checkpoint_s", 3, /*csv=*/false},
    {"input_wait_ms", 3}, {"frames_uploaded_per_update", 2}, {"device_idle_ms", 3}};
// An agent's metric: 5 significant digits (losses and values of any scale).
constexpr int kAgentMetricDecimals = LogColumn::kSignificant;
constexpr LogColumn kRlEvalColumns[] = {{"frames", 0}, {"updates", 0}, {"eval_return", 3}, {"actions_at_bound", 3}};
constexpr LogColumn kGanMetricsColumns[] = {
    {"seconds", 1}, {"images", 0}, {"steps", 0}, {"images_per_s", 1}, {"d_loss", 5}, {"g_loss", 5},
    {"d_lr", LogColumn::kSignificant}, {"g_lr", LogColumn::kSignificant}};
constexpr LogColumn kGanEvalColumns[] = {
    {"images", 0}, {"steps", 0}, {"classifier_fid", 4}, {"classifier_score", 4}, {"seconds", 1}};
constexpr LogColumn kEpisodeColumns[] = {{"episode", 0}, {"env", 0}, {"frames", 0}, {"return", 3}, {"seconds", 2}};

double D(int64_t n) { return static_cast<double>(n); }

}  // namespace

const LogSchema& RlMetricsRow::Schema(std::span<const std::string> agent_columns) {
  // Each list's schema, its names and columns owned here for good (a run
  // has one agent; a test a few).
  struct Made {
    std::vector<std::string> names;
    std::vector<LogColumn> columns;
    LogSchema schema;
  };
  static absl::Mutex mu;
  static auto* made = new std::map<std::vector<std::string>, std::unique_ptr<Made>>();
  std::vector<std::string> key(agent_columns.begin(), agent_columns.end());
  absl::MutexLock lock(&mu);
  std::unique_ptr<Made>& m = (*made)[key];
  if (m == nullptr) {
    m = std::make_unique<Made>();
    m->names = std::move(key);
    m->columns.assign(std::begin(kRlMetricsColumnsBefore), std::end(kRlMetricsColumnsBefore));
    for (const std::string& name : m->names) m->columns.push_back({name.c_str(), kAgentMetricDecimals});
    m->columns.insert(m->columns.end(), std::begin(kRlMetricsColumnsAfter), std::end(kRlMetricsColumnsAfter));
    m->schema = LogSchema{kMetricsCsvFile, kMetricsJsonlFile, "frames", m->columns};
  }
  return m->schema;
}
std::vector<double> RlMetricsRow::Values() const {
  std::vector<double> values = {seconds,      D(frames),      D(updates),        updates_per_s,
                                frames_per_s, D(replay_size), samples_per_insert};
  values.insert(values.end(), agent.begin(), agent.end());
  for (double v : {eval_return, D(parameter_version), checkpoint_s, input_wait_ms, frames_uploaded_per_update,
                    device_idle_ms}) {
    values.push_back(v);
  }
  return values;
}

const LogSchema& RlEvalRow::Schema() {
  static constexpr LogSchema kSchema{kEvalCsvFile, nullptr, "frames", kRlEvalColumns};
  return kSchema;
}
std::vector<double> RlEvalRow::Values() const { return {D(frames), D(updates), eval_return, actions_at_bound}; }

const LogSchema& GanMetricsRow::Schema() {
  static constexpr LogSchema kSchema{kMetricsCsvFile, nullptr, "images", kGanMetricsColumns};
  return kSchema;
}
std::vector<double> GanMetricsRow::Values() const {
  return {seconds, D(images), D(steps), images_per_s, d_loss, g_loss, d_lr, g_lr};
}

const LogSchema& GanEvalRow::Schema() {
  static constexpr LogSchema kSchema{kEvalCsvFile, nullptr, "images", kGanEvalColumns};
  return kSchema;
}
std::vector<double> GanEvalRow::Values() const {
  return {D(images), D(steps), classifier_fid, classifier_score, seconds};
}

const LogSchema& EpisodeRow::Schema() {
  static constexpr LogSchema kSchema{kEpisodesCsvFile, nullptr, "frames", kEpisodeColumns};
  return kSchema;
}
std::vector<double> EpisodeRow::Values() const {
  return {D(episode), D(env), D(frames), episode_return, seconds};
}

namespace {

std::string Format(const LogColumn& column, double value) {
  if (column.decimals == LogColumn::kSignificant) return absl::StrFormat("%.6g", value);
  return absl::StrFormat("%.*f", column.decimals, value);
}

// The first line of `path` when it has a whole one ("" otherwise).
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || in.eof()) return "";
  return line;
}

}  // namespace

RunLog::RunLog(const RunLayout& run, const LogSchema& schema)
    : schema_(&schema),
      csv_(run.File(schema.csv_file), schema.Header()),
      jsonl_(schema.jsonl_file != nullptr ? run.File(schema.jsonl_file) : "") {}

std::string RunLog::CsvRow(std::span<const double> values) {
  const std::span<const LogColumn> columns = schema_->columns;
  if (!file_columns_.has_value()) {
    // The header the rows must match: the file's, or the schema's when the
    // file has none yet.
    const std::string header = FirstLine(csv_.path());
    const std::string ours = schema_->Header();
    std::vector<int> mapped;
    if (header.empty() || header + "\n" == ours) {
      for (size_t i = 0; i < columns.size(); ++i) {
        if (columns[i].csv) mapped.push_back(static_cast<int>(i));
      }
    } else {
      for (absl::string_view name : absl::StrSplit(header, ',')) {
        const auto it = std::find_if(columns.begin(), columns.end(),
                                     [&](const LogColumn& c) { return c.csv && name == c.name; });
        mapped.push_back(it == columns.end() ? -1 : static_cast<int>(it - columns.begin()));
      }
      std::fprintf(stderr,
                   "%s: its header (\"%s\") is not this troupe's (\"%s\"); rows are written with its columns, so "
                   "they match it\n",
                   csv_.path().c_str(), header.c_str(), std::string(absl::StripSuffix(ours, "\n")).c_str());
    }
    file_columns_ = std::move(mapped);
  }
  std::string row;
  for (size_t i = 0; i < file_columns_->size(); ++i) {
    if (i > 0) row.push_back(',');
    if (const int column = (*file_columns_)[i]; column >= 0) row += Format(columns[column], values[column]);
  }
  return row + "\n";
}

bool RunLog::Append(std::span<const double> values) {
  TROUPE_CHECK(values.size() == schema_->columns.size());
  const bool written = csv_.Append(CsvRow(values));
  if (schema_->jsonl_file != nullptr) {
    std::string json = "{";
    for (size_t i = 0; i < schema_->columns.size(); ++i) {
      absl::StrAppend(&json, i > 0 ? ", " : "", "\"", schema_->columns[i].name,
                      "\": ", Format(schema_->columns[i], values[i]));
    }
    jsonl_.Append(json + "}\n");
  }
  return written;
}

absl::Status RunLog::WriteHeader() { return AppendToFile(csv_.path(), "", schema_->Header()); }

absl::StatusOr<std::vector<double>> RunLog::DropRowsPast(double limit) {
  // The progress column by name in the file's header (the schema's place
  // when the header does not name it).
  int index = -1;
  const std::string header = FirstLine(csv_.path());
  const std::vector<absl::string_view> names = absl::StrSplit(header, ',');
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == schema_->progress) index = static_cast<int>(i);
  }
  if (index < 0) {
    index = 0;
    for (const LogColumn& column : schema_->columns) {
      if (column.name == std::string_view(schema_->progress)) break;
      index += column.csv ? 1 : 0;
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   troupe::DropRowsPast(csv_.path(), limit, /*header=*/true,
                                        [&](std::string_view row) { return CsvNumber(row, index); }));
  if (schema_->jsonl_file != nullptr) {
    RETURN_IF_ERROR(troupe::DropRowsPast(jsonl_.path(), limit, /*header=*/false, [&](std::string_view row) {
                      return JsonNumber(row, schema_->progress);
                    }).status());
  }
  std::vector<double> dropped;
  for (const std::string& row : rows) {
    dropped.push_back(CsvNumber(row, index).value_or(std::numeric_limits<double>::quiet_NaN()));
  }
  return dropped;
}

int CsvTable::Index(const std::string& name) const {
  const auto it = std::find(header.begin(), header.end(), name);
  return it == header.end() ? -1 : static_cast<int>(it - header.begin());
}

std::vector<double> CsvTable::Column(const std::string& name) const {
  std::vector<double> values;
  const int index = Index(name);
  if (index < 0) return values;
  for (const auto& row : rows) {
    double v = std::numeric_limits<double>::quiet_NaN();
    if (static_cast<size_t>(index) < row.size() && !absl::SimpleAtod(row[index], &v)) {
      v = std::numeric_limits<double>::quiet_NaN();
    }
    values.push_back(v);
  }
  return values;
}

std::vector<std::pair<double, double>> CsvTable::Points(const std::string& x, const std::string& y) const {
  const std::vector<double> xs = Column(x), ys = Column(y);
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
    if (!std::isnan(xs[i]) && !std::isnan(ys[i])) points.emplace_back(xs[i], ys[i]);
  }
  return points;
}

absl::StatusOr<CsvTable> ReadCsvTable(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  CsvTable table;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // The piece after the last newline is a row still being written (or "").
  lines.pop_back();
  for (absl::string_view line : lines) {
    if (line.empty()) continue;
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    if (table.header.empty()) {
      table.header = std::move(cells);
    } else {
      table.rows.push_back(std::move(cells));
    }
  }
  return table;
}

std::map<std::string, std::string> ReadKeyValues(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    values[line.substr(0, space)] = line.substr(space + 1);
  }
  return values;
}

namespace {

// The whole lines in the last 64 KB of the file at `path`, newest first: a
// line a killed writer left without its newline, and one the tail cut at its
// start, left out. Empty for a missing file.
std::vector<std::string> LastWholeLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return lines;
  const std::streamoff size = in.tellg(), tail = std::min<std::streamoff>(size, 1 << 16);
  std::string text(static_cast<size_t>(tail), '\0');
  in.seekg(size - tail);
  in.read(text.data(), tail);
  size_t end = text.rfind('\n');
  while (end != std::string::npos && end > 0) {
    const size_t begin = text.rfind('\n', end - 1);
    if (begin == std::string::npos && tail < size) break;  // cut at its start
    const size_t from = begin == std::string::npos ? 0 : begin + 1;
    lines.push_back(text.substr(from, end - from));
    if (begin == std::string::npos) break;
    end = begin;
  }
  return lines;
}

}  // namespace

double LastRunSeconds(const std::string& metrics_csv) {
  for (const std::string& row : LastWholeLines(metrics_csv)) {
    if (const std::optional<double> seconds = CsvNumber(row, 0); seconds.has_value() && *seconds >= 0) {
      return *seconds;
    }
  }
  return 0;
}

std::map<std::string, std::string> LastCsvRow(const std::string& path) {
  std::map<std::string, std::string> last;
  std::ifstream in(path);
  std::string header;
  if (!std::getline(in, header) || in.eof()) return last;  // no whole header line
  const std::vector<std::string> lines = LastWholeLines(path);
  if (lines.empty() || lines.front() == header) return last;
  const std::vector<std::string> names = absl::StrSplit(header, ','), cells = absl::StrSplit(lines.front(), ',');
  for (size_t i = 0; i < names.size() && i < cells.size(); ++i) last[names[i]] = cells[i];
  return last;
}

std::chrono::steady_clock::time_point RunClockStart(const RunLayout& run, bool resume) {
  const double seconds = resume ? LastRunSeconds(run.metrics_csv()) : 0.0;
  return std::chrono::steady_clock::now() -
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace troupe
