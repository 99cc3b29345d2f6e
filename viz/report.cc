#include "viz/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/files.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "proto/config.pb.h"

namespace troupe::viz {
namespace fs = std::filesystem;
namespace {

// Line colours (matplotlib's first ten), cycled.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A number as a table shows it: integers whole, others with 3 decimals.
std::string Number(double value) {
  if (!std::isfinite(value)) return "-";
  if (value == std::round(value) && std::fabs(value) < 1e15) return absl::StrFormat("%.0f", value);
  return absl::StrFormat("%.3f", value);
}

// Tick label: short, whatever the scale.
std::string Tick(double value) {
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e6) return absl::StrFormat("%.3gM", value / 1e6);
  if (magnitude >= 1e4) return absl::StrFormat("%.3gk", value / 1e3);
  return absl::StrFormat("%.4g", value);
}

struct Series {
  std::string label;
  std::vector<double> x, y;
};

// A line chart as inline SVG: axes with 5 ticks each, one polyline per
// series (class "curve", its points in data-points), a legend.
std::string Svg(const std::string& title, const std::string& x_label, const std::vector<Series>& series) {
  constexpr int kWidth = 640, kHeight = 320, kLeft = 64, kRight = 16, kTop = 28, kBottom = 44;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  }
  if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no points: empty axes
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * plot_h; };

  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<title>%s</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"18\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
      kWidth, kHeight, kWidth, kHeight, Escape(title), kWidth, kHeight, kLeft, Escape(title));
  // Axes, grid and ticks.
  absl::StrAppendFormat(&svg, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n",
                        kLeft, kTop, plot_w, plot_h);
  for (int t = 0; t <= 4; ++t) {
    const double x = x0 + (x1 - x0) * t / 4, y = y0 + (y1 - y0) * t / 4;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#eee\"/>"
                          "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n",
                          px(x), kTop, px(x), kTop + plot_h, px(x), kTop + plot_h + 14, Tick(x));
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          kLeft, py(y), kLeft + plot_w, py(y), kLeft - 4, py(y) + 4, Tick(y));
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", kLeft + plot_w / 2,
                        kHeight - 8, Escape(x_label));
  // The curves and the legend.
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    std::vector<std::string> points, data;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      points.push_back(absl::StrFormat("%.1f,%.1f", px(s.x[i]), py(s.y[i])));
      data.push_back(absl::StrCat(Number(s.x[i]), ":", Number(s.y[i])));
    }
    const char* color = kColors[k % std::size(kColors)];
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"curve\" data-label=\"%s\" data-points=\"%s\" points=\"%s\" fill=\"none\" "
                          "stroke=\"%s\" stroke-width=\"2\"/>\n",
                          Escape(s.label), absl::StrJoin(data, " "), absl::StrJoin(points, " "), color);
    if (points.size() == 1) {  // one point draws no line: a dot
      const std::vector<std::string> xy = absl::StrSplit(points[0], ',');
      absl::StrAppendFormat(&svg, "<circle cx=\"%s\" cy=\"%s\" r=\"3\" fill=\"%s\"/>\n", xy[0], xy[1], color);
    }
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%d\">%s</text>\n",
                          kLeft + plot_w - 150, kTop + 10 + 14 * int(k), color, kLeft + plot_w - 134,
                          kTop + 14 + 14 * int(k), Escape(s.label));
  }
  svg += "</svg>\n";
  return svg;
}

// Columns not worth a curve of their own (counters and labels).
bool IsCounter(const std::string& column) {
  static const char* const kCounters[] = {"seconds", "frames", "updates", "parameter_version", "episode",
                                          "env", "images", "steps"};
  return std::find(std::begin(kCounters), std::end(kCounters), column) != std::end(kCounters);
}

// The x column of a metrics file: frames where there is one (RL, scripted),
// else images (GAN), else the first.
std::string XColumn(const CsvTable& table) {
  for (const char* name : {"frames", "images"}) {
    if (std::find(table.header.begin(), table.header.end(), name) != table.header.end()) return name;
  }
  return table.header.empty() ? "" : table.header[0];
}

std::string HtmlTable(const CsvTable& table, const std::string& id, size_t max_rows) {
  std::string html = absl::StrCat("<table id=\"", id, "\"><thead><tr>");
  for (const std::string& h : table.header) absl::StrAppend(&html, "<th>", Escape(h), "</th>");
  html += "</tr></thead><tbody>\n";
  // The last max_rows rows (the end of a long run is what counts).
  const size_t first = table.rows.size() > max_rows ? table.rows.size() - max_rows : 0;
  for (size_t r = first; r < table.rows.size(); ++r) {
    html += "<tr>";
    for (const std::string& cell : table.rows[r]) absl::StrAppend(&html, "<td>", Escape(cell), "</td>");
    html += "</tr>\n";
  }
  html += "</tbody></table>\n";
  if (first > 0) absl::StrAppend(&html, "<p class=\"note\">the last ", max_rows, " of ", table.rows.size(), " rows</p>\n");
  return html;
}

