#include "launch/sweep_summary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/image.h"
#include "common/plot.h"
#include "common/run_layout.h"
#include "common/status_macros.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using config::ExperimentConfig;

struct Stats {
  int count = 0;
  double mean = NAN, spread = NAN;  // spread: sample standard deviation (0 for one value)
};

Stats Summarize(const std::vector<double>& values) {
  Stats s;
  s.count = static_cast<int>(values.size());
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / values.size();
  double squares = 0;
  for (double v : values) squares += (v - s.mean) * (v - s.mean);
  s.spread = values.size() > 1 ? std::sqrt(squares / (values.size() - 1)) : 0.0;
  return s;
}

std::string Number(double v) { return std::isnan(v) ? "" : absl::StrFormat("%.4f", v); }

}  // namespace

RunCurve ReadRunCurve(const std::string& run_dir) {
  RunCurve curve;
  curve.done = SweepRunDone(run_dir);
  // x and the metric: eval.csv's first and third columns (frames and
  // eval_return; images and classifier_fid).
  const absl::StatusOr<CsvTable> table = ReadCsvTable(RunLayout(run_dir).eval_csv());
  if (!table.ok() || table->header.size() < 3) return curve;
  for (const auto& [x, y] : table->Points(table->header[0], table->header[2])) {
    // A resumed run re-evaluates from its checkpoint: the later rows win.
    while (!curve.x.empty() && curve.x.back() >= x) {
      curve.x.pop_back();
      curve.y.pop_back();
    }
    curve.x.push_back(x);
    curve.y.push_back(y);
  }
  return curve;
}

