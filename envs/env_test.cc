#include "envs/env.h"

#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "common/files.h"
#include "common/image.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using ::testing::HasSubstr;

// An env and buffers for its observations.
struct Harness {
  std::unique_ptr<Environment> env;
  std::vector<float> state;
  std::vector<uint8_t> pixels;
  ObservationBuffers out() { return {state.data(), pixels.empty() ? nullptr : pixels.data()}; }
};

Harness Make(EnvOptions options) {
  auto env = MakeEnv(options);
  EXPECT_TRUE(env.ok()) << env.status();
  Harness h;
  h.env = std::move(env).value();
  h.state.resize(h.env->spec().state_size);
  h.pixels.resize(h.env->spec().pixel_bytes());
  return h;
}

EnvOptions Options(const std::string& task, bool pixels, uint64_t seed = 0) {
  EnvOptions o;
  o.task = task;
  o.pixels = pixels;
  o.seed = seed;
  return o;
}

std::vector<std::string> TaskNames() {
  std::vector<std::string> names;
  for (const auto& t : Tasks()) names.push_back(t.name);
  return names;
}

std::string Sanitize(std::string name) {
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  return name;
}

class EveryTaskTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryTaskTest, StepsToItsTimeLimitWithRewardsInUnitRange) {
  Harness h = Make(Options(GetParam(), /*pixels=*/false, /*seed=*/3));
  const EnvSpec& spec = h.env->spec();
  int fields = 0;
  for (const auto& f : spec.state_fields) fields += f.size;
  EXPECT_EQ(fields, spec.state_size);
  EXPECT_GT(spec.action_size, 0);
  ASSERT_EQ(spec.episode_steps, 1000);

  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> action(spec.action_size);
  auto first = h.env->Reset(h.out());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->step_type, StepType::kFirst);
  int steps = 0;
  for (;;) {
    for (float& a : action) a = uniform(rng);
    auto t = h.env->Step(action, h.out());
    ASSERT_TRUE(t.ok()) << t.status();
    ++steps;
    ASSERT_GE(t->reward, 0.0f) << "step " << steps;
    ASSERT_LE(t->reward, 1.0f) << "step " << steps;
    for (float v : h.state) ASSERT_TRUE(std::isfinite(v)) << "step " << steps;
    if (t->step_type == StepType::kLast) break;
    ASSERT_EQ(t->step_type, StepType::kMid);
  }
  EXPECT_EQ(steps, 1000);
  EXPECT_EQ(h.env->physics_errors(), 0);
  // The episode is over: stepping again is a precondition error.
  EXPECT_EQ(h.env->Step(action, h.out()).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Each model sizes its mjData (<size nstack njmax nconmax>) small, since
// MuJoCo zeroes the solver stack at every reset. Episodes of bang-bang
// actions (held for a while: bodies hit limits, fall, tumble) must stay
// well inside it: a full stack is a physics error, and full contact or
// constraint arrays silently drop contacts.
TEST_P(EveryTaskTest, ArenaHeadroom) {
  int max_stack = 0, max_contacts = 0, max_rows = 0;
  for (int episode = 0; episode < 3; ++episode) {
    Harness h = Make(Options(GetParam(), /*pixels=*/false, /*seed=*/11 + episode));
    std::mt19937_64 rng(episode);
    std::vector<float> action(h.env->spec().action_size);
    ASSERT_TRUE(h.env->Reset(h.out()).ok());
    for (int step = 0; step < h.env->spec().episode_steps; ++step) {
      if (step % (10 + 20 * episode) == 0) {
        for (float& a : action) a = rng() % 2 ? 1.0f : -1.0f;
      }
      auto t = h.env->Step(action, h.out());
      ASSERT_TRUE(t.ok()) << t.status();
      if (t->step_type == StepType::kLast) break;
    }
    const mjData* d = h.env->data();
    EXPECT_EQ(d->warning[mjWARN_CONTACTFULL].number, 0);
    EXPECT_EQ(d->warning[mjWARN_CNSTRFULL].number, 0);
    max_stack = std::max(max_stack, d->maxuse_stack);
    max_contacts = std::max(max_contacts, d->maxuse_con);
    max_rows = std::max(max_rows, d->maxuse_efc);
  }
  auto model = LoadTaskModel(GetParam(), /*multisample=*/false);
  ASSERT_TRUE(model.ok()) << model.status();
  const mjModel* m = (*model)->get();
  EXPECT_LE(max_stack, m->nstack / 8) << "solver stack";
  EXPECT_LE(max_contacts, m->nconmax / 4) << "contacts";
  EXPECT_LE(max_rows, m->njmax / 4) << "constraint rows";
}

TEST_P(EveryTaskTest, SameSeedSameEpisodeDifferentSeedDifferentStart) {
  Harness a = Make(Options(GetParam(), /*pixels=*/true, /*seed=*/11));
  Harness b = Make(Options(GetParam(), /*pixels=*/true, /*seed=*/11));
  Harness c = Make(Options(GetParam(), /*pixels=*/true, /*seed=*/12));
  EXPECT_EQ(a.env->spec().height, 84);
  EXPECT_EQ(a.env->spec().width, 84);
  EXPECT_EQ(a.env->spec().channels, 3);
  ASSERT_TRUE(a.env->Reset(a.out()).ok());
  ASSERT_TRUE(b.env->Reset(b.out()).ok());
  ASSERT_TRUE(c.env->Reset(c.out()).ok());
  EXPECT_NE(a.state, c.state) << "a different seed gave the same initial state";
  std::vector<float> action(a.env->spec().action_size, 0.5f);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(a.state, b.state) << "step " << i;
    ASSERT_EQ(a.pixels, b.pixels) << "step " << i;
    ASSERT_TRUE(a.env->Step(action, a.out()).ok());
    ASSERT_TRUE(b.env->Step(action, b.out()).ok());
  }
  // Episode 2 of the same seed is the same too, and differs from episode 1's start.
  std::vector<float> first_state = a.state;
  ASSERT_TRUE(a.env->Reset(a.out()).ok());
  ASSERT_TRUE(b.env->Reset(b.out()).ok());
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.pixels, b.pixels);
}

