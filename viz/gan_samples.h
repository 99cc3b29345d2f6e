// What the viewer shows of a GAN run directory (`troupe run` of a mode
// GAN config, gan/run.cc): the newest sample grid and the FID
// curve, re-read as training writes new ones.
//
// Layout read here:
//   RUN_DIR/samples/samples-NNNNNNNNN.png  a grid per evaluation (NNN: images
//                                          seen); the newest by name is shown
//   RUN_DIR/samples.png                    the latest grid (used when
//                                          samples/ has none)
//   RUN_DIR/eval.csv                       images,steps,classifier_fid,...:
//                                          the FID column is the first whose
//                                          name contains "fid"
//
// Not thread-safe: the viewer's drawing thread owns it.
#ifndef TROUPE_VIZ_GAN_SAMPLES_H_
#define TROUPE_VIZ_GAN_SAMPLES_H_

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/image.h"
#include "viz/curve.h"

namespace troupe::viz {

class GanSamples {
 public:
  // Follows `run_dir` (it need not hold samples yet: a run that just
  // started shows "waiting for the first sample grid").
  explicit GanSamples(std::string run_dir);

  // Re-reads the newest sample grid if a newer file (or a rewritten one)
  // appeared and the FID curve if eval.csv changed. Returns true if either
  // changed. A PNG that cannot be read (being written) keeps the last one
  // and sets error().
  bool Refresh();

  // The grid shown; nullopt before the first one.
  const std::optional<Image>& grid() const { return grid_; }
  // Its file ("" before the first one) and when it was written.
  const std::string& grid_path() const { return grid_path_; }
  std::filesystem::file_time_type grid_time() const { return grid_time_; }
  // FID against images seen; empty until the first evaluation.
  const Curve& fid() const { return fid_ ? fid_->curve() : no_curve_; }
  const std::string& error() const { return error_; }
  const std::string& run_dir() const { return run_dir_; }

 private:
  // The newest grid file, "" if none.
  std::string NewestGrid() const;
  // The eval.csv column to plot: the first containing "fid" ("" if none yet).
  std::string FidColumn() const;

  std::string run_dir_;
  std::optional<Image> grid_;
  std::string grid_path_;
  std::filesystem::file_time_type grid_time_{};
  std::unique_ptr<CurveFile> fid_;  // made once eval.csv names its FID column
  Curve no_curve_;
  std::string error_;
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_GAN_SAMPLES_H_
