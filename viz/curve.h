// Learning curves from a run's metrics CSV files (a header row, then one
// row per record), re-read when the file changes so the panel follows a run
// that is still going.
#ifndef TROUPE_VIZ_CURVE_H_
#define TROUPE_VIZ_CURVE_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::viz {

struct Curve {
  std::string label;                           // legend, e.g. "episode return"
  std::vector<std::pair<double, double>> points;  // (x, y) in file order
};

// Reads columns `x_column` and `y_column` of the CSV at `path`. Errors:
// NotFound for a missing file; InvalidArgument naming the file and line for
// a missing column (listing the header's columns) or a value that is not a
// number. A last line without its newline (a row being written) is skipped.
absl::StatusOr<Curve> ReadCurveCsv(const std::string& path, const std::string& x_column, const std::string& y_column,
                                   const std::string& label);

// One metrics file to follow. Not thread-safe: the drawing thread owns it.
class CurveFile {
 public:
  CurveFile(std::string path, std::string x_column, std::string y_column, std::string label)
      : path_(std::move(path)), x_column_(std::move(x_column)), y_column_(std::move(y_column)),
        label_(std::move(label)) {}

  // Re-reads the file if its size or modification time changed. Returns
  // true if curve() changed. A missing file is an empty curve; a malformed
  // one keeps the last good curve and sets error().
  bool Refresh();
  const Curve& curve() const { return curve_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, x_column_, y_column_, label_;
  Curve curve_;
  std::string error_;
  std::uintmax_t size_ = 0;
  std::filesystem::file_time_type modified_{};
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_CURVE_H_
