// Fuzzing the config path `troupe run` takes (ParseExperimentConfig, the
// --set overrides, ValidateExperiment, ConfigSource::Locate), in process: a
// seeded loop of mutations (byte flips, token swaps and deletions, numeric
// and string edge values, truncation, random overrides) of every shipped
// config and every refused one in tests/bad_configs. A crash, an abort, an
// exception or a sanitizer report fails it; so does a refusal that does not
// say where (file:line or the --set) or does not name a field, and any file
// created. Bounded for ctest (a few seconds); on demand:
//   TROUPE_FUZZ_ITERATIONS=100000 build/release/launch/experiment_fuzz_test
// (TROUPE_FUZZ_SEED=S to start elsewhere; a failure prints its seed).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/files.h"
#include "common/fuzz.h"
#include "gtest/gtest.h"
#include "launch/experiment.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (const char* folder : {"configs", "tests/bad_configs"}) {
    for (const auto& entry : fs::directory_iterator(ProjectPath(folder))) {
      if (entry.path().extension() != ".textproto") continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      seeds.push_back(text.str());
    }
  }
  return seeds;
}

// Every singular scalar field of the schema, by path, with its descriptor.
void ScalarPaths(const pb::Descriptor* d, const std::string& prefix, int depth,
                 std::vector<std::pair<std::string, const pb::FieldDescriptor*>>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (depth < 4) ScalarPaths(f->message_type(), path, depth + 1, out);
    } else {
      out->emplace_back(path, f);
    }
  }
}

// A random --set: a real field with an edge value, now and then a bad path.
std::string RandomOverride(fuzz::Mutator& m,
                           const std::vector<std::pair<std::string, const pb::FieldDescriptor*>>& paths) {
  const auto& [path, field] = paths[static_cast<size_t>(m.Uniform(0, paths.size() - 1))];
  std::string value;
  if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
    value = field->enum_type()->value(static_cast<int>(m.Uniform(0, field->enum_type()->value_count() - 1)))->name();
  } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
    value = m.EdgeString();
  } else {
    value = m.EdgeNumber();
  }
  std::string assignment = absl::StrCat(path, "=", value);
  if (m.OneIn(10)) m.MutateBytes(assignment);
  return assignment;
}

TEST(ExperimentFuzzTest, MutatedConfigsAreRefusedSayingWhereOrAcceptedNeverCrashing) {
  const std::vector<std::string> seeds = Seeds();
  ASSERT_GE(seeds.size(), 30u);
  std::vector<std::pair<std::string, const pb::FieldDescriptor*>> paths;
  ScalarPaths(config::ExperimentConfig::descriptor(), "", 0, &paths);
  // Validation runs in an empty folder, which must stay empty.
  const fs::path scratch = fs::path(::testing::TempDir()) / absl::StrCat("experiment_fuzz_", getpid());
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch);

  const fuzz::Budget budget = fuzz::Budget::FromEnvironment(/*default_iterations=*/1'000'000, /*default_seconds=*/12);
  const std::regex located(R"(^(fuzz\.textproto:[0-9]+(:[0-9]+)?: |--set ))");
  int64_t parsed = 0, accepted = 0, refused = 0, at_default = 0;
  std::vector<std::string> unlocated;
  const int64_t iterations = fuzz::Loop(budget, [&](uint64_t seed) {
    fuzz::Mutator m(seed);
    std::string text = seeds[static_cast<size_t>(m.Uniform(0, seeds.size() - 1))];
    for (int k = static_cast<int>(m.Uniform(1, 4)); k > 0; --k) m.MutateText(text);
    std::vector<std::string> overrides;
    if (m.OneIn(3)) overrides.push_back(RandomOverride(m, paths));
    auto loaded = ParseExperimentConfig(text, "fuzz.textproto", overrides);
    std::string message;
    if (loaded.ok()) {
      ++parsed;
      const absl::Status valid = ValidateExperiment(loaded->config);
      if (valid.ok()) {
        ++accepted;
        return;
      }
      ++refused;
      message = loaded->source.Locate(valid.message());
      if (absl::StrContains(message, "is not set in the file")) ++at_default;
    } else {
      message = std::string(loaded.status().message());
    }
    if (!std::regex_search(message, located) && !absl::StrContains(message, "is not set in the file") &&
        unlocated.size() < 20) {
      unlocated.push_back(absl::StrCat("seed ", seed, ": ", message));
    }
  });
  fs::current_path(cwd);
  std::vector<std::string> left;
  for (const auto& entry : fs::recursive_directory_iterator(scratch)) left.push_back(entry.path().string());
  fs::remove_all(scratch);

  std::printf("config fuzz: %lld iterations from seed %llu: %lld parsed, %lld accepted, %lld refused by validation "
              "(%lld of them about a field at its default)\n",
              static_cast<long long>(iterations), static_cast<unsigned long long>(budget.seed),
              static_cast<long long>(parsed), static_cast<long long>(accepted), static_cast<long long>(refused),
              static_cast<long long>(at_default));
  EXPECT_GT(iterations, 0);
  EXPECT_GT(parsed, 0) << "the mutations never produced a config that parses: they test nothing past the parser";
  for (const std::string& u : unlocated) ADD_FAILURE() << "a refusal that does not say where: " << u;
  for (const std::string& l : left) ADD_FAILURE() << "validation created " << l;
}

}  // namespace
}  // namespace troupe::launch
