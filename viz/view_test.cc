// troupe view's run-directory modes in a real window (Xvfb started by the
// test): a D4PG checkpoint driving the env, and a GAN run's samples and FID.
#include "viz/view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "actors/episode_recorder.h"
#include "agents/policies.h"
#include "common/run_layout.h"
#include "common/video.h"
#include "envs/env.h"
#include "viz/testing/run_dirs.h"
#include "viz/testing/xvfb.h"

namespace troupe::viz {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

const auto* const xvfb = ::testing::AddGlobalTestEnvironment(new testing::XvfbEnvironment);

constexpr int kWidth = 480;
constexpr int kHeight = 360;

std::unique_ptr<Viewer> MakeWindow() {
  ViewerOptions options;
  options.width = kWidth;
  options.height = kHeight;
  options.vsync = false;
  options.screenshot_dir = ::testing::TempDir();
  auto viewer = Viewer::Create(std::move(options));
  EXPECT_TRUE(viewer.ok()) << viewer.status();
  return viewer.ok() ? *std::move(viewer) : nullptr;
}

size_t Colours(const Image& image) {
  std::set<uint32_t> colours;
  for (int i = 0; i < image.width * image.height; ++i) {
    const uint8_t* p = image.pixels.data() + 3 * i;
    colours.insert(p[0] << 16 | p[1] << 8 | p[2]);
  }
  return colours.size();
}

// Pixels within 30 of `rgb` in each channel.
int PixelsNear(const Image& image, std::array<int, 3> rgb) {
  int count = 0;
  for (int i = 0; i < image.width * image.height; ++i) {
    const uint8_t* p = image.pixels.data() + 3 * i;
    count += std::abs(p[0] - rgb[0]) < 30 && std::abs(p[1] - rgb[1]) < 30 && std::abs(p[2] - rgb[2]) < 30;
  }
  return count;
}

TEST(RecordViewTest, RecordsTheCheckpointsEpisodesToAnMp4WithoutAWindow) {
  std::vector<float> parameters;
  const std::string dir = testing::RlRunDir("record", "cartpole.swingup", "[32, 32]", &parameters);
  const std::string video = ::testing::TempDir() + "/record-view.mp4";
  fs::remove(video);
  const std::string strip = ::testing::TempDir() + "/record-view-strip.png";
  fs::remove(strip);
  const ViewRequest request{.run_dir = dir,
                            .seed = 2,
                            .width = 64,
                            .height = 48,
                            .record = video,
                            .record_episodes = 2,
                            .strip = strip,
                            .strip_frames = 5};
  auto plan = PlanView(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto spec = envs::DescribeEnv(plan->env);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto frames = RecordView(request);
  ASSERT_TRUE(frames.ok()) << frames.status();
  // Two whole episodes (each its reset state and every agent step), one
  // state in `stride` a frame (the recorder's 30 fps cap).
  auto recorder = actors::EpisodeRecorder::Create(
      {.task = plan->env.task, .action_repeat = plan->env.action_repeat, .width = 64, .height = 48});
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  const int stride = (*recorder)->stride();
  EXPECT_EQ(*frames, (2 * (spec->episode_steps + 1) + stride - 1) / stride);
  auto info = ReadVideoInfo(video);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->frames, *frames);
  EXPECT_EQ(info->width, 64);
  EXPECT_EQ(info->height, 48);
  // The frame strip: 5 frames of 64x48 with 4-pixel gaps, the first and the
  // last the video's own.
  auto png = ReadPng(strip);
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->width, 5 * 64 + 4 * 4);
  EXPECT_EQ(png->height, 48);
  auto ends = ReadVideoFrames(video, 2);
  ASSERT_TRUE(ends.ok()) << ends.status();
  for (int y = 0; y < 48; y += 7) {
    for (int x = 0; x < 64; x += 9) {
      EXPECT_EQ(png->at(x, y)[1], (*ends)[0].at(x, y)[1]) << "first frame at " << x << "," << y;
      EXPECT_EQ(png->at(4 * 68 + x, y)[1], (*ends)[1].at(x, y)[1]) << "last frame at " << x << "," << y;
    }
  }
}

