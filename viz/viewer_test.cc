// The viewer in a real window: an Xvfb server started by the test (Mesa's
// llvmpipe gives software OpenGL under it), cartpole in the window, keys
// injected as SDL events, screenshots read back and compared.
#include "viz/viewer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "viz/policies/scripted.h"
#include "viz/sources/policy_episodes.h"
#include "viz/testing/xvfb.h"

namespace troupe::viz {
namespace {
using ::testing::HasSubstr;

constexpr int kWidth = 480;
constexpr int kHeight = 360;

const auto* const xvfb = ::testing::AddGlobalTestEnvironment(new testing::XvfbEnvironment);

// Always the same action: moves the cart predictably.
class ConstantPolicy : public PolicySource {
 public:
  explicit ConstantPolicy(float value) : value_(value) {}
  std::string Describe() const override { return "constant"; }
  absl::Status Act(const envs::Environment&, const Observation&, std::span<float> action) override {
    std::fill(action.begin(), action.end(), value_);
    return absl::OkStatus();
  }

 private:
  float value_;
};

// A paused cartpole.swingup viewer in a kWidth x kHeight window.
std::unique_ptr<Viewer> MakeViewer(std::unique_ptr<PolicySource> policy, bool paused = true) {
  ViewerOptions options;
  options.width = kWidth;
  options.height = kHeight;
  options.vsync = false;
  options.task = "cartpole.swingup";
  options.screenshot_dir = ::testing::TempDir();
  auto viewer = Viewer::Create(std::move(options));
  EXPECT_TRUE(viewer.ok()) << viewer.status();
  if (!viewer.ok()) return nullptr;
  envs::EnvOptions env;
  env.task = "cartpole.swingup";
  auto simulation = Simulation::Create(
      [&]() -> absl::StatusOr<std::unique_ptr<EpisodeSource>> { return PolicyEpisodes::Create(env, std::move(policy)); },
      {.start_paused = paused});
  EXPECT_TRUE(simulation.ok()) << simulation.status();
  EXPECT_TRUE((*viewer)->Show(*std::move(simulation)).ok());
  return *std::move(viewer);
}

// Presses `key`, lets the viewer handle it and the physics carry it out.
void Press(Viewer& viewer, SDL_Keycode key) {
  viewer.InjectKey(key);
  ASSERT_TRUE(viewer.RunFrames(1).ok());
  ASSERT_TRUE(viewer.simulation().WaitUntilIdle(absl::Seconds(10)));
}

Image Shot(Viewer& viewer) {
  auto image = viewer.Screenshot();
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? *std::move(image) : Image();
}

// Pixels (of all three channels) that differ by more than 24 in `region`
// (x0, y0, x1, y1; whole image when empty).
int DifferentPixels(const Image& a, const Image& b, std::array<int, 4> region = {0, 0, 0, 0}) {
  if (region[2] == 0) region = {0, 0, a.width, a.height};
  int count = 0;
  for (int y = region[1]; y < region[3]; ++y) {
    for (int x = region[0]; x < region[2]; ++x) {
      const uint8_t* p = a.at(x, y);
      const uint8_t* q = b.at(x, y);
      if (std::abs(p[0] - q[0]) + std::abs(p[1] - q[1]) + std::abs(p[2] - q[2]) > 24) ++count;
    }
  }
  return count;
}

int64_t Step(Viewer& viewer) {
  int64_t step = 0;
  viewer.simulation().Read([&](const mjModel*, const mjData*, const SimulationStatus& s) { step = s.step; });
  return step;
}

// Where the world point `p` lands in a window of width x height seen from
// fixed camera `camera` (MuJoCo cameras look along their -z axis, y up).
std::array<int, 2> Project(const mjModel* m, const mjData* d, int camera, const double* p, int width, int height) {
  double relative[3], local[3];
  mju_sub3(relative, p, d->cam_xpos + 3 * camera);
  mju_mulMatTVec(local, d->cam_xmat + 9 * camera, relative, 3, 3);
  const double f = 1.0 / std::tan(m->cam_fovy[camera] * M_PI / 360.0);
  const double x = f * local[0] / -local[2] * height / width;
  const double y = f * local[1] / -local[2];
  return {int((x + 1) / 2 * width), int((1 - y) / 2 * height)};
}

// The cart's orange (.75 .45 .15 lit): red well above blue.
bool IsCartColoured(const Image& image, std::array<int, 2> at) {
  const uint8_t* p = image.at(at[0], at[1]);
  return p[0] > p[2] + 60 && p[0] > p[1];
}

TEST(ViewerTest, DrawsTheSceneInARealWindow) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  ASSERT_TRUE(viewer->RunFrames(3).ok());
  Image image = Shot(*viewer);
  ASSERT_EQ(image.width, kWidth);
  ASSERT_EQ(image.height, kHeight);
  // Not blank, not one colour: a lit scene has many colours.
  std::set<uint32_t> colours;
  for (int i = 0; i < image.width * image.height; ++i) {
    const uint8_t* p = image.pixels.data() + 3 * i;
    colours.insert(p[0] << 16 | p[1] << 8 | p[2]);
  }
  EXPECT_GT(colours.size(), 500u);
  ASSERT_TRUE(WritePng(::testing::TempDir() + "/viewer_cartpole.png", image).ok());
}

TEST(ViewerTest, CartIsDrawnWhereTheStateSaysIt) {
  auto viewer = MakeViewer(std::make_unique<ConstantPolicy>(1.0f));
  ASSERT_NE(viewer, nullptr);
  viewer->options().show_hud = viewer->options().show_agent_view = viewer->options().show_actions = false;
  // The task's fixed side camera ("fixed", id 0).
  Press(*viewer, SDLK_c);
  ASSERT_EQ(viewer->CameraName(), "fixed");
  auto cart_pixel = [&] {
    std::array<int, 2> at;
    viewer->simulation().Read([&](const mjModel* m, const mjData* d, const SimulationStatus&) {
      const int cart = mj_name2id(m, mjOBJ_BODY, "cart");
      at = Project(m, d, /*camera=*/0, d->xpos + 3 * cart, kWidth, kHeight);
    });
    return at;
  };
  const std::array<int, 2> before_at = cart_pixel();
  Image before = Shot(*viewer);
  // Full force to the right for 0.6 s of simulated time.
  for (int i = 0; i < 60; ++i) viewer->simulation().RequestStep();
  ASSERT_TRUE(viewer->simulation().WaitUntilIdle(absl::Seconds(10)));
  const std::array<int, 2> after_at = cart_pixel();
  Image after = Shot(*viewer);
  ASSERT_GT(after_at[0] - before_at[0], 40) << "the cart should have moved right on screen";
  EXPECT_TRUE(IsCartColoured(before, before_at));
  EXPECT_TRUE(IsCartColoured(after, after_at));
  EXPECT_FALSE(IsCartColoured(before, after_at));
  EXPECT_FALSE(IsCartColoured(after, before_at));
}

TEST(ViewerTest, SpacePausesRightArrowStepsAndRStartsANewEpisode) {
  auto viewer = MakeViewer(std::make_unique<ConstantPolicy>(1.0f), /*paused=*/false);
  ASSERT_NE(viewer, nullptr);
  // Running: steps advance on their own.
  ASSERT_TRUE(viewer->RunFrames(2).ok());
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_GT(Step(*viewer), 0);
  // Space pauses: no more steps.
  Press(*viewer, SDLK_SPACE);
  const int64_t paused_at = Step(*viewer);
  absl::SleepFor(absl::Milliseconds(150));
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  EXPECT_EQ(Step(*viewer), paused_at);
  // r: a new episode from step 0, still paused.
  Press(*viewer, SDLK_r);
  EXPECT_EQ(Step(*viewer), 0);
  viewer->simulation().Read([](const mjModel*, const mjData*, const SimulationStatus& s) {
    EXPECT_EQ(s.episode, 2);
    EXPECT_TRUE(s.paused);
  });
  Image paused = Shot(*viewer);
  double cart_before = 0, cart_after = 0;
  viewer->simulation().Read([&](const mjModel*, const mjData* d, const SimulationStatus&) { cart_before = d->qpos[0]; });
  // Right arrow: exactly one step each. From the new episode's start (near
  // the rail's middle, nearly at rest), ten steps at full force to the right
  // move the cart right visibly, however long it ran before the pause (a long
  // run presses it against the rail's end, where it moves little or back).
  Press(*viewer, SDLK_RIGHT);
  EXPECT_EQ(Step(*viewer), 1);
  for (int i = 0; i < 9; ++i) Press(*viewer, SDLK_RIGHT);
  EXPECT_EQ(Step(*viewer), 10);
  viewer->simulation().Read([&](const mjModel*, const mjData* d, const SimulationStatus&) { cart_after = d->qpos[0]; });
  EXPECT_GT(cart_after, cart_before + 1e-2);
  EXPECT_GT(DifferentPixels(paused, Shot(*viewer)), 30);
  // r again: the next episode, from step 0.
  Press(*viewer, SDLK_r);
  EXPECT_EQ(Step(*viewer), 0);
  viewer->simulation().Read([](const mjModel*, const mjData*, const SimulationStatus& s) { EXPECT_EQ(s.episode, 3); });
}

TEST(ViewerTest, CKeyCyclesThroughTheTasksFixedCamerasAndBackToTheFreeCamera) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  EXPECT_EQ(viewer->CameraName(), "free");
  Image free_view = Shot(*viewer);
  Press(*viewer, SDLK_c);
  EXPECT_EQ(viewer->CameraName(), "fixed");
  Image fixed_view = Shot(*viewer);
  EXPECT_GT(DifferentPixels(free_view, fixed_view), kWidth * kHeight / 10);
  Press(*viewer, SDLK_c);
  EXPECT_EQ(viewer->CameraName(), "lookatcart");
  EXPECT_GT(DifferentPixels(fixed_view, Shot(*viewer)), kWidth * kHeight / 10);
  Press(*viewer, SDLK_c);
  EXPECT_EQ(viewer->CameraName(), "free");
}

