// troupe report: the page's content, and the page as Debian's headless
// Chromium renders it (Chromium installed here on first use, as root:
// tools/install_deps.sh browser; skipped, saying why, where it cannot be).
#include "viz/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/files.h"
#include "common/image.h"
#include "common/run_layout.h"

namespace troupe::viz {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A learner run directory with three evaluations (returns 12.5, 250.25, 180).
std::string MakeRun(const fs::path& dir, double scale = 1) {
  fs::remove_all(dir);
  Write(dir / kConfigFile, "mode: RL\nenv { task: \"cartpole.swingup\" }\nevaluator { episodes: 2 }\n");
  char eval[512];
  std::snprintf(eval, sizeof(eval),
                "frames,updates,eval_return,actions_at_bound\n1000,10,%.3f,0.100\n2000,20,%.3f,0.200\n"
                "3000,30,%.3f,0.300\n",
                12.5 * scale, 250.25 * scale, 180 * scale);
  Write(dir / kEvalCsvFile, eval);
  Write(dir / kMetricsCsvFile,
        "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,critic_loss,actor_loss,"
        "q_mean,eval_return,parameter_version\n1.0,500,5,5.00,500.0,500,0.010,0.50000,-0.10000,0.1000,0.00,5\n"
        "2.0,1500,15,10.00,1000.0,1500,0.010,0.40000,-0.20000,0.2000,12.50,15\n"
        "3.0,3000,30,15.00,1500.0,3000,0.010,0.30000,-0.30000,0.3000,250.25,30\n4.0,35");  // last row half-written
  Write(dir / "videos" / "eval-1000.mp4", "not really a video");
  Write(dir / "videos" / "eval-3000.mp4", "not really a video");
  return dir.string();
}

fs::path Scratch(const std::string& name) { return fs::path(::testing::TempDir()) / ("report-" + std::to_string(::getpid())) / name; }

TEST(ReportTest, RunPageHoldsCurvesTablesVideosAndConfig) {
  const std::string run = MakeRun(Scratch("run"));
  auto written = WriteReport(run);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, (fs::path(run) / "report.html").string());
  const std::string html = ReadFile(*written).value_or("");
  // The evaluation curve carries the CSV's points; the table its rows.
  EXPECT_THAT(html, HasSubstr("data-points=\"1000:12.500 2000:250.250 3000:180\""));
  EXPECT_THAT(html, HasSubstr("<td>250.250</td>"));
  EXPECT_THAT(html, HasSubstr("final <b class=\"final\">180</b>, best <b class=\"best\">250.250</b>"));
  // metrics.csv: its complete rows only; a curve per metric (critic_loss...).
  EXPECT_THAT(html, HasSubstr("critic_loss (metrics.csv)"));
  EXPECT_THAT(html, Not(HasSubstr("<td>35</td>")));
  // Videos linked relative to the page, newest shown; the config inline.
  EXPECT_THAT(html, HasSubstr("<video controls preload=\"metadata\" src=\"videos/eval-3000.mp4\">"));
  EXPECT_THAT(html, HasSubstr("<a href=\"videos/eval-1000.mp4\">"));
  EXPECT_THAT(html, HasSubstr("task: &quot;cartpole.swingup&quot;"));
  // Self-contained: nothing fetched but the linked videos.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("http://www.w3.org/2000/svg\" src")));
}

TEST(ReportTest, SweepPageTablesEveryRunsFinalAndBestEvaluation) {
  const fs::path sweep = Scratch("sweep");
  fs::remove_all(sweep);
  MakeRun(sweep / "lr-0.001", /*scale=*/1);
  MakeRun(sweep / "lr-0.01", /*scale=*/2);
  fs::create_directories(sweep / "not-a-run");
  auto written = WriteReport(sweep.string(), (sweep / "sweep.html").string());
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string html = ReadFile(*written).value_or("");
  EXPECT_THAT(html, HasSubstr("<table id=\"runs\">"));
  EXPECT_THAT(html, HasSubstr("<td><a href=\"#run-lr-0.001\">lr-0.001</a></td><td>cartpole.swingup</td><td>3</td>"
                              "<td>3000</td><td>180</td><td>250.250</td>"
                              "<td><a href=\"lr-0.001/videos/eval-3000.mp4\">eval-3000.mp4</a></td>"));
  EXPECT_THAT(html, HasSubstr("<td>360</td><td>500.500</td>"));
  EXPECT_THAT(html, HasSubstr("data-label=\"lr-0.01\""));
  EXPECT_THAT(html, Not(HasSubstr("not-a-run")));
}

TEST(ReportTest, ADirectoryWithNoRunsIsAClearError) {
  const fs::path empty = Scratch("empty");
  fs::create_directories(empty);
  auto written = WriteReport(empty.string());
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(written.status().message(), HasSubstr("config.textproto"));
  EXPECT_EQ(WriteReport((empty / "missing").string()).status().code(), absl::StatusCode::kNotFound);
}

// Runs `command`, returning its exit status.
int Shell(const std::string& command) { return std::system(command.c_str()); }

TEST(ReportTest, HeadlessChromiumRendersTheTableAndTheCurves) {
  // Chromium is no dependency of troupe, nor of the other tests: this test installs it.
  if (Shell("command -v chromium >/dev/null 2>&1") != 0 &&
      Shell(ProjectPath("tools/install_deps.sh") + " browser") != 0) {
    GTEST_SKIP() << "chromium is not installed and `tools/install_deps.sh browser` could not install it (above): "
                    "the page is not rendered";
  }
  const std::string run = MakeRun(Scratch("rendered"));
  auto written = WriteReport(run);
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string url = "file://" + fs::absolute(*written).string();
  const std::string dom = (Scratch("rendered") / "dom.html").string();
  const std::string png = (Scratch("rendered") / "page.png").string();
  const std::string flags = "--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run ";
  // The DOM the browser built: the table's cells and the curves are in it.
  ASSERT_EQ(Shell("timeout 60 chromium " + flags + "--dump-dom '" + url + "' > " + dom + " 2>/dev/null"), 0);
  const std::string parsed = ReadFile(dom).value_or("");
  const std::regex eval_table("<table id=\"eval-table\">[^]*<td>1000</td><td>10</td><td>12.500</td>[^]*"
                              "<td>3000</td><td>30</td><td>180.000</td>");
  EXPECT_TRUE(std::regex_search(parsed, eval_table)) << "the eval table is not in the browser's DOM";
  size_t curves = 0;
  for (size_t at = parsed.find("class=\"curve\""); at != std::string::npos; at = parsed.find("class=\"curve\"", at + 1)) {
    ++curves;
  }
  EXPECT_GE(curves, 5u);  // eval_return, actions_at_bound, and metrics.csv's
  // The pixels: the first curve's colour (#1f77b4) is drawn on the page.
  ASSERT_EQ(Shell("timeout 60 chromium " + flags + "--window-size=1200,1600 --screenshot=" + png + " '" + url +
                  "' >/dev/null 2>&1"),
            0);
  auto image = ReadPng(png);
  ASSERT_TRUE(image.ok()) << image.status();
  int blue = 0;
  for (int i = 0; i < image->width * image->height; ++i) {
    const uint8_t* p = image->pixels.data() + size_t(i) * image->channels;
    blue += std::abs(p[0] - 31) < 20 && std::abs(p[1] - 119) < 20 && std::abs(p[2] - 180) < 20;
  }
  EXPECT_GT(blue, 300) << "no curve drawn in the screenshot " << png;
}

}  // namespace
}  // namespace troupe::viz
