#include "common/run_layout.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

// A fresh, empty run directory for each test.
class RunLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("run_layout_");
  }
  RunLayout run() const { return RunLayout(dir_); }
  std::string dir_;
};

TEST_F(RunLayoutTest, DerivesEveryPathFromTheDirectory) {
  const RunLayout r = run();
  EXPECT_EQ(r.config(), dir_ + "/config.textproto");
  EXPECT_EQ(r.metrics_csv(), dir_ + "/metrics.csv");
  EXPECT_EQ(r.checkpoints(), dir_ + "/checkpoints");
  EXPECT_EQ(r.actor_log(3), dir_ + "/logs/actor-3.log");
  EXPECT_EQ(r.eval_video(12000), dir_ + "/videos/eval-12000.mp4");
  EXPECT_EQ(EvalVideoFrames(r.eval_video(12000)), 12000);
  EXPECT_EQ(EvalVideoFrames(dir_ + "/videos/eval-12x.mp4"), std::nullopt);
  EXPECT_EQ(EvalVideoFrames(dir_ + "/videos/view-12.mp4"), std::nullopt);
  EXPECT_FALSE(r.HasConfig());
  std::ofstream(r.config()) << "name: \"x\"\n";
  EXPECT_TRUE(r.HasConfig());
  // Python's names are these.
  bool found = false;
  for (const auto& [key, name] : RunFileNames()) found |= key == "eval_csv" && name == "eval.csv";
  EXPECT_TRUE(found);
}

// An agent's own metrics columns (D4PG's).
const std::string kAgentColumns[] = {"critic_loss", "actor_loss", "q_mean"};

TEST_F(RunLayoutTest, EveryRowHasAValueForEachColumnOfItsSchema) {
  EXPECT_EQ(RlMetricsRow().Values().size(), RlMetricsRow::Schema().columns.size());
  const RlMetricsRow with_agent{.agent = {1, 2, 3}};
  EXPECT_EQ(with_agent.Values().size(), RlMetricsRow::Schema(kAgentColumns).columns.size());
  // One schema per list of agent columns, the same object each time.
  EXPECT_EQ(&RlMetricsRow::Schema(kAgentColumns), &RlMetricsRow::Schema(kAgentColumns));
  EXPECT_NE(&RlMetricsRow::Schema(kAgentColumns), &RlMetricsRow::Schema());
  EXPECT_EQ(RlEvalRow().Values().size(), RlEvalRow::Schema().columns.size());
  EXPECT_EQ(GanMetricsRow().Values().size(), GanMetricsRow::Schema().columns.size());
  EXPECT_EQ(GanEvalRow().Values().size(), GanEvalRow::Schema().columns.size());
  EXPECT_EQ(EpisodeRow().Values().size(), EpisodeRow::Schema().columns.size());
}

TEST_F(RunLayoutTest, WritesTheHeaderOnceThenRowsAndTheirJsonLines) {
  RowLog<RlMetricsRow> log(run(), RlMetricsRow::Schema(kAgentColumns));
  RlMetricsRow row{.seconds = 2.04, .frames = 4000, .updates = 100, .updates_per_s = 50, .frames_per_s = 2000,
                   .replay_size = 3900, .samples_per_insert = 0.5, .agent = {1.25, -0.5, 3.5}, .eval_return = -1, .parameter_version = 11, .checkpoint_s = 0.125,
                   .input_wait_ms = 0.75, .frames_uploaded_per_update = 12.5, .device_idle_ms = 0.25};
  ASSERT_TRUE(log.Append(row));
  row.frames = 8000;
  ASSERT_TRUE(log.Append(row));
  const std::string line =
      ",100,50.00,2000.0,3900,0.500,1.25,-0.5,3.5,-1.00,11,0.750,12.50,0.250\n";
  EXPECT_EQ(ReadFile(run().metrics_csv()).value_or(""),
            "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,critic_loss,actor_loss,"
            "q_mean,eval_return,parameter_version,input_wait_ms,frames_uploaded_per_update,device_idle_ms\n"
            "2.0,4000" + line + "2.0,8000" + line);
  const std::string json = ReadFile(run().metrics_jsonl()).value_or("");
  EXPECT_EQ(json.substr(0, json.find('\n') + 1),
            "{\"seconds\": 2.0, \"frames\": 4000, \"updates\": 100, \"updates_per_s\": 50.00, \"frames_per_s\": "
            "2000.0, \"replay_size\": 3900, \"samples_per_insert\": 0.500, \"critic_loss\": 1.25, \"actor_loss\": "
            "-0.5, \"q_mean\": 3.5, \"eval_return\": -1.00, \"parameter_version\": 11, \"checkpoint_s\": "
            "0.125, \"input_wait_ms\": 0.750, \"frames_uploaded_per_update\": 12.50, \"device_idle_ms\": 0.250}\n");
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 2);
}