TEST(ViewerTest, MouseDragOrbitsAndWheelZoomsTheFreeCamera) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::ZERO, 0));
  ASSERT_NE(viewer, nullptr);
  Image start = Shot(*viewer);
  viewer->InjectDrag(SDL_BUTTON_LEFT, /*dx=*/120, /*dy=*/0);
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  Image orbited = Shot(*viewer);
  EXPECT_GT(DifferentPixels(start, orbited), kWidth * kHeight / 20);
  viewer->InjectWheel(/*clicks=*/5);
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  EXPECT_GT(DifferentPixels(orbited, Shot(*viewer)), kWidth * kHeight / 20);
}

TEST(ViewerTest, HudTextIsDrawnInTheTopLeftCorner) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  viewer->options().show_hud = true;
  Image with_hud = Shot(*viewer);
  viewer->options().show_hud = false;
  Image without_hud = Shot(*viewer);
  // Text in the top-left quarter; the rest of the picture is the same scene.
  EXPECT_GT(DifferentPixels(with_hud, without_hud, {0, 0, kWidth / 2, kHeight / 2}), 1000);
  EXPECT_EQ(DifferentPixels(with_hud, without_hud, {kWidth / 2, kHeight / 2, kWidth, kHeight}), 0);
  // The help overlay (h) draws in the top-right corner.
  Press(*viewer, SDLK_h);
  EXPECT_GT(DifferentPixels(without_hud, Shot(*viewer), {kWidth / 2, 0, kWidth, kHeight / 2}), 1000);
}

