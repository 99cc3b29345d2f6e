#include "common/run_layout.h"
#include "viz/gan_samples.h"

#include <fstream>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace troupe::viz {
namespace fs = std::filesystem;

GanSamples::GanSamples(std::string run_dir) : run_dir_(std::move(run_dir)) {}

std::string GanSamples::NewestGrid() const {
  // samples/samples-NNNNNNNNN.png: zero-padded, so the largest name is the newest.
  std::error_code ec;
  std::string newest;
  for (const auto& entry : fs::directory_iterator(RunLayout(run_dir_).samples_folder(), ec)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() == ".png" && entry.is_regular_file(ec) && path > newest) newest = path;
  }
  if (!newest.empty()) return newest;
  const fs::path latest = RunLayout(run_dir_).samples();
  return fs::is_regular_file(latest, ec) ? latest.string() : "";
}

std::string GanSamples::FidColumn() const {
  std::ifstream in(RunLayout(run_dir_).eval_csv());
  std::string header;
  if (!std::getline(in, header)) return "";
  for (absl::string_view name : absl::StrSplit(header, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name.find("fid") != absl::string_view::npos) return std::string(name);
  }
  return "";
}

bool GanSamples::Refresh() {
  bool changed = false;
  // The FID curve, once eval.csv has a header naming the column.
  if (!fid_) {
    const std::string column = FidColumn();
    if (!column.empty()) {
      fid_ = std::make_unique<CurveFile>(RunLayout(run_dir_).eval_csv(), "images", column, "FID");
    }
  }
  if (fid_) changed |= fid_->Refresh();

  // The newest grid, when its name or modification time changed.
  const std::string path = NewestGrid();
  if (path.empty()) return changed;
  std::error_code ec;
  const fs::file_time_type time = fs::last_write_time(path, ec);
  if (ec || (path == grid_path_ && time == grid_time_)) return changed;
  auto image = ReadPng(path);
  if (!image.ok()) {
    error_ = std::string(image.status().message());
    return changed;
  }
  error_.clear();
  grid_ = *std::move(image);
  grid_path_ = path;
  grid_time_ = time;
  return true;
}

}  // namespace troupe::viz