TEST_F(RunLayoutTest, RowsKeepToTheHeaderOfAnOlderFile) {
  // A metrics.csv from before the learner-input columns: a resumed run's
  // rows must have its 12 fields, not 14.
  const std::string old_header =
      "seconds,frames,updates,updates_per_s,frames_per_s,replay_size,samples_per_insert,critic_loss,actor_loss,"
      "q_mean,eval_return,parameter_version\n";
  std::ofstream(run().metrics_csv()) << old_header
                                     << "1.0,1000,10,5.00,500.0,900,0.000,1.00000,1.00000,1.0000,-1.00,2\n";
  RowLog<RlMetricsRow> log(run(), RlMetricsRow::Schema(kAgentColumns));
  ASSERT_TRUE(log.Append(
      {.seconds = 3, .frames = 2000, .updates = 20, .agent = {0, 0, 0}, .parameter_version = 3, .input_wait_ms = 9}));
  ASSERT_TRUE(log.Append({.seconds = 4, .frames = 3000, .updates = 30, .agent = {0, 0, 0}, .parameter_version = 4}));
  const absl::StatusOr<CsvTable> table = ReadCsvTable(run().metrics_csv());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->header.size(), 12u);
  ASSERT_EQ(table->rows.size(), 3u);
  for (const auto& cells : table->rows) EXPECT_EQ(cells.size(), 12u);
  EXPECT_EQ(table->Column("frames"), (std::vector<double>{1000, 2000, 3000}));
  EXPECT_EQ(table->Column("parameter_version"), (std::vector<double>{2, 3, 4}));
  // The JSON lines have every field (their readers go by key).
  EXPECT_NE(ReadFile(run().metrics_jsonl()).value_or("").find("\"input_wait_ms\": 9.000"), std::string::npos);
}

TEST_F(RunLayoutTest, RowsFollowTheOrderOfTheFilesHeaderAndLeaveUnknownColumnsEmpty) {
  std::ofstream(run().eval_csv()) << "updates,note,frames\n";
  RowLog<RlEvalRow> log(run());
  ASSERT_TRUE(log.Append({.frames = 5000, .updates = 50, .eval_return = 1.5}));
  EXPECT_EQ(ReadFile(run().eval_csv()).value_or(""), "updates,note,frames\n50,,5000\n");
}

TEST_F(RunLayoutTest, TheResumeCutDropsRowsPastTheLimitFromTheCsvAndItsJsonLines) {
  RowLog<RlMetricsRow> log(run());
  for (int64_t frames : {1000, 2000, 3000, 4000}) ASSERT_TRUE(log.Append({.seconds = 1, .frames = frames}));
  // A row cut off by a killed writer goes too, even below the limit, and so
  // does a row whose frames cannot be read.
  std::ofstream(run().metrics_csv(), std::ios::app) << "9.0,x\n9.0,1500";
  const absl::StatusOr<std::vector<double>> dropped = RowLog<RlMetricsRow>(run()).DropRowsPast(2000);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_EQ(dropped->size(), 4u);
  EXPECT_EQ((*dropped)[0], 3000);
  EXPECT_EQ((*dropped)[1], 4000);
  EXPECT_TRUE(std::isnan((*dropped)[2]));  // "9.0,x"
  EXPECT_EQ((*dropped)[3], 1500);
  const absl::StatusOr<CsvTable> table = ReadCsvTable(run().metrics_csv());
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->Column("frames"), (std::vector<double>{1000, 2000}));
  const std::string json = ReadFile(run().metrics_jsonl()).value_or("");
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 2);
  EXPECT_EQ(json.find("\"frames\": 3000"), std::string::npos);
}