TEST_P(EveryTaskTest, PixelsShowAVariedSceneThatChangesAsTheBodyMoves) {
  Harness h = Make(Options(GetParam(), /*pixels=*/true, /*seed=*/5));
  ASSERT_TRUE(h.env->Reset(h.out()).ok());
  const std::vector<uint8_t> first = h.pixels;
  // Not a constant image: a spread of intensities.
  const auto [lo, hi] = std::minmax_element(first.begin(), first.end());
  EXPECT_GT(*hi - *lo, 60);
  std::vector<float> action(h.env->spec().action_size);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int i = 0; i < 60; ++i) {
    for (float& a : action) a = uniform(rng);
    ASSERT_TRUE(h.env->Step(action, h.out()).ok());
  }
  size_t changed = 0;
  for (size_t i = 0; i < first.size(); ++i) changed += std::abs(int(first[i]) - int(h.pixels[i])) > 10;
  EXPECT_GT(changed, first.size() / 200) << "pixels barely changed after 60 random steps";
}

// One frame per task against an image stored in envs/testdata/golden.
// TROUPE_UPDATE_GOLDENS=1 rewrites them.
TEST_P(EveryTaskTest, FirstFrameMatchesGoldenImage) {
  Harness h = Make(Options(GetParam(), /*pixels=*/true, /*seed=*/0));
  ASSERT_TRUE(h.env->Reset(h.out()).ok());
  Image frame(84, 84, 3);
  frame.pixels = h.pixels;
  const std::string path = ProjectPath("envs/testdata/golden/") + Sanitize(GetParam()) + ".png";
  if (const char* update = std::getenv("TROUPE_UPDATE_GOLDENS"); update && std::string(update) == "1") {
    ASSERT_TRUE(WritePng(path, frame).ok());
  }
  auto golden = ReadPng(path);
  ASSERT_TRUE(golden.ok()) << golden.status() << " (run with TROUPE_UPDATE_GOLDENS=1 to create it)";
  ASSERT_EQ(golden->pixels.size(), frame.pixels.size());
  double total = 0;
  size_t far = 0;
  for (size_t i = 0; i < frame.pixels.size(); ++i) {
    const int d = std::abs(int(frame.pixels[i]) - int(golden->pixels[i]));
    total += d;
    far += d > 24;
  }
  EXPECT_LT(total / frame.pixels.size(), 1.0) << "mean absolute difference from " << path;
  EXPECT_LT(far, frame.pixels.size() / 200) << "values far from " << path;
}