// The charts of one metrics file: every non-counter column against x.
std::string Charts(const CsvTable& table, const std::string& file) {
  const std::string x = XColumn(table);
  const std::vector<double> xs = table.Column(x);
  std::string html;
  for (const std::string& column : table.header) {
    if (column == x || IsCounter(column)) continue;
    const std::vector<double> ys = table.Column(column);
    if (std::none_of(ys.begin(), ys.end(), [](double v) { return std::isfinite(v); })) continue;
    html += Svg(absl::StrCat(column, " (", file, ")"), x, {{column, xs, ys}});
  }
  return html;
}

std::vector<std::string> Videos(const std::string& run) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(RunLayout(run).videos(), error)) {
    if (const std::optional<int64_t> frames = EvalVideoFrames(entry.path().string())) {
      found.emplace_back(*frames, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [frames, path] : found) paths.push_back(path);
  return paths;
}

std::string Relative(const std::string& path, const fs::path& from_dir) {
  std::error_code error;
  const fs::path relative = fs::relative(fs::absolute(path), fs::absolute(from_dir), error);
  return error || relative.empty() ? fs::absolute(path).string() : relative.generic_string();
}

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }
.charts { display: flex; flex-wrap: wrap; } .chart { margin: 6px 12px 6px 0; border: 1px solid #eee; } .note { color: #777; font-size: 12px; }
video { max-width: 480px; display: block; margin: 8px 0; }
</style>
)";

// The page of one run (inside a report's body), links relative to `page_dir`.
std::string RunSection(const RunSummary& run, const fs::path& page_dir, bool open) {
  std::string html;
  absl::StrAppend(&html, "<section class=\"run\" id=\"run-", Escape(run.name), "\">\n<h2>", Escape(run.name), "</h2>\n");
  absl::StrAppend(&html, "<p>task <b>", Escape(run.task), "</b>, mode ", Escape(run.mode), ", ", run.evaluations,
                  " evaluations", run.evaluations > 0
                                      ? absl::StrCat(": final <b class=\"final\">", Number(run.final_eval),
                                                     "</b>, best <b class=\"best\">", Number(run.best_eval),
                                                     "</b> at ", Number(run.frames), " frames")
                                      : "",
                  "</p>\n");
  // Curves: the evaluations, the learner's metrics, the scripted episodes.
  for (const char* file : {kEvalCsvFile, kMetricsCsvFile, kEpisodesCsvFile}) {
    auto table = ReadCsvTable((fs::path(run.path) / file).string());
    if (!table.ok() || table->rows.empty()) continue;
    absl::StrAppend(&html, "<h3>", file, "</h3>\n<div class=\"charts\">\n", Charts(*table, file), "</div>\n");
    const std::string id = absl::StrCat(fs::path(file).stem().string(), "-table");
    const bool eval = std::string(file) == kEvalCsvFile;
    absl::StrAppend(&html, eval ? "" : "<details><summary>table</summary>\n", HtmlTable(*table, id, /*max_rows=*/200),
                    eval ? "" : "</details>\n");
  }
  // Videos: the newest shown, every one linked.
  const std::vector<std::string> videos = Videos(run.path);
  if (!videos.empty()) {
    absl::StrAppend(&html, "<h3>videos</h3>\n<video controls preload=\"metadata\" src=\"",
                    Escape(Relative(videos.back(), page_dir)), "\"></video>\n<ul class=\"videos\">\n");
    for (const std::string& video : videos) {
      const std::string link = Escape(Relative(video, page_dir));
      absl::StrAppend(&html, "<li><a href=\"", link, "\">", Escape(fs::path(video).filename().string()), "</a></li>\n");
    }
    html += "</ul>\n";
  }
  absl::StrAppend(&html, "<details", open ? " open" : "", "><summary>", kConfigFile, "</summary><pre class=\"config\">",
                  Escape(ReadFile(RunLayout(run.path).config()).value_or("")), "</pre></details>\n</section>\n");
  return html;
}

}  // namespace