TEST(RecordViewTest, RefusesALiveStream) {
  auto frames = RecordView({.live = "127.0.0.1:7070", .record = ::testing::TempDir() + "/live.mp4"});
  ASSERT_FALSE(frames.ok());
  EXPECT_EQ(frames.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(frames.status().message(), HasSubstr("videos/"));
}

TEST(CheckpointViewTest, TheCheckpointsPolicyDrivesTheEnvInAWindow) {
  std::vector<float> parameters;
  const std::string dir = testing::RlRunDir("window", "cartpole.swingup", "[32, 32]", &parameters);
  auto plan = PlanView({.run_dir = dir, .seed = 5});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->mode, ViewPlan::Mode::kCheckpoint);
  auto viewer = MakeWindow();
  ASSERT_NE(viewer, nullptr);
  auto simulation = Simulation::Create([&] { return MakeSource(*plan); }, {.start_paused = true});
  ASSERT_TRUE(simulation.ok()) << simulation.status();
  ASSERT_TRUE(viewer->Show(*std::move(simulation)).ok());

  // The action the learner's own policy takes in the episode's first state.
  envs::EnvOptions options = plan->env;
  options.pixels = false;
  auto env = envs::MakeEnv(options);
  ASSERT_TRUE(env.ok()) << env.status();
  std::vector<float> state((*env)->spec().state_size);
  ASSERT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  auto reference = agents::CreatePolicy(plan->config, {.state_size = int(state.size())}, 1);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE((*reference)->SetParameters(parameters).ok());
  float expected = 0;
  ASSERT_TRUE((*reference)->Act(state.data(), nullptr, 1, &expected).ok());
  ASSERT_GT(std::abs(expected), 1e-6f);

  // One step (right arrow while paused): the viewer applied that action.
  viewer->InjectKey(SDLK_RIGHT);
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  ASSERT_TRUE(viewer->simulation().WaitUntilIdle(absl::Seconds(10)));
  SimulationStatus status;
  viewer->simulation().Read([&](const mjModel*, const mjData*, const SimulationStatus& s) { status = s; });
  ASSERT_TRUE(status.error.ok()) << status.error;
  EXPECT_EQ(status.step, 1);
  ASSERT_EQ(status.action.size(), 1u);
  EXPECT_FLOAT_EQ(status.action[0], expected);
  EXPECT_THAT(status.policy, HasSubstr("D4PG checkpoint agent.ckpt"));
  EXPECT_THAT(status.version, HasSubstr("version 0 (updates), 3000 frames, saved"));

  // Running, it draws a scene (not blank) and keeps stepping.
  viewer->InjectKey(SDLK_SPACE);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(viewer->RunFrames(1).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto image = viewer->Screenshot();
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_GT(Colours(*image), 500u);
  viewer->simulation().Read([&](const mjModel*, const mjData*, const SimulationStatus& s) { status = s; });
  EXPECT_TRUE(status.error.ok()) << status.error;
  EXPECT_GT(status.total_steps, 1);
}

// A GAN run directory as gan/run.cc writes it.
std::string GanRunDir() {
  const std::string dir = testing::FreshDir("gan");
  std::ofstream(RunLayout(dir).config()) << "name: \"fashion\"\nmode: GAN\n";
  std::ofstream(RunLayout(dir).eval_csv()) << "images,steps,classifier_fid,classifier_score,seconds\n"
                                      "1000,10,80.5,2.0,1.0\n2000,20,60.25,3.0,2.0\n";
  fs::create_directories(dir + "/samples");
  return dir;
}

// A width x height grid: `rgb` with a black line every 8 pixels.
void WriteGrid(const std::string& path, std::array<int, 3> rgb) {
  Image grid(64, 64, 3);
  for (int y = 0; y < 64; ++y) {
    for (int x = 0; x < 64; ++x) {
      if (x % 8 == 0 || y % 8 == 0) continue;
      for (int c = 0; c < 3; ++c) grid.at(x, y)[c] = uint8_t(rgb[c]);
    }
  }
  ASSERT_TRUE(WritePng(path, grid).ok());
}

TEST(GanViewTest, ShowsTheNewestSampleGridAndTheFidCurveAndFollowsNewGrids) {
  const std::string dir = GanRunDir();
  WriteGrid(dir + "/samples/samples-000001000.png", {230, 30, 30});
  WriteGrid(dir + "/samples.png", {230, 30, 30});
  auto plan = PlanView({.run_dir = dir});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->mode, ViewPlan::Mode::kGan);
  EXPECT_EQ(MakeSource(*plan).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(PlanView({.run_dir = dir, .policy = "zero"}).status().message(), HasSubstr("GAN run"));

  auto viewer = MakeWindow();
  ASSERT_NE(viewer, nullptr);
  ASSERT_TRUE(viewer->ShowGan(std::make_unique<GanSamples>(dir)).ok());
  ASSERT_TRUE(viewer->RunFrames(2).ok());
  auto first = viewer->Screenshot();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WritePng(::testing::TempDir() + "/viewer_gan.png", *first).ok());
  // The grid fills much of the window's left side; the FID curve has both evaluations.
  EXPECT_GT(PixelsNear(*first, {230, 30, 30}), kWidth * kHeight / 8);
  EXPECT_THAT(viewer->gan()->grid_path(), HasSubstr("samples-000001000.png"));
  ASSERT_EQ(viewer->gan()->fid().points.size(), 2u);
  EXPECT_DOUBLE_EQ(viewer->gan()->fid().points[1].second, 60.25);

  // Training writes a newer grid and an evaluation: shown within a second or so.
  WriteGrid(dir + "/samples/samples-000003000.png", {30, 200, 60});
  std::ofstream(RunLayout(dir).eval_csv(), std::ios::app) << "3000,30,41.0,4.0,3.0\n";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  auto second = viewer->Screenshot();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(PixelsNear(*second, {30, 200, 60}), kWidth * kHeight / 8);
  EXPECT_LT(PixelsNear(*second, {230, 30, 30}), 50);
  EXPECT_EQ(viewer->gan()->fid().points.size(), 3u);

  // p still saves a screenshot; Esc quits.
  viewer->InjectKey(SDLK_p);
  ASSERT_TRUE(viewer->RunFrames(1).ok());
  EXPECT_TRUE(fs::exists(viewer->last_screenshot()));
  viewer->InjectKey(SDLK_ESCAPE);
  auto running = viewer->RunFrames(1);
  ASSERT_TRUE(running.ok());
  EXPECT_FALSE(*running);
}

TEST(GanViewTest, ARunWithoutSamplesYetSaysItIsWaiting) {
  const std::string dir = testing::FreshDir("gan_empty");
  std::ofstream(RunLayout(dir).config()) << "name: \"fashion\"\nmode: GAN\n";
  auto viewer = MakeWindow();
  ASSERT_NE(viewer, nullptr);
  ASSERT_TRUE(viewer->ShowGan(std::make_unique<GanSamples>(dir)).ok());
  auto image = viewer->Screenshot();
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_FALSE(viewer->gan()->grid().has_value());
  EXPECT_TRUE(viewer->gan()->fid().points.empty());
  EXPECT_GT(Colours(*image), 2u);  // background and text
}

}  // namespace
}  // namespace troupe::viz