TEST(ViewerTest, AgentViewInsetShowsTheObservationScaledWithoutSmoothing) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  viewer->options().show_hud = viewer->options().show_actions = false;
  Image image = Shot(*viewer);
  std::vector<uint8_t> pixels;
  viewer->simulation().Read([&](const mjModel*, const mjData*, const SimulationStatus& s) { pixels = s.pixels; });
  ASSERT_EQ(pixels.size(), 84u * 84 * 3);
  // The inset's integer scale and place (bottom-right, 10 px margin).
  const int scale = std::max(1, std::min(int(kHeight * 0.35 / 84), int(kWidth * 0.3 / 84)));
  const int left = kWidth - 10 - 84 * scale, top = kHeight - 10 - 84 * scale;
  int mismatches = 0;
  for (int y = 0; y < 84 * scale; ++y) {
    for (int x = 0; x < 84 * scale; ++x) {
      const uint8_t* shown = image.at(left + x, top + y);
      const uint8_t* seen = pixels.data() + ((y / scale) * 84 + x / scale) * 3;
      mismatches += std::memcmp(shown, seen, 3) != 0;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ViewerTest, PKeySavesAPngScreenshot) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  Press(*viewer, SDLK_p);
  ASSERT_FALSE(viewer->last_screenshot().empty());
  auto png = ReadPng(viewer->last_screenshot());
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->width, kWidth);
  EXPECT_EQ(png->height, kHeight);
  std::filesystem::remove(viewer->last_screenshot());
}

TEST(ViewerTest, BracketKeysHalveAndDoubleTheSpeed) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  auto speed = [&] {
    double value = 0;
    viewer->simulation().Read([&](const mjModel*, const mjData*, const SimulationStatus& s) { value = s.speed; });
    return value;
  };
  Press(*viewer, SDLK_LEFTBRACKET);
  EXPECT_EQ(speed(), 0.5);
  Press(*viewer, SDLK_RIGHTBRACKET);
  Press(*viewer, SDLK_RIGHTBRACKET);
  EXPECT_EQ(speed(), 2.0);
}

TEST(ViewerTest, ResizedWindowIsDrawnAtItsNewSize) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  SDL_SetWindowSize(viewer->window(), 640, 400);
  // The X server applies the size asynchronously.
  Image image;
  for (int i = 0; i < 50 && image.width != 640; ++i) {
    ASSERT_TRUE(viewer->RunFrames(1).ok());
    image = Shot(*viewer);
    if (image.width != 640) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(image.width, 640);
  ASSERT_EQ(image.height, 400);
  // The scene fills the new size: the bottom-right corner is drawn too.
  std::set<uint32_t> colours;
  for (int y = 200; y < 400; ++y) {
    for (int x = 320; x < 640; ++x) {
      const uint8_t* p = image.at(x, y);
      colours.insert(p[0] << 16 | p[1] << 8 | p[2]);
    }
  }
  EXPECT_GT(colours.size(), 50u);
}

TEST(ViewerTest, EscapeQuits) {
  auto viewer = MakeViewer(std::make_unique<ScriptedPolicy>(config::ScriptedPolicyConfig::CONTROLLER, 0));
  ASSERT_NE(viewer, nullptr);
  viewer->InjectKey(SDLK_ESCAPE);
  auto running = viewer->RunFrames(5);
  ASSERT_TRUE(running.ok());
  EXPECT_FALSE(*running);
}

}  // namespace
}  // namespace troupe::viz