absl::StatusOr<RunSummary> SummarizeRun(const std::string& path) {
  const RunLayout layout(path);
  if (!layout.HasConfig()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a run directory: it has no ", kConfigFile, " (troupe run writes one)"));
  }
  RunSummary run;
  run.path = path;
  run.name = fs::path(path).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::path(path).lexically_normal().parent_path().filename().string();
  config::ExperimentConfig config;
  if (ParseTextConfig(ReadFile(layout.config()).value_or(""), layout.config(), &config, /*allow_unknown_fields=*/true)
          .ok()) {
    run.task = config.env().task();
    run.mode = config::ExperimentConfig::Mode_Name(config.mode());
  }
  // The evaluation figure: eval_return (RL), classifier_fid (GAN, lower is better).
  if (auto eval = ReadCsvTable(layout.eval_csv()); eval.ok()) {
    const bool fid = eval->Column("eval_return").empty();
    const std::vector<double> values = eval->Column(fid ? "classifier_fid" : "eval_return");
    const std::vector<double> frames = eval->Column(XColumn(*eval));
    run.evaluations = int(values.size());
    if (!values.empty()) {
      run.final_eval = values.back();
      run.best_eval = fid ? *std::min_element(values.begin(), values.end())
                          : *std::max_element(values.begin(), values.end());
      run.frames = frames.empty() ? 0 : frames.back();
    }
  }
  const std::vector<std::string> videos = Videos(path);
  if (!videos.empty()) run.last_video = videos.back();
  return run;
}

absl::StatusOr<std::string> WriteReport(const std::string& dir, const std::string& output) {
  if (!fs::is_directory(dir)) return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  const std::string out = output.empty() ? RunLayout(dir).report() : output;
  const fs::path page_dir = fs::absolute(out).parent_path();
  // One run, or the runs in the folder (a sweep).
  std::vector<RunSummary> runs;
  const bool single = RunLayout(dir).HasConfig();
  if (single) {
    ASSIGN_OR_RETURN(RunSummary run, SummarizeRun(dir));
    runs.push_back(std::move(run));
  } else {
    std::vector<std::string> subdirs;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_directory() && RunLayout(entry.path().string()).HasConfig()) {
        subdirs.push_back(entry.path().string());
      }
    }
    std::sort(subdirs.begin(), subdirs.end());
    for (const std::string& sub : subdirs) {
      ASSIGN_OR_RETURN(RunSummary run, SummarizeRun(sub));
      runs.push_back(std::move(run));
    }
  }
  if (runs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " is neither a run directory (it has no ", kConfigFile, ") nor a directory of runs "
        "(none of its subfolders has one)"));
  }

  const std::string title =
      single ? absl::StrCat("troupe report: ", runs[0].name) : absl::StrCat("troupe report: ", runs.size(), " runs in ", dir);
  std::string html = absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>",
                                  Escape(title), "</title>\n", kStyle, "</head><body>\n<h1>", Escape(title), "</h1>\n");
  if (!single) {
    // The sweep: a table of every run's final and best evaluation, their curves together.
    html += "<table id=\"runs\"><thead><tr><th>run</th><th>task</th><th>evaluations</th><th>frames</th>"
            "<th>final eval</th><th>best eval</th><th>video</th></tr></thead><tbody>\n";
    std::vector<Series> curves;
    for (const RunSummary& run : runs) {
      absl::StrAppend(&html, "<tr><td><a href=\"#run-", Escape(run.name), "\">", Escape(run.name), "</a></td><td>",
                      Escape(run.task), "</td><td>", run.evaluations, "</td><td>", Number(run.frames), "</td><td>",
                      run.evaluations ? Number(run.final_eval) : "-", "</td><td>",
                      run.evaluations ? Number(run.best_eval) : "-", "</td><td>",
                      run.last_video.empty()
                          ? "-"
                          : absl::StrCat("<a href=\"", Escape(Relative(run.last_video, page_dir)), "\">",
                                         Escape(fs::path(run.last_video).filename().string()), "</a>"),
                      "</td></tr>\n");
      if (auto eval = ReadCsvTable(RunLayout(run.path).eval_csv()); eval.ok()) {
        const bool fid = eval->Column("eval_return").empty();
        curves.push_back({run.name, eval->Column(XColumn(*eval)), eval->Column(fid ? "classifier_fid" : "eval_return")});
      }
    }
    html += "</tbody></table>\n";
    if (!curves.empty()) html += Svg("evaluation, every run", "frames", curves);
  }
  for (const RunSummary& run : runs) html += RunSection(run, page_dir, /*open=*/single);
  html += "</body></html>\n";

  // Written whole, then moved into place.
  const std::string partial = out + ".partial";
  {
    std::ofstream file(partial, std::ios::trunc);
    file << html;
    if (!file) return absl::PermissionDeniedError(absl::StrCat("cannot write ", partial));
  }
  std::error_code error;
  fs::rename(partial, out, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot write ", out, ": ", error.message()));
  return out;
}

}  // namespace troupe::viz
