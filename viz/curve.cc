#include "viz/curve.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace troupe::viz {

absl::StatusOr<Curve> ReadCurveCsv(const std::string& path, const std::string& x_column, const std::string& y_column,
                                   const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read metrics file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // Without a trailing newline the last line may be half-written.
  if (!lines.empty()) lines.pop_back();
  Curve curve;
  curve.label = label;
  if (lines.empty()) return curve;

  // Column indices from the header.
  std::vector<std::string> header;
  for (absl::string_view name : absl::StrSplit(lines[0], ',')) header.emplace_back(absl::StripAsciiWhitespace(name));
  int x_index = -1, y_index = -1;
  for (int i = 0; i < int(header.size()); ++i) {
    if (header[i] == x_column) x_index = i;
    if (header[i] == y_column) y_index = i;
  }
  if (x_index < 0 || y_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":1: no column '", x_index < 0 ? x_column : y_column,
                                                   "'; the header has: ", absl::StrJoin(header, ", ")));
  }

  // One point per row.
  for (size_t line = 1; line < lines.size(); ++line) {
    if (absl::StripAsciiWhitespace(lines[line]).empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(lines[line], ',');
    double x = 0, y = 0;
    if (int(fields.size()) <= std::max(x_index, y_index) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(fields[x_index]), &x) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(fields[y_index]), &y)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line + 1, ": expected numbers in columns '", x_column,
                                                     "' and '", y_column, "', got: ", lines[line]));
    }
    curve.points.emplace_back(x, y);
  }
  return curve;
}

bool CurveFile::Refresh() {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path_, ec);
  if (ec) {
    const bool changed = !curve_.points.empty();
    curve_.points.clear();
    size_ = 0;
    return changed;
  }
  const auto modified = std::filesystem::last_write_time(path_, ec);
  if (size == size_ && modified == modified_) return false;
  size_ = size;
  modified_ = modified;
  auto curve = ReadCurveCsv(path_, x_column_, y_column_, label_);
  if (!curve.ok()) {
    error_ = std::string(curve.status().message());
    return false;
  }
  error_.clear();
  curve_ = *std::move(curve);
  return true;
}

}  // namespace troupe::viz