TEST_F(RunLayoutTest, TheResumeCutFindsTheProgressColumnByName) {
  // GAN metrics: images is the second column.
  std::ofstream(run().metrics_csv()) << "seconds,images,steps\n500,100,1\n600,200,2\n";
  const absl::StatusOr<std::vector<double>> dropped = RowLog<GanMetricsRow>(run()).DropRowsPast(150);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, std::vector<double>{200});
  EXPECT_EQ(ReadFile(run().metrics_csv()).value_or(""), "seconds,images,steps\n500,100,1\n");
  // A missing file drops nothing.
  const absl::StatusOr<std::vector<double>> none = RowLog<GanEvalRow>(run()).DropRowsPast(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(RunLayoutTest, ReadsTablesAndKeyValues) {
  std::ofstream(run().eval_csv()) << "frames,eval_return\n1000,2.5\n\n2000,x\n3000,4";
  const absl::StatusOr<CsvTable> table = ReadCsvTable(run().eval_csv());
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->Index("eval_return"), 1);
  EXPECT_EQ(table->Index("nope"), -1);
  const std::vector<double> returns = table->Column("eval_return");
  ASSERT_EQ(returns.size(), 2u);  // the unfinished last line is not a row
  EXPECT_EQ(returns[0], 2.5);
  EXPECT_TRUE(std::isnan(returns[1]));
  EXPECT_EQ(LastCsvRow(run().eval_csv()).at("frames"), "2000");
  // A curve: the rows whose two cells are numbers.
  EXPECT_EQ(table->Points("frames", "eval_return"), (std::vector<std::pair<double, double>>{{1000, 2.5}}));
  EXPECT_TRUE(table->Points("frames", "nope").empty());
  EXPECT_TRUE(absl::IsNotFound(ReadCsvTable(run().metrics_csv()).status()));

  std::ofstream(run().launch()) << "mode local\nhost a b\n";
  const auto values = ReadKeyValues(run().launch());
  EXPECT_EQ(values.at("mode"), "local");
  EXPECT_EQ(values.at("host"), "a b");
  EXPECT_TRUE(ReadKeyValues(run().status()).empty());
}

class LastRunSecondsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/last_run_seconds_metrics.csv";
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }
};

TEST_F(LastRunSecondsTest, IsTheFirstColumnOfTheLastWholeRow) {
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n1.5,100\n2.0,200\n3125.4,300\n")), 3125.4);
  // A row cut off by a killed writer (no newline yet) is not a row.
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n1.5,100\n2.0,200\n99")), 2.0);
  // Nothing to go on: 0.
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\nnan,5\n")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(::testing::TempDir() + "/no_such_metrics.csv"), 0.0);
}

TEST_F(LastRunSecondsTest, FindsTheLastRowOfAFileLongerThanTheTailItReads) {
  std::string text = "seconds,frames\n";
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + ".5,123456789\n";
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write(text)), 19999.5);
  // The last row by column name, the header read from the file's start.
  const std::map<std::string, std::string> last = LastCsvRow(Write(text + "20000.5,12"));
  EXPECT_EQ(last, (std::map<std::string, std::string>{{"seconds", "19999.5"}, {"frames", "123456789"}}));
  EXPECT_TRUE(LastCsvRow(Write("seconds,frames\n")).empty()) << "a header is no row";
  EXPECT_TRUE(LastCsvRow(::testing::TempDir() + "/no_such_metrics.csv").empty());
  // The 64 KB tail starts inside a row ("123456.5,1" cut to ".5,1") and
  // holds no whole numeric row after it: the cut row is not read as 0.5.
  std::string cut = "seconds,frames\n";
  for (int i = 0; i < 100; ++i) cut += "123456.5,1\n";
  cut += "xy\n";  // 3 bytes, then 2-byte rows: 65,531 bytes after the numeric rows
  for (int i = 0; i < 32764; ++i) cut += "x\n";
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write(cut)), 0.0);
}

}  // namespace
}  // namespace troupe
