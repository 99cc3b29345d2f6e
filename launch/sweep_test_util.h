// Helpers shared by the sweep's tests: a scratch directory, a tiny GAN
// config, and summary CSVs read back.
#ifndef TROUPE_LAUNCH_SWEEP_TEST_UTIL_H_
#define TROUPE_LAUNCH_SWEEP_TEST_UTIL_H_

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "launch/sweep_plan.h"

namespace troupe::launch::testing {

inline void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A fresh directory under the system's temporary directory, removed with
// everything in it on destruction.
class TempDir {
 public:
  TempDir()
      : path_((std::filesystem::temp_directory_path() /
               ("troupe_sweep_" + std::to_string(getpid()) + "_" + std::to_string(counter_++)))
                  .string()) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// A GAN config small enough to train in about a second.
inline std::string TinyGanConfig(const std::string& runs_dir, const std::string& classifier) {
  return absl::StrCat("name: \"tiny\" mode: GAN runs_dir: \"", runs_dir,
                      "\" gan { batch_size: 16 noise_size: 16 generator_channels: 8 discriminator_channels: 8 "
                      "total_images: 6400 eval_every_images: 1600 eval_samples: 300 warmup_images: 0 "
                      "checkpoint_every_s: 1 classifier_checkpoint: \"",
                      classifier, "\" }\n");
}

// A sweep of RL runs in `dir`: 2 grid points (learner.batch_size 16, 32)
// x `seeds`, planned from a config written there. Preparing it trains
// nothing (no FID classifier), and each run's config is the defaults.
inline SweepOptions TinyRlSweep(const std::string& dir, int seeds) {
  SweepOptions options;
  options.config_path = dir + "/tiny_rl.textproto";
  Write(options.config_path, "name: \"tiny_rl\" mode: RL runs_dir: \"" + dir + "/runs\"\n");
  options.grid = *ParseGrid({"learner.batch_size=16,32"});
  options.seeds = seeds;
  return options;
}

// A CSV file as rows of column -> cell.
inline std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = absl::StrSplit(line, ',');
  while (std::getline(in, line)) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

// A cell as a number (fails the test when it is not one).
inline double ToDouble(const std::string& text) {
  double v = NAN;
  EXPECT_TRUE(absl::SimpleAtod(text, &v)) << "'" << text << "'";
  return v;
}

}  // namespace troupe::launch::testing

#endif  // TROUPE_LAUNCH_SWEEP_TEST_UTIL_H_