INSTANTIATE_TEST_SUITE_P(Tasks, EveryTaskTest, ::testing::ValuesIn(TaskNames()),
                         [](const auto& info) { return Sanitize(info.param); });

// DescribeEnv (no mjData, no renderer) says what MakeEnv builds, wrappers included.
TEST_P(EveryTaskTest, DescribeEnvGivesTheSpecOfTheBuiltEnv) {
  EnvOptions state = Options(GetParam(), /*pixels=*/false);
  EnvOptions pixels = Options(GetParam(), /*pixels=*/true);
  pixels.action_repeat = 2;
  pixels.frame_stack = 3;
  pixels.render.width = 48;
  for (const EnvOptions& options : {state, pixels}) {
    auto described = DescribeEnv(options);
    ASSERT_TRUE(described.ok()) << described.status();
    const EnvSpec built = Make(options).env->spec();
    EXPECT_EQ(described->task, built.task);
    EXPECT_EQ(described->state_size, built.state_size);
    ASSERT_EQ(described->state_fields.size(), built.state_fields.size());
    for (size_t i = 0; i < built.state_fields.size(); ++i) {
      EXPECT_EQ(described->state_fields[i].name, built.state_fields[i].name);
      EXPECT_EQ(described->state_fields[i].size, built.state_fields[i].size);
    }
    EXPECT_EQ(described->height, built.height);
    EXPECT_EQ(described->width, built.width);
    EXPECT_EQ(described->channels, built.channels);
    EXPECT_EQ(described->action_size, built.action_size);
    EXPECT_EQ(described->action_minimum, built.action_minimum);
    EXPECT_EQ(described->action_maximum, built.action_maximum);
    EXPECT_EQ(described->episode_steps, built.episode_steps);
    EXPECT_EQ(described->action_repeat, built.action_repeat);
  }
  EXPECT_EQ(DescribeEnv(pixels)->channels, 9);
  EXPECT_EQ(DescribeEnv(pixels)->width, 48);
}

TEST(EnvTest, DescribeEnvRefusesWhatMakeEnvRefuses) {
  EnvOptions options = Options("cartpole.swingup", /*pixels=*/true);
  options.camera = "nowhere";
  EXPECT_THAT(DescribeEnv(options).status().message(), HasSubstr("no camera named 'nowhere'"));
  EXPECT_EQ(DescribeEnv(Options("cartpole.jump", false)).status().code(), absl::StatusCode::kNotFound);
  config::EnvConfig bad;
  bad.set_frame_stack(0);
  EXPECT_THAT(DescribeEnv(bad).status().message(), HasSubstr("env.frame_stack"));
}

TEST(EnvTest, UnknownTaskListsTheKnownOnes) {
  auto env = MakeEnv(Options("cartpole.flip", /*pixels=*/false));
  ASSERT_EQ(env.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(env.status().message(), HasSubstr("cartpole.flip"));
  for (const auto& name : TaskNames()) EXPECT_THAT(env.status().message(), HasSubstr(name));
}

TEST(EnvTest, MissingModelFileIsNotFoundNamingThePath) {
  auto model = Model::Load("/nonexistent/troupe/model.xml");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr("/nonexistent/troupe/model.xml"));
}

TEST(EnvTest, MalformedModelGivesMujocosMessageWithFileAndLine) {
  const std::string path = ::testing::TempDir() + "/malformed.xml";
  std::ofstream(path) << "<mujoco>\n  <worldbody>\n    <body name='b'>\n      <geom type='sphere' size='oops'/>\n"
                         "    </body>\n  </worldbody>\n</mujoco>\n";
  auto model = Model::Load(path);
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr(path));
  EXPECT_THAT(model.status().message(), HasSubstr("line 4"));
}

