// Smoke test of `troupe bench rl --quick --json PATH`: the benchmark runs end
// to end (2 actor processes + learner from pixels, and both references) and
// writes every figure with a positive value and reference.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/build_tree.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

TEST(BenchRlSmokeTest, QuickRunWritesEveryFigureWithPositiveValues) {
  const std::string dir = ::testing::TempDir() + "/bench_rl_smoke";
  std::filesystem::create_directories(dir);
  const std::string json = dir + "/rl.json", log = dir + "/bench.log";
  std::filesystem::remove(json);
  const std::string command =
      std::string(TROUPE_BINARY) + " bench rl --quick --json " + json + " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  std::stringstream output;
  output << std::ifstream(log).rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output.str();

  std::stringstream text;
  text << std::ifstream(json).rdbuf();
  const std::string document = text.str();
  EXPECT_THAT(document, ::testing::HasSubstr("\"benchmark\": \"rl\""));
  // Every figure: {"name": N, "value": V, "unit": U, "reference": R, "reference_value": RV, "ratio": X}.
  const std::regex figure(
      "\\{\"name\": \"([^\"]+)\", \"value\": ([-0-9.e+]+), \"unit\": \"[^\"]*\", \"reference\": \"[^\"]*\", "
      "\"reference_value\": ([-0-9.e+]+), \"ratio\": ([-0-9.e+]+)\\}");
  std::vector<std::string> names;
  for (std::sregex_iterator it(document.begin(), document.end(), figure), end; it != end; ++it) {
    const std::string name = (*it)[1];
    names.push_back(name);
    EXPECT_GT(std::stod((*it)[2]), 0) << name << "\n" << document;
    EXPECT_GT(std::stod((*it)[3]), 0) << name << "\n" << document;
    EXPECT_GT(std::stod((*it)[4]), 0) << name << "\n" << document;
  }
  const std::string all = ::testing::PrintToString(names);
  for (const char* expected : {"env frames/s, 2 actors + learner, samples/insert 32",
                               "learner updates/s, batch 32, samples/insert 32",
                               "CPU share: 2 actor processes, samples/insert 32",
                               "CPU share: learner process (replay embedded), samples/insert 32",
                               "env frames/s, 2 actors + learner, no samples/insert limit",
                               "learner updates/s, batch 32, no samples/insert limit"}) {
    EXPECT_THAT(names, ::testing::Contains(std::string(expected))) << all;
  }
}

}  // namespace
}  // namespace troupe