absl::Status WriteSweepSummary(const SweepPlan& plan) {
  const bool gan = plan.mode == ExperimentConfig::GAN;
  const std::string metric = gan ? "classifier_fid" : "eval_return";
  const std::string x_name = gan ? "images" : "frames";
  auto better = [gan](double a, double b) { return gan ? a < b : a > b; };

  // Per run: the final and best metric.
  std::string runs_csv = absl::StrCat("run,point,seed,done,", x_name, "_final,", metric, "_final,", metric, "_best\n");
  struct Point {
    std::string name;
    std::vector<double> finals, bests;
    std::vector<RunCurve> curves;
    int runs = 0, done = 0;
  };
  std::vector<Point> points;
  for (const SweepRun& run : plan.runs) {
    if (points.empty() || points.back().name != run.point) points.push_back(Point{run.point});
    Point& point = points.back();
    ++point.runs;
    RunCurve curve = ReadRunCurve(run.run_dir);
    point.done += curve.done;
    double final_value = NAN, best = NAN, x_final = NAN;
    if (!curve.y.empty()) {
      final_value = curve.y.back();
      x_final = curve.x.back();
      best = curve.y[0];
      for (double y : curve.y) best = better(y, best) ? y : best;
      point.finals.push_back(final_value);
      point.bests.push_back(best);
      point.curves.push_back(curve);
    }
    absl::StrAppend(&runs_csv, run.name, ",\"", run.point, "\",", run.seed, ",", curve.done ? 1 : 0, ",",
                    std::isnan(x_final) ? "" : absl::StrFormat("%.0f", x_final), ",", Number(final_value), ",",
                    Number(best), "\n");
  }
  RETURN_IF_ERROR(WriteFileAtomically(plan.sweep_dir + "/runs.csv", runs_csv));

  // Per grid point: mean and spread over its seeds.
  std::string summary_csv;
  for (const GridAxis& axis : plan.grid) {
    for (absl::string_view name : absl::StrSplit(axis.field, ':')) absl::StrAppend(&summary_csv, name, ",");
  }
  absl::StrAppend(&summary_csv, "runs,done,with_metric,", metric, "_final_mean,", metric, "_final_std,", metric,
                  "_best_mean,", metric, "_best_std\n");
  std::string markdown = absl::StrCat("| point | runs done | ", metric, " final (mean ± std) | ", metric,
                                      " best (mean ± std) |\n| --- | --- | --- | --- |\n");
  for (const Point& point : points) {
    const Stats final_stats = Summarize(point.finals), best_stats = Summarize(point.bests);
    if (!plan.grid.empty()) {
      for (absl::string_view assignment : absl::StrSplit(point.name, ',')) {
        absl::StrAppend(&summary_csv, assignment.substr(assignment.find('=') + 1), ",");
      }
    }
    absl::StrAppend(&summary_csv, point.runs, ",", point.done, ",", final_stats.count, ",", Number(final_stats.mean),
                    ",", Number(final_stats.spread), ",", Number(best_stats.mean), ",", Number(best_stats.spread),
                    "\n");
    auto cell = [](const Stats& s) {
      return s.count == 0 ? std::string("-") : absl::StrFormat("%.3f ± %.3f", s.mean, s.spread);
    };
    absl::StrAppend(&markdown, "| ", point.name, " | ", point.done, "/", point.runs, " | ", cell(final_stats), " | ",
                    cell(best_stats), " |\n");
  }
  RETURN_IF_ERROR(WriteFileAtomically(plan.sweep_dir + "/summary.csv", summary_csv));
  RETURN_IF_ERROR(WriteFileAtomically(plan.sweep_dir + "/summary.md", markdown));

  // Curves: per point the mean over seeds at the x every seed has reached,
  // and the lowest and highest seed there in a lighter shade.
  static const std::array<std::array<uint8_t, 3>, 10> kColors = {{{31, 119, 180},
                                                                  {255, 127, 14},
                                                                  {44, 160, 44},
                                                                  {214, 39, 40},
                                                                  {148, 103, 189},
                                                                  {140, 86, 75},
                                                                  {227, 119, 194},
                                                                  {127, 127, 127},
                                                                  {188, 189, 34},
                                                                  {23, 190, 207}}};
  std::vector<PlotSeries> series, bands;
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& point = points[i];
    if (point.curves.empty()) continue;
    const std::array<uint8_t, 3> color = kColors[i % kColors.size()];
    std::array<uint8_t, 3> light;
    for (int c = 0; c < 3; ++c) light[c] = static_cast<uint8_t>(color[c] + (255 - color[c]) * 0.6);
    PlotSeries mean{point.name, {}, {}, color}, low{"", {}, {}, light}, high{"", {}, {}, light};
    for (size_t k = 0; k < point.curves[0].x.size(); ++k) {
      const double x = point.curves[0].x[k];
      std::vector<double> ys;
      for (const RunCurve& curve : point.curves) {
        auto at = std::find(curve.x.begin(), curve.x.end(), x);
        if (at != curve.x.end()) ys.push_back(curve.y[at - curve.x.begin()]);
      }
      if (ys.size() != point.curves.size()) continue;
      mean.x.push_back(x);
      low.x.push_back(x);
      high.x.push_back(x);
      mean.y.push_back(Summarize(ys).mean);
      low.y.push_back(*std::min_element(ys.begin(), ys.end()));
      high.y.push_back(*std::max_element(ys.begin(), ys.end()));
    }
    if (point.curves.size() > 1) {
      bands.push_back(std::move(low));
      bands.push_back(std::move(high));
    }
    series.push_back(std::move(mean));
  }
  bands.insert(bands.end(), series.begin(), series.end());  // bands under the means
  const std::string title = absl::StrCat(fs::path(plan.sweep_dir).filename().string(), ": ",
                                         gan ? "classifier-FID" : "eval return", ", mean over seeds (band: min-max)");
  return WritePng(plan.sweep_dir + "/curves.png",
                  PlotLines(bands, PlotOptions{960, 600, title, gan ? "images seen" : "env frames",
                                               gan ? "classifier-FID" : "eval return"}));
}

}  // namespace troupe::launch