TEST(EnvTest, UnclosedXmlIsRejected) {
  const std::string path = ::testing::TempDir() + "/unclosed.xml";
  std::ofstream(path) << "<mujoco>\n  <worldbody>\n";
  auto model = Model::Load(path);
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr(path));
}

TEST(EnvTest, MujocoErrorsThrowInsteadOfExiting) {
  InstallMujocoErrorHandlers();
  EXPECT_THROW(mju_error("boom"), MujocoError);
}

TEST(EnvTest, WrongActionSizeAndNonFiniteActionsAreRejectedWithoutStepping) {
  Harness h = Make(Options("cartpole.swingup", /*pixels=*/false));
  ASSERT_TRUE(h.env->Reset(h.out()).ok());
  const std::vector<float> before = h.state;
  std::vector<float> two = {0.1f, 0.2f};
  auto size_error = h.env->Step(two, h.out());
  ASSERT_EQ(size_error.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(size_error.status().message(), HasSubstr("action has 2 values, the task takes 1"));
  std::vector<float> nan = {std::nanf("")};
  auto nan_error = h.env->Step(nan, h.out());
  ASSERT_EQ(nan_error.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nan_error.status().message(), HasSubstr("action[0] is nan"));
  std::vector<float> inf = {INFINITY};
  EXPECT_EQ(h.env->Step(inf, h.out()).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(h.env->Observe(h.out()).ok());
  EXPECT_EQ(h.state, before) << "a rejected action changed the state";
}

TEST(EnvTest, StepBeforeResetIsAPreconditionError) {
  Harness h = Make(Options("pendulum.swingup", /*pixels=*/false));
  std::vector<float> action = {0.0f};
  EXPECT_EQ(h.env->Step(action, h.out()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EnvTest, RenderSizeBeyondTheOffscreenBufferIsRejected) {
  EnvOptions options = Options("cartpole.swingup", /*pixels=*/true);
  options.render.width = 4096;
  auto env = MakeEnv(options);
  ASSERT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(env.status().message(), HasSubstr("4096x84"));
  EXPECT_THAT(env.status().message(), HasSubstr("offscreen buffer 512x512"));
  // Described (what a config is checked with) as well, before any buffer is made.
  options.render.width = 100000;
  options.render.height = 100000;
  EXPECT_THAT(DescribeEnv(options).status().message(),
              HasSubstr("env.render: size 100000x100000 is outside the offscreen buffer 512x512"));
}

TEST(EnvTest, UnknownCameraIsRejected) {
  EnvOptions options = Options("cartpole.swingup", /*pixels=*/true);
  options.camera = "nowhere";
  auto env = MakeEnv(options);
  ASSERT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(env.status().message(), HasSubstr("nowhere"));
}

TEST(EnvTest, ActionsAreClippedToTheSpec) {
  Harness a = Make(Options("cartpole.swingup", /*pixels=*/false, /*seed=*/2));
  Harness b = Make(Options("cartpole.swingup", /*pixels=*/false, /*seed=*/2));
  EXPECT_EQ(a.env->spec().action_minimum, std::vector<float>{-1.0f});
  EXPECT_EQ(a.env->spec().action_maximum, std::vector<float>{1.0f});
  ASSERT_TRUE(a.env->Reset(a.out()).ok());
  ASSERT_TRUE(b.env->Reset(b.out()).ok());
  std::vector<float> big = {7.0f}, one = {1.0f};
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(a.env->Step(big, a.out()).ok());
    ASSERT_TRUE(b.env->Step(one, b.out()).ok());
  }
  EXPECT_EQ(a.state, b.state);
  EXPECT_GT(a.state[0], 0.02f) << "the cart should have moved right";
}

TEST(EnvTest, ActionRepeatSumsRewardsAndRendersTheLastState) {
  EnvOptions options = Options("cartpole.swingup", /*pixels=*/true, /*seed=*/4);
  Harness plain = Make(options);
  options.action_repeat = 4;
  Harness repeated = Make(options);
  EXPECT_EQ(repeated.env->spec().episode_steps, 250);
  ASSERT_TRUE(plain.env->Reset(plain.out()).ok());
  ASSERT_TRUE(repeated.env->Reset(repeated.out()).ok());
  std::vector<float> action = {0.8f};
  for (int step = 0; step < 5; ++step) {
    float sum = 0;
    for (int r = 0; r < 4; ++r) sum += plain.env->Step(action, plain.out())->reward;
    auto t = repeated.env->Step(action, repeated.out());
    ASSERT_TRUE(t.ok());
    EXPECT_FLOAT_EQ(t->reward, sum);
    EXPECT_EQ(repeated.state, plain.state);
    EXPECT_EQ(repeated.pixels, plain.pixels);
  }
  int steps = 5;
  while (repeated.env->Step(action, repeated.out())->step_type != StepType::kLast) ++steps;
  EXPECT_EQ(steps + 1, 250);
}

TEST(EnvTest, FrameStackShiftsFramesOldestFirst) {
  EnvOptions options = Options("pendulum.swingup", /*pixels=*/true, /*seed=*/9);
  options.frame_stack = 3;
  Harness h = Make(options);
  const EnvSpec& spec = h.env->spec();
  ASSERT_EQ(spec.channels, 9);
  ASSERT_TRUE(h.env->Reset(h.out()).ok());
  const size_t pixels = size_t(spec.height) * spec.width;
  auto frame = [&](const std::vector<uint8_t>& stack, int j) {
    std::vector<uint8_t> f(pixels * 3);
    for (size_t p = 0; p < pixels; ++p) {
      for (int c = 0; c < 3; ++c) f[p * 3 + c] = stack[p * 9 + j * 3 + c];
    }
    return f;
  };
  // At reset the first frame fills the stack.
  EXPECT_EQ(frame(h.pixels, 0), frame(h.pixels, 2));
  std::vector<float> action = {1.0f};
  std::vector<uint8_t> previous = h.pixels;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(h.env->Step(action, h.out()).ok());
    EXPECT_EQ(frame(h.pixels, 0), frame(previous, 1));
    EXPECT_EQ(frame(h.pixels, 1), frame(previous, 2));
    EXPECT_NE(frame(h.pixels, 2), frame(previous, 2));
    previous = h.pixels;
  }
}

// A model whose motor is absurdly strong blows up; the episode ends, counted.
TEST(EnvTest, PhysicsBlowUpEndsTheEpisodeAndIsCounted) {
  const std::string dir = ::testing::TempDir() + "/blowup_assets";
  std::filesystem::create_directories(dir);
  std::ifstream in(AssetsDir() + "/cartpole.xml");
  std::stringstream text;
  text << in.rdbuf();
  std::string xml = text.str();
  const std::string gear = "gear=\"10\"";
  ASSERT_NE(xml.find(gear), std::string::npos);
  xml.replace(xml.find(gear), gear.size(), "gear=\"1e30\"");
  std::ofstream(dir + "/cartpole.xml") << xml;
  auto model = Model::Load(dir + "/cartpole.xml");
  ASSERT_TRUE(model.ok()) << model.status();
  auto env = MakeEnv(Options("cartpole.swingup", /*pixels=*/false), *model);
  ASSERT_TRUE(env.ok()) << env.status();
  std::vector<float> state((*env)->spec().state_size);
  ASSERT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  std::vector<float> action = {1.0f};
  int steps = 0;
  StepType type = StepType::kMid;
  while (type != StepType::kLast && steps < 1000) {
    auto t = (*env)->Step(action, {state.data(), nullptr});
    ASSERT_TRUE(t.ok()) << t.status();
    type = t->step_type;
    ++steps;
  }
  EXPECT_LT(steps, 1000);
  EXPECT_EQ((*env)->physics_errors(), 1);
  // The next episode starts normally.
  ASSERT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  for (float v : state) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace troupe::envs
